"""What a Dockerfile builds from and what it copies: the pure half of building images without Docker.

Two questions are answered here without running anything:

* **Which local base stands in for each FROM.** No public registry is reachable, so every public
  base a Dockerfile names must map to a base assembled on this machine (`gate/devcluster/bases.py`).
  A FROM may name the image literally (`FROM busybox:1.37`) or through a build argument with a
  default (`ARG PYTHON_IMAGE=python:3.11-slim-bookworm` then `FROM ${PYTHON_IMAGE}`). The answer is
  the build arguments to pass, or an image for buildah's `--from`, which replaces the first FROM. A
  FROM that maps to nothing is an error naming it, never a silent pull.
* **Which files are the build's inputs**, so that an unchanged build is skipped: the sources of every
  COPY/ADD from the context (not `--from=<stage>`), minus what `.dockerignore` excludes, with
  Docker's rules (Go `filepath.Match` patterns, `**` for any number of directories, a pattern that
  matches a directory excludes everything below it, the last matching pattern wins, `!` re-includes).

Only the Dockerfile subset NodeGate uses is parsed: line continuations, comments, `ARG`, `FROM ...
[AS name]`, `COPY`/`ADD` with flags and the plain or JSON-array form. Heredocs are not supported.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


class DockerfileError(ValueError):
    """The Dockerfile uses something this builder cannot map or parse; the message says what."""


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    args: str  # the rest of the logical line, continuations joined


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]
    destination: str
    from_stage: str | None = None  # COPY --from=<stage or image>: not from the context


@dataclass(frozen=True)
class Stage:
    base: str  # the FROM argument as written (may hold ${ARG})
    name: str | None
    copies: tuple[Copy, ...] = ()


@dataclass(frozen=True)
class Dockerfile:
    args: Mapping[str, str | None]  # ARGs declared before the first FROM, with their defaults
    stages: tuple[Stage, ...]

    @classmethod
    def parse(cls, text: str) -> Dockerfile:
        return parse(text)


@dataclass(frozen=True)
class BaseOverrides:
    """How to point a Dockerfile at local bases: build arguments, and an image for `--from`."""

    build_args: Mapping[str, str] = field(default_factory=dict)
    from_image: str | None = None

    def buildah_args(self) -> list[str]:
        out = [arg for name, value in sorted(self.build_args.items()) for arg in ("--build-arg", f"{name}={value}")]
        if self.from_image:
            out += ["--from", self.from_image]
        return out


def instructions(text: str) -> list[Instruction]:
    """Logical lines: comments and blank lines dropped, backslash continuations joined."""
    out: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction is skipped, as Docker does
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical = (pending + line).strip()
        pending = ""
        if logical:
            keyword, _, rest = logical.partition(" ")
            out.append(Instruction(keyword.upper(), rest.strip()))
    if pending.strip():
        keyword, _, rest = pending.strip().partition(" ")
        out.append(Instruction(keyword.upper(), rest.strip()))
    return out


def _parse_copy(args: str) -> Copy:
    words = args.split()
    from_stage = None
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        if flag.startswith("--from="):
            from_stage = flag.split("=", 1)[1]
    rest = " ".join(words)
    if rest.startswith("["):
        try:
            items = json.loads(rest)
        except json.JSONDecodeError as exc:
            raise DockerfileError(f"COPY {args}: not a JSON array: {exc}") from None
        parts = [str(item) for item in items]
    else:
        parts = rest.split()
    if len(parts) < 2:
        raise DockerfileError(f"COPY {args}: needs at least one source and a destination")
    return Copy(tuple(parts[:-1]), parts[-1], from_stage)


def parse(text: str) -> Dockerfile:
    args: dict[str, str | None] = {}
    stages: list[Stage] = []
    copies: list[Copy] = []
    for ins in instructions(text):
        if ins.keyword == "ARG" and not stages:
            arg, eq, default = ins.args.partition("=")
            args[arg.strip()] = default.strip().strip('"') if eq else None
        elif ins.keyword == "FROM":
            if stages:
                stages[-1] = Stage(stages[-1].base, stages[-1].name, tuple(copies))
                copies = []
            words = [w for w in ins.args.split() if not w.startswith("--platform")]
            if not words:
                raise DockerfileError("FROM without an image")
            stage_name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], stage_name))
        elif ins.keyword in ("COPY", "ADD"):
            if not stages:
                raise DockerfileError(f"{ins.keyword} before the first FROM")
            copies.append(_parse_copy(ins.args))
    if not stages:
        raise DockerfileError("no FROM instruction")
    stages[-1] = Stage(stages[-1].base, stages[-1].name, tuple(copies))
    return Dockerfile(args, tuple(stages))


def expand(value: str, args: Mapping[str, str | None]) -> str:
    """`${NAME}` / `$NAME` replaced by the ARG defaults (unknown or unset: an error)."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        found = args.get(name)
        if found is None:
            raise DockerfileError(f"FROM {value}: build argument {name} has no default to map")
        return found

    return _VAR.sub(sub, value)


def base_overrides(dockerfile: Dockerfile, bases: Mapping[str, str]) -> BaseOverrides:
    """The build arguments and `--from` image that replace every public FROM by its local base.

    `bases` maps public image references (`busybox:1.37`) to local ones. A FROM naming an earlier
    stage needs nothing. A FROM through a build argument is mapped by overriding that argument, so
    every stage using it follows; a literal FROM can only be replaced when it is the first one
    (that is what `--from` does), and it must be the only literal public FROM of the file.
    """
    build_args: dict[str, str] = {}
    from_image: str | None = None
    stage_names: set[str] = set()
    for index, stage in enumerate(dockerfile.stages):
        written = stage.base
        if written in stage_names:
            pass
        elif refs := [m.group(1) or m.group(2) for m in _VAR.finditer(written)]:
            public = expand(written, dockerfile.args)
            if public not in bases:
                raise DockerfileError(_unmapped(public, bases))
            if written.strip() not in (f"${{{refs[0]}}}", f"${refs[0]}"):
                raise DockerfileError(f"FROM {written}: only a FROM that is one build argument can be mapped")
            build_args[refs[0]] = bases[public]
        elif written == "scratch":
            pass
        elif index == 0:
            if written not in bases:
                raise DockerfileError(_unmapped(written, bases))
            from_image = bases[written]
        else:
            raise DockerfileError(
                f"FROM {written} (stage {index + 1}): a literal FROM after the first cannot be replaced by "
                "--from; name the base through a build argument (ARG ...=image, FROM ${...})")
        if stage.name:
            stage_names.add(stage.name)
    return BaseOverrides(build_args, from_image)


def _unmapped(image: str, bases: Mapping[str, str]) -> str:
    known = ", ".join(sorted(bases)) or "none"
    return (f"FROM {image}: no local base stands in for it (no registry outside this machine is reachable); "
            f"the local bases map {known} (docs/images.md)")


# -- .dockerignore ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IgnoreRule:
    pattern: tuple[str, ...]  # path segments, cleaned
    negated: bool


def ignore_rules(text: str) -> list[IgnoreRule]:
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        if negated:
            line = line[1:].strip()
        cleaned = os.path.normpath(line.lstrip("/")) if line.strip("/") else "."
        if cleaned == ".":
            continue
        rules.append(IgnoreRule(tuple(cleaned.split("/")), negated))
    return rules


def _match_segments(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Go filepath.Match per segment (`*` never crosses `/`), with `**` as any number of segments."""
    if not pattern:
        return not path
    head = pattern[0]
    if head == "**":
        return any(_match_segments(pattern[1:], path[i:]) for i in range(len(path) + 1))
    if not path:
        return False
    return fnmatch.fnmatchcase(path[0], head) and _match_segments(pattern[1:], path[1:])


def _rule_matches(rule: IgnoreRule, path: tuple[str, ...]) -> bool:
    # A pattern that matches a parent directory matches everything below it.
    return any(_match_segments(rule.pattern, path[:n]) for n in range(len(path), 0, -1))


def is_ignored(relpath: str, rules: Iterable[IgnoreRule]) -> bool:
    path = tuple(Path(relpath).parts)
    ignored = False
    for rule in rules:
        if _rule_matches(rule, path):
            ignored = not rule.negated
    return ignored


# -- inputs -------------------------------------------------------------------------------------------


def context_inputs(context: Path, dockerfile: Dockerfile) -> list[str]:
    """Paths (relative to `context`, sorted) of every context file the Dockerfile copies."""
    ignore_file = context / ".dockerignore"
    rules = ignore_rules(ignore_file.read_text()) if ignore_file.is_file() else []
    may_reinclude = any(rule.negated for rule in rules)
    found: set[str] = set()
    for stage in dockerfile.stages:
        for copy in stage.copies:
            if copy.from_stage is not None:
                continue
            for source in copy.sources:
                if "://" in source:
                    raise DockerfileError(f"ADD {source}: a URL is not a context input; download it in a RUN")
                matches = sorted(context.glob(source.strip("/"))) if any(c in source for c in "*?[") \
                    else [context / source.strip("/")]
                if not matches or not all(m.exists() for m in matches):
                    raise DockerfileError(f"COPY {source}: not found in the build context {context}")
                for match in matches:
                    found.update(_walk(context, match, rules, may_reinclude))
    return sorted(found)


def _walk(context: Path, start: Path, rules: list[IgnoreRule], may_reinclude: bool) -> Iterable[str]:
    if start.is_file():
        rel = start.relative_to(context).as_posix()
        if not is_ignored(rel, rules):
            yield rel
        return
    for dirpath, dirnames, filenames in os.walk(start):
        base = Path(dirpath)
        if not may_reinclude:
            dirnames[:] = [d for d in dirnames if not is_ignored((base / d).relative_to(context).as_posix(), rules)]
        dirnames.sort()
        for name in sorted(filenames):
            rel = (base / name).relative_to(context).as_posix()
            if not is_ignored(rel, rules):
                yield rel


def inputs_digest(context: Path, dockerfile_text: str, extra: Mapping[str, str]) -> str:
    """A digest of everything a build depends on: the Dockerfile, every copied file (path, content and
    executable bit), and `extra` (the build arguments, the base images' ids)."""
    parsed = parse(dockerfile_text)
    h = hashlib.sha256()
    h.update(b"dockerfile\0" + dockerfile_text.encode() + b"\0")
    for key, value in sorted(extra.items()):
        h.update(f"extra\0{key}\0{value}\0".encode())
    for rel in context_inputs(context, parsed):
        path = context / rel
        mode = "x" if os.access(path, os.X_OK) else "-"
        h.update(f"file\0{rel}\0{mode}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()
