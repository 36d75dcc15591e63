"""A gate's config for a package, held against the keys the package declares in package.yaml.

The gate's `config` is a map of key -> text (a ConfigMap); the package says which keys it takes, of
which type, which are required and what the others default to (`config.keys` in package.yaml). The
agent checks the given config here before any step runs, and the steps read the *effective* config:
the given keys plus the defaults of the declared keys the gate left out, typed keys written in one
normal spelling (`true`, `4`, `h100`) so a script compares strings, never re-parses.

The declaration is the rule: a package without a `config:` section accepts no config at all, and one
with it accepts only the keys it declares. A gate's config is data for the package's scripts; a key
the package does not expect is a file nobody checked, dropped where a script (or an interpreter the
gate's env points at) might read it.
"""

from __future__ import annotations

from collections.abc import Mapping

from gate.agent.errors import ConfigMismatch, PackageError
from gate.agent.package import PackageManifest
from gate.agent.values import ConfigSpec, parse_config_value, render_config_value
from gate.api.digests import config_digest

ConfigValue = str | int | bool


def _text(name: str, data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ValueError(f"config key {name!r}: not UTF-8 text") from None


def _declared_names(spec: ConfigSpec) -> str:
    return ", ".join(spec.keys) or "none"


def check_config(manifest: PackageManifest, given: Mapping[str, bytes]) -> tuple[dict[str, ConfigValue], list[str]]:
    """The typed effective config and every problem with `given`, each naming its key and why."""
    spec = manifest.config
    if spec is None:
        return {}, [f"config key {name!r} is not accepted: package {manifest.name} declares no config "
                    "(package.yaml has no config section)" for name in sorted(given)]
    values, problems = {}, []
    for name, data in sorted(given.items()):
        key = spec.declaration(name)
        if key is None:
            problems.append(f"config key {name!r} is not declared by package {manifest.name} "
                            f"(declared: {_declared_names(spec)})")
            continue
        try:
            values[name] = parse_config_value(key, _text(name, data))
        except ValueError as exc:
            problems.append(str(exc) if str(exc).startswith("config key") else f"config key {name!r}: {exc}")
    for name, key in spec.keys.items():
        if name in given:
            continue
        if key.required:
            why = f" ({key.description.strip()})" if key.description.strip() else ""
            problems.append(f"config key {name!r} is required by package {manifest.name}{why}")
        elif key.default is not None:
            values[name] = key.default
    return dict(sorted(values.items())), problems


def check_digest(given: Mapping[str, bytes], expected: str | None, where: str) -> None:
    """Refuse config that is not what the operator rendered for this stage: `expected` is the digest it
    put into the pod's spec (`gate.api.digests`), None when the agent runs by hand (nothing to hold it
    against). Raised before anything touches the host; names both digests and the keys found."""
    if expected is None:
        return
    found = config_digest(given)
    if found != expected:
        keys = ", ".join(sorted(given)) or "none"
        raise ConfigMismatch(
            f"the config in {where} has digest {found} (keys: {keys}), but the operator started this stage "
            f"with config digest {expected}: the package's ConfigMap was changed, replaced or created by "
            "someone else; nothing was run and the host is unchanged")


def config_problems(manifest: PackageManifest, given: Mapping[str, bytes]) -> list[str]:
    return check_config(manifest, given)[1]


def typed_config(manifest: PackageManifest, given: Mapping[str, bytes]) -> dict[str, ConfigValue]:
    """The effective config with typed values; PackageError lists every problem."""
    values, problems = check_config(manifest, given)
    if problems:
        raise PackageError("; ".join(problems))
    return values


def render(
    manifest: PackageManifest, values: Mapping[str, ConfigValue], given: Mapping[str, bytes]
) -> dict[str, bytes]:
    """Files for $NODEGATE_CONFIG_DIR: string keys exactly as given, typed keys and defaults normalised."""
    out: dict[str, bytes] = {}
    for name, value in values.items():
        key = manifest.config.declaration(name) if manifest.config is not None else None
        if name in given and (key is None or key.type == "string"):
            out[name] = given[name]
        else:
            out[name] = render_config_value(value).encode()
    return out


def effective_config(manifest: PackageManifest, given: Mapping[str, bytes]) -> dict[str, bytes]:
    """What the steps find in $NODEGATE_CONFIG_DIR; PackageError (naming each key) when `given` is wrong."""
    return render(manifest, typed_config(manifest, given), given)


def lenient_config(manifest: PackageManifest, given: Mapping[str, bytes]) -> tuple[dict[str, bytes], list[str]]:
    """For uninstall: the keys that pass the declarations, plus the defaults, and the problems to warn about.

    A node must be able to leave a gate whose config went wrong, so nothing here refuses; but what
    breaks the declarations (an undeclared key, a value against its rule) is left out rather than
    written to the host: undeclared input never reaches a step, at uninstall either."""
    values, problems = check_config(manifest, given)
    valid = {name: data for name, data in given.items() if name in values}
    for name, key in (manifest.config.keys.items() if manifest.config is not None else ()):
        if name not in values and key.default is not None:
            values[name] = key.default  # given against its rule: the default stands in, as if left out
    return dict(sorted(render(manifest, values, valid).items())), problems


def parse_assignments(text: str) -> dict[str, bytes]:
    """`key=value,key=value` (as `--config` takes it) as config; ValueError names a malformed part."""
    out: dict[str, bytes] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{part!r} is not key=value")
        out[name.strip()] = value.strip().encode()
    return out
