"""The documentation's examples and commands, executed. Markdown blocks are marked for the tests:

* `<!-- apply -->` before a fenced yaml block: the objects are admitted by the API server and the
  webhook (DeploymentPolicies are created, everything else is applied as a server-side dry run);
* `<!-- refused: TEXT -->`: the objects are refused, and the refusal says TEXT;
* `<!-- tour -->` ... `<!-- /tour -->` in the README: every `nodegate` and `kubectl` command in it
  runs, in order, against a real control plane.

docs/operations.md needs no marks: every line of its ```sh blocks runs (writes as server dry runs) or
is parsed, and test_operations.py lists which are only parsed and why.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import webhook  # noqa: F401 - pytest fixture
from tests.integration.operator.conftest import operator  # noqa: F401 - pytest fixture

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "docs" / "concepts.md", REPO / "docs" / "operations.md"]
_BLOCK = re.compile(r"<!-- (apply|refused: (?P<why>[^>]*?)) -->\n```ya?ml\n(?P<body>.*?)```", re.S)
_SHELL = re.compile(r"```sh\n(.*?)```", re.S)


@dataclass(frozen=True)
class Example:
    source: str
    body: str
    refused: str | None  # what the refusal must say; None: must be admitted


def examples() -> list[Example]:
    out = []
    for doc in DOCS:
        for match in _BLOCK.finditer(doc.read_text()):
            out.append(Example(doc.name, match["body"], match["why"]))
    return out


def shell_commands(text: str) -> list[list[str]]:
    """Every command line of the ```sh blocks in `text`, split like a shell would (comments dropped)."""
    commands = []
    for block in _SHELL.findall(text):
        # A line ending in a backslash goes on on the next one, as in a shell.
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/docs/" in str(item.fspath) and "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)
