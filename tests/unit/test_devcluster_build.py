"""The control plane's build recipe: the wrapper module, the pinned staging modules, a missing Go."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gate.devcluster.build import BuildError, _go, _wrapper, load_components


def test_the_wrapper_pins_kubernetes_and_every_staging_module_to_its_published_version() -> None:
    k8s = load_components()["kubernetes"]
    gomod, tools = _wrapper(k8s)
    assert f"require k8s.io/kubernetes {k8s.version}" in gomod
    replaced = dict(re.findall(r"^\t(k8s\.io/\S+) => \1 (v\S+)$", gomod, flags=re.M))
    assert replaced and set(replaced) == set(k8s.replaces)
    assert set(replaced.values()) == {"v0." + k8s.version.split(".", 1)[1]}  # v1.35.x -> v0.35.x
    for package in k8s.binaries.values():
        assert f'_ "{package}"' in tools
    assert any(f.startswith("-X k8s.io/component-base/version.gitVersion=") for f in k8s.ldflags)


def test_every_staging_module_kubernetes_replaces_is_replaced_by_the_wrapper(tmp_path: Path) -> None:
    # k8s.io/kubernetes's go.mod points each staging module at ./staging; those replaces do not apply
    # to a module that requires it, so the wrapper must name every one of them (here: from the proxy,
    # or the module cache once the binaries were built).
    k8s = load_components()["kubernetes"]
    go = shutil.which("go")
    assert go is not None, "the tests need Go (the control plane is built with it)"
    out = subprocess.run([go, "mod", "download", "-json", f"{k8s.module}@{k8s.version}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    upstream = Path(json.loads(out)["GoMod"]).read_text()
    staging = set(re.findall(r"^\s*(k8s\.io/\S+) => \./staging/", upstream, flags=re.M))
    assert len(staging) > 20 and staging == set(k8s.replaces)


def test_a_missing_go_toolchain_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildError, match="Go toolchain was not found on PATH"):
        _go()


def test_kube_version_override_builds_the_control_plane_of_another_release_into_its_own_directory() -> None:
    from gate.devcluster.build import OVERRIDE_BINARIES, bin_dir

    pinned = load_components(environ={})["kubernetes"]
    other = load_components(environ={"NODEGATE_KUBE_VERSION": "v1.33.13"})["kubernetes"]
    assert other.version == "v1.33.13" and set(other.replaces.values()) == {"v0.33.13"}
    assert set(other.replaces) == set(pinned.replaces)
    assert tuple(other.binaries) == OVERRIDE_BINARIES and "kubelet" in pinned.binaries
    assert "-X k8s.io/component-base/version.gitVersion=v1.33.13" in other.ldflags
    assert "-X k8s.io/component-base/version.gitMinor=33" in other.ldflags
    assert bin_dir(other) != bin_dir(pinned) and other.fingerprint != pinned.fingerprint
    # The pinned release asked for by name is the pinned build, kubelet and all.
    assert load_components(environ={"NODEGATE_KUBE_VERSION": pinned.version})["kubernetes"] == pinned


@pytest.mark.parametrize("value", ["1.33", "v2.0.0", "latest", "v1.33.13-rc.0"])
def test_a_kube_version_override_that_is_no_release_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(BuildError, match=r"NODEGATE_KUBE_VERSION=.*v1\.33\.13"):
        load_components(environ={"NODEGATE_KUBE_VERSION": value})


def test_the_kstatus_probe_is_built_from_its_own_source_on_cli_utils() -> None:
    probe = load_components()["kstatus-probe"]
    gomod, tools = _wrapper(probe)
    assert f"require sigs.k8s.io/cli-utils {probe.version}" in gomod
    assert tools == ""  # main.go is the command; a tools.go beside it would be a second package
    source = Path(__file__).resolve().parents[2] / "gate" / "devcluster" / probe.sources["main.go"]
    assert '"sigs.k8s.io/cli-utils/pkg/kstatus/status"' in source.read_text()


def test_a_component_without_own_sources_keeps_the_fingerprint_its_binaries_were_stamped_with() -> None:
    # The cache is shared by every checkout on the machine: a fingerprint that changed shape would
    # make each of them rebuild (and re-stamp) every component in turn.
    import hashlib

    for name, comp in load_components(environ={}).items():
        if comp.sources or comp.tags:  # these stamps name their sources or tags as well
            continue
        blob = json.dumps([comp.module, comp.version, comp.binaries, comp.replaces, list(comp.ldflags), comp.assets],
                          sort_keys=True)
        assert comp.fingerprint == hashlib.sha256(blob.encode()).hexdigest()[:16], name


def test_prometheus_is_built_without_service_discoveries_and_stamped_with_its_release() -> None:
    prom = load_components(environ={})["prometheus"]
    gomod, tools = _wrapper(prom)
    assert f"require github.com/prometheus/prometheus {prom.version}" in gomod
    assert '_ "github.com/prometheus/prometheus/cmd/prometheus"' in tools
    assert prom.tags == ("remove_all_sd",)  # and no builtinassets: the web UI needs npm
    assert "-X github.com/prometheus/common/version.Version=3.16.0" in prom.ldflags
    # The tags are part of what the stamp records: built with other tags, it is built again.
    from dataclasses import replace

    assert replace(prom, tags=()).fingerprint != prom.fingerprint


def test_cert_manager_is_built_from_its_own_source_on_the_main_module_without_cloud_issuers() -> None:
    cm = load_components(environ={})["cert-manager"]
    gomod, tools = _wrapper(cm)
    assert f"require github.com/cert-manager/cert-manager {cm.version}" in gomod
    assert tools == ""
    assert f"-X github.com/cert-manager/cert-manager/pkg/util.AppVersion={cm.version}" in cm.ldflags
    # every CRD of the release, from the module's deploy/crds/, installed next to the binary
    assert sorted(cm.assets.values()) == sorted(f"deploy/crds/{name}" for name in cm.assets)
    assert {"cert-manager.io_certificates.yaml", "cert-manager.io_issuers.yaml"} <= set(cm.assets)
    source = (Path(__file__).resolve().parents[2] / "gate" / "devcluster" / cm.sources["main.go"]).read_text()
    imports = source.split("import (", 1)[1].split(")", 1)[0]
    assert '"github.com/cert-manager/cert-manager/pkg/controller/cainjector"' in imports
    assert '_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"' in imports
    # cmd/controller's own module is not servable; and no ACME, Vault or Venafi (cloud SDKs) is linked
    for unwanted in ("cert-manager/controller-binary", "/acme", "/vault", "/venafi", "/internal/"):
        assert unwanted not in imports, unwanted


def test_a_source_edited_during_a_build_leaves_a_stamp_that_builds_again(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from gate.devcluster import build

    source = tmp_path / "main.go"
    source.write_text("package main\n")
    comp = replace(load_components(environ={})["kstatus-probe"], sources={"main.go": str(source)})
    monkeypatch.setenv("NODEGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_go", lambda: "go")

    def fake_run(cmd: list[str], cwd: Path, *args: object, **kw: object) -> None:
        if "build" in cmd:
            source.write_text("package main // edited while building\n")
            Path(cmd[cmd.index("-o") + 1]).write_text("binary")

    monkeypatch.setattr(build, "_run", fake_run)
    monkeypatch.setattr(build.subprocess, "run", lambda *a, **k: build.subprocess.CompletedProcess(a, 1, "", ""))
    build.build(comp, progress=lambda m: None)
    assert not build.is_built(comp)  # the stamp names the source the binary was built from
