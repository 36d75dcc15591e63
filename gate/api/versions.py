"""Semantic versions and dependsOn constraints, read one way by admission and by the operator.

Comparators joined by commas or spaces must all hold: `>=1.2.0, <2`, `^1.4`, `~1.2.3`, `1.2.3`
(exactly), `1.2` (any 1.2.x), `*` (any). A parse returns the reason as a string when it fails, so a
caller can put it in a message without catching anything.

Prereleases follow npm and Cargo, the rule users of version ranges expect: a prerelease satisfies a
constraint only when one of its comparators names a prerelease of the same MAJOR.MINOR.PATCH, and
then only if every comparator holds. So `>=1.0.0` is not met by `2.0.0-rc.1`, nor `^1.4` by
`2.0.0-rc.1`, nor `*` by any prerelease; `>=1.2.3-rc.1, <2` is met by `1.2.3-rc.2` and not by
`1.2.4-rc.1`. A dependency on a release candidate is written by naming it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import semver

_memo = functools.lru_cache(maxsize=4096)


def type_name(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def parse_version(text: object) -> semver.Version | str:
    if not isinstance(text, str):
        return f"a version must be a string like 1.2.0, not {type_name(text)}"
    return _parse_version_text(text)


@_memo
def _parse_version_text(text: str) -> semver.Version | str:
    try:
        return semver.Version.parse(text)
    except (ValueError, TypeError):
        return f"{text!r} is not a semantic version MAJOR.MINOR.PATCH (e.g. 1.2.0 or 1.2.0-rc.1)"


_COMPARATOR = re.compile(
    r"^(>=|<=|==|!=|>|<|=|\^|~)?\s*v?([0-9]+(?:\.[0-9]+){0,2}(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?)$"
)
Predicate = Callable[[semver.Version], bool]


def _padded(text: str) -> tuple[semver.Version, int]:
    """A possibly partial version (1, 1.2, 1.2.3-rc.1) as a full one, and how many parts were given."""
    main, _, build = text.partition("+")
    core, dash, pre = main.partition("-")
    parts = core.split(".")
    full = ".".join(parts + ["0"] * (3 - len(parts))) + (f"-{pre}" if dash else "") + (f"+{build}" if build else "")
    return semver.Version.parse(full), len(parts)


def parse_constraint(text: object) -> list[Predicate] | str:
    """Comparators joined by commas or spaces, all of which must hold: `>=1.2.0, <2`, `^1.4`, `~1.2.3`,
    `1.2.3` (exactly), `*` (any)."""
    if not isinstance(text, str) or not text.strip():
        return "a version constraint must be a non-empty string like >=1.2.0 or ^1.4"
    return _parse_constraint_text(text)


@_memo
def _parse_constraint_text(text: str) -> list[Predicate] | str:
    if len(text) > 256:
        return "a version constraint must be at most 256 characters"
    preds: list[Predicate] = []
    prerelease_of: set[tuple[int, int, int]] = set()  # the MAJOR.MINOR.PATCH a comparator opens to prereleases
    tokens = re.sub(r"(>=|<=|==|!=|>|<|=|\^|~)\s+", r"\1", text.strip()).replace(",", " ").split()
    for token in tokens:
        if token in ("*", "x", "X"):
            continue
        match = _COMPARATOR.match(token)
        if not match:
            return f"{text!r} is not a version constraint like >=1.2.0, <2.0.0, ^1.4 or ~1.2.3"
        op, ver = match.group(1) or "=", match.group(2)
        try:
            bound, given = _padded(ver)
        except ValueError:
            return f"{ver!r} in {text!r} is not a version"
        preds.extend(_predicates(op, bound, given))
        if bound.prerelease and op != "!=":
            prerelease_of.add((bound.major, bound.minor, bound.patch))
    frozen = frozenset(prerelease_of)
    preds.append(lambda x: not x.prerelease or (x.major, x.minor, x.patch) in frozen)
    return preds


def _predicates(op: str, v: semver.Version, given: int) -> list[Predicate]:
    if op in (">=",):
        return [lambda x: x >= v]
    if op == ">":
        return [lambda x: x > v]
    if op == "<=":
        return [lambda x: x <= v]
    if op == "<":
        return [lambda x: x < v]
    if op == "!=":
        return [lambda x: x != v]
    if op == "^":
        upper = v.bump_major() if v.major else (v.bump_minor() if v.minor or given < 3 else v.bump_patch())
        return [lambda x: x >= v, lambda x: x < upper]
    if op == "~":
        upper = v.bump_minor() if given >= 2 else v.bump_major()
        return [lambda x: x >= v, lambda x: x < upper]
    # "=" / "==": a partial version (1.2) means any 1.2.x
    if given == 3:
        return [lambda x: x == v]
    upper = v.bump_minor() if given == 2 else v.bump_major()
    return [lambda x: x >= v, lambda x: x < upper]


def satisfies(version: semver.Version, constraint: list[Predicate]) -> bool:
    return all(pred(version) for pred in constraint)




def image_tag(version: str) -> str:
    """The image tag a package version is published under: the version itself, with semver's build
    separator `+` (not allowed in a tag) written `_`, as Helm and OCI registries do."""
    return version.replace("+", "_")


def image_reference(image: str, version: str) -> str:
    """The image a package's stages run: pinned by digest or tagged as given (admission checked the tag
    is the version), or else tagged with the version. A colon counts as a tag only after the last
    slash, so `host:5000/team/tool` gets one."""
    if "@" in image or ":" in image.rsplit("/", 1)[-1]:
        return image
    return f"{image}:{image_tag(version)}"
