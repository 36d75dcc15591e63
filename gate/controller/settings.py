"""Every operator setting in one place: documented defaults, read from flags and environment once.

Each field's environment variable is `NODEGATE_<FIELD IN UPPER CASE>`; a flag of the same name in
kebab case wins over the environment.
"""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from gate import __version__


@dataclass(frozen=True)
class OperatorSettings:
    namespace: str = field(default="nodegate-system", metadata={
        "help": "namespace of the operator: stage pods, ConfigMaps, the leader Lease and Events live here"})
    kubeconfig: str | None = field(default=None, metadata={
        "help": "kubeconfig to use; in a pod the service account is used when unset"})
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}", metadata={
        "help": "this replica's name in the leader Lease (default: hostname-pid)"})
    lease_name: str = field(default="nodegate-operator", metadata={"help": "name of the leader election Lease"})
    state_key_secret: str = field(default="nodegate-state-key", metadata={
        "help": "Secret of the operator's namespace holding the keys that sign its node records "
                "(created at first start; docs/security.md)"})
    revision_history_limit: int = field(default=10, metadata={
        "help": "previous specs kept per NodeGate as ControllerRevisions for `nodegate rollout history/undo`, "
                "besides the current one (10, as a DaemonSet's revisionHistoryLimit)"})
    lease_seconds: int = field(default=15, metadata={"help": "lease duration; a standby takes over after it"})
    renew_seconds: float = field(default=5.0, metadata={"help": "how often the leader renews the lease"})
    renew_deadline: float = field(default=10.0, metadata={
        "help": "the leader stops all work, and refuses its own writes, this long after it sent its last "
                "successful renewal; lease-seconds minus this is the margin before a standby may lead"})
    agent_image: str = field(default=f"ghcr.io/nodegate/nodegate:{__version__}", metadata={
        "help": "image of the agent container in stage pods (NodeGate's own image)"})
    package_service_account: str = field(default="nodegate-package", metadata={
        "help": "service account of package pods (no API access is needed; its token is not mounted)"})
    resolve_digests: bool = field(default=True, metadata={
        "help": "resolve each package's tagged image to a digest once per rollout, record it in the gate's status "
                "and pull it by digest (IfNotPresent); false: pull tags with imagePullPolicy Always, for "
                "clusters whose operator cannot reach the registry (a tag pushed again mid-rollout may then run "
                "on some nodes)"})
    resolve_timeout: float = field(default=15.0, metadata={
        "help": "seconds one image resolution (token and manifest requests together) may take"})
    registry_token_hosts: str = field(default="auth.docker.io", metadata={
        "help": "comma-separated hosts, besides a registry's own, that its Bearer token realm may name; the pull "
                "credentials go to no other (Docker Hub's realm is auth.docker.io; docs/security.md)"})
    registry_plain_http: str = field(default="", metadata={
        "help": "comma-separated registries (host:port, as images name them) the operator speaks plain HTTP to, as "
                "the nodes' containerd is configured to pull from them (the dev cluster's registry at its nodes' "
                "gateway); no pull credentials are sent to them. Besides these, only the loopback is plain HTTP"})
    image_signatures: str = field(default="", metadata={
        "help": "YAML file of the image signature policy (mode, unmatched, rules of repositories and the public keys "
                "that must have signed them): every package image digest is verified before any node is cordoned "
                "for it; read at start (a file that does not parse stops the start) and again when it changes; "
                "empty: no policy, nothing is verified (docs/supply-chain.md)"})
    prometheus_endpoints: str = field(default="", metadata={
        "help": "YAML file of the Prometheus endpoints a DeploymentPolicy may name (name: {url, caFile, "
                "insecureSkipVerify, bearerTokenFile}); read again when it changes; empty: none, and a policy's "
                "Prometheus signal is never asked (docs/operations.md)"})
    workers: int = field(default=16, metadata={"help": "node reconciles run concurrently"})
    metrics_port: int = field(default=8080, metadata={"help": "port of /metrics, /healthz and /readyz (0: off)"})
    metrics_host: str = field(default="0.0.0.0", metadata={"help": "address /metrics listens on"})
    image_pull_grace: float = field(default=120.0, metadata={
        "help": "seconds a stage pod may fail to pull its image before the stage fails"})
    pending_timeout: float = field(default=600.0, metadata={
        "help": "seconds a stage pod may stay pending before the stage fails"})
    reboot_timeout: float = field(default=900.0, metadata={
        "help": "seconds a rebooted node has to come back with a new boot ID and Ready"})
    prepull_concurrency: int = field(default=10, metadata={
        "help": "prepull pods pulling at once over the whole fleet: the images of a round that cordons are pulled "
                "onto its node while it still serves, and its cordon waits for them (0: off; docs/operations.md)"})
    prepull_ahead: int = field(default=10, metadata={
        "help": "per gate, how many nodes ahead in pick order get their next round's images pulled ahead"})
    staging_concurrency: int = field(default=10, metadata={
        "help": "staging and undo pods running at once over the whole fleet: a round that cordons first runs its "
                "packages' serving steps on the serving node, and cordons once they succeeded (0: off; "
                "docs/concepts.md#stage-while-serving)"})
    staging_ahead: int = field(default=3, metadata={
        "help": "per gate, how many nodes ahead in pick order get their next round's serving steps staged"})
    poll_seconds: float = field(default=5.0, metadata={
        "help": "how often to look again at nodes waiting on pods, drains or reboots"})
    health_poll_seconds: float = field(default=15.0, metadata={
        "help": "how often the Prometheus health query of a soaking node is asked again (DeploymentPolicy health)"})
    health_queries: int = field(default=8, metadata={
        "help": "Prometheus health queries in flight at once, across all soaking nodes"})
    resync_seconds: float = field(default=300.0, metadata={
        "help": "every gate is reconciled at least this often even without events"})
    event_loop: str = field(default="uvloop", metadata={
        "help": "uvloop (libuv's event loop and TLS, the faster) or asyncio "
                "(the standard library's)"})
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING or ERROR"})
    log_format: str = field(default="text", metadata={"help": "text or json"})

    def pin_agent_image(self, pinned: str) -> None:
        """The agent image by digest, once the operator resolved its tag under an image signature policy
        (`gate.controller.images`): the one setting changed after start, once per process, so that every
        stage and prepull pod made from then on pulls the digest that was verified, not the tag."""
        object.__setattr__(self, "agent_image", pinned)

    @property
    def plain_http_registries(self) -> tuple[str, ...]:
        return tuple(h.strip().lower() for h in self.registry_plain_http.split(",") if h.strip())

    @property
    def token_hosts(self) -> tuple[str, ...]:
        return tuple(h.strip().lower() for h in self.registry_token_hosts.split(",") if h.strip())

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            default = None if f.default is MISSING else f.default
            kind = _kind(f.type)
            helptext = f.metadata.get("help", "")
            env = f"NODEGATE_{f.name.upper()}"
            parser.add_argument(flag, type=kind, default=None,
                                help=f"{helptext} (env {env}; default {default!r})")

    @classmethod
    def from_args(cls, args: argparse.Namespace | None = None, env: dict[str, str] | None = None) -> OperatorSettings:
        env = dict(os.environ if env is None else env)
        values: dict[str, Any] = {}
        for f in fields(cls):
            flag_value = getattr(args, f.name, None) if args is not None else None
            env_value = env.get(f"NODEGATE_{f.name.upper()}")
            if flag_value is not None:
                values[f.name] = flag_value
            elif env_value is not None:
                values[f.name] = _kind(f.type)(env_value)
        return cls(**values)


def _bool(text: str) -> bool:
    """A flag's or environment variable's true/false (also 1/0, yes/no, on/off)."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not true or false")


def _kind(annotation: object) -> Any:
    text = str(annotation)
    if text == "bool":
        return _bool
    if "int" in text and "str" not in text:
        return int
    if "float" in text:
        return float
    return str
