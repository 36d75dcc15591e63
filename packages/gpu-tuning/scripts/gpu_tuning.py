#!/usr/bin/env python3
"""gpu-tuning's profile assembler: layers of data merged into one host profile.

The layers are JSON files next to this script (`../layers`), merged in a fixed order:

    base -> accelerator/<accelerator> -> intent/<intent> -> os/<os> -> cloud/<cloud>

Each layer names its sources; each setting names which of them it comes from. A later layer
overrides an earlier one's setting of the same id, and `"value": null` removes it. The OS layer
also says what the platform can take (`platform.applies`): on Container-Optimized OS only sysctls
and containerd limits are applied, and everything else is left out, with the reason.

Setting ids: `kernelArg/<id>` (value: the argument), `sysctl/<key>`, `cpu/governor`,
`cpu/max_cstate`, `service/<unit>` (enabled | disabled), `limit/<unit>/<LimitX>`.

Standard library only: the script runs in the agent's container (`onHost: false`), in unit tests
(imported), and behind `nodegate package explain` on a laptop.

    gpu_tuning.py assemble --root ROOT --config-dir DIR --out DIR   (the stage step)
    gpu_tuning.py explain                                           (nodegate package explain)
    gpu_tuning.py golden [--write]                                  (the golden files)
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LAYERS = HERE.parent / "layers"
GOLDEN = HERE.parent / "golden"
CATEGORIES = ("kernelArg", "sysctl", "cpu", "service", "limit")
CPU_SETTINGS = ("governor", "max_cstate")
SERVICE_STATES = ("enabled", "disabled")
NO_CLOUD = "none"
OS_RELEASE_PATHS = ("etc/os-release", "usr/lib/os-release")
_SYSCTL_KEY = re.compile(r"^[a-z0-9_]+(\.[a-zA-Z0-9_-]+)+$")
_UNIT = re.compile(r"^[A-Za-z0-9@._-]+\.service$")
_LIMIT = re.compile(r"^Limit[A-Z]+$")
_SAFE_VALUE = re.compile(r"^[^\n\"'`$\\]*$")


class ProfileError(Exception):
    """A combination, a config value or a layer file that cannot make a profile."""


@dataclass(frozen=True)
class Source:
    key: str
    title: str
    url: str


@dataclass(frozen=True)
class Setting:
    id: str
    value: str
    layer: str
    source: Source
    note: str = ""

    @property
    def category(self) -> str:
        return self.id.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.id.split("/", 1)[1]


@dataclass
class Layer:
    name: str
    summary: str
    sources: dict[str, Source]
    settings: dict[str, dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    include: str | None = None
    platform: dict[str, Any] = field(default_factory=dict)
    match: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Profile:
    accelerator: str
    intent: str
    os: str | None
    cloud: str | None
    layers: list[str]
    settings: list[Setting]
    left_out: list[tuple[Setting, str]]
    notes: list[str]
    bootloader: str

    def rows(self) -> list[list[str]]:
        """setting, value, layer, source: what the stage log, explain and the golden files show."""
        return [[s.id, s.value, s.layer, _cite(s.source)] for s in self.settings]

    def header(self) -> str:
        os_name = self.os or "(not given: no OS layer)"
        return (f"gpu-tuning profile: accelerator={self.accelerator} intent={self.intent} os={os_name} "
                f"cloud={self.cloud or NO_CLOUD}\nlayers: {' -> '.join(self.layers)}")

    def render(self) -> str:
        """The profile as plain text: the stage log and the golden files."""
        lines = [self.header(), ""]
        lines += _table(["setting", "value", "layer", "source"], self.rows())
        if self.left_out:
            lines.append("")
            lines.append("left out:")
            lines += [f"  {s.id} = {s.value} ({s.layer}): {why}" for s, why in self.left_out]
        if self.notes:
            lines.append("")
            lines.append("notes:")
            lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


def _cite(source: Source) -> str:
    """The table's source column: the layer's short name for it and where to read it (the layer file
    and profile.json carry the full title: what exactly the source says)."""
    return f"{source.key} <{source.url}>" if source.url else source.key


def _table(columns: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns[:-1])]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths, strict=True)) + "  " + cells[-1]

    return [line(columns), line(["-" * w for w in widths] + ["-" * len(columns[-1])])] + [line(r) for r in rows]


# --- layers ----------------------------------------------------------------------------------------


def _check_setting(layer: str, sid: str, value: Any) -> None:
    category, sep, name = sid.partition("/")
    where = f"layer {layer}: setting {sid!r}"
    if not sep or category not in CATEGORIES:
        raise ProfileError(f"{where}: the id must start with one of {', '.join(c + '/' for c in CATEGORIES)}")
    if value is None:
        return
    if not isinstance(value, str) or not _SAFE_VALUE.match(value):
        raise ProfileError(f"{where}: the value must be a string without quotes, $, ` or \\ (got {value!r})")
    if category == "sysctl" and not _SYSCTL_KEY.match(name):
        raise ProfileError(f"{where}: {name!r} is not a sysctl key")
    if category == "cpu" and name not in CPU_SETTINGS:
        raise ProfileError(f"{where}: cpu settings are {', '.join(CPU_SETTINGS)}")
    if category == "cpu" and name == "max_cstate" and not value.isdigit():
        raise ProfileError(f"{where}: max_cstate is a cpuidle state index, got {value!r}")
    if category == "service" and (not _UNIT.match(name) or value not in SERVICE_STATES):
        raise ProfileError(f"{where}: a service is a systemd .service unit, enabled or disabled")
    if category == "limit":
        unit, _, limit = name.partition("/")
        if not _UNIT.match(unit) or not _LIMIT.match(limit):
            raise ProfileError(f"{where}: a limit is limit/<unit>.service/Limit<NAME>")
    if category == "kernelArg" and (not value or any(ch.isspace() for ch in value)):
        raise ProfileError(f"{where}: a kernel argument is one word")


def load_layer(name: str, layers: Path = LAYERS) -> Layer:
    path = layers / f"{name}.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"no layer {name} ({path})") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"layer {name}: not valid JSON: {exc}") from None
    sources = {key: Source(key, src["title"], src.get("url", "")) for key, src in data.get("sources", {}).items()}
    if not sources:
        raise ProfileError(f"layer {name}: names no source (every layer says where its settings come from)")
    settings = data.get("settings", {})
    for sid, spec in settings.items():
        _check_setting(name, sid, spec.get("value"))
        source = spec.get("source")
        if source is None and len(sources) > 1:
            raise ProfileError(f"layer {name}: setting {sid!r} must name one of its sources: {', '.join(sources)}")
        if source is not None and source not in sources:
            raise ProfileError(f"layer {name}: setting {sid!r} names source {source!r}, "
                               f"not one of {', '.join(sources)}")
    return Layer(name=name, summary=data.get("summary", ""), sources=sources, settings=settings,
                 notes=list(data.get("notes", [])), include=data.get("include"),
                 platform=data.get("platform", {}), match=data.get("match", {}))


def choices(kind: str, layers: Path = LAYERS) -> list[str]:
    """The accelerators, intents, OSes or clouds there are layers for."""
    return sorted(p.stem for p in (layers / kind).glob("*.json"))


def supported_pairs(layers: Path = LAYERS) -> dict[str, list[str]]:
    """cloud ("none" for none) -> the OSes supported under it."""
    data = json.loads((layers / "supported.json").read_text())
    clouds: dict[str, list[str]] = data["clouds"]
    return clouds


def combinations(layers: Path = LAYERS) -> list[tuple[str, str, str, str | None]]:
    """Every supported (accelerator, intent, os, cloud): the table the tests and golden files cover."""
    out = []
    for accelerator in choices("accelerator", layers):
        for intent in choices("intent", layers):
            for cloud, oses in sorted(supported_pairs(layers).items()):
                for os_name in sorted(oses):
                    out.append((accelerator, intent, os_name, None if cloud == NO_CLOUD else cloud))
    return out


def _supported_text(layers: Path) -> str:
    pairs = supported_pairs(layers)
    return "; ".join(f"cloud {cloud}: os {', '.join(oses)}" for cloud, oses in sorted(pairs.items()))


# --- the OS ----------------------------------------------------------------------------------------


def parse_os_release(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            out[key] = value.strip().strip("\"'")
    return out


def read_os_release(root: Path) -> dict[str, str]:
    for rel in OS_RELEASE_PATHS:
        path = root / rel
        if path.is_file():
            return parse_os_release(path.read_text(errors="replace"))
    raise ProfileError(f"cannot tell the OS: neither /{OS_RELEASE_PATHS[0]} nor /{OS_RELEASE_PATHS[1]} "
                       "exists on the host")


def detect_os(os_release: dict[str, str], layers: Path = LAYERS) -> str:
    """The OS layer for an os-release: ID first, then ID_LIKE, as the layers' `match` lists them."""
    os_id = os_release.get("ID", "")
    like = os_release.get("ID_LIKE", "").split()
    candidates = {name: load_layer(f"os/{name}", layers).match for name in choices("os", layers)}
    for name, match in candidates.items():
        if os_id in match.get("ids", []):
            return name
    for item in like:  # ID_LIKE lists the closest relative first
        for name, match in candidates.items():
            if item in match.get("idLike", []):
                return name
    pretty = os_release.get("PRETTY_NAME") or os_id or "an OS without ID"
    raise ProfileError(f"the host runs {pretty} (ID={os_id or '?'}, ID_LIKE={' '.join(like) or '?'}), which "
                       f"gpu-tuning has no OS layer for; supported: {_supported_text(layers)}")


# --- assembly --------------------------------------------------------------------------------------


def _chain(name: str, layers: Path, seen: tuple[str, ...] = ()) -> list[Layer]:
    if name in seen:
        raise ProfileError(f"layer {name} includes itself through {' -> '.join(seen)}")
    layer = load_layer(name, layers)
    before = _chain(layer.include, layers, (*seen, name)) if layer.include else []
    return [*before, layer]


def _pick(kind: str, value: str | None, layers: Path) -> str:
    options = choices(kind, layers)
    if value not in options:
        raise ProfileError(f"config key {kind!r}: {value!r} is not one of {', '.join(options)}")
    return value


def assemble(accelerator: str, intent: str, os_name: str | None, cloud: str | None = None,
             exclude: list[str] | None = None, layers: Path = LAYERS) -> Profile:
    """Merge the layers for one combination into a profile; ProfileError names what is wrong."""
    accelerator = _pick("accelerator", accelerator, layers)
    intent = _pick("intent", intent, layers)
    if cloud is not None:
        cloud = _pick("cloud", cloud, layers)
    if os_name is not None:
        os_name = _pick("os", os_name, layers)
        supported = supported_pairs(layers)
        if os_name not in supported.get(cloud or NO_CLOUD, []):
            raise ProfileError(f"os {os_name} with cloud {cloud or NO_CLOUD} is not supported; supported: "
                               f"{_supported_text(layers)}")
    chain = [load_layer("base", layers), *_chain(f"accelerator/{accelerator}", layers),
             load_layer(f"intent/{intent}", layers)]
    os_layer = load_layer(f"os/{os_name}", layers) if os_name is not None else None
    if os_layer is not None:
        chain.append(os_layer)
    if cloud is not None:
        chain.append(load_layer(f"cloud/{cloud}", layers))

    merged: dict[str, Setting] = {}
    notes: list[str] = []
    for layer in chain:
        for sid, spec in layer.settings.items():
            source = layer.sources[spec.get("source") or next(iter(layer.sources))]
            if spec.get("value") is None:
                if sid in merged:
                    notes.append(f"{layer.name} removes {sid} (set by {merged.pop(sid).layer})")
                continue
            merged[sid] = Setting(sid, spec["value"], layer.name, source, spec.get("note", ""))
        notes += [f"{layer.name}: {note}" for note in layer.notes]

    platform = os_layer.platform if os_layer is not None else {}
    applies = platform.get("applies", list(CATEGORIES))
    left_out: list[tuple[Setting, str]] = []
    for sid in list(merged):
        setting = merged[sid]
        if setting.category not in applies:
            left_out.append((merged.pop(sid), f"{os_name} takes only {', '.join(applies)} settings"))
    for pattern in exclude or []:
        hits = [sid for sid in merged if fnmatch.fnmatchcase(sid, pattern)]
        if not hits:
            raise ProfileError(f"config key 'exclude': {pattern!r} matches no setting of this profile; "
                               f"settings: {', '.join(sorted(merged))}")
        for sid in hits:
            left_out.append((merged.pop(sid), f"excluded by config ({pattern})"))

    # Kernel arguments keep the layers' order (hugepagesz= must come before its hugepages=); the rest
    # is sorted by id, so a profile reads the same whatever order the layers list them in.
    order = {c: i for i, c in enumerate(CATEGORIES)}
    position = {sid: i for i, sid in enumerate(merged)}
    settings = sorted(merged.values(),
                      key=lambda s: (order[s.category], position[s.id] if s.category == "kernelArg" else 0, s.id))
    return Profile(accelerator=accelerator, intent=intent, os=os_name, cloud=cloud,
                   layers=[layer.name for layer in chain], settings=settings,
                   left_out=sorted(left_out, key=lambda item: item[0].id), notes=notes,
                   bootloader=platform.get("bootloader", "none" if os_name else "unknown"))


# --- config ----------------------------------------------------------------------------------------


def split_exclude(text: str) -> list[str]:
    return [item for item in re.split(r"[\s,]+", text.strip()) if item]


def profile_from_config(config: dict[str, str], os_release: dict[str, str] | None,
                        layers: Path = LAYERS) -> Profile:
    """The profile for the gate's config and the host's os-release (None: no OS layer, for explain)."""
    missing = [key for key in ("accelerator", "intent") if not config.get(key, "").strip()]
    if missing:
        raise ProfileError(f"config key {missing[0]!r} is required: one of {', '.join(choices(missing[0], layers))}")
    cloud = config.get("cloud", "").strip() or None
    if cloud == NO_CLOUD:
        cloud = None
    os_name = detect_os(os_release, layers) if os_release is not None else None
    return assemble(config["accelerator"].strip(), config["intent"].strip(), os_name, cloud,
                    split_exclude(config.get("exclude", "")), layers)


def read_config(config_dir: Path | None) -> dict[str, str]:
    if config_dir is None or not config_dir.is_dir():
        return {}
    return {p.name: p.read_text().strip() for p in config_dir.iterdir() if p.is_file() and not p.name.startswith(".")}


# --- what the host scripts read --------------------------------------------------------------------


def host_files(profile: Profile) -> dict[str, str]:
    """The profile as line files for the shell steps on the host (no JSON parser needed there)."""
    by = {c: [s for s in profile.settings if s.category == c] for c in CATEGORIES}
    return {
        "profile.txt": profile.render(),
        "profile.json": json.dumps(profile_json(profile), indent=2, sort_keys=True) + "\n",
        "bootloader": profile.bootloader + "\n",
        "kernel-args": "".join(f"{s.value}\n" for s in by["kernelArg"]),
        "sysctl.conf": "".join(f"{s.name} = {s.value}\n" for s in by["sysctl"]),
        "cpu": "".join(f"{s.name} {s.value}\n" for s in by["cpu"]),
        "services": "".join(f"{s.name} {s.value}\n" for s in by["service"]),
        "limits": "".join(f"{s.name.replace('/', ' ')} {s.value}\n" for s in by["limit"]),
    }


def profile_json(profile: Profile) -> dict[str, Any]:
    return {
        "accelerator": profile.accelerator, "intent": profile.intent, "os": profile.os, "cloud": profile.cloud,
        "layers": profile.layers, "bootloader": profile.bootloader,
        "settings": [asdict(s) for s in profile.settings],
        "leftOut": [{**asdict(s), "reason": why} for s, why in profile.left_out],
        "notes": profile.notes,
    }


def write_host_files(profile: Profile, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in host_files(profile).items():
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


# --- golden files ----------------------------------------------------------------------------------


def golden_name(accelerator: str, intent: str, os_name: str, cloud: str | None) -> str:
    return f"{accelerator}-{intent}-{os_name}-{cloud or NO_CLOUD}.txt"


def golden_texts(layers: Path = LAYERS) -> dict[str, str]:
    return {golden_name(*combo): assemble(*combo, layers=layers).render() for combo in combinations(layers)}


def stale_golden(golden: Path | None = None, layers: Path = LAYERS) -> list[str]:
    """Golden files that differ from what the layers assemble now, are missing, or are left over."""
    golden = GOLDEN if golden is None else golden
    want = golden_texts(layers)
    have = {p.name for p in golden.glob("*.txt")} if golden.is_dir() else set()
    stale = [name for name, text in want.items()
             if name not in have or (golden / name).read_text() != text]
    return sorted(stale + sorted(have - set(want)))


def write_golden(golden: Path | None = None, layers: Path = LAYERS) -> int:
    golden = GOLDEN if golden is None else golden
    want = golden_texts(layers)
    golden.mkdir(parents=True, exist_ok=True)
    for old in golden.glob("*.txt"):
        if old.name not in want:
            old.unlink()
    for name, text in want.items():
        (golden / name).write_text(text)
    return len(want)


# --- commands --------------------------------------------------------------------------------------


def cmd_assemble(args: argparse.Namespace) -> int:
    root = Path(args.root)
    config = read_config(Path(args.config_dir) if args.config_dir else None)
    profile = profile_from_config(config, read_os_release(root))
    write_host_files(profile, Path(args.out))
    sys.stdout.write(profile.render())
    return 0


def cmd_explain(_: argparse.Namespace) -> int:
    """`nodegate package explain`: config in NODEGATE_EXPLAIN_CONFIG (JSON), an os-release text in
    NODEGATE_EXPLAIN_OS_RELEASE (absent: no OS layer). Prints the table as JSON on stdout."""
    config = json.loads(os.environ.get("NODEGATE_EXPLAIN_CONFIG") or "{}")
    os_text = os.environ.get("NODEGATE_EXPLAIN_OS_RELEASE")
    profile = profile_from_config(config, parse_os_release(os_text) if os_text is not None else None)
    notes = [f"left out: {s.id} = {s.value} ({s.layer}): {why}" for s, why in profile.left_out] + profile.notes
    if profile.os is None:
        notes.append("no --os given: the OS layer is left out (a node's /etc/os-release picks it); "
                     f"OSes: {', '.join(choices('os'))}")
    print(json.dumps({"title": profile.header(), "columns": ["setting", "value", "layer", "source"],
                      "rows": profile.rows(), "notes": notes}))
    return 0


def cmd_golden(args: argparse.Namespace) -> int:
    if args.write:
        print(f"wrote {write_golden()} golden profiles to {GOLDEN}")
        return 0
    stale = stale_golden()
    if stale:
        print(f"stale golden profiles in {GOLDEN}: {', '.join(stale[:10])}"
              f"{' ...' if len(stale) > 10 else ''}; run `{Path(__file__).name} golden --write`")
        return 1
    print(f"{len(combinations())} golden profiles are current")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_tuning.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("assemble", help="assemble the host's profile and write the files the host steps read")
    run.add_argument("--root", default=os.environ.get("NODEGATE_ROOT", "/"))
    run.add_argument("--config-dir", default=os.environ.get("NODEGATE_CONFIG_DIR"))
    run.add_argument("--out", default=str(Path(os.environ.get("NODEGATE_STATE_DIR", ".")) / "profile"))
    run.set_defaults(func=cmd_assemble)
    sub.add_parser("explain", help="print the profile as JSON for `nodegate package explain`").set_defaults(
        func=cmd_explain)
    golden = sub.add_parser("golden", help="check (or --write) the golden profiles")
    golden.add_argument("--write", action="store_true")
    golden.set_defaults(func=cmd_golden)
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("NODEGATE_STAGE") == "upgrade" and len(argv) > 2:
        argv = argv[2:]  # upgrade steps get the previous and the new version first
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
        return result
    except ProfileError as exc:
        print(f"gpu-tuning: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
