"""Image signature policy: which keys must have signed the images of which repositories (issue 34).

The cluster's trust policy, as the operator reads it from `--image-signatures FILE` (the chart's
`operator.imageSignatures`) and `nodegate package verify --policy FILE` reads it too:

```yaml
mode: enforce            # enforce: a failed image holds its gate | warn: it runs, with a warning
unmatched: allow         # a repository no rule covers: allow | refuse
rules:
  - name: catalog
    repositories: ["registry.example.com/nodegate/**"]
    keys:                # any one of them suffices: several during a rotation
      - name: catalog-2026
        pem: |
          -----BEGIN PUBLIC KEY-----
          ...
```

Decisions:

* **Patterns match whole path components**, never a string prefix: `registry.example.com/nodegate/*`
  matches `registry.example.com/nodegate/agent` and not `.../nodegate/a/b` nor
  `.../nodegate-evil/agent`; `**` (only as the last component) matches one or more components at any
  depth; any other pattern is an exact repository name. A `*` inside a component (`nodegate-*`) is
  refused when the file is read: it would be a string prefix again.
* **Names are compared fully qualified**, as the image policy compares them (`gate.api.references`):
  a pattern starts with a registry host, and `index.docker.io` is `docker.io`.
* **The most specific rule wins**, whatever the order of the file: an exact name before any pattern;
  among patterns, the one with more literal components; at equal literal components `*` before `**`;
  a tie goes to the rule listed first. So a narrow rule for one repository (a team's own key) can sit
  beside the chart's catalog-wide rule without the order of the list deciding.
* **Keys are parsed when the file is read**, with `cryptography`: PEM public keys, ECDSA on P-256 or
  Ed25519, the two kinds `cosign generate-key-pair` makes. A bad PEM or another curve is refused then,
  naming the rule and the key, rather than failing every verification later.
* **`fingerprint()` hashes what decides**: the mode, `unmatched`, and each rule's patterns and keys
  (their DER, so a PEM re-wrapped or re-indented is the same policy). A changed fingerprint means
  every verdict must be taken again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gate.api.references import is_registry_host, registry_of_host

Mode = Literal["enforce", "warn"]
Unmatched = Literal["allow", "refuse"]
Reason = Literal["Verified", "NotCovered", "NoRule", "SignatureMissing", "SignatureInvalid", "UntrustedKey"]
FAILURE_REASONS: tuple[Reason, ...] = ("NoRule", "SignatureMissing", "SignatureInvalid", "UntrustedKey")

PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


def parse_public_key(pem: str) -> PublicKey:
    """A cosign public key from its PEM, or ValueError saying why it is not one NodeGate accepts."""
    try:
        key = serialization.load_pem_public_key(pem.strip().encode())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"is not a PEM public key ({exc})") from None
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise ValueError(f"is an ECDSA key on {key.curve.name}; only P-256 (secp256r1) and Ed25519 keys "
                             "are accepted (the keys cosign generate-key-pair makes)")
        return key
    raise ValueError(f"is a {type(key).__name__.removeprefix('_')} key; only ECDSA P-256 and Ed25519 keys "
                     "are accepted (the keys cosign generate-key-pair makes)")


def key_der(key: PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SignatureKey(_Strict):
    """A public key whose signatures a rule trusts."""

    name: str = Field(min_length=1, description="Said in verdicts and status: which key signed.")
    pem: str = Field(description="The PEM public key (ECDSA P-256 or Ed25519), as in cosign.pub.")

    @field_validator("pem")
    @classmethod
    def _parses(cls, pem: str) -> str:
        parse_public_key(pem)
        return pem

    @cached_property
    def public_key(self) -> PublicKey:
        return parse_public_key(self.pem)


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be a repository pattern, or None."""
    parts = pattern.split("/")
    if not pattern or any(not p for p in parts):
        return f"{pattern!r} has an empty path component"
    if not is_registry_host(parts[0]) or "*" in parts[0]:
        return (f"{pattern!r} must start with a registry host (e.g. registry.example.com/{pattern}); "
                "names are compared fully qualified, docker.io for Docker Hub")
    if len(parts) < 2:
        return f"{pattern!r} names a registry but no repository: add /** for every repository on it"
    for i, part in enumerate(parts):
        if "*" in part and part not in ("*", "**"):
            return (f"{pattern!r}: a wildcard must be a whole path component ({part!r}); use * for one "
                    "component or ** (last) for any depth")
        if part == "**" and i != len(parts) - 1:
            return f"{pattern!r}: ** may only be the last path component"
    return None


def _qualify(name: str) -> list[str]:
    """A repository name's components, with its registry host qualified as containerd does."""
    first, slash, rest = name.partition("/")
    if not slash or not is_registry_host(first):
        return ["docker.io", *(name.split("/") if slash else ["library", name])]
    return [registry_of_host(first), *rest.split("/")]


def _matches(pattern: list[str], name: list[str]) -> bool:
    if pattern and pattern[-1] == "**":
        head = pattern[:-1]
        return len(name) > len(head) and _matches(head, name[: len(head)])
    return len(pattern) == len(name) and all(p in ("*", n) for p, n in zip(pattern, name, strict=True))


def _specificity(pattern: list[str]) -> tuple[int, int, int]:
    """Higher is more specific: exact names, then more literal components, then `*` before `**`."""
    wild = [p for p in pattern if p in ("*", "**")]
    return (0 if wild else 1, len(pattern) - len(wild), 0 if "**" in wild else 1)


def _unique(what: str, names: list[str]) -> None:
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{what}: {', '.join(dup)} appears twice")


class SignatureRule(_Strict):
    """The keys whose signature the images of some repositories need."""

    name: str = Field(min_length=1, description="Said in verdicts and status: which rule judged.")
    repositories: list[str] = Field(min_length=1, description="Repository names or patterns (* and **).")
    keys: list[SignatureKey] = Field(min_length=1, description="Any one of them suffices (rotation).")

    @field_validator("repositories")
    @classmethod
    def _patterns(cls, repositories: list[str]) -> list[str]:
        for pattern in repositories:
            problem = pattern_problem(pattern)
            if problem is not None:
                raise ValueError(problem)
        return repositories

    @model_validator(mode="after")
    def _unique_keys(self) -> SignatureRule:
        _unique("key names must be unique within a rule", [k.name for k in self.keys])
        return self

    def specificity(self, repository: str) -> tuple[int, int, int] | None:
        """How specifically this rule names `repository` (qualified), or None when it does not cover it."""
        name = _qualify(repository)
        found = [_specificity(p) for p in (_qualify(r) for r in self.repositories) if _matches(p, name)]
        return max(found) if found else None


class SignaturePolicy(_Strict):
    """The cluster's image signature policy (see the module docstring for the file format)."""

    mode: Mode = "enforce"
    unmatched: Unmatched = "allow"
    rules: list[SignatureRule] = []

    @model_validator(mode="after")
    def _unique_rules(self) -> SignaturePolicy:
        _unique("rule names must be unique", [r.name for r in self.rules])
        return self

    def rule_for(self, repository: str) -> SignatureRule | None:
        """The most specific rule covering `repository` (a tie goes to the first listed), or None."""
        best: tuple[tuple[int, int, int], int, SignatureRule] | None = None
        for index, rule in enumerate(self.rules):
            rank = rule.specificity(repository)
            if rank is not None and (best is None or rank > best[0]):
                best = (rank, index, rule)
        return best[2] if best else None

    def fingerprint(self) -> str:
        """A stable hash of what decides verdicts: a different one means verify again."""
        blob = {
            "mode": self.mode,
            "unmatched": self.unmatched,
            "rules": [{"name": r.name, "repositories": ["/".join(_qualify(p)) for p in r.repositories],
                       "keys": [[k.name, key_der(k.public_key).hex()] for k in r.keys]} for r in self.rules],
        }
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_policy(text: str, *, source: str = "policy") -> SignaturePolicy:
    """The policy of a YAML (or JSON) document; ValueError naming the file, the field and why."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not YAML or JSON: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: must be a mapping with mode, unmatched and rules, not a {type(data).__name__}")
    return _validated(data, source)


def _validated(data: dict[str, object], source: str) -> SignaturePolicy:
    """The policy of `data`; ValueError naming `source`, each field and why."""
    try:
        return SignaturePolicy.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            where = _where(loc)
            named = _named(data, loc)
            problems.append(f"{where}{named}: {msg}")
        raise ValueError(f"{source}: " + "; ".join(problems)) from None


def _named(data: object, loc: tuple[int | str, ...]) -> str:
    """` (rule catalog, key k1)`: the names along a location, so a message is read without counting."""
    names = []
    node = data
    for part in loc:
        if isinstance(node, dict):
            node = node.get(part) if isinstance(part, str) else None
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                names.append(node["name"])
        else:
            break
    return f" ({' / '.join(names)})" if names else ""


def policy_for_keys(keys: dict[str, str], repository: str, *, rule: str = "command-line") -> SignaturePolicy:
    """A policy with one rule trusting `keys` (name -> PEM) for exactly `repository`: what
    `nodegate package verify IMAGE --key FILE` judges by."""
    return _validated({"rules": [{"name": rule, "repositories": ["/".join(_qualify(repository))],
                                  "keys": [{"name": n, "pem": p} for n, p in keys.items()]}]}, "--key")


Format = Literal["simplesigning", "bundle-referrers", "bundle-tag"]
FORMAT_NAMES: dict[str, str] = {
    "simplesigning": "simple-signing payload under the sha256-<hex>.sig tag",
    "bundle-referrers": "Sigstore bundle found through the OCI referrers API",
    "bundle-tag": "Sigstore bundle found through the referrers tag schema (sha256-<hex>)",
}


@dataclass(frozen=True)
class Verdict:
    """What the policy decides for one image digest, and why."""

    reason: Reason
    rule: str | None
    key: str | None
    message: str  # names the image, the digest, the rule (and key) and why
    format: Format | None = None  # where the deciding signature was found, if one was

    @property
    def ok(self) -> bool:
        return self.reason in ("Verified", "NotCovered")


__all__ = [
    "FAILURE_REASONS", "FORMAT_NAMES", "Format", "Mode", "PublicKey", "Reason", "SignatureKey", "SignaturePolicy",
    "SignatureRule", "Unmatched", "Verdict", "key_der", "load_policy", "parse_public_key", "pattern_problem",
    "policy_for_keys",
]
