"""gpu-tuning rolled by the operator over the real nodes (Debian 12 and Debian 13): the profile
assembled in the real agent image from the node's own /etc/os-release, its network sysctls live in
the node's network namespace,
the stage log showing each setting's layer, and uninstall giving the originals back.

Real nodes share this machine's kernel, so the test keeps the profile to namespaced sysctls: the gate's
`exclude` leaves out vm.* (global) and net.core.* (netdev_max_backlog and default_qdisc exist only in
the first network namespace; a namespace's buffer maxima cannot exceed the host's, which the first
run here showed: the kernel refused them and the apply-check caught it), and the CPU, service and
limit settings (no cpufreq here, no GPU units, containerd is not a systemd unit of the node)."""

from __future__ import annotations

import pytest

from tests.realnode.conftest import RealCluster, real_pool_gate

pytestmark = pytest.mark.timeout(1800)

EXCLUDE = "sysctl/vm.* sysctl/net.core.* cpu/* service/* limit/*"
KEYS = ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_max_syn_backlog")
WANT = {"net.ipv4.tcp_rmem": "4096 87380 268435456", "net.ipv4.tcp_wmem": "4096 65536 268435456",
        "net.ipv4.tcp_max_syn_backlog": "8192"}


def values(real: RealCluster, node: str) -> dict[str, str]:
    out = real.node_sh(node, " && ".join(f"sysctl -n {key}" for key in KEYS)).stdout.splitlines()
    return {key: " ".join(line.split()) for key, line in zip(KEYS, out, strict=True)}


def test_gpu_tuning_applies_a_training_profile_on_real_debian_nodes_and_uninstall_restores_it(
        real: RealCluster, gate_name: str) -> None:
    before = {node: values(real, node) for node in real.nodes}
    for node in real.nodes:
        assert before[node]["net.ipv4.tcp_rmem"] != WANT["net.ipv4.tcp_rmem"], node
    real.kubectl.apply(real_pool_gate(gate_name, {"gpu-tuning": {
        "version": "1.0.0", "image": real.images["gpu-tuning"], "interrupt": {"type": "none"},
        "config": {"accelerator": "any", "intent": "multiNodeTraining", "exclude": EXCLUDE},
        "uninstall": {"enabled": True}}}))
    try:
        real.wait_complete(gate_name, 300.0)
        for node in real.nodes:
            assert values(real, node) == WANT, f"{node} ({real.os_of(node)})"
            conf = real.node_file(node, "/etc/sysctl.d/90-nodegate-gpu-tuning.conf") or ""
            assert "net.ipv4.tcp_rmem = 4096 87380 268435456" in conf and "vm." not in conf and "net.core" not in conf
            log = real.node_sh(node, f"cat /var/log/nodegate/{gate_name}/gpu-tuning/1.0.0/*-apply.log").stdout
            assert "accelerator=any intent=multiNodeTraining os=debian cloud=none" in log, node
            assert "sysctl/net.ipv4.tcp_rmem" in log and "intent/multiNodeTraining" in log
            assert "sysctl/vm.swappiness = 10 (base): excluded by config (sysctl/vm.*)" in log
        real.delete_gate(gate_name, 300.0)
        for node in real.nodes:
            assert values(real, node) == before[node], f"{node} ({real.os_of(node)})"
            assert real.node_file(node, "/etc/sysctl.d/90-nodegate-gpu-tuning.conf") is None
            assert real.node_file(node, "/etc/systemd/system/nodegate-gpu-tuning.service") is None
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=false")
