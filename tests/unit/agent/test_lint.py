"""`nodegate package lint`: every problem at once, including host changes nothing checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.agent.lint import has_errors, lint_package

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted(p.parent for p in (REPO / "packages").glob("*/package.yaml"))


def write(directory: Path, manifest: str, scripts: tuple[str, ...] = (), dockerfile: bool = True) -> Path:
    directory.mkdir(parents=True)
    (directory / "package.yaml").write_text("apiVersion: nodegate.io/v1alpha1\nkind: Package\nname: demo-pkg\n"
                                            "version: 1.0.0\n" + manifest)
    for name in scripts:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text("#!/bin/sh\n")
        (directory / name).chmod(0o755)
    if dockerfile:
        (directory / "Dockerfile").write_text("FROM busybox\nCOPY . /nodegate-package/\n")
    return directory


def messages(directory: Path) -> list[str]:
    return [str(f) for f in lint_package(directory)]


def test_the_example_packages_are_all_here() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"chrony-conf", "gpu-tuning", "grub-cmdline", "module-blocklist", "sysctl-tuning", "tuning"} <= names


@pytest.mark.parametrize("package", EXAMPLES, ids=lambda p: p.name)
def test_every_example_package_lints_clean(package: Path) -> None:
    assert lint_package(package) == []


def test_a_stage_that_changes_the_host_without_a_check_is_an_error(tmp_path: Path) -> None:
    found = messages(write(tmp_path / "p", "stages:\n  config: [{name: a, command: 'true'}]\n"
                                           "  uninstall: [{name: b, command: 'true'}]\n"))
    assert found == [
        "error: package.yaml: stages.config has steps but stages.config-check is empty",
        "error: package.yaml: stages.uninstall has steps but stages.uninstall-check is empty",
    ]


def test_an_overlay_needs_an_apply_check_even_without_apply_steps(tmp_path: Path) -> None:
    directory = write(tmp_path / "p", "root: root\n")
    (directory / "root/etc").mkdir(parents=True)
    assert messages(directory) == [
        "error: package.yaml: stages.apply lays down the overlay but stages.apply-check is empty"
    ]


def test_lint_reports_every_file_problem_together(tmp_path: Path) -> None:
    directory = write(tmp_path / "p", "stages:\n  apply: [{name: a, script: a.sh}, {name: b, script: b.sh}]\n"
                                      "  apply-check: [{name: c, script: c.sh}]\n"
                                      "  uninstall: [{name: d, command: 'true'}]\n"
                                      "  uninstall-check: [{name: e, command: 'true'}]\n", scripts=("c.sh",))
    found = messages(directory)
    assert len(found) == 2 and all("no such file in the package" in m for m in found)
    assert has_errors(lint_package(directory))


def test_schema_errors_are_listed_one_per_field(tmp_path: Path) -> None:
    directory = write(tmp_path / "p", "stages:\n  apply: [{name: a, script: a.sh, onhost: true, retries: 3}]\n")
    assert messages(directory) == [
        "error: package.yaml: stages.apply[0].onhost: unknown field",
        "error: package.yaml: stages.apply[0].retries: unknown field",
    ]


def test_apply_without_uninstall_and_a_missing_dockerfile_are_warnings_not_errors(tmp_path: Path) -> None:
    directory = write(tmp_path / "p", "stages:\n  apply: [{name: a, command: 'true'}]\n"
                                      "  apply-check: [{name: b, command: 'true'}]\n", dockerfile=False)
    findings = lint_package(directory)
    assert [f.level for f in findings] == ["warning", "warning"]
    assert not has_errors(findings)


def test_a_dockerfile_that_does_not_fill_nodegate_package_is_an_error(tmp_path: Path) -> None:
    directory = write(tmp_path / "p", "")
    (directory / "Dockerfile").write_text("FROM busybox\nCOPY . /pkg/\n")
    assert messages(directory) == ["error: Dockerfile: the image must carry the package at /nodegate-package/"]


def test_lint_holds_the_packages_own_example_configs_against_its_declared_keys(tmp_path: Path) -> None:
    directory = write(tmp_path / "p", "config:\n  keys:\n    mode: {type: enum, enum: [fast, safe], required: true}\n"
                                      "stages:\n  config: [{name: a, command: 'true'}]\n"
                                      "  config-check: [{name: b, command: 'true'}]\n")
    (directory / "sample-config").mkdir()
    (directory / "sample-config/mode").write_text("quick\n")
    (directory / "nodegate.yaml").write_text("kind: NodeGate\nspec:\n  packages:\n    demo-pkg:\n"
                                             "      config: {mode: safe, extra: x}\n")
    assert messages(directory) == [
        "error: sample-config/: config key 'mode': 'quick' is not one of fast, safe",
        "error: nodegate.yaml: spec.packages.demo-pkg.config: config key 'extra' is not declared by package "
        "demo-pkg (declared: mode)",
    ]


def test_lint_names_a_bad_config_declaration(tmp_path: Path) -> None:
    directory = write(tmp_path / "p", "config:\n  keys:\n    mode: {type: enum}\n")
    assert messages(directory) == ["error: package.yaml: config.keys.mode: a key of type enum needs its values in enum"]
