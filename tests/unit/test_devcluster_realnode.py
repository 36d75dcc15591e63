"""The real nodes' settings as data: addresses, containerd's and the kubelet's configuration, the checks
that decide whether this machine can run them. The nodes themselves are tested in tests/realnode."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gate.cli.main import main
from gate.devcluster import hostside, realnode
from gate.devcluster.cluster import RealNodeSpec
from gate.devcluster.network import MAX_REAL_NODES, ClusterNetwork


def config(tmp_path: Path, index: int = 1) -> realnode.NodeConfig:
    return realnode.NodeConfig(
        name=f"real-node-{index}", index=index, cluster_dir=str(tmp_path), lower="/lower", kubelet="/kubelet",
        tools="/tools", apiserver_port=6443, registry="10.213.7.1:5000", labels={"a": "b"}, taints=[])


def test_every_node_of_a_cluster_gets_its_own_address_pod_range_and_veth() -> None:
    net = ClusterNetwork(7)
    ips = {net.node_ip(i) for i in range(MAX_REAL_NODES)}
    pods = {net.pod_cidr(i) for i in range(MAX_REAL_NODES)}
    veths = {net.host_veth(i) for i in range(MAX_REAL_NODES)}
    assert len(ips) == len(pods) == len(veths) == MAX_REAL_NODES
    assert net.gateway not in ips and all(ip.startswith("10.213.7.") for ip in ips)
    assert all(len(v) <= 15 for v in [*veths, net.bridge])  # Linux interface names
    with pytest.raises(ValueError, match="at most 4 real nodes"):
        net.node_ip(MAX_REAL_NODES)


def test_two_state_directories_rarely_share_a_network(tmp_path: Path) -> None:
    # Fixed paths, so the figure is the same on every run (under a random tmp_path, 8 draws of 64 lost 3
    # to collisions about once in a hundred runs, and the test failed for nothing).
    indexes = {ClusterNetwork.of(Path(f"/var/tmp/nodegate-test/cluster-{i}")).index for i in range(8)}
    assert len(indexes) >= 7
    assert ClusterNetwork.of(tmp_path / "a") == ClusterNetwork.of(tmp_path / "a")


def test_containerd_restricts_oom_score_adj_and_pulls_the_sandbox_from_the_cluster_registry(tmp_path: Path) -> None:
    parsed = tomllib.loads(realnode.containerd_config(config(tmp_path)))
    cri = parsed["plugins"]["io.containerd.grpc.v1.cri"]
    # Root here lacks CAP_SYS_RESOURCE: without this every sandbox fails to start.
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == f"10.213.7.1:5000/{realnode.PAUSE_IMAGE}"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["registry"]["config_path"] == "/etc/containerd/certs.d"


def test_the_kubelet_uses_cgroupfs_on_cgroup_v1_under_a_root_of_the_nodes_own(tmp_path: Path) -> None:
    kubelet = realnode.kubelet_config(config(tmp_path, 2))
    assert kubelet["cgroupDriver"] == "cgroupfs" and kubelet["failCgroupV1"] is False
    net = ClusterNetwork.of(tmp_path)
    assert kubelet["cgroupRoot"] == f"/nodegate-{net.index}-real-node-2"
    assert kubelet["podCIDR"] == net.pod_cidr(2)
    assert kubelet["authentication"] == {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                                         "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"}}


def test_the_kubelet_takes_feature_gates_only_when_asked_and_refuses_a_misspelt_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(realnode.KUBELET_FEATURE_GATES_ENV, raising=False)
    assert "featureGates" not in realnode.kubelet_config(config(tmp_path))
    monkeypatch.setenv(realnode.KUBELET_FEATURE_GATES_ENV, "EventedPLEG=true, Other=False")
    assert realnode.kubelet_config(config(tmp_path))["featureGates"] == {"EventedPLEG": True, "Other": False}
    with pytest.raises(ValueError, match="'EventedPLEG' is not Name=true or Name=false"):
        realnode.feature_gates("EventedPLEG")


def test_a_machine_without_root_is_told_why_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 1000)
    reason = realnode.unsupported_reason()
    assert reason == "real nodes need root (namespaces, mounts, cgroups)"


def test_a_machine_without_unshare_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 0)
    monkeypatch.setattr(realnode.shutil, "which", lambda tool: None if tool == "unshare" else f"/usr/bin/{tool}")
    reason = realnode.unsupported_reason() or ""
    assert reason.startswith("real nodes need unshare (apt-get install ") and "\n" not in reason


def test_the_node_stand_ins_say_what_they_stand_in_for() -> None:
    for name in ("systemctl", "grub-probe", "boot-cmdline"):
        head = (realnode.NODE_FILES / name).read_text().splitlines()[1]
        assert head.startswith("# STAND-IN for"), name


def test_real_nodes_take_the_debian_releases_in_turn_and_build_only_the_roots_they_use() -> None:
    spec = RealNodeSpec(3, suites=["bookworm", "trixie"])
    assert [spec.suite_of(i) for i in range(3)] == ["bookworm", "trixie", "bookworm"]
    assert spec.used_suites() == ["bookworm", "trixie"]
    assert RealNodeSpec(2).used_suites() == ["bookworm"]
    assert RealNodeSpec(1, suites=["bookworm", "trixie"]).used_suites() == ["bookworm"]
    assert {realnode.NODE_OS[s] for s in realnode.NODE_ROOTS} == {"debian-12", "debian-13"}


def test_each_release_has_a_root_of_its_own_from_the_same_package_list() -> None:
    bookworm, trixie = realnode.NODE_ROOTS["bookworm"], realnode.NODE_ROOTS["trixie"]
    assert (bookworm.suite, trixie.suite) == ("bookworm", "trixie")
    assert bookworm.packages == trixie.packages == realnode.NODE_PACKAGES
    assert bookworm.path != trixie.path and bookworm.fingerprint != trixie.fingerprint
    assert realnode.NODE_ROOT is bookworm


@pytest.mark.parametrize("suites", [["bookworm", "sid"], ["Trixie"], []])
def test_an_unknown_or_missing_release_is_refused_naming_the_option_and_the_known_ones(suites: list[str]) -> None:
    with pytest.raises(hostside.RealNodeError, match=r"^--real-node-os: .*bookworm, trixie") as caught:
        RealNodeSpec(2, suites=suites)
    if suites:
        assert repr(suites[-1]) in str(caught.value)


def test_dev_up_refuses_an_unknown_real_node_os_before_starting_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "dev"
    code = main(["dev", "up", "--state-dir", str(state), "--nodes", "0", "--real-nodes", "2",
                 "--real-node-os", "bookworm,buster"])
    assert code != 0
    assert "--real-node-os: 'buster' is not a Debian release" in capsys.readouterr().err
    assert not (state / "processes.json").exists()


def test_free_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    import socket

    from gate.devcluster.processes import free_port

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports)
    assert len(ports) > 10  # drawn at random, not one port handed out again and again
    for port in list(ports)[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
