"""The operator's signing key for its node records, and the signer the reconcilers use.

The key ring lives in a Secret of the operator's namespace (`OperatorSettings.state_key_secret`,
`nodegate-state-key` by default) that only the operator reads: RBAC gives it `get` and `patch` on that
one name, and `create` on Secrets of its namespace for the first start (RBAC cannot name an object
that does not exist yet). Each data entry is one key: its name is the key id, its value at least 32
random bytes; the greatest id signs (`gate.api.records.KeyRing`).

* **Loaded once**, when this replica first leads; a rotation takes effect at the next restart
  (docs/operations.md), when the leader signs every record of an older key with the newest before it
  starts work, so that the old key can then be removed. A standby never touches the Secret.
* **Created when missing**, with 32 random bytes, and marked `nodegate.io/adopt-records: pending`.
  Records on the nodes at that moment were written by an operator that did not sign (an upgrade):
  the leader signs every well-formed record of an existing gate it finds (trust on first use, one log
  line and one Event per gate), then removes the mark. A crash in between adopts again at the next
  start; once the mark is gone, an unsigned record is not the operator's.
"""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.records import Binding, KeyRing, KeyRingError, refusal, sign
from gate.api.state import NodeGateState
from gate.kube.client import SECRETS, KubeClient
from gate.kube.errors import Conflict, NotFound

log = logging.getLogger("nodegate.operator")


ADOPT_ANNOTATION = f"{keys.GROUP}/adopt-records"
"""On the key Secret: "pending" until the leader has signed the records an older operator left."""


class Signer:
    """Signs the records the operator writes and checks the ones it reads, for the gates the caches hold."""

    def __init__(self, ring: KeyRing, gate_uid: Callable[[str], str | None]) -> None:
        self.ring = ring
        self.gate_uid = gate_uid

    def sign(self, gate: NodeGate, node: Obj, state: NodeGateState) -> NodeGateState:
        uid = gate.metadata.uid
        if not uid:
            raise ValueError(f"NodeGate {gate.name} has no metadata.uid: its records cannot be bound to it")
        return sign(state, self.ring, _binding(gate.name, uid, node))

    def check(self, gate: str, node: Obj, state: NodeGateState) -> str | None:
        """Why the record is not the operator's, or None (`gate.controller.views.RecordCheck`)."""
        uid = self.gate_uid(gate)
        if uid is None:
            return f"NodeGate {gate} does not exist"
        return refusal(state, self.ring, _binding(gate, uid, node))


def needs_signing(signer: Signer, gate: str, node: Obj, state: NodeGateState, *, adopt: bool) -> bool:
    """Whether the leader signs this record anew before it starts work: one of its own signed with an
    older key (a rotation: the old key can then be removed), or, while adopting (`adopt`), one it did not
    write (trust on first use)."""
    if signer.check(gate, node, state) is None:
        return state.sig.partition(":")[0] != signer.ring.signing_id
    return adopt


def _binding(gate: str, gate_uid: str, node: Obj) -> Binding:
    meta = node.get("metadata") or {}
    return Binding(gate=gate, gate_uid=gate_uid, node=str(meta.get("name", "")), node_uid=str(meta.get("uid", "")))


def ring_of(secret: Obj, name: str) -> KeyRing:
    """The key ring in the Secret's data; a clear error naming the Secret and the key when it is unusable."""
    try:
        data = {kid: base64.b64decode(value, validate=True) for kid, value in (secret.get("data") or {}).items()}
        return KeyRing(data)
    except (KeyRingError, ValueError) as exc:
        raise KeyRingError(f"Secret {name}, the operator's record signing key: {exc}") from exc


def new_key_id(now: datetime) -> str:
    """Ids sort by time, so the newest key is the greatest id."""
    return now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


async def load_or_create(client: KubeClient, namespace: str, name: str) -> tuple[KeyRing, bool]:
    """The key ring, created when there is none; and whether the records on the nodes still wait for
    adoption (the Secret was just created, or the adoption after its creation did not finish)."""
    try:
        secret = await client.get(SECRETS, name, namespace)
    except NotFound:
        secret = None
    if secret is None:
        kid = new_key_id(datetime.now(UTC))
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {keys.MANAGED_BY_LABEL: keys.MANAGER},
                             "annotations": {ADOPT_ANNOTATION: "pending"}},
                "data": {kid: base64.b64encode(secrets.token_bytes(32)).decode()}}
        try:
            secret = await client.create(SECRETS, body, namespace)
            log.warning("Created the record signing key; secret=%s/%s key=%s", namespace, name, kid)
        except Conflict:
            secret = await client.get(SECRETS, name, namespace)  # another replica made it a moment ago
    pending = ((secret.get("metadata") or {}).get("annotations") or {}).get(ADOPT_ANNOTATION) == "pending"
    return ring_of(secret, name), pending


async def adoption_done(client: KubeClient, namespace: str, name: str) -> None:
    """From now on, an unsigned record is not the operator's."""
    await client.patch(SECRETS, name, {"metadata": {"annotations": {ADOPT_ANNOTATION: None}}}, namespace=namespace)
