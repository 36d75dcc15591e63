"""Real nodes are machines of their own: own root, hostname, network and boot, registered and Ready."""

from __future__ import annotations

import os

import pytest

from tests.realnode.conftest import REAL_NODE_SUITES, RealCluster

# The first test of the tier builds what is missing (node root, images): minutes from a cold cache.
pytestmark = pytest.mark.timeout(1800)


def test_each_real_node_is_ready_with_its_own_identity_and_network(real_nodes: RealCluster) -> None:
    seen_boot_ids = set()
    for index, node in enumerate(real_nodes.nodes):
        ready = real_nodes.kubectl.run("get", "node", node, "-o",
                                 "jsonpath={.status.conditions[?(@.type=='Ready')].status}").stdout
        assert ready == "True", f"{node} is not Ready: {ready!r}"
        assert real_nodes.node_sh(node, "hostname").stdout.strip() == node
        # Its eth0 carries its own address on the cluster's bridge; the kubelet reported it as InternalIP.
        address = real_nodes.kubectl.run("get", "node", node, "-o",
                                   "jsonpath={.status.addresses[?(@.type=='InternalIP')].address}").stdout
        assert address == real_nodes.dev.network.node_ip(index)
        assert address in real_nodes.node_sh(node, "ip -4 -o addr show dev eth0").stdout
        boot_id = real_nodes.boot_id(node)
        assert boot_id == real_nodes.node_sh(node, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
        seen_boot_ids.add(boot_id)
    machine_boot_id = open("/proc/sys/kernel/random/boot_id").read().strip()
    assert len(seen_boot_ids) == len(real_nodes.nodes) and machine_boot_id not in seen_boot_ids


def test_the_nodes_run_the_debian_releases_the_tier_asks_for(real_nodes: RealCluster) -> None:
    """real-node-0 boots Debian 12 and real-node-1 Debian 13: what a package's testedOn claims for the
    tier rests on this. The node's own /etc/os-release, its label and what its kubelet reports agree."""
    from gate.devcluster import realnode

    wanted = [realnode.NODE_OS[REAL_NODE_SUITES[i % len(REAL_NODE_SUITES)]] for i in range(len(real_nodes.nodes))]
    seen = []
    for node in real_nodes.nodes:
        lines = real_nodes.node_sh(node, "cat /etc/os-release").stdout.splitlines()
        release = dict(line.split("=", 1) for line in lines if "=" in line)
        os_name = f"{release['ID']}-{release['VERSION_ID'].strip(chr(34))}"
        assert real_nodes.os_of(node) == os_name, node
        image = real_nodes.kubectl.run("get", "node", node, "-o", "jsonpath={.status.nodeInfo.osImage}").stdout
        assert image.startswith(f"Debian GNU/Linux {os_name.removeprefix('debian-')} "), f"{node}: {image}"
        seen.append(os_name)
    assert seen == wanted


def test_a_file_written_on_one_node_is_only_on_that_node(real_nodes: RealCluster) -> None:
    first, second = real_nodes.nodes[:2]
    real_nodes.node_sh(first, "echo mine > /etc/nodegate-test-marker")
    try:
        assert real_nodes.node_file(first, "/etc/nodegate-test-marker") == "mine\n"
        assert real_nodes.node_file(second, "/etc/nodegate-test-marker") is None
        assert not os.path.exists("/etc/nodegate-test-marker")
    finally:
        real_nodes.node_sh(first, "rm -f /etc/nodegate-test-marker")


def test_net_sysctls_are_the_nodes_own(real_nodes: RealCluster) -> None:
    first, second = real_nodes.nodes[:2]
    before = real_nodes.node_sh(second, "sysctl -n net.core.somaxconn").stdout.strip()
    real_nodes.node_sh(first, "sysctl -q -w net.core.somaxconn=1234")
    try:
        assert real_nodes.node_sh(first, "sysctl -n net.core.somaxconn").stdout.strip() == "1234"
        assert real_nodes.node_sh(second, "sysctl -n net.core.somaxconn").stdout.strip() == before
    finally:
        real_nodes.node_sh(first, f"sysctl -q -w net.core.somaxconn={before}")


def test_kwok_nodes_next_to_real_ones_stay_ready_with_the_node_lifecycle_controller_on(
        real_nodes: RealCluster) -> None:
    # With real nodes the node lifecycle controller runs (a silent node goes NotReady in 16 s); kwok
    # then renews its nodes' leases, or they would go NotReady too. By now the session is far past that.
    ready = "{.status.conditions[?(@.type=='Ready')].status}"
    jsonpath = f"jsonpath={{range .items[*]}}{{.metadata.name}}={ready}{{'\\n'}}{{end}}"
    out = real_nodes.kubectl.run("get", "nodes", "-l", "nodegate.dev/pool=kwok", "-o", jsonpath).stdout.split()
    assert out == ["kwok-node-0=True"], out
    renewed = real_nodes.kubectl.run("get", "lease", "-n", "kube-node-lease", "kwok-node-0", "-o",
                                     "jsonpath={.spec.renewTime}").stdout
    assert renewed, "kwok renews the lease of its node"


def test_a_kubelet_that_exits_is_started_again_without_a_reboot(real_nodes: RealCluster) -> None:
    """As kubelet.service's Restart=always does: a kubelet whose first start meets containerd's socket
    before the CRI answers exits, and the node must not stop for it (the boot stand-in starts it again)."""
    node = real_nodes.nodes[-1]
    boot_id = real_nodes.boot_id(node)
    first = real_nodes.node_sh(node, "pgrep -x kubelet").stdout.split()
    assert len(first) == 1, first
    real_nodes.node_sh(node, f"kill -9 {first[0]}")

    def running_again() -> bool:
        now = real_nodes.node_sh(node, "pgrep -x kubelet", check=False).stdout.split()
        return len(now) == 1 and now != first

    def renewed() -> str:
        return real_nodes.kubectl.run("get", "lease", "-n", "kube-node-lease", node, "-o",
                                      "jsonpath={.spec.renewTime}").stdout

    real_nodes.wait(f"a new kubelet on {node}", running_again, timeout=60.0)
    # The new kubelet works: it renews the node's lease again (every 10 s here).
    before = renewed()
    real_nodes.wait(f"the new kubelet of {node} renewing its lease", lambda: renewed() != before, timeout=60.0)
    ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
    assert real_nodes.kubectl.run("get", "node", node, "-o", ready).stdout == "True"
    assert real_nodes.boot_id(node) == boot_id, f"{node} rebooted"
    console = (real_nodes.dev.dir / "realnodes" / node / "console.log").read_text()
    assert "boot: the kubelet exited; starting it again" in console
