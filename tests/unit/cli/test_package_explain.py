"""`nodegate package explain`: any package's explain entry point, run without a node, and gpu-tuning's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gate.agent.lint import lint_package
from gate.cli.main import main

REPO = Path(__file__).resolve().parents[3]
GPU_TUNING = REPO / "packages" / "gpu-tuning"

MANIFEST = """apiVersion: nodegate.io/v1alpha1
kind: Package
name: demo-pkg
version: 1.0.0
config:
  keys:
    pages: {type: int, default: 4, minimum: 1}
explain:
  script: scripts/explain.sh
  args: [--from-test]
"""


def demo(tmp_path: Path, body: str) -> Path:
    directory = tmp_path / "demo"
    (directory / "scripts").mkdir(parents=True)
    (directory / "package.yaml").write_text(MANIFEST)
    script = directory / "scripts" / "explain.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return directory


def test_the_entry_point_gets_the_effective_config_and_the_os_and_its_table_is_printed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The script echoes what it was given back as its rows: config with the default filled in, the os-release.
    directory = demo(tmp_path, """printf '{"title": "demo %s", "columns": ["config", "os"], "rows": [["%s", "%s"]], '\\
'"notes": ["a note"]}\\n' "$1" "$(echo "$NODEGATE_EXPLAIN_CONFIG" | sed 's/"/\\\\"/g')" \\
"$(printf %s "$NODEGATE_EXPLAIN_OS_RELEASE" | tr '\\n' ' ')"
""")
    assert main(["package", "explain", str(directory), "--os", "rhel:9", "-o", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["title"] == "demo --from-test"
    assert shown["rows"] == [['{"pages": "4"}', "ID=rhel VERSION_ID=9 "]]
    assert shown["notes"] == ["a note"]
    assert main(["package", "explain", str(directory), "--config", "pages=9"]) == 0
    plain = capsys.readouterr().out
    assert plain.splitlines()[0] == "demo --from-test"
    assert '{"pages": "9"}' in plain and "notes:\n  a note" in plain


def test_config_breaking_the_declarations_is_refused_before_the_script_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = demo(tmp_path, "touch ran; echo '{}'\n")
    assert main(["package", "explain", str(directory), "--config", "pages=0"]) == 2
    assert "config key 'pages': 0 is below the minimum 1" in capsys.readouterr().err
    assert main(["package", "explain", str(directory), "--config", "colour=red"]) == 2
    assert "config key 'colour' is not declared by package demo-pkg" in capsys.readouterr().err
    assert main(["package", "explain", str(directory), "--config", "pages"]) == 2
    assert "--config wants key=value" in capsys.readouterr().err
    assert not (directory / "ran").exists()


def test_a_script_that_refuses_exits_1_with_its_reason_and_bad_output_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refusing = demo(tmp_path, "echo 'working...'; echo 'pages=4 is not supported here' >&2; exit 3\n")
    assert main(["package", "explain", str(refusing)]) == 1
    assert capsys.readouterr().err.strip().endswith("pages=4 is not supported here")
    (refusing / "scripts" / "explain.sh").write_text('#!/bin/sh\necho \'{"columns": ["a"], "rows": [["1", "2"]]}\'\n')
    assert main(["package", "explain", str(refusing)]) == 2
    assert "'rows' must be lists of 1 values" in capsys.readouterr().err
    (refusing / "scripts" / "explain.sh").write_text("#!/bin/sh\necho not json\n")
    assert main(["package", "explain", str(refusing)]) == 2
    assert "did not print one JSON object" in capsys.readouterr().err


def test_a_package_without_an_entry_point_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["package", "explain", str(REPO / "packages" / "sysctl-tuning")]) == 2
    assert "declares no explain entry point" in capsys.readouterr().err


def test_lint_checks_the_explain_script_like_a_step_script(tmp_path: Path) -> None:
    directory = demo(tmp_path, "echo '{}'\n")
    (directory / "scripts" / "explain.sh").chmod(0o644)
    assert any("explain.script: not executable" in str(f) for f in lint_package(directory))
    (directory / "scripts" / "explain.sh").unlink()
    assert any("explain.script: no such file in the package" in str(f) for f in lint_package(directory))


def test_gpu_tuning_explains_h100_inference_without_a_node(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["package", "explain", str(GPU_TUNING), "--config", "accelerator=h100,intent=inference",
                 "--os", "ubuntu", "--cloud", "eks", "-o", "json"])
    shown = json.loads(capsys.readouterr().out)
    assert code == 0
    assert shown["columns"] == ["setting", "value", "layer", "source"]
    rows = {row[0]: row for row in shown["rows"]}
    assert rows["sysctl/vm.swappiness"][1:3] == ["1", "intent/inference"]
    assert rows["kernelArg/iommu"][1:3] == ["iommu=pt", "accelerator/h100"]
    assert rows["kernelArg/intel-idle-max-cstate"][2] == "cloud/eks"
    assert rows["sysctl/vm.swappiness"][3].startswith("nvidia-h100-inference <https://github.com/NVIDIA/")
    assert shown["title"].splitlines()[1] == ("layers: base -> accelerator/h100 -> intent/inference -> os/ubuntu "
                                              "-> cloud/eks")


def test_gpu_tuning_explain_refuses_an_unsupported_combination_with_the_supported_list(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["package", "explain", str(GPU_TUNING), "--config", "intent=inference", "--os", "cos",
                 "--cloud", "aks"]) == 1
    err = capsys.readouterr().err
    assert "os cos with cloud aks is not supported" in err and "cloud gke: os cos, ubuntu" in err


def test_gpu_tuning_explain_without_an_os_says_the_os_layer_is_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["package", "explain", str(GPU_TUNING), "--config", "intent=performance", "-o", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert any(note.startswith("no --os given: the OS layer is left out") for note in shown["notes"])
    assert "accelerator=any" in shown["title"]  # the declared default, filled in as the agent would
