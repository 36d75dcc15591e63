"""Settings of `nodegate webhook serve`, in one place: defaults here, flags and env read here.

Every setting has a flag and an environment variable `NODEGATE_WEBHOOK_<NAME>` (flags win).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from gate.admission.rules.images import UNBOUND_CHOICES, ImagePolicy, PackageBindings, UnboundPackages, bindings

CertMode = Literal["self-managed", "files"]


@dataclass(frozen=True)
class WebhookSettings:
    listen: str = "0.0.0.0:9443"
    """host:port to serve TLS on."""
    cert_mode: CertMode = "self-managed"
    """self-managed: keep a CA and serving certificate in a Secret, rotate it and patch the caBundle;
    files: serve tls.crt/tls.key from cert_dir (cert-manager or a mounted Secret), reloaded on change."""
    cert_dir: str = "/tls"
    secret_namespace: str = "nodegate-system"
    secret_name: str = "nodegate-webhook-tls"
    hosts: tuple[str, ...] = ("nodegate-webhook", "nodegate-webhook.nodegate-system",
                              "nodegate-webhook.nodegate-system.svc",
                              "nodegate-webhook.nodegate-system.svc.cluster.local", "127.0.0.1")
    """SANs of the self-managed serving certificate."""
    configuration_name: str = "nodegate"
    """Validating- and MutatingWebhookConfiguration whose caBundle the self-managed mode keeps current."""
    operator_namespace: str = "nodegate-system"
    operator_service_account: str = "nodegate-operator"
    kubeconfig: str | None = None
    cert_check_seconds: float = 60.0
    """How often the certificate Secret (or the files) is re-read and rotation considered."""
    cert_propagation_seconds: float = 600.0
    """How long a new CA is trusted before the serving certificate moves to it."""
    sar_cache_seconds: float = 10.0
    """How long a SubjectAccessReview answer is reused, allowed and denied alike (0: never): a role
    granted or revoked takes up to this long to be seen by admission."""
    sar_cache_entries: int = 10_000
    """Most SubjectAccessReview answers kept; the least recently used go first."""
    sar_max_in_flight: int = 16
    """Most SubjectAccessReviews in flight to the API server at once, from the whole process."""
    sar_per_request: int = 4
    """Most SubjectAccessReviews in flight for one admission request (fairness: a write with
    thousands of checks queues at most this many ahead of another write's)."""
    max_body_bytes: int = 3 * 1024 * 1024
    """Largest request body: an AdmissionReview holds two objects of at most 1.5 MiB each."""
    max_bodies_bytes: int = 16 * 1024 * 1024
    """Most bytes of request bodies held at once (claimed by Content-Length before a body is read;
    a quarter kept for bodies of at most 64 KiB); a request that does not fit is answered 429.
    Parsed and judged, a body takes about 11 times its size (the largest gate, 1.39 MiB: 15.7 MiB),
    so the default holds at most about 180 MiB of reviews, well inside the chart's 512Mi limit."""
    allowed_image_repositories: tuple[str, ...] = ()
    """Registry hosts or repository prefixes package images must come from (gate/admission/rules/images.py:
    whole path components, names fully qualified); empty: any."""
    require_image_digest: bool = False
    """Package images must be pinned by digest (image@sha256:...)."""
    package_repositories: PackageBindings = ()
    """Package names bound to the repositories their images must come from, read as a JSON object
    `{"sysctl-tuning": ["ghcr.io/example/nodegate-sysctl-tuning"], ...}` (JSON: a repository may hold
    ':' and a list needs no separator of its own); empty: no package is bound. The chart binds its
    catalog (webhook.imagePolicy.packages)."""
    unbound_packages: UnboundPackages = "allow"
    """allow: a package name with no binding may use any image the other rules allow; refuse: refused."""
    log_level: str = "info"

    @property
    def image_policy(self) -> ImagePolicy:
        return ImagePolicy(self.allowed_image_repositories, self.require_image_digest, self.package_repositories,
                           self.unbound_packages)

    @property
    def operator_username(self) -> str:
        return f"system:serviceaccount:{self.operator_namespace}:{self.operator_service_account}"

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "0.0.0.0", int(port)

    @property
    def cert_files(self) -> tuple[Path, Path]:
        return Path(self.cert_dir, "tls.crt"), Path(self.cert_dir, "tls.key")


_HELP = {
    "listen": "host:port to serve TLS on",
    "cert_mode": "self-managed (Secret, rotation, caBundle) or files (cert-manager / mounted Secret)",
    "cert_dir": "directory with tls.crt and tls.key (files mode)",
    "secret_namespace": "namespace of the certificate Secret (self-managed mode)",
    "secret_name": "name of the certificate Secret (self-managed mode)",
    "hosts": "comma-separated SANs of the serving certificate (self-managed mode)",
    "configuration_name": "name of the webhook configurations whose caBundle to keep current",
    "operator_namespace": "namespace of the operator's ServiceAccount",
    "operator_service_account": "the operator's ServiceAccount (may remove the readiness taint)",
    "kubeconfig": "kubeconfig to use (default: in-cluster, else $KUBECONFIG)",
    "cert_check_seconds": "how often certificates are re-read and rotation considered",
    "cert_propagation_seconds": "how long a new CA is trusted before the serving certificate uses it",
    "sar_cache_seconds": "how long a SubjectAccessReview answer, allowed or denied, is reused (0: never)",
    "sar_cache_entries": "most SubjectAccessReview answers kept (least recently used dropped first)",
    "sar_max_in_flight": "most SubjectAccessReviews in flight to the API server at once",
    "sar_per_request": "most SubjectAccessReviews in flight for one admission request",
    "max_body_bytes": "largest request body accepted",
    "max_bodies_bytes": "most bytes of request bodies held at once (more: 429)",
    "allowed_image_repositories": "comma-separated registry hosts or repository prefixes package images must come "
                                  "from, e.g. ghcr.io/acme,registry.internal:5000 (empty: any)",
    "require_image_digest": "true: package images must carry an @sha256: digest",
    "package_repositories": "JSON object binding package names to the repositories their images must come from, "
                            "e.g. '{\"sysctl-tuning\": [\"ghcr.io/acme/sysctl-tuning\"]}' (empty: none bound)",
    "unbound_packages": "allow or refuse a package whose name has no binding",
    "log_level": "debug, info, warning or error",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for f in fields(WebhookSettings):
        flag = "--" + f.name.replace("_", "-")
        default = WebhookSettings.__dataclass_fields__[f.name].default
        shown = ",".join(default) if isinstance(default, tuple) else default
        kw: dict[str, Any] = {"default": None, "help": f"{_HELP[f.name]} (default {shown}; env {env_name(f.name)})"}
        if f.name == "cert_mode":
            kw["choices"] = ["self-managed", "files"]
        if f.name == "unbound_packages":
            kw["choices"] = list(UNBOUND_CHOICES)
        if isinstance(default, bool):
            kw.update(nargs="?", const="true", metavar="true|false")
        parser.add_argument(flag, dest=f.name, **kw)


def env_name(name: str) -> str:
    return "NODEGATE_WEBHOOK_" + name.upper()


def from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> WebhookSettings:
    """Flags win over environment variables, which win over the defaults."""
    env = dict(os.environ if environ is None else environ)
    values: dict[str, Any] = {}
    for f in fields(WebhookSettings):
        raw = getattr(args, f.name, None)
        if raw is None:
            raw = env.get(env_name(f.name))
        if raw is None:
            continue
        default = WebhookSettings.__dataclass_fields__[f.name].default
        if f.name == "package_repositories":
            values[f.name] = _package_repositories(str(raw))
        elif isinstance(default, tuple):
            values[f.name] = tuple(h.strip() for h in str(raw).split(",") if h.strip())
        elif isinstance(default, bool):
            values[f.name] = _boolean(f.name, str(raw))
        elif isinstance(default, int):
            values[f.name] = int(raw)
        elif isinstance(default, float):
            values[f.name] = float(raw)
        else:
            values[f.name] = str(raw)
    settings = WebhookSettings(**values)
    if settings.cert_mode not in ("self-managed", "files"):
        raise ValueError(f"cert mode must be self-managed or files, not {settings.cert_mode!r}")
    for name in ("sar_cache_entries", "sar_max_in_flight", "sar_per_request", "max_body_bytes"):
        if getattr(settings, name) < 1:
            raise ValueError(f"{env_name(name)} (--{name.replace('_', '-')}) must be at least 1, "
                             f"not {getattr(settings, name)}")
    if settings.max_bodies_bytes * 3 // 4 < settings.max_body_bytes:
        raise ValueError(f"{env_name('max_bodies_bytes')} ({settings.max_bodies_bytes}) must hold at least one "
                         f"largest body in three quarters of it (max_body_bytes {settings.max_body_bytes})")
    if settings.unbound_packages not in UNBOUND_CHOICES:
        raise ValueError(f"{env_name('unbound_packages')} (--unbound-packages) must be allow or refuse, "
                         f"not {settings.unbound_packages!r}")
    settings.host_port  # noqa: B018 - fail early on a malformed --listen
    settings.image_policy  # noqa: B018 - and on an allowed repository that is not one
    return settings


def _package_repositories(raw: str) -> PackageBindings:
    """The bindings of the JSON object `raw` ("" or "{}": none); a ValueError names the setting and the entry."""
    where = f"{env_name('package_repositories')} (--package-repositories)"
    if not raw.strip():
        return ()
    try:
        mapping = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not JSON ({exc}); expected an object such as "
                         '{"sysctl-tuning": ["ghcr.io/acme/sysctl-tuning"]}') from None
    if not isinstance(mapping, dict):
        raise ValueError(f"{where} must be a JSON object of package name to a list of repositories, "
                         f"not {type(mapping).__name__}")
    try:
        return bindings(mapping)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _boolean(name: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no", ""):
        return False
    raise ValueError(f"{env_name(name)} (--{name.replace('_', '-')}) must be true or false, not {raw!r}")


__all__ = ["WebhookSettings", "add_arguments", "from_args"]
