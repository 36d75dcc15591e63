"""Pure checks of the small languages inside a spec: label selectors, image references, resource
quantities, semantic versions and version constraints.

The CRD schema only checks shapes (a string, a map); these say whether the string means something,
and every problem comes back as a `Violation` naming the field, never as an exception.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gate.admission.rules.review import Violation
from gate.api.common import selector_holds
from gate.api.versions import Predicate as Predicate  # re-exported: the rules read versions through syntax
from gate.api.versions import parse_constraint as parse_constraint
from gate.api.versions import parse_version as parse_version
from gate.api.versions import satisfies as satisfies

# -- label selectors (k8s.io/apimachinery validation: IsQualifiedName, IsValidLabelValue) ----------

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


# The parsers below are pure functions of one string, and the same strings (versions, quantities,
# label keys, images) come back in request after request: they are memoised.
_memo = functools.lru_cache(maxsize=4096)


def label_key_problem(key: object) -> str | None:
    """Why `key` is not a label key (`[prefix/]name`), or None when it is one."""
    if not isinstance(key, str) or not key:
        return "a label key must be a non-empty string"
    return _label_key_problem(key)


@_memo
def _label_key_problem(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"the prefix of label key {key!r} must be a DNS subdomain (lowercase, at most 253 characters)"
    if len(name) > 63 or not _NAME.match(name):
        return (f"label key {key!r} must be at most 63 characters of letters, digits, '-', '_' or '.' "
                "after the optional prefix/, starting and ending with a letter or digit")
    return None


def label_value_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return f"a label value must be a string, not {type_name(value)}"
    if value and (len(value) > 63 or not _NAME.match(value)):
        return (f"label value {value!r} must be empty or at most 63 characters of letters, digits, '-', '_' "
                "or '.', starting and ending with a letter or digit")
    return None


def selector_violations(raw: object, path: str) -> list[Violation]:
    """Every reason `raw` is not a valid metav1.LabelSelector."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [Violation(path, f"a label selector must be an object, not {type_name(raw)}")]
    out: list[Violation] = []
    labels = raw.get("matchLabels")
    if labels is not None:
        if not isinstance(labels, dict):
            out.append(Violation(f"{path}.matchLabels", "must be a map of label keys to values"))
        else:
            for key, value in labels.items():
                problem = label_key_problem(key) or label_value_problem(value)
                if problem:
                    out.append(Violation(f"{path}.matchLabels[{key}]", problem))
    exprs = raw.get("matchExpressions")
    if exprs is not None:
        if not isinstance(exprs, list):
            return [*out, Violation(f"{path}.matchExpressions", "must be a list of requirements")]
        for i, req in enumerate(exprs):
            where = f"{path}.matchExpressions[{i}]"
            if not isinstance(req, dict):
                out.append(Violation(where, "a requirement must be an object with key, operator and values"))
                continue
            problem = label_key_problem(req.get("key"))
            if problem:
                out.append(Violation(f"{where}.key", problem))
            op = req.get("operator")
            values = req.get("values") or []
            if op not in OPERATORS:
                out.append(Violation(f"{where}.operator", f"{op!r} is not one of In, NotIn, Exists, DoesNotExist"))
            if not isinstance(values, list):
                out.append(Violation(f"{where}.values", "must be a list of strings"))
                continue
            if op in ("In", "NotIn") and not values:
                out.append(Violation(f"{where}.values", f"operator {op} needs at least one value"))
            if op in ("Exists", "DoesNotExist") and values:
                out.append(Violation(f"{where}.values", f"operator {op} takes no values"))
            for j, value in enumerate(values):
                problem = label_value_problem(value)
                if problem:
                    out.append(Violation(f"{where}.values[{j}]", problem))
    return out


def selector_matches(raw: object, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics on a raw selector; an invalid selector matches nothing."""
    if raw is None:
        return True
    if not isinstance(raw, dict) or selector_violations(raw, ""):
        return False
    expressions = ((r["key"], r["operator"], r.get("values") or []) for r in raw.get("matchExpressions") or [])
    return selector_holds(raw.get("matchLabels") or {}, expressions, labels)


def selector_canonical(raw: dict[str, Any]) -> tuple[object, ...]:
    """A normal form of a valid selector: two selectors that select the same way compare equal."""
    labels = tuple(sorted((raw.get("matchLabels") or {}).items()))
    exprs = tuple(sorted(
        (r["key"], r["operator"], tuple(sorted(set(r.get("values") or [])))) for r in raw.get("matchExpressions") or []
    ))
    # `matchLabels: {a: b}` and `a In (b)` select the same nodes
    as_exprs = tuple(sorted({*((k, "In", (v,)) for k, v in labels), *exprs}))
    return as_exprs


# -- image references (distribution/reference grammar) ---------------------------------------------

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"^(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$"
)
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImageRef:
    name: str
    tag: str | None
    digest: str | None


@_memo
def parse_image(text: str) -> ImageRef | str:
    """The parts of an image reference, or why it is not one.

    `host:5000/team/tool` has no tag: a colon belongs to the tag only after the last slash.
    """
    if not text:
        return "an image reference must not be empty"
    if len(text) > 512:
        return "an image reference must be at most 512 characters"
    match = _REFERENCE.match(text)
    if not match:
        return (f"{text!r} is not an image reference like registry.example.com:5000/team/tool "
                "or ghcr.io/team/tool@sha256:<64 hex digits> (repository path in lowercase)")
    digest = match.group("digest")
    if digest is not None and digest.startswith("sha256:") and not _SHA256.match(digest):
        return f"digest {digest!r} must be sha256: followed by 64 lowercase hex digits"
    if len(match.group("name")) > 255:
        return "the repository name must be at most 255 characters"
    return ImageRef(match.group("name"), match.group("tag"), digest)


# -- quantities (resource.Quantity) ----------------------------------------------------------------

_QUANTITY = re.compile(r"^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_SUFFIX = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}


def parse_quantity(value: object) -> Fraction | str:
    """The value of a Kubernetes quantity ("100m", "1.5Gi", 2), or why it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, str, float)):
        return f"a quantity must be a number or a string like 100m or 1Gi, not {type_name(value)}"
    if isinstance(value, float) and not math.isfinite(value):  # JSON's Infinity and NaN, as Python reads them
        return f"a quantity must be a finite number, not {value}"
    if isinstance(value, (int, float)):
        return Fraction(value)
    return _parse_quantity_text(value)


@_memo
def _parse_quantity_text(value: str) -> Fraction | str:
    match = _QUANTITY.match(value.strip()) if len(value) <= 64 else None
    if not match:
        return f"{value!r} is not a quantity like 100m, 0.5, 64Mi or 2Gi"
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    amount = Fraction(number)
    if suffix[:1] in ("e", "E"):
        exponent = int(suffix[1:])
        if abs(exponent) > 30:
            return f"{value!r} is out of range"
        amount *= Fraction(10) ** exponent
    else:
        amount *= _SUFFIX[suffix]
    return -amount if sign == "-" else amount


# -- semantic versions and constraints: shared with the operator, which must read them the same way


def type_name(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
