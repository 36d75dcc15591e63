"""Every `nodegate` command the docs show is one the CLI accepts: flags and subcommands exist."""

from __future__ import annotations

import pytest

from gate.cli.main import parser
from tests.docs.conftest import DOCS, REPO, shell_commands

ALL = [*DOCS, REPO / "docs" / "packages.md", REPO / "docs" / "admission.md", REPO / "docs" / "realnodes.md",
       REPO / "docs" / "supply-chain.md"]


def _nodegate_commands() -> list[tuple[str, list[str]]]:
    found = []
    for doc in ALL:
        for argv in shell_commands(doc.read_text()):
            if argv[:2] == ["kubectl", "nodegate"]:
                argv = argv[1:]
            if argv and argv[0] in ("nodegate", ".venv/bin/nodegate"):
                found.append((doc.name, argv[1:]))
    return found


def test_the_docs_show_the_everyday_commands() -> None:
    shown = {argv[0] for _, argv in _nodegate_commands()}
    assert {"status", "plan", "pause", "resume", "rerun", "node"} <= shown


@pytest.mark.parametrize(("doc", "argv"), _nodegate_commands(), ids=lambda v: " ".join(v) if isinstance(v, list)
                         else v)
def test_every_documented_command_parses(doc: str, argv: list[str]) -> None:
    try:
        parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"{doc}: `nodegate {' '.join(argv)}` does not parse") from exc
