"""Where the API server is and who asks: the pod's ServiceAccount read by NodeGate itself, a kubeconfig
by `kubernetes.aio`; and the image's modules import without that package."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from gate.kube import config
from gate.kube.client import KubeClient

ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def service_account(tmp_path: Path, token: str = "t1") -> Path:
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "ca.crt").write_text("not read until a connection is made")
    return tmp_path


async def test_in_a_pod_the_service_account_token_and_ca_are_used(tmp_path: Path) -> None:
    conn = config.in_cluster(ENV, service_account(tmp_path))
    assert conn.host == "https://10.96.0.1:443"
    assert conn.ca_file == str(tmp_path / "ca.crt")
    assert await conn.authorization() == "Bearer t1"


async def test_a_rotated_token_is_read_again_once_a_minute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(config.time, "monotonic", lambda: now[0])
    conn = config.in_cluster(ENV, service_account(tmp_path))
    assert await conn.authorization() == "Bearer t1"
    (tmp_path / "token").write_text("t2")
    now[0] += 59
    assert await conn.authorization() == "Bearer t1"  # no file read per request
    now[0] += 1
    assert await conn.authorization() == "Bearer t2"
    (tmp_path / "token").unlink()  # the kubelet replacing it: the last token serves meanwhile
    now[0] += 60
    assert await conn.authorization() == "Bearer t2"


def test_an_ipv6_service_address_is_bracketed(tmp_path: Path) -> None:
    conn = config.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
                             service_account(tmp_path))
    assert conn.host == "https://[fd00::1]:443"


def test_outside_a_pod_or_without_a_token_the_error_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="KUBERNETES_SERVICE_HOST"):
        config.in_cluster({}, service_account(tmp_path))
    (tmp_path / "token").unlink()
    with pytest.raises(config.ConfigError, match=r"token is missing|automountServiceAccountToken") as err:
        config.in_cluster(ENV, tmp_path)
    assert str(tmp_path / "token") in str(err.value)


async def test_a_kubeconfig_is_read_by_kubernetes_aio_and_a_token_request_replaces_the_identity(
        tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "secret"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))
    conn = await config.from_kubeconfig(str(path))
    assert conn.host == "https://127.0.0.1:6443" and not conn.verify
    assert await conn.authorization() == "Bearer secret"
    other = conn.with_bearer("requested")
    assert other.host == conn.host and await other.authorization() == "Bearer requested"
    async with KubeClient(conn) as client:  # the client takes it as it is
        assert client.base_url == "https://127.0.0.1:6443"


HIDDEN = textwrap.dedent("""
    import asyncio, runpy, sys

    class Hide:
        def find_spec(self, name, path=None, target=None):
            if name == "kubernetes" or name.startswith("kubernetes."):
                raise ImportError("no module named " + name)

    sys.meta_path.insert(0, Hide())
    from gate.kube import config
    try:
        asyncio.run(config.from_kubeconfig("/nonexistent"))
    except config.ConfigError as exc:
        print("kubeconfig:", exc)
    sys.argv = ["imagecheck"]
    runpy.run_module("gate.kube.imagecheck", run_name="__main__")
""")


def test_every_module_of_the_image_imports_without_the_kubernetes_package() -> None:
    proc = subprocess.run([sys.executable, "-c", HIDDEN], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    # the package is hidden indeed: reading a kubeconfig, which needs it, says so
    assert "kubeconfig: reading a kubeconfig needs the Python package `kubernetes`" in proc.stdout
    count = int(proc.stdout.split("imagecheck: ")[1].split()[0])
    assert count > 100  # the operator, the webhook, the agent and the CLI, not an empty walk
