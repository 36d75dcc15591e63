"""The agent runs in a pod without the operator's dependencies: importing it must not need them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

PROBE = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("aiohttp", "kubernetes", "cryptography", "prometheus_client"):
            raise ImportError(f"the agent must not import {name}")
        return None

sys.meta_path.insert(0, Refuse())
import gate.agent.interrupt, gate.agent.lint, gate.agent.stage, gate.agent.trial
from gate.cli.main import parser
parser().parse_args(["agent", "run", "--stage", "apply"])
parser().parse_args(["package", "lint", "x"])
print("ok")
"""


def test_the_agent_and_its_commands_import_without_aiohttp_or_kubernetes() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
