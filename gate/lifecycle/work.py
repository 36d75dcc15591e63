"""What a package still needs on a node: the difference between the spec and what is installed.

Level-triggered: nothing here remembers which stage ran last; the remaining work is recomputed from
the spec and the `installed` record every time, and the record is updated after each stage succeeds.

| installed vs spec                     | stages                          | interrupt asked for                   |
|---------------------------------------|---------------------------------|---------------------------------------|
| uninstall.apply, installed            | uninstall                       | none                                  |
| not installed                         | apply (+ config if any)         | interrupt + configInterrupts of keys  |
| older version                         | upgrade (+ config if changed)   | interrupt + configInterrupts changed  |
| newer version (downgrade)             | uninstall, apply (+ config)     | as apply (uninstall only if enabled)  |
| image, env, resources changed         | apply (+ config if changed)     | interrupt + configInterrupts changed  |
| only config changed                   | config                          | configInterrupts of the changed keys  |
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import semver

from gate.api.nodegate import Interrupt, Package
from gate.api.state import Installed, Stage, config_hashes, spec_hash
from gate.lifecycle.interrupts import config_interrupts, merge


@dataclass(frozen=True)
class PackageWork:
    package: str
    stages: tuple[Stage, ...]
    interrupt: Interrupt
    changed_config: tuple[str, ...] = ()
    previous_version: str | None = None

    @property
    def done(self) -> bool:
        return not self.stages

    @property
    def next_stage(self) -> Stage | None:
        return self.stages[0] if self.stages else None


def _newer(a: str, b: str) -> bool:
    """a > b by semver; unparsable versions compare as strings (admission refuses them anyway)."""
    try:
        return bool(semver.Version.parse(a) > semver.Version.parse(b))
    except ValueError:
        return a > b


def changed_keys(package: Package, installed: Installed | None) -> tuple[str, ...]:
    have = installed.config if installed else {}
    want = config_hashes(package)
    return tuple(sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k)))


def package_work(name: str, package: Package, installed: Installed | None) -> PackageWork:
    none = Interrupt()
    if package.uninstall.apply:
        return PackageWork(name, ("uninstall",) if installed else (), none)
    changed = changed_keys(package, installed)
    config_stage: tuple[Stage, ...] = ("config",) if package.config and changed else ()
    on_config = config_interrupts(package.config_interrupts, changed)
    if installed is None:
        return PackageWork(name, ("apply", *config_stage), merge([package.interrupt, *on_config]), changed)
    if installed.version != package.version:
        main: tuple[Stage, ...]
        if _newer(package.version, installed.version):
            main = ("upgrade",)
        else:
            main = ("uninstall", "apply") if package.uninstall.enabled else ("apply",)
        return PackageWork(name, (*main, *config_stage), merge([package.interrupt, *on_config]), changed,
                           previous_version=installed.version)
    if installed.spec_hash != spec_hash(package):
        return PackageWork(name, ("apply", *config_stage), merge([package.interrupt, *on_config]), changed)
    if changed:
        return PackageWork(name, config_stage, merge(on_config), changed)
    return PackageWork(name, (), none)


def after_stage(stage: Stage, package: Package, installed: Installed | None) -> Installed | None:
    """The installed record once `stage` succeeded."""
    if stage == "uninstall":
        return None
    if stage in ("apply", "upgrade"):
        # Config files are mounted into every stage, but the config stage is what applies them; a
        # package without config has nothing left to apply.
        applied = config_hashes(package) if not package.config else {}
        return Installed(version=package.version, spec_hash=spec_hash(package), config=applied)
    if stage == "config":
        base = installed or Installed(version=package.version, spec_hash=spec_hash(package))
        return base.model_copy(update={"config": config_hashes(package)})
    return installed


def constraint_error(constraint: str) -> str | None:
    """Why a dependsOn constraint does not parse, or None when it does."""
    try:
        constraint_satisfied(constraint, "0.0.0", strict=True)
    except ValueError as exc:
        return str(exc)
    return None


def constraint_satisfied(constraint: str, version: str, *, strict: bool = False) -> bool:
    """`version` meets a dependsOn constraint: "*", "1.2.3", ">=1.2.0", ">=1.2 <2", "^1.2", "~1.2.3".

    Parts separated by spaces or commas must all hold. With `strict`, a malformed constraint raises
    ValueError; otherwise it is simply not satisfied.
    """
    constraint = constraint.strip()
    if constraint in ("", "*"):
        return True
    try:
        parsed = semver.Version.parse(version)
        return all(_match_one(parsed, part) for part in constraint.replace(",", " ").split())
    except ValueError as exc:
        if strict:
            raise ValueError(f"{constraint!r} is not a version constraint like >=1.2.0, ^1.2 or 1.2.3") from exc
        return False


_OPS = (">=", "<=", "==", "!=", ">", "<", "=")


def _match_one(version: semver.Version, part: str) -> bool:
    if part.startswith("^"):
        base = semver.Version.parse(_pad(part[1:]))
        upper = base.bump_major() if base.major else (base.bump_minor() if base.minor else base.bump_patch())
        return bool(base <= version < upper)
    if part.startswith("~"):
        base = semver.Version.parse(_pad(part[1:]))
        return bool(base <= version < base.bump_minor())
    for op in _OPS:
        if part.startswith(op):
            target = semver.Version.parse(_pad(part[len(op):]))
            return bool(version.match(("==" if op == "=" else op) + str(target)))
    return bool(version == semver.Version.parse(_pad(part)))


def _pad(text: str) -> str:
    """'1.2' -> '1.2.0' and '1' -> '1.0.0' (keeping any pre-release): semver needs three parts."""
    match = re.match(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(.*)$", text.strip())
    if not match:
        return text
    major, minor, patch, rest = match.groups()
    return f"{major}.{minor or 0}.{patch or 0}{rest}"
