"""What a package still needs on a node: the difference between the spec and what is installed.

Level-triggered: nothing here remembers which stage ran last; the remaining work is recomputed from
the spec and the `installed` record every time, and the record is updated after each stage succeeds.

| installed vs spec                     | stages                          | interrupt asked for                   |
|---------------------------------------|---------------------------------|---------------------------------------|
| uninstall.apply, installed            | uninstall                       | uninstall.interrupt (else interrupt)  |
| not installed                         | apply (+ config if any)         | interrupt + configInterrupts of keys  |
| older version                         | upgrade (+ config if changed)   | interrupt + configInterrupts changed  |
| newer version (downgrade)             | uninstall, apply (+ config)     | as apply, and uninstall's if it runs  |
| image, env, resources changed         | apply (+ config if changed)     | interrupt + configInterrupts changed  |
| only config changed                   | config                          | configInterrupts of the changed keys  |
"""

from __future__ import annotations

from dataclasses import dataclass

import semver

from gate.api.nodegate import Interrupt, Package
from gate.api.state import Installed, Stage, config_hashes, spec_hash
from gate.api.versions import parse_constraint, parse_version, satisfies
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
        return PackageWork(name, ("uninstall",), package.uninstall_interrupt()) if installed else PackageWork(
            name, (), none)
    changed = changed_keys(package, installed)
    config_stage: tuple[Stage, ...] = ("config",) if package.config and changed else ()
    on_config = config_interrupts(package.config_interrupts, changed)
    if installed is None:
        return PackageWork(name, ("apply", *config_stage), merge([package.interrupt, *on_config]), changed)
    if installed.version != package.version:
        main: tuple[Stage, ...]
        asked = [package.interrupt, *on_config]
        if _newer(package.version, installed.version):
            main = ("upgrade",)
        elif package.uninstall.enabled:
            main = ("uninstall", "apply")
            asked.append(package.uninstall_interrupt())
        else:
            main = ("apply",)
        return PackageWork(name, (*main, *config_stage), merge(asked), changed, previous_version=installed.version)
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
    """Why a dependsOn constraint does not parse, or None when it does (admission's reading)."""
    parsed = parse_constraint(constraint)
    return parsed if isinstance(parsed, str) else None


def constraint_satisfied(constraint: str, version: str) -> bool:
    """`version` meets a dependsOn constraint, read exactly as admission reads it (gate.api.versions);
    a constraint or version that does not parse is not satisfied."""
    parsed = parse_constraint(constraint)
    ver = parse_version(version)
    if isinstance(parsed, str) or isinstance(ver, str):
        return False
    return satisfies(ver, parsed)
