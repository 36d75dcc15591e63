"""The node's facts on the host: joined from the operator's file and the host's package histories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gate.agent.errors import UsageError
from gate.agent.facts import NodeFacts, installed_on_host, load_operator_facts, node_facts, write_facts
from gate.agent.history import History, save_history
from gate.agent.host import PackageLayout
from gate.api.facts import OperatorFacts, RolloutPlace


def _installed(root: Path, gate: str, package: str, version: str | None) -> None:
    save_history(PackageLayout(root, gate, package).history_file,
                 History(gate=gate, package=package, installed=version))


def test_installed_packages_come_from_every_history_on_the_host_and_a_broken_one_is_left_out(tmp_path: Path) -> None:
    _installed(tmp_path, "base", "sysctl", "1.2.0")
    _installed(tmp_path, "gpu", "driver", "550.1.0")
    _installed(tmp_path, "gpu", "removed", None)  # uninstalled: not installed any more
    broken = PackageLayout(tmp_path, "gpu", "broken").history_file
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    assert installed_on_host(tmp_path) == {"base": {"sysctl": "1.2.0"}, "gpu": {"driver": "550.1.0"}}


def test_the_fact_files_hold_json_and_lines_a_shell_reads(tmp_path: Path) -> None:
    _installed(tmp_path, "base", "sysctl", "1.2.0")
    facts = node_facts(OperatorFacts(node="n1", labels={"zone": "b", "pool": "gpu"},
                                     rollout=RolloutPlace(compartment="canary", batch=1)), tmp_path)
    write_facts(facts, tmp_path / "node")
    data = json.loads((tmp_path / "node" / "facts.json").read_text())
    assert data["node"] == "n1" and data["installed"] == {"base": {"sysctl": "1.2.0"}}
    assert data["rollout"] == {"compartment": "canary", "batch": 1, "round": 0}
    assert (tmp_path / "node" / "labels").read_text() == "pool=gpu\nzone=b\n"
    assert (tmp_path / "node" / "installed").read_text() == "base sysctl 1.2.0\n"


def test_without_a_file_the_node_is_named_by_its_variable_and_a_bad_file_is_refused(tmp_path: Path) -> None:
    assert load_operator_facts(None, {"NODEGATE_NODE": "n9"}).node == "n9"
    with pytest.raises(UsageError, match="does not exist"):
        load_operator_facts(tmp_path / "missing.json", {})
    bad = tmp_path / "facts.json"
    bad.write_text('{"labels": {}}')
    with pytest.raises(UsageError, match=r"facts.json is not valid"):
        load_operator_facts(bad, {})


def test_the_documented_facts_file_is_what_the_agent_writes() -> None:
    import re

    doc = (Path(__file__).resolve().parents[3] / "docs" / "packages.md").read_text()
    block = re.search(r"<!-- example: node-facts -->\n```json\n(.*?)```", doc, re.S)
    assert block is not None
    documented = json.loads(block[1])
    written = NodeFacts.model_validate(documented).model_dump(by_alias=True, mode="json")
    assert documented == written  # every field, named as the agent writes it

