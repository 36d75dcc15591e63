"""docs/packages.md's worked example, extracted file by file and run like any package."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gate.agent.summary import Summary
from gate.api.nodegate import NodeGate
from gate.cli.main import main
from tests.agent.conftest import REPO

DOC = REPO / "docs" / "packages.md"
BLOCK = re.compile(r"<!-- (file|example): (\S+) -->\n```\w*\n(.*?)```", re.S)


def blocks(kind: str) -> dict[str, str]:
    return {name: body for k, name, body in BLOCK.findall(DOC.read_text()) if k == kind}


@pytest.fixture
def example(tmp_path: Path) -> Path:
    directory = tmp_path / "hugepages"
    for name, body in blocks("file").items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        if name.startswith("scripts/"):
            path.chmod(0o755)  # the doc says chmod +x
    return directory


def test_the_worked_example_has_every_file_it_mentions(example: Path) -> None:
    assert sorted(str(p.relative_to(example)) for p in example.rglob("*") if p.is_file()) == [
        "Dockerfile", "nodegate.yaml", "package.yaml", "scripts/check.sh", "scripts/reserve.sh"]


def test_the_worked_example_lints_clean(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["package", "lint", str(example)]) == 0
    assert capsys.readouterr().out == f"{example}: ok\n"


def test_the_worked_example_passes_package_test_with_its_reboot_and_upgrade(
    example: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["package", "test", str(example), "--root", str(root), "--interrupt", "reboot",
                 "--upgrade-from", "1.0.0", "--verbose"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[upgrade/reserve] upgrading hugepages from 1.0.0 to 1.1.0" in out
    assert [line[6:24].strip() for line in out.splitlines() if line.startswith("PASS  ")] == [
        "apply", "apply again", "interrupt reboot", "post-interrupt", "upgrade", "uninstall", "interrupt reboot",
        "post-uninstall"]
    assert (root / "proc/sys/vm/nr_hugepages").read_text() == "0\n"


def test_the_worked_examples_gate_is_a_valid_nodegate(example: Path) -> None:
    gate = NodeGate.model_validate(yaml.safe_load((example / "nodegate.yaml").read_text()))
    assert gate.spec.packages["hugepages"].version == "1.1.0"


def test_the_documented_summary_has_exactly_the_fields_the_agent_writes() -> None:
    documented = json.loads(blocks("example")["summary"])
    written = Summary(package="p", version="1", stage="apply", ok=False).to_wire()
    assert list(documented) == list(written)
