"""Build the dev cluster's binaries from the Go module proxy, once per machine.

Each component of `versions.toml` is built in a generated wrapper module under the cache directory
and installed into `<cache>/<component>-<version>/bin/`. A stamp file records exactly what was
built; a later run whose stamp matches reuses the binaries without invoking Go at all.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

VERSIONS_FILE = Path(__file__).with_name("versions.toml")
ORDER = ("etcd", "kubernetes", "kwok", "helm", "registry", "kstatus-probe", "prometheus", "cert-manager", "cosign")
# Runs the control plane on another Kubernetes release than the pinned one (`make test-matrix`):
# `NODEGATE_KUBE_VERSION=v1.33.13`. Unset, CI and `nodegate dev up` use versions.toml's pin.
KUBE_VERSION_ENV = "NODEGATE_KUBE_VERSION"
# What an overridden release builds: the control plane and kubectl. The kubelet is left out (only the
# real-node tier runs one, and it stays on the pinned release), which saves a third of the build.
OVERRIDE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")

Progress = Callable[[str], None]


class BuildError(RuntimeError):
    """The binaries could not be built; the message says why and what to do."""


@dataclass(frozen=True)
class Component:
    name: str
    module: str
    version: str
    binaries: dict[str, str]
    replaces: dict[str, str] = field(default_factory=dict)
    ldflags: tuple[str, ...] = ()
    # Files copied from the module's source next to the binaries (name -> path inside the module).
    assets: dict[str, str] = field(default_factory=dict)
    # Go source of NodeGate's own, written into the wrapper module (name -> path beside this file): the
    # command is the wrapper itself, and `module` the library it is built on.
    sources: dict[str, str] = field(default_factory=dict)
    # Go build tags (`go build -tags`): what the command leaves out (Prometheus's service discoveries).
    tags: tuple[str, ...] = ()

    @property
    def fingerprint(self) -> str:
        fields: list[object] = [self.module, self.version, self.binaries, self.replaces, list(self.ldflags),
                                self.assets]
        if self.sources:  # only then: every other component keeps the stamp it was built with
            fields.append({name: hashlib.sha256((VERSIONS_FILE.parent / rel).read_bytes()).hexdigest()
                           for name, rel in self.sources.items()})
        if self.tags:  # likewise
            fields.append({"tags": list(self.tags)})
        blob = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("NODEGATE_CACHE", Path.home() / ".cache" / "nodegate"))


def kube_version_override(environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """(k8s.io/kubernetes version, staging version) asked for by NODEGATE_KUBE_VERSION, or None."""
    raw = environ.get(KUBE_VERSION_ENV, "").strip()
    if not raw:
        return None
    match = re.fullmatch(r"v?1\.(\d+)\.(\d+)", raw)
    if match is None:
        raise BuildError(
            f"{KUBE_VERSION_ENV}={raw!r} is not a Kubernetes release: give one like v1.33.13 "
            "(`go list -m -versions k8s.io/kubernetes` lists what the Go module proxy serves)"
        )
    minor, patch = match.groups()
    return f"v1.{minor}.{patch}", f"v0.{minor}.{patch}"


def load_components(path: Path = VERSIONS_FILE, environ: Mapping[str, str] = os.environ) -> dict[str, Component]:
    data = tomllib.loads(path.read_text())
    k8s = data["kubernetes"]
    gitv, staging_version = k8s["version"], k8s["staging_version"]
    k8s_binaries = dict(k8s["binaries"])
    override = kube_version_override(environ)
    if override is not None and override[0] != gitv:
        # The staging module list is the same from 1.32 to 1.35 (checked against each release's go.mod).
        gitv, staging_version = override
        k8s_binaries = {name: k8s_binaries[name] for name in OVERRIDE_BINARIES}
    major, minor = gitv.lstrip("v").split(".")[:2]
    k8s_ldflags = []
    # Both packages carry version variables: component-base for the servers, client-go for kubectl.
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        k8s_ldflags += [
            f"-X {pkg}.gitVersion={gitv}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.gitCommit=0000000000000000000000000000000000000000",
            f"-X {pkg}.buildDate={k8s['build_date']}",
        ]
    etcd = data["etcd"]
    kwok = data["kwok"]
    helm = data["helm"]
    registry = data["registry"]
    probe = data["kstatus-probe"]
    prom = data["prometheus"]
    certmanager = data["cert-manager"]
    cosign = data["cosign"]
    cosign_version_pkg = "sigs.k8s.io/release-utils/version"
    prom_version_pkg = "github.com/prometheus/common/version"
    return {
        "kubernetes": Component(
            "kubernetes",
            k8s["module"],
            gitv,
            k8s_binaries,
            {f"k8s.io/{m}": staging_version for m in k8s["staging"]},
            tuple(k8s_ldflags),
        ),
        "etcd": Component(
            "etcd",
            etcd["module"],
            etcd["version"],
            dict(etcd["binaries"]),
            {m: etcd["version"] for m in etcd["siblings"]},
            (f"-X go.etcd.io/etcd/api/v3/version.GitSHA=v{etcd['version'].lstrip('v')}",),
        ),
        "kwok": Component(
            "kwok",
            kwok["module"],
            kwok["version"],
            dict(kwok["binaries"]),
            {},
            (f"-X sigs.k8s.io/kwok/pkg/consts.Version={kwok['version'].lstrip('v')}",),
            dict(kwok.get("assets", {})),
        ),
        "helm": Component(
            "helm",
            helm["module"],
            helm["version"],
            dict(helm["binaries"]),
            {},
            (f"-X helm.sh/helm/v3/internal/version.version={helm['version']}",),
        ),
        "registry": Component(
            "registry",
            registry["module"],
            registry["version"],
            dict(registry["binaries"]),
            {},
            (f"-X {registry['module']}/version.version={registry['version']}",),
        ),
        "kstatus-probe": Component(
            "kstatus-probe",
            probe["module"],
            probe["version"],
            dict(probe["binaries"]),
            sources=dict(probe["sources"]),
        ),
        "prometheus": Component(
            "prometheus",
            prom["module"],
            prom["version"],
            dict(prom["binaries"]),
            # `prometheus --version` says the release (3.x), not the Go module's v0.3xx tag.
            ldflags=(f"-X {prom_version_pkg}.Version={prom['release']}",
                     f"-X {prom_version_pkg}.Revision={prom['version']}",
                     f"-X {prom_version_pkg}.Branch=release"),
            tags=tuple(prom["tags"]),
        ),
        "cert-manager": Component(
            "cert-manager",
            certmanager["module"],
            certmanager["version"],
            dict(certmanager["binaries"]),
            # `cert-manager controller` logs the release it runs (util.AppVersion).
            ldflags=(f"-X {certmanager['module']}/pkg/util.AppVersion={certmanager['version']}",),
            assets=dict(certmanager["assets"]),
            sources=dict(certmanager["sources"]),
        ),
        "cosign": Component(
            "cosign",
            cosign["module"],
            cosign["version"],
            dict(cosign["binaries"]),
            # `cosign version` reports the release, like the project's own Makefile stamps it.
            ldflags=(f"-X {cosign_version_pkg}.gitVersion={cosign['version']}",
                     f"-X {cosign_version_pkg}.gitTreeState=clean",
                     f"-X {cosign_version_pkg}.buildDate={cosign['build_date']}"),
        ),
    }


def bin_dir(component: Component) -> Path:
    return cache_root() / f"{component.name}-{component.version}" / "bin"


def _stamp(component: Component) -> Path:
    return bin_dir(component) / ".built"


def is_built(component: Component) -> bool:
    stamp = _stamp(component)
    if not stamp.exists() or stamp.read_text().strip() != component.fingerprint:
        return False
    files = [*component.binaries, *component.assets]
    return all((bin_dir(component) / name).is_file() for name in files)


def binary_paths(names: tuple[str, ...] = ORDER) -> dict[str, Path]:
    """Paths of every binary of the named components (built or not)."""
    comps = load_components()
    return {b: bin_dir(comps[n]) / b for n in names for b in comps[n].binaries}


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "the Go toolchain was not found on PATH. NodeGate builds its local control plane "
            "(etcd, kube-apiserver, kube-controller-manager, kwok, helm, the image registry, Prometheus) from the Go "
            "module proxy once per machine; install Go 1.25 or newer (https://go.dev/dl/) and run this again."
        )
    return go


def _wrapper(component: Component) -> tuple[str, str]:
    lines = [f"module nodegate.local/build/{component.name}", "", "go 1.25.0", ""]
    lines.append(f"require {component.module} {component.version}")
    if component.replaces:
        lines += ["", "replace ("]
        lines += [f"\t{mod} => {mod} {ver}" for mod, ver in sorted(component.replaces.items())]
        lines.append(")")
    gomod = "\n".join(lines) + "\n"
    if component.sources:
        return gomod, ""  # the command's own source imports what it needs
    imports = "\n".join(f'\t_ "{pkg}"' for pkg in sorted(set(component.binaries.values())))
    tools = (
        "//go:build tools\n\n// Keeps the built commands in go.mod for `go mod tidy`.\n"
        f"package tools\n\nimport (\n{imports}\n)\n"
    )
    return gomod, tools


@contextmanager
def _locked(component: Component) -> Iterator[None]:
    """One build of a component at a time on this machine; different components (or releases) build
    side by side, each in its own work directory (Go's module and build caches are safe to share)."""
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / f".build-{component.name}-{component.version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, progress: Progress, label: str,
         total: int = 0) -> None:
    """Run a Go command, teeing output to `log` and reporting compiled packages as progress."""
    started = time.monotonic()
    last_report = started
    compiled = 0
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if not line.startswith(("go: ", "#")):
                compiled += 1
            now = time.monotonic()
            if now - last_report >= 20:
                last_report = now
                done = f"{compiled}/{total}" if total else str(compiled)
                progress(f"  {label}: {done} packages compiled ({int(now - started)}s)")
        code = proc.wait()
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-25:])
        raise BuildError(f"{label} failed (exit {code}); full log: {log}\n{tail}")


def build(component: Component, progress: Progress = print) -> Path:
    """Build one component into its cache directory (no-op when already built)."""
    with _locked(component):
        if is_built(component):
            return bin_dir(component)
        go = _go()
        work = cache_root() / "build" / f"{component.name}-{component.version}"
        work.mkdir(parents=True, exist_ok=True)
        # Taken before the sources are copied: a source edited during the build leaves a stamp that
        # does not match it, so the next run builds again.
        fingerprint = component.fingerprint
        gomod, tools = _wrapper(component)
        (work / "go.mod").write_text(gomod)
        if tools:
            (work / "tools.go").write_text(tools)
        for name, rel in component.sources.items():
            shutil.copyfile(VERSIONS_FILE.parent / rel, work / name)
        log = work / "build.log"
        log.write_text("")
        env = dict(os.environ, CGO_ENABLED="0")
        names = ", ".join(component.binaries)
        progress(f"Building {names} {component.version} from the Go module proxy "
                 f"(once per machine; log: {log})")
        started = time.monotonic()
        _run([go, "mod", "tidy"], work, env, log, progress, f"{component.name}: go mod tidy")
        pkgs = sorted(set(component.binaries.values()))
        tag_args = ["-tags", ",".join(component.tags)] if component.tags else []
        listed = subprocess.run(
            [go, "list", "-deps", *tag_args, "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", *pkgs],
            cwd=work, env=env, capture_output=True, text=True,
        )
        total = len([ln for ln in listed.stdout.splitlines() if ln.strip()]) if listed.returncode == 0 else 0
        staging = work / "out"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        ldflags = " ".join(["-s", "-w", *component.ldflags])
        # A command of NodeGate's own carries no paths of this machine (its panics name module paths).
        trim = ["-trimpath"] if component.sources else []
        for binary, pkg in component.binaries.items():
            _run(
                [go, "build", "-v", *trim, *tag_args, "-ldflags", ldflags, "-o", str(staging / binary), pkg],
                work, env, log, progress, f"{component.name}: {binary}", total,
            )
        if component.assets:
            listed = subprocess.run([go, "mod", "download", "-json", f"{component.module}@{component.version}"],
                                    cwd=work, env=env, capture_output=True, text=True, check=False)
            if listed.returncode != 0:
                raise BuildError(f"{component.name}: could not locate the module source: {listed.stderr}")
            source = Path(json.loads(listed.stdout)["Dir"])
            for name, rel in component.assets.items():
                shutil.copyfile(source / rel, staging / name)
        target = bin_dir(component)
        target.mkdir(parents=True, exist_ok=True)
        for name in [*component.binaries, *component.assets]:
            os.replace(staging / name, target / name)
        _stamp(component).write_text(fingerprint + "\n")
        progress(f"Built {names} in {time.monotonic() - started:.0f}s -> {target}")
        return target


def ensure_built(names: tuple[str, ...] = ORDER, progress: Progress = print) -> dict[str, Path]:
    """Build whatever of `names` is missing and return every binary's path."""
    comps = load_components()
    missing = [comps[n] for n in names if not is_built(comps[n])]
    if missing:
        progress(
            "NodeGate's local control plane is built from source once per machine and cached in "
            f"{cache_root()}: {', '.join(f'{c.name} {c.version}' for c in missing)}. "
            "A cold build takes about 5 to 10 minutes on two cores (module downloads included); "
            "later runs start in seconds."
        )
        for component in missing:
            build(component, progress)
    return binary_paths(names)


def link_tools(paths: dict[str, Path], directory: Path) -> None:
    """Symlink kubectl and helm into `directory` (the venv's bin), so the README's commands work."""
    directory.mkdir(parents=True, exist_ok=True)
    for tool in ("kubectl", "helm"):
        link = directory / tool
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(paths[tool])


def main() -> None:  # pragma: no cover - `python -m gate.devcluster.build [--link DIR]`
    try:
        paths = ensure_built(progress=lambda m: print(m, file=sys.stderr, flush=True))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    if len(sys.argv) == 3 and sys.argv[1] == "--link":
        link_tools(paths, Path(sys.argv[2]))
    for name, path in paths.items():
        print(f"{name}\t{path}")


if __name__ == "__main__":  # pragma: no cover
    main()
