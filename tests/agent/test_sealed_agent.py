"""Issue 33: nothing a gate says becomes code outside the package's own scripts.

The attacks of a package user (`use` on one package, nothing more) through the gate's env and config,
each with a payload that leaves a marker file: PYTHONPATH at the config directory with a
`sitecustomize.py` config key; PYTHONWARNINGS naming a module whose import opens BROWSER; BASH_ENV
(and ENV) at a shell file; LD_PRELOAD at a shared object. The agent runs as the operator starts it:
the stage pod's own command (isolated Python on NodeGate's module), arguments and environment
(`gate.controller.pods.stage_pod`), with what admission and the operator drop put back in, as if both
had been bypassed (all but LD_*, which loads into any process before its first line: only the
operator and admission keep it out). The package's steps run in the agent's container (`onHost:
false`) with bash and Python, where each payload would fire.

Controls run every payload without NodeGate in the way and see its marker: the test can fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gate.api.environment import never_passed
from gate.api.facts import FACTS_ANNOTATION
from gate.api.nodegate import NodeGate
from gate.controller.pods import AGENT_COMMAND, CONFIG_DIR, HOST_ROOT, PAYLOAD_DIR, TERMINATION_LOG, stage_pod
from gate.controller.settings import OperatorSettings
from gate.lifecycle.node import PodRequest, Step
from tests.agent.conftest import Agent
from tests.agent.packaging import configmap, make_package

pytestmark = pytest.mark.usefixtures("clean_env")

SO_SOURCE = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    int fd = open(MARKER, O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
}
"""


def _scripts(directory: Path) -> None:
    """A bash and a Python step, each leaving proof that it ran, and nothing else."""
    bash = directory / "scripts/step.sh"
    bash.parent.mkdir(parents=True, exist_ok=True)
    bash.write_text('#!/bin/bash\nset -eu\necho ran > "$PROOF_DIR/bash-ran"\nenv > "$PROOF_DIR/bash-env"\n')
    python = directory / "scripts/step.py"
    python.write_text("#!/usr/bin/env python3\nimport os\n"
                      "open(os.environ['PROOF_DIR'] + '/python-ran', 'w').write('ran')\n")
    for script in (bash, python):
        script.chmod(0o755)


def _hostile(tmp: Path, config_dir: Path, tag: str) -> tuple[dict[str, str], dict[str, str], dict[str, Path]]:
    """(env, config, markers): each payload of issue 33, leaving `marker-<kind>-<tag>` in `tmp`."""
    markers = {kind: tmp / f"marker-{kind}-{tag}" for kind in ("sitecustomize", "browser", "bash", "ld")}
    shell = tmp / f"evil-{tag}.sh"
    shell.write_text(f"touch {markers['bash']}\n")
    env = {
        "PYTHONPATH": str(config_dir),
        "PYTHONWARNINGS": "all:0:antigravity.x:0:0",  # importing the category imports antigravity
        "BROWSER": f"/bin/sh -c 'touch {markers['browser']}' #%s",
        "BASH_ENV": str(shell),
        "ENV": str(shell),
    }
    config = {"sitecustomize.py": f"open({str(markers['sitecustomize'])!r}, 'w').close()\n"}
    return env, config, markers


def _shared_object(tmp: Path, marker: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source, library = tmp / "evil.c", tmp / "evil.so"
    source.write_text(SO_SOURCE)
    subprocess.run([cc, "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(library), str(source)], check=True)
    return library


def _wait_for(path: Path) -> bool:
    # The BROWSER payload runs in a child the interpreter does not wait for.
    for _ in range(100):
        if path.exists():
            return True
        time.sleep(0.05)
    return False


def _attack_gate(env: dict[str, str], config: dict[str, str]) -> NodeGate:
    return NodeGate.model_validate({
        "metadata": {"name": "attack", "generation": 1, "uid": "u-attack"},
        "spec": {"packages": {"demo-pkg": {
            "version": "1.0.0", "image": "example.com/demo", "config": config,
            "env": [{"name": k, "value": v} for k, v in env.items()]}}},
    })


def _run_as_the_operator_would(agent: Agent, tmp: Path, gate: NodeGate, stage: str, payload: Path, config_dir: Path,
                               bypass: dict[str, str]) -> tuple[int, dict[str, Any], str]:
    """The agent container of the stage pod, run here: its command, its args with this test's paths, its
    env (plus `bypass`: what admission and the operator keep out, put back)."""
    pod = stage_pod(gate, "n1", PodRequest(name="p", kind="stages", steps=(Step("demo-pkg", stage, "f"),)),
                    OperatorSettings(namespace="ng"))
    [container] = pod["spec"]["containers"]
    facts = tmp / "facts.json"
    facts.write_text(pod["metadata"]["annotations"][FACTS_ANNOTATION])
    log = tmp / "termination-log"
    log.unlink(missing_ok=True)
    places = {HOST_ROOT: str(agent.root), PAYLOAD_DIR: str(payload), CONFIG_DIR: str(config_dir),
              TERMINATION_LOG: str(log), "/nodegate-facts/facts.json": str(facts)}
    args = [places.get(a, a) for a in container["args"]]
    assert container["command"][0] == AGENT_COMMAND[0] == "/opt/nodegate/bin/python"
    command = [sys.executable, *container["command"][1:]]  # this venv's interpreter stands in for the image's
    env = {"PATH": os.environ["PATH"], **{e["name"]: e["value"] for e in container["env"]}, **bypass}
    done = subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=str(config_dir))  # the current directory too: isolated mode leaves it off sys.path
    summary = json.loads(log.read_text()) if log.exists() else {}
    return done.returncode, summary, done.stdout + done.stderr


def test_a_package_users_env_and_config_run_nothing_as_root(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        apply:
          - {name: bash, script: scripts/step.sh, onHost: false}
          - {name: py, script: scripts/step.py, onHost: false}
        apply-check: [{name: c, command: 'true'}]
        uninstall:
          - {name: bash, script: scripts/step.sh, onHost: false}
          - {name: py, script: scripts/step.py, onHost: false}
        uninstall-check: [{name: c, command: 'true'}]
    """, header=f"env: {{PROOF_DIR: {tmp_path / 'proof'}}}\n")
    (tmp_path / "proof").mkdir()
    _scripts(pkg)
    config_dir = tmp_path / "cm"
    env, config, markers = _hostile(tmp_path, config_dir, "sealed")
    library = _shared_object(tmp_path, markers["ld"])
    if library is not None:
        env["LD_PRELOAD"] = str(library)
    configmap(config_dir, config)
    gate = _attack_gate(env, config)
    bypass = {k: v for k, v in env.items() if not k.startswith("LD_")}
    proof = tmp_path / "proof"

    code, summary, output = _run_as_the_operator_would(agent, tmp_path, gate, "apply", pkg, config_dir, bypass)
    assert code == 2, output
    message = str(summary["message"])
    for name in env:  # every name refused by name, before the host was touched
        assert f"env {name} is refused: " in message, (name, message)
    assert "config key 'sitecustomize.py' is not accepted: package demo-pkg declares no config" in message
    assert not (agent.root / "var/lib/nodegate/attack").exists()

    # Uninstall does not refuse (a node must be able to leave): the steps run, without any of it.
    code, summary, output = _run_as_the_operator_would(agent, tmp_path, gate, "uninstall", pkg, config_dir, bypass)
    assert code == 0, (summary, output)
    assert (proof / "bash-ran").read_text() == "ran\n" and (proof / "python-ran").read_text() == "ran"
    step_env = (proof / "bash-env").read_text()
    assert not [line for line in step_env.splitlines() if never_passed(line.partition("=")[0])
                and not line.startswith(("NODEGATE_", "PATH=", "HOME="))], step_env

    # The controls: each payload, with nothing in its way, fires.
    env_c, config_c, controls = _hostile(tmp_path, config_dir, "control")
    configmap(config_dir, config_c)
    base = {"PATH": os.environ["PATH"]}
    subprocess.run([sys.executable, "-c", "pass"], env={**base, "PYTHONPATH": env_c["PYTHONPATH"]}, check=True)
    subprocess.run([sys.executable, "-c", "pass"], check=True, capture_output=True,
                   env={**base, "PYTHONWARNINGS": env_c["PYTHONWARNINGS"], "BROWSER": env_c["BROWSER"]})
    subprocess.run([str(pkg / "scripts/step.sh")], env={**base, "BASH_ENV": env_c["BASH_ENV"],
                                                        "PROOF_DIR": str(tmp_path)}, check=True)
    assert controls["sitecustomize"].exists() and controls["bash"].exists() and _wait_for(controls["browser"])
    if library is not None:
        subprocess.run(["/bin/true"], env={**base, "LD_PRELOAD": str(library)}, check=True)
        assert markers["ld"].exists(), "the LD_PRELOAD payload works"
        markers["ld"].unlink()

    # ... and none of them fired through NodeGate (the browser child had as long as the control's).
    assert [m.name for m in markers.values() if m.exists()] == []
