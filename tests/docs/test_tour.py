"""The README's 5-minute tour, command by command, on the session's control plane.

`nodegate dev up|down` and `export` are the only lines not run: the test's control plane (with the
webhook and the operator) stands in for `nodegate dev up`, and six nodes labelled as the tour's
`--label` would label them are created here. Their names replace `kwok-node-`.
"""

from __future__ import annotations

import os
import subprocess
import sys

from gate.devcluster.cluster import DevCluster, NodeSpec
from gate.kube.client import NODEGATES, NODES, POLICIES
from tests.conftest import kubectl_path, unique
from tests.docs.conftest import REPO, shell_commands
from tests.integration.conftest import Webhook


def _tour() -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    start, end = text.index("<!-- tour -->"), text.index("<!-- /tour -->")
    return shell_commands(text[start:end])


def test_the_tour_runs_every_nodegate_and_kubectl_command(cluster: DevCluster, webhook: Webhook,
                                                          operator: int) -> None:
    import asyncio

    prefix = unique("tour") + "-"
    names = asyncio.run(cluster.add_nodes(NodeSpec(6, {"nodegate.dev/tour": "true"}, prefix=prefix)))
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    outputs: list[tuple[list[str], str]] = []
    try:
        for argv in _tour():
            if argv[0] == "export" or argv[:2] == ["nodegate", "dev"]:
                continue
            argv = [a.replace("kwok-node-", prefix) for a in argv]
            if argv[0] == "nodegate":
                cmd = [sys.executable, "-m", "gate.cli.main", *argv[1:]]
            else:
                assert argv[0] == "kubectl", f"the tour runs only nodegate and kubectl: {argv}"
                cmd = [kubectl_path(), *argv[1:]]
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
            assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr}{proc.stdout}"
            outputs.append((argv, proc.stdout))
        statuses = [out for argv, out in outputs if argv[1:3] == ["status", "tour"]]
        assert "waits: the gate is paused" not in statuses[0]  # the README's comment is not output
        assert "paused: gate tour is paused" in statuses[0]
        assert statuses[-1].startswith("NodeGate tour  Ready  6/6 complete  policy tour")
        planned = next(out for argv, out in outputs if argv[1:3] == ["plan", "tour"])
        assert "  canary: 1 nodes, at most 1 at once, 1 batches" in planned
        assert "  __default__: 5 nodes, at most 2 at once, 3 batches" in planned
    finally:
        async def cleanup() -> None:
            async with await cluster.client() as kube:
                await kube.delete(NODEGATES, "tour")
                for _ in range(240):
                    try:
                        await kube.get(NODEGATES, "tour")
                    except Exception:
                        break
                    await asyncio.sleep(0.25)
                await kube.delete(POLICIES, "tour")
                for name in names:
                    await kube.delete(NODES, name)

        asyncio.run(cleanup())
