"""docs/catalog.md: written from the packages' own files, fresh, and every "tested on" claim backed by a test."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from gate.agent.catalog import render_catalog
from gate.agent.loader import load_package
from gate.cli.main import main
from gate.devcluster.realnode import NODE_OS
from tests.realnode.conftest import REAL_NODE_SUITES

REPO = Path(__file__).resolve().parents[3]
PACKAGES = REPO / "packages"
PUBLISHED = REPO / "docs" / "catalog.md"
NAMES = sorted(p.parent.name for p in PACKAGES.glob("*/package.yaml"))
# The OSes the real-node tier's nodes run (tests/realnode/conftest.py REAL_NODE_SUITES, one root each
# from gate/devcluster/realnode.py NODE_ROOTS), as testedOn spells them.
REAL_NODE_OSES = [NODE_OS[suite] for suite in REAL_NODE_SUITES]


def test_the_published_catalog_is_fresh() -> None:
    assert PUBLISHED.read_text() == render_catalog(PACKAGES), (
        "docs/catalog.md is stale: run `nodegate package catalog --output docs/catalog.md`")


def test_catalog_check_fails_on_a_stale_page_and_passes_once_written(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "catalog.md"
    page.write_text("# an old catalog\n")
    assert main(["package", "catalog", "--packages", str(PACKAGES), "--output", str(page), "--check"]) == 1
    assert "is stale; run `nodegate package catalog" in capsys.readouterr().err
    assert main(["package", "catalog", "--packages", str(PACKAGES), "--output", str(page)]) == 0
    assert main(["package", "catalog", "--packages", str(PACKAGES), "--output", str(page), "--check"]) == 0


def test_a_package_added_to_the_folder_appears_with_its_stages_keys_interrupts_and_systems(tmp_path: Path) -> None:
    packages = tmp_path / "packages"
    shutil.copytree(PACKAGES / "sysctl-tuning", packages / "sysctl-tuning")
    new = packages / "zz-demo"
    new.mkdir()
    (new / "package.yaml").write_text("""\
apiVersion: nodegate.io/v1alpha1
kind: Package
name: zz-demo
version: 2.1.0
description: Does a thing. Then more.
config:
  keys:
    mode: {type: enum, enum: [fast, safe], default: safe, description: How | carefully.}
    count: {type: int, minimum: 1, required: true}
testedOn:
  - {os: debian-13, tier: chroot, note: only the files}
stages:
  config: [{name: write, command: 'true'}]
  config-check: [{name: written, command: 'true'}]
""")
    (new / "nodegate.yaml").write_text("spec:\n  packages:\n    zz-demo:\n      interrupt: {type: reboot}\n"
                                       "      configInterrupts: {mode: {type: service, services: [a.service]}}\n")
    page = render_catalog(packages)
    assert "| [zz-demo](#zz-demo) | 2.1.0 | Does a thing. | debian-13: chroot |" in page
    section = page[page.index("## zz-demo"):]
    assert "| config | `write` | `written` |" in section
    assert "| `mode` | enum: `fast`, `safe` | `safe` | How \\| carefully. |" in section
    assert "| `count` | int (≥ 1) | required | — |" in section
    assert ("Interrupts (from the example gate): on install and upgrade: reboot; "
            "when config `mode` changes: service (a.service).") in section
    assert "Tested on: debian-13: `nodegate package test` (chroot) (only the files)." in section
    assert page.index("## sysctl-tuning") < page.index("## zz-demo")


@pytest.mark.parametrize("name", NAMES)
def test_every_tested_on_claim_is_backed_by_a_test_of_that_tier(name: str) -> None:
    """A package claiming a tier is named by a test module of that tier, on the OS that tier runs."""
    claims = load_package(PACKAGES / name).manifest.tested_on
    assert claims, f"{name}: package.yaml declares no testedOn"
    mentions = re.compile(rf'["/]{re.escape(name)}["/]')
    for claim in claims:
        if claim.tier == "unit":
            continue
        folder = {"realnode": "tests/realnode", "chroot": "tests/agent"}[claim.tier]
        naming = [p.name for p in sorted((REPO / folder).glob("test_*.py")) if mentions.search(p.read_text())]
        assert naming, f"{name} claims {claim.tier} on {claim.os}, but no module of {folder} names it"
        if claim.tier == "realnode":
            assert claim.os in REAL_NODE_OSES, (
                f"{name} claims realnode on {claim.os}, but the real nodes run {', '.join(REAL_NODE_OSES)}")

