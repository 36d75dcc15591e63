"""The CLI against the session's control plane, with the operator's scenario fixtures.

Commands run through `gate.cli.main.main`, exactly what the `nodegate` entry point calls, in a
worker thread (each command runs its own event loop) with stdout and stderr captured.
"""

from __future__ import annotations

import asyncio
import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

import pytest

from gate.devcluster.cluster import DevCluster
from tests.integration.operator.conftest import operator, scenario, step_log  # noqa: F401 - pytest fixtures


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


class Cli:
    def __init__(self, cluster: DevCluster) -> None:
        self.cluster = cluster

    async def __call__(self, *argv: str, kubeconfig: str | None = None) -> Result:
        from gate.cli.main import main

        def run() -> Result:
            out, err = io.StringIO(), io.StringIO()
            with redirect_stdout(out), redirect_stderr(err):
                code = main([*argv, "--kubeconfig", kubeconfig or str(self.cluster.kubeconfig)])
            return Result(code, out.getvalue(), err.getvalue())

        return await asyncio.to_thread(run)

    async def ok(self, *argv: str) -> Result:
        result = await self(*argv)
        assert result.code == 0, f"nodegate {' '.join(argv)} exited {result.code}: {result.err}{result.out}"
        return result

    async def fails(self, *argv: str, kubeconfig: str | None = None) -> str:
        """The one line a failing command prints (it must exit 2 and print nothing else)."""
        result = await self(*argv, kubeconfig=kubeconfig)
        assert result.code == 2, f"nodegate {' '.join(argv)} exited {result.code}: {result.err}{result.out}"
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and not result.out, result.err
        return lines[0]


@pytest.fixture(scope="session")
def cli(cluster: DevCluster) -> Cli:
    return Cli(cluster)
