"""What keeps the API server from calling NodeGate's admission webhooks, as `nodegate status` says it.

A webhook configuration whose caBundle is empty cannot be called: the API server has nothing to verify
the webhook's certificate with, and every write that webhook checks (failurePolicy Fail) is refused
with "failed calling webhook". The caBundle is set at run time, never by the chart: by the
self-managed webhook when it starts, or by cert-manager's cainjector from the Certificate named in the
annotation `cert-manager.io/inject-ca-from`. So an empty one names who should have set it, and, for
cert-manager, what its Certificate says (missing CRDs, no status, not Ready and why).

Only configurations with webhooks named `*.nodegate.io` are read. A caller who may not list webhook
configurations gets no finding (the status's other parts do not need that permission).
"""

from __future__ import annotations

from gate.kube.client import MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS, KubeClient, Resource
from gate.kube.errors import ApiError, Forbidden, NotFound

INJECT_CA_FROM = "cert-manager.io/inject-ca-from"
CERTIFICATES = Resource("cert-manager.io", "v1", "certificates", True, "Certificate")


async def webhook_problems(client: KubeClient) -> list[str]:
    """One sentence per NodeGate webhook configuration the API server cannot call; [] when all can."""
    problems = []
    for res in (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS):
        try:
            configs, _ = await client.list(res)
        except Forbidden:
            return []
        for config in configs:
            hooks = [w for w in config.get("webhooks") or [] if str(w.get("name", "")).endswith(".nodegate.io")]
            empty = [str(w["name"]) for w in hooks if not (w.get("clientConfig") or {}).get("caBundle")]
            if not empty:
                continue
            name = config["metadata"]["name"]
            message = (f"admission webhook: {res.kind} {name} has no caBundle for {', '.join(empty)}, so the "
                       "API server cannot verify the webhook and refuses every write it checks")
            source = (config["metadata"].get("annotations") or {}).get(INJECT_CA_FROM)
            if source:
                message += f"; cert-manager's cainjector fills it from Certificate {source}: " + \
                    await _certificate_state(client, source)
            else:
                message += "; the self-managed webhook sets it when it starts: is it running?"
            problems.append(message)
    return problems


async def _certificate_state(client: KubeClient, source: str) -> str:
    namespace, _, name = source.partition("/")
    try:
        cert = await client.get(CERTIFICATES, name, namespace)
    except NotFound as exc:
        if f'"{name}" not found' in exc.message:
            return "it does not exist"
        # the resource itself is unknown: 404 "the server could not find the requested resource"
        return "this cluster does not serve cert-manager.io/v1 Certificates (are cert-manager's CRDs installed?)"
    except ApiError as exc:
        return f"reading it failed ({exc.message})"
    conditions = {c.get("type"): c for c in (cert.get("status") or {}).get("conditions") or []}
    ready = conditions.get("Ready")
    if ready is None:
        return "it has no status yet (is cert-manager's controller running?)"
    if ready.get("status") == "True":
        return "it is Ready (is cert-manager's cainjector running?)"
    return f"it is not Ready ({ready.get('reason', '')}: {ready.get('message', '')})"


__all__ = ["CERTIFICATES", "INJECT_CA_FROM", "webhook_problems"]
