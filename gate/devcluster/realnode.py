"""Real nodes next to the kwok ones: a kubelet, containerd and runc per node, each node its own machine.

A real node is a process tree in its own mount, UTS, PID and network namespaces (`unshare`), booted
into its own root: an overlay of a cached Debian root (bookworm or trixie, see `NODE_ROOTS`:
containerd, runc, CNI plugins, a kernel package, GRUB's tools, chrony) and a writable layer of its
own, which is the node's disk and survives its reboots. Its eth0 is one end of a veth whose other
end is on the cluster's bridge (gate/devcluster/network.py); its containerd pulls images from the
cluster's registry, and its kubelet registers with the dev control plane under a
`system:node:<name>` certificate.

What systemd and the boot loader do on a host is played by small stand-ins, each named as such in
its file (gate/devcluster/node_files): an init that reaps, a boot script that is the service manager
(and loads /etc/sysctl.d, the kube-proxy rule for the API server's ClusterIP, containerd, kubelet), a
`systemctl` that asks it, a `grub-probe` that answers for the disk the node does not have, and a boot
loader that shows grub.cfg's command line at /proc/cmdline. Packages run Debian's own tools on top.

Each node has a supervisor (`python -m gate.devcluster.realnode supervise`), recorded with the
cluster's processes: it plugs the veth in, waits for the node, and boots it again when the node
reboots (a reboot(2) in the node's PID namespace kills its init with SIGHUP), with a new boot ID.
Stopping the supervisor stops the node and removes its cgroups and links: `dev down` leaves nothing. The
machine's side of it (the bridge, the cgroups) is `gate.devcluster.hostside`.

The kernel is shared: `vm.*` and other global sysctls, modules and /sys/module are this machine's.
`net.*` sysctls, mounts, processes, hostname and files are the node's own.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

import yaml

from gate.certs import pki
from gate.devcluster.build import BuildError, cache_root
from gate.devcluster.hostside import CGROUP_ROOT, RealNodeError, cgroup_dirs, create_cgroups, remove_cgroups, run_ip
from gate.devcluster.network import SERVICE_CIDR, ClusterNetwork
from gate.devcluster.rootfs import RootSpec, ensure_root

Progress = Callable[[str], None]

NODE_FILES = Path(__file__).with_name("node_files")
# What a node root holds on top of debootstrap's minbase: the same package names in every release.
NODE_PACKAGES = (
    "containerd", "runc", "containernetworking-plugins", "iptables", "iproute2", "procps", "kmod",
    "busybox-static", "chrony", "grub2-common", "initramfs-tools", "linux-image-cloud-amd64",
    "ca-certificates", "util-linux", "mount",
)
# The Debian releases a real node can run (`RealNodeSpec.suites`), each a root built once per machine
# from the same package names, and the OS each is, spelled as a package's `testedOn` spells it.
NODE_OS = {"bookworm": "debian-12", "trixie": "debian-13"}
NODE_ROOTS = {suite: RootSpec("node", suite, NODE_PACKAGES) for suite in NODE_OS}
DEFAULT_SUITE = "bookworm"
NODE_ROOT = NODE_ROOTS[DEFAULT_SUITE]
REAL_NODE_PREFIX = "real-node-"
REAL_NODE_LABEL = "nodegate.dev/real"
# The node's OS (`NODE_OS`), so that a gate or a test can pick the nodes of one release.
REAL_NODE_OS_LABEL = "nodegate.dev/os"
PAUSE_IMAGE = "nodegate/pause:3.10"
# Debian packages this machine needs to run real nodes (the nodes carry their own copies).
HOST_PACKAGES = ("debootstrap", "iproute2", "iptables", "util-linux", "umoci", "skopeo")
REBOOT_SIGNAL = signal.SIGHUP
# How long a rebooting node stays down (firmware, boot loader) before it boots again: longer than the
# control plane's node-monitor grace period, so a reboot is seen as a real one is, NotReady then Ready.
REBOOT_SECONDS = float(os.environ.get("NODEGATE_REALNODE_REBOOT_SECONDS", "20"))
# Kubelet feature gates of the real nodes, "Name=true,Other=false" (default none): for measuring one,
# such as EventedPLEG (alpha; needs containerd 1.7 or newer, the trixie root's), docs/realnodes.md.
KUBELET_FEATURE_GATES_ENV = "NODEGATE_REALNODE_KUBELET_FEATURE_GATES"


def feature_gates(text: str) -> dict[str, bool]:
    """Feature gates written as the kubelet's flag writes them ("A=true,B=false") to a config's map."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if not name or value.lower() not in ("true", "false"):
            raise ValueError(f"{KUBELET_FEATURE_GATES_ENV}: {item!r} is not Name=true or Name=false")
        gates[name] = value.lower() == "true"
    return gates


# A power cut (gate/devcluster/faults.py) is the node's init killed with SIGKILL after this file was
# written in the node's directory: the supervisor boots the node again, as power coming back does. A
# SIGKILL without it (someone killed the node) stops the node, so a broken node never boot-loops.
POWER_CUT_FILE = "power-cut"
POWER_CUT_SECONDS = 2.0
# Seconds the node's next boot is held back after its shutdown (a reboot that does not come back in
# time); removing the file releases it.
HOLD_BOOT_FILE = "hold-boot"


def down_cause(code: int, power_cut: Path) -> str | None:
    """Why the node's init ended, when the node is to boot again: "rebooted" (reboot(2) in its PID
    namespace: SIGHUP), "power cut" (the power-cut file written before its init was killed; `unshare`
    then exits 1 rather than by the signal); None when it stopped by itself or was killed by someone
    else, and must stay down."""
    if code == -REBOOT_SIGNAL:
        return "rebooted"
    if code != 0 and power_cut.exists():
        return "power cut"
    return None


def read_hold(path: Path) -> float:
    """Seconds a held boot waits (`HOLD_BOOT_FILE`); 0 when there is no hold or it is not a number."""
    try:
        return max(0.0, float(path.read_text().strip()))
    except (OSError, ValueError):
        return 0.0


def unsupported_reason() -> str | None:
    """Why this machine cannot run real nodes, in one line; None when it can."""
    if os.geteuid() != 0:
        return "real nodes need root (namespaces, mounts, cgroups)"
    missing = [tool for tool in ("unshare", "nsenter", "ip", "debootstrap", "mount", "umoci", "skopeo")
               if shutil.which(tool) is None]
    if missing:
        return f"real nodes need {', '.join(missing)} (apt-get install {' '.join(HOST_PACKAGES)})"
    if not (CGROUP_ROOT / "memory").is_dir() and not (CGROUP_ROOT / "cgroup.controllers").is_file():
        return "real nodes need cgroups mounted at /sys/fs/cgroup"
    return None


# -- once per machine: the root, the node tools, the pause image ------------------------------------


def tools_dir() -> Path:
    sources = sorted((NODE_FILES / "go").rglob("*"))
    digest = hashlib.sha256()
    for path in sources:
        if path.is_file():
            digest.update(path.relative_to(NODE_FILES).as_posix().encode() + b"\0" + path.read_bytes())
    return cache_root() / f"node-tools-{digest.hexdigest()[:12]}"


def ensure_tools(progress: Progress = print) -> Path:
    """The node's init and the pause program, static Go binaries built once into the cache."""
    target = tools_dir()
    if (target / "init").is_file() and (target / "pause").is_file():
        return target
    go = shutil.which("go")
    if go is None:
        raise BuildError("real nodes need the Go toolchain to build their init and pause programs")
    progress("Building the real nodes' init and pause programs ...")
    staging = target.with_name(target.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    for name in ("init", "pause"):
        proc = subprocess.run([go, "build", "-ldflags", "-s -w", "-o", str(staging / name), f"./{name}"],
                              cwd=NODE_FILES / "go", env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"building the real nodes' {name} failed: {proc.stderr.strip()}")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target


def push_pause_image(registry: str, progress: Progress = print) -> str:
    """Push the pause image (the pause program alone, as registry.k8s.io's is) to `registry`
    (host:port on this machine); returns its reference there."""
    tools = ensure_tools(progress)
    layout = tools / "pause-oci"
    if not (layout / "index.json").is_file():
        work = tools / "pause-build"
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(layout, ignore_errors=True)
        work.mkdir()
        steps = [
            ["umoci", "init", "--layout", str(layout)],
            ["umoci", "new", "--image", f"{layout}:3.10"],
            ["umoci", "unpack", "--rootless", "--image", f"{layout}:3.10", str(work / "bundle")],
        ]
        for step in steps:
            _check(step, "building the pause image")
        shutil.copy2(tools / "pause", work / "bundle" / "rootfs" / "pause")
        for step in (
            ["umoci", "repack", "--image", f"{layout}:3.10", str(work / "bundle")],
            ["umoci", "config", "--image", f"{layout}:3.10", "--config.entrypoint", "/pause",
             "--config.user", "65535:65535"],
        ):
            _check(step, "building the pause image")
        shutil.rmtree(work, ignore_errors=True)
    _check(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:3.10",
            f"docker://127.0.0.1:{registry.rsplit(':', 1)[1]}/{PAUSE_IMAGE}"], "pushing the pause image")
    return f"{registry}/{PAUSE_IMAGE}"


def _check(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RealNodeError(f"{what}: `{' '.join(cmd)}` failed: {(proc.stderr or proc.stdout).strip()[-800:]}")


# -- one node's disk and settings ---------------------------------------------------------------------


@dataclass(frozen=True)
class NodeConfig:
    """Everything a real node is started with; kept in its directory as node.json."""

    name: str
    index: int
    cluster_dir: str
    lower: str
    kubelet: str
    tools: str
    apiserver_port: int
    registry: str
    labels: dict[str, str]
    taints: list[str]

    @property
    def dir(self) -> Path:
        return Path(self.cluster_dir) / "realnodes" / self.name

    @property
    def network(self) -> ClusterNetwork:
        return ClusterNetwork.of(Path(self.cluster_dir))

    @property
    def cgroup_name(self) -> str:
        return f"nodegate-{self.network.index}-{self.name}"

    @classmethod
    def load(cls, node_dir: Path) -> NodeConfig:
        return cls(**json.loads((node_dir / "node.json").read_text()))

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "node.json").write_text(json.dumps(asdict(self), indent=1))


def _write(root: Path, rel: str, text: str | bytes, mode: int = 0o644) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    path.chmod(mode)


def write_node_disk(config: NodeConfig, ca: pki.KeyPair) -> None:
    """The node's own layer over the Debian root: its identity, the stand-ins, containerd's, CNI's and
    the kubelet's settings. Written when the node is created; afterwards it is the node's disk."""
    upper = config.dir / "upper"
    net = config.network
    node_ip = net.node_ip(config.index)
    gateway = net.gateway
    client = pki.issue(ca, f"system:node:{config.name}", organizations=["system:nodes"], client=True,
                       valid_for=dt.timedelta(days=30))
    for name in ("boot", "boot-cmdline"):
        _write(upper, f"usr/libexec/nodegate-node/{name}", (NODE_FILES / name).read_text(), 0o755)
    _write(upper, "usr/libexec/nodegate-node/init", (Path(config.tools) / "init").read_bytes(), 0o755)
    _write(upper, "usr/bin/systemctl", (NODE_FILES / "systemctl").read_text(), 0o755)
    _write(upper, "usr/sbin/grub-probe", (NODE_FILES / "grub-probe").read_text(), 0o755)
    for unit in (NODE_FILES / "units").iterdir():
        _write(upper, f"etc/nodegate-node/units/{unit.name}", unit.read_text())
        (upper / "etc/nodegate-node/enabled").mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            (upper / "etc/nodegate-node/enabled" / unit.name).symlink_to(f"/etc/nodegate-node/units/{unit.name}")
    env = {
        "NODE_NAME": config.name, "NODE_IP": node_ip, "NODE_APISERVER_HOST": gateway,
        "NODE_APISERVER_PORT": str(config.apiserver_port),
        "NODE_LABELS": ",".join(f"{k}={v}" for k, v in sorted(config.labels.items())),
        "NODE_TAINTS": ",".join(config.taints),
    }
    _write(upper, "etc/nodegate-node/node.env", "".join(f"{k}='{v}'\n" for k, v in env.items()))
    _write(upper, "etc/hostname", config.name + "\n")
    _write(upper, "etc/hosts", f"127.0.0.1 localhost\n{node_ip} {config.name}\n")
    _write(upper, "etc/machine-id", uuid.uuid4().hex + "\n")
    _write(upper, "etc/resolv.conf", "# no DNS server is reachable from a dev real node\n")
    grub_default = Path(config.lower) / "etc/default/grub"
    if not grub_default.exists():
        _write(upper, "etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=0\nGRUB_DISTRIBUTOR="Debian"\n'
                                          'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n')
    (upper / "boot/grub").mkdir(parents=True, exist_ok=True)
    _write(upper, "etc/kubernetes/pki/ca.crt", ca.cert_pem)
    _write(upper, "etc/kubernetes/pki/kubelet-client.crt", client.cert_pem)
    _write(upper, "etc/kubernetes/pki/kubelet-client.key", client.key_pem, 0o600)
    _write(upper, "etc/kubernetes/kubelet.kubeconfig", yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "dev", "cluster": {"server": f"https://{gateway}:{config.apiserver_port}",
                                                 "certificate-authority": "/etc/kubernetes/pki/ca.crt"}}],
        "users": [{"name": config.name, "user": {"client-certificate": "/etc/kubernetes/pki/kubelet-client.crt",
                                                 "client-key": "/etc/kubernetes/pki/kubelet-client.key"}}],
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": config.name}}],
        "current-context": "dev",
    }))
    _write(upper, "etc/kubernetes/kubelet.yaml", yaml.safe_dump(kubelet_config(config)))
    _write(upper, "etc/containerd/config.toml", containerd_config(config))
    _write(upper, f"etc/containerd/certs.d/{config.registry}/hosts.toml",
           f'server = "http://{config.registry}"\n\n[host."http://{config.registry}"]\n'
           '  capabilities = ["pull", "resolve"]\n')
    _write(upper, "etc/cni/net.d/10-nodegate.conflist", json.dumps({
        "cniVersion": "0.4.0", "name": "nodegate-dev",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": net.pod_cidr(config.index)}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=1))


def kubelet_config(config: NodeConfig) -> dict[str, object]:
    out: dict[str, object] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        # This machine has cgroup v1 and no systemd: cgroupfs, under a root of the node's own.
        "cgroupDriver": "cgroupfs", "failCgroupV1": False, "cgroupRoot": f"/{config.cgroup_name}",
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"}},
        # Only clients with a certificate of the dev CA get here (the API server for logs and exec).
        "authorization": {"mode": "AlwaysAllow"},
        "podCIDR": config.network.pod_cidr(config.index),
        "failSwapOn": False, "resolvConf": "/etc/resolv.conf",
        # The node shares this machine's disk and memory: no evictions for what other nodes use.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False, "registerNode": True,
        "nodeStatusUpdateFrequency": "4s", "nodeStatusReportFrequency": "20s",
        "syncFrequency": "10s", "fileCheckFrequency": "10s",
        "shutdownGracePeriod": "0s", "localStorageCapacityIsolation": False,
        "enableControllerAttachDetach": True, "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False, "staticPodPath": "",
    }
    gates = feature_gates(os.environ.get(KUBELET_FEATURE_GATES_ENV, ""))
    if gates:
        out["featureGates"] = gates
    return out


def containerd_config(config: NodeConfig) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""# containerd of the NodeGate dev real node {config.name} (written by gate/devcluster/realnode.py)
version = 2
[plugins]
  [{cri}]
    # Root here lacks CAP_SYS_RESOURCE: without this every sandbox fails to start.
    restrict_oom_score_adj = true
    sandbox_image = "{config.registry}/{PAUSE_IMAGE}"
    [{cri}.containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [{cri}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [{cri}.containerd.runtimes.runc.options]
          SystemdCgroup = false
    [{cri}.cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
    [{cri}.registry]
      config_path = "/etc/containerd/certs.d"
"""


# -- the supervisor: boot, reboot, stop ------------------------------------------------------------------


class Supervisor:
    """Runs one real node: boots it, plugs in its network, boots it again after a reboot, stops it."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.net = config.network
        self.unshare: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.boots = 0

    def log(self, message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {self.config.name}: {message}", flush=True)

    def boot(self) -> subprocess.Popen[bytes]:
        c = self.config
        remove_cgroups(c.cgroup_name)
        create_cgroups(c.cgroup_name)
        (c.dir / "boot_id").write_text(str(uuid.uuid4()) + "\n")
        run_ip("link", "del", self.net.host_veth(c.index), check=False)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NODE_DIR": str(c.dir), "NODE_NAME": c.name,
               "NODE_LOWER": c.lower, "NODE_KUBELET": c.kubelet}
        console = open(c.dir / "console.log", "ab")
        # The node's processes start in its own cgroups, so stopping it can account for every one.
        proc = subprocess.Popen(
            ["unshare", "--mount", "--uts", "--pid", "--net", "--fork", "--kill-child=SIGKILL",
             "--propagation", "private",
             "/bin/sh", str(NODE_FILES / "prepare.sh")],
            env=env, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
            preexec_fn=lambda: _join_cgroups(c.cgroup_name),
        )
        console.close()
        init = self._child_of(proc.pid)
        (c.dir / "init.pid").write_text(f"{init}\n")
        veth = self.net.host_veth(c.index)
        run_ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(init))
        run_ip("link", "set", veth, "master", self.net.bridge, "up")
        for args in (("link", "set", "lo", "up"), ("addr", "add", f"{self.net.node_ip(c.index)}/24", "dev", "eth0"),
                     ("link", "set", "eth0", "up"),
                     # No default route: nothing on a node reaches past this machine. The Service
                     # range goes to the gateway, where the boot script's DNAT sends the API server's
                     # ClusterIP (a route must exist before that rule is consulted).
                     ("route", "add", SERVICE_CIDR, "via", self.net.gateway)):
            subprocess.run(["nsenter", f"--net=/proc/{init}/ns/net", "ip", *args], check=True, capture_output=True)
        # The machine reaches the node's pods (the API server calls a webhook that runs in one).
        run_ip("route", "replace", self.net.pod_cidr(c.index), "via", self.net.node_ip(c.index))
        self.boots += 1
        self.log(f"booted (boot {self.boots}, init pid {init} on this machine)")
        return proc

    def _child_of(self, pid: int, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                if children:
                    return int(children[0])
            time.sleep(0.01)
        raise RealNodeError(f"unshare (pid {pid}) started no node init within {timeout:.0f}s")

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        try:
            while not self.stopping:
                self.unshare = self.boot()
                code = self.unshare.wait()
                if self.stopping:
                    break
                cause = down_cause(code, self.config.dir / POWER_CUT_FILE)
                if cause is not None:
                    # Down, as a machine between its shutdown and its next boot: no veth, no cgroups.
                    clean_up(self.config)
                    self._stay_down(cause)
                    continue
                self.log(f"stopped by itself (exit {code}); see {self.config.dir / 'console.log'}")
                return 1
            return 0
        finally:
            self.cleanup()

    def _stay_down(self, cause: str) -> None:
        """Wait as the machine is down: REBOOT_SECONDS after a reboot, POWER_CUT_SECONDS after a power
        cut, and on top as long as a held boot says (`hold_boot`), until that hold is released."""
        c = self.config
        (c.dir / POWER_CUT_FILE).unlink(missing_ok=True)
        now = time.monotonic()
        deadline = now + (REBOOT_SECONDS if cause == "rebooted" else POWER_CUT_SECONDS)
        hold = c.dir / HOLD_BOOT_FILE
        held = read_hold(hold)
        held_until = now + held if held else 0.0
        self.log(f"{cause}: booting again in {max(deadline, held_until) - now:.0f}s"
                 + (f" (boot held for {held:.0f}s)" if held else ""))
        while not self.stopping and (time.monotonic() < deadline
                                     or (hold.exists() and time.monotonic() < held_until)):
            time.sleep(0.2)
        if held:
            hold.unlink(missing_ok=True)  # one boot is held, not every later one

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        if self.unshare is not None and self.unshare.poll() is None:
            with contextlib.suppress(RealNodeError, ProcessLookupError):
                # Killing a PID namespace's init kills every process in it, at once.
                os.kill(self._child_of(self.unshare.pid, timeout=1), signal.SIGKILL)

    def cleanup(self) -> None:
        c = self.config
        if self.unshare is not None and self.unshare.poll() is None:
            self.unshare.kill()
            self.unshare.wait()
        left = clean_up(c)
        self.log("stopped" + (f"; cgroups left: {left}" if left else ""))


def clean_up(config: NodeConfig) -> list[str]:
    """Make sure nothing of a stopped node is left on this machine: its processes (an init whose
    supervisor was killed), cgroups, veth and pod route. Returns what could not be removed."""
    with contextlib.suppress(RealNodeError, ProcessLookupError):
        os.kill(node_init_pid(config), signal.SIGKILL)
    left = remove_cgroups(config.cgroup_name)
    net = config.network
    run_ip("link", "del", net.host_veth(config.index), check=False)
    run_ip("route", "del", net.pod_cidr(config.index), check=False)
    return left


def _join_cgroups(name: str) -> None:
    pid = str(os.getpid())
    for path in cgroup_dirs(name):
        with contextlib.suppress(OSError):
            (path / "cgroup.procs").write_text(pid)


# -- what DevCluster calls --------------------------------------------------------------------------------


def check_suites(suites: Sequence[str]) -> None:
    """Refuse a release no node root is defined for, naming it and the known ones."""
    known = ", ".join(NODE_ROOTS)
    if not suites:
        raise RealNodeError(f"--real-node-os: real nodes need at least one Debian release ({known})")
    for suite in suites:
        if suite not in NODE_ROOTS:
            raise RealNodeError(f"--real-node-os: {suite!r} is not a Debian release a node root is defined for "
                                f"(known: {known})")


def prepare(suites: Sequence[str] = (DEFAULT_SUITE,), progress: Progress = print) -> tuple[dict[str, Path], Path]:
    """Build what real nodes need once per machine: the root of each Debian release in `suites`
    (bookworm, trixie) and their tools."""
    check_suites(suites)
    if reason := unsupported_reason():
        raise RealNodeError(reason)
    roots = {suite: ensure_root(NODE_ROOTS[suite], progress) for suite in dict.fromkeys(suites)}
    return roots, ensure_tools(progress)


def node_names(count: int) -> list[str]:
    return [f"{REAL_NODE_PREFIX}{i}" for i in range(count)]


def supervisor_argv(node_dir: Path) -> list[str]:
    return [sys.executable, "-m", "gate.devcluster.realnode", "supervise", str(node_dir)]


def supervisor_env() -> dict[str, str]:
    """The supervisor runs this source tree's realnode.py and node files (boot, prepare.sh), not those
    of wherever `gate` is installed: it starts in the state directory, where `-m` finds no source."""
    return {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PYTHONUNBUFFERED": "1"}


def in_node(config: NodeConfig, *argv: str, namespaces: str = "--mount --uts --pid --net") -> list[str]:
    """A command line that runs `argv` inside the running node (its init's namespaces)."""
    init = node_init_pid(config)
    return ["nsenter", "-t", str(init), *namespaces.split(), *argv]


def node_init_pid(config: NodeConfig) -> int:
    """The node's init as this machine sees it (PID 1 in the node), as its supervisor recorded it."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((config.dir / "init.pid").read_text())
        status = Path(f"/proc/{pid}/status").read_text()
        # A recycled pid would not be PID 1 of a namespace of its own.
        if status.split("NSpid:")[1].splitlines()[0].split()[-1] == "1":
            return pid
    raise RealNodeError(f"real node {config.name} is not running")


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - the supervisor process
    parser = argparse.ArgumentParser(prog="python -m gate.devcluster.realnode")
    sub = parser.add_subparsers(dest="command", required=True)
    sup = sub.add_parser("supervise", help="run one real node until SIGTERM")
    sup.add_argument("node_dir")
    args = parser.parse_args(argv)
    return Supervisor(NodeConfig.load(Path(args.node_dir))).run()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
