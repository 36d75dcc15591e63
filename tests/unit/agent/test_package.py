"""package.yaml: what it accepts, and how it says what is wrong with what it refuses."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gate.agent.errors import PackageError
from gate.agent.loader import load_package, parse_manifest

GOOD = """
apiVersion: nodegate.io/v1alpha1
kind: Package
name: demo-pkg
version: 1.2.3-rc.1+build.5
stages:
  apply:
    - name: install
      script: scripts/install.sh
      args: [--fast]
  apply-check:
    - name: installed
      command: test -e /etc/demo
"""


def manifest(extra: str = "", stages: str = "") -> str:
    base = textwrap.dedent(
        """
        apiVersion: nodegate.io/v1alpha1
        kind: Package
        name: demo-pkg
        version: 1.0.0
        """
    )
    tail = "stages:\n" + textwrap.indent(textwrap.dedent(stages), "  ") if stages else ""
    return base + textwrap.dedent(extra) + tail


def test_a_valid_manifest_gets_the_documented_defaults() -> None:
    parsed = parse_manifest(GOOD)
    step = parsed.stages.apply[0]
    assert (step.on_host, step.accepted_exit_codes, step.idempotent, step.timeout) == (True, [0], False, None)
    assert step.args == ["--fast"]
    assert parsed.stages.checks_of("apply")[0].command == "test -e /etc/demo"
    assert parsed.stages.of("post-interrupt") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (manifest().replace("version: 1.0.0\n", ""), "version: Field required"),
        (manifest().replace("1.0.0", "1.0"), "version: Input should be a valid string (quote it: YAML reads 1.0"),
        (manifest().replace("1.0.0", "v1.0.0"), "version: String should match pattern"),
        (manifest().replace("demo-pkg", "Demo_Pkg"), "name: String should match pattern"),
        (manifest().replace("kind: Package", "kind: Pkg"), "kind: Input should be 'Package'"),
        (manifest("rooot: root\n"), "rooot: unknown field"),
        (manifest(stages="apply:\n  - {name: a, script: a.sh, onhost: false}\n"),
         "stages.apply[0].onhost: unknown field"),
        (manifest(stages="apply:\n  - {name: a, script: a.sh, command: 'true'}\n"),
         "exactly one of script and command"),
        (manifest(stages="apply:\n  - {name: a}\n"), "exactly one of script and command"),
        (manifest(stages="apply:\n  - {name: a, script: ../escape.sh}\n"), "must be a path inside the package"),
        (manifest(stages="apply:\n  - {name: a, script: /bin/true}\n"), "must be a path inside the package"),
        (manifest("root: /\n"), "root must be a path inside the package"),
        (manifest(stages="apply:\n  - {name: a, command: 'true'}\n  - {name: a, command: 'true'}\n"),
         "step name 'a' is used twice"),
        (manifest(stages="apply-check:\n  - {name: a, command: 'true', idempotent: true}\n"),
         "checks always run, idempotent is not allowed"),
        (manifest(stages="apply:\n  - {name: a, command: 'true', env: {NODEGATE_STAGE: x}}\n"),
         "NODEGATE_ are set by the agent: NODEGATE_STAGE"),
        (manifest(stages="apply:\n  - {name: a, command: 'true', timeout: 5 minutes}\n"), "stages.apply[0].timeout"),
        (manifest(stages="apply:\n  - {name: a, command: 'true', acceptedExitCodes: []}\n"),
         "stages.apply[0].acceptedExitCodes: List should have at least 1 item"),
        (manifest(stages="apply:\n  - {name: a, command: 'true', acceptedExitCodes: [256]}\n"),
         "stages.apply[0].acceptedExitCodes[0]"),
        (manifest(stages="apply:\n  - {name: Bad Name, command: 'true'}\n"), "stages.apply[0].name"),
        (manifest(stages="reboot:\n  - {name: a, command: 'true'}\n"), "stages.reboot: unknown field"),
        (manifest(stages="apply:\n  - {name: a, command: 'true', serving: true}\n"),
         "step 'a': a serving step needs an undo"),
        (manifest(stages="apply:\n  - {name: a, command: 'true', undo: {command: 'true'}}\n"),
         "step 'a': undo is for serving steps only"),
        (manifest(stages="apply:\n  - {name: a, command: 'true'}\n"
                         "  - {name: b, command: 'true', serving: true, undo: {command: 'true'}}\n"),
         "apply: serving step 'b' comes after 'a', which is not serving"),
        (manifest(stages="uninstall:\n  - {name: a, command: 'true', serving: true, undo: {command: 'true'}}\n"),
         "uninstall: step 'a': serving steps are for apply, upgrade, config only"),
        (manifest(stages="apply:\n  - {name: a, command: 'true', serving: true, undo: {name: u, command: 'true'}}\n"),
         "stages.apply[0].undo.name: unknown field"),
        ("just a string", "expected a mapping"),
        ("name: [unclosed", "not valid YAML at line 1"),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_field(text: str, expected: str) -> None:
    with pytest.raises(PackageError, match=r"package\.yaml") as caught:
        parse_manifest(text)
    assert expected in str(caught.value)


def test_serving_steps_are_the_first_of_their_list_and_the_catalog_reads_them() -> None:
    parsed = parse_manifest(manifest(stages="""
        apply:
          - {name: write, command: 'true', serving: true, undo: {script: scripts/unwrite.sh}}
          - {name: build, command: 'true', serving: true, undo: {command: 'true'}}
          - {name: restart, command: 'true'}
        config:
          - {name: render, command: 'true'}
    """))
    assert [s.name for s in parsed.stages.serving_steps("apply")] == ["write", "build"]
    assert parsed.serving() == {"apply": ["write", "build"]}
    assert [(name, s.name) for name, s in parsed.undo_scripts()] == [("apply", "write")]


def write_package(directory: Path, text: str, scripts: dict[str, str | None]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "package.yaml").write_text(text)
    for name, body in scripts.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body if body is not None else "#!/bin/sh\n")
        path.chmod(0o755)
    return directory


def test_load_package_accepts_a_complete_package(tmp_path: Path) -> None:
    pkg = load_package(write_package(tmp_path / "p", GOOD, {"scripts/install.sh": None}))
    assert (pkg.name, pkg.version, pkg.overlay_dir()) == ("demo-pkg", "1.2.3-rc.1+build.5", None)


def test_a_missing_script_is_refused_naming_stage_step_and_file(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match=r"stages.apply step 'install': script scripts/install.sh: no such file"):
        load_package(write_package(tmp_path / "p", GOOD, {}))


def test_a_script_without_the_executable_bit_is_refused(tmp_path: Path) -> None:
    directory = write_package(tmp_path / "p", GOOD, {"scripts/install.sh": None})
    (directory / "scripts/install.sh").chmod(0o644)
    with pytest.raises(PackageError, match=r"not executable \(chmod \+x\)"):
        load_package(directory)


def test_a_script_without_a_shebang_is_refused(tmp_path: Path) -> None:
    directory = write_package(tmp_path / "p", GOOD, {"scripts/install.sh": "echo hi\n"})
    with pytest.raises(PackageError, match="has no #! line"):
        load_package(directory)


def test_a_script_symlinked_out_of_the_package_is_refused(tmp_path: Path) -> None:
    directory = write_package(tmp_path / "p", GOOD, {})
    (tmp_path / "outside.sh").write_text("#!/bin/sh\n")
    (directory / "scripts").mkdir()
    (directory / "scripts/install.sh").symlink_to(tmp_path / "outside.sh")
    with pytest.raises(PackageError, match="resolves outside the package"):
        load_package(directory)


def test_a_declared_overlay_that_is_missing_is_refused(tmp_path: Path) -> None:
    text = GOOD.replace("stages:", "root: root\nstages:")
    with pytest.raises(PackageError, match="root root: no such directory in the package"):
        load_package(write_package(tmp_path / "p", text, {"scripts/install.sh": None}))


def test_an_overlay_with_a_symlink_is_refused(tmp_path: Path) -> None:
    text = GOOD.replace("stages:", "root: root\nstages:")
    directory = write_package(tmp_path / "p", text, {"scripts/install.sh": None})
    (directory / "root/etc").mkdir(parents=True)
    (directory / "root/etc/link").symlink_to("/etc/passwd")
    with pytest.raises(PackageError, match="etc/link is not a regular file or directory"):
        load_package(directory)


def test_a_directory_without_package_yaml_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackageError, match=r"package.yaml: no such file \(a package carries /nodegate-package/"):
        load_package(tmp_path / "empty")
    with pytest.raises(PackageError, match="does not exist"):
        load_package(tmp_path / "missing")
