"""What a stage pod runs, as one comparable value: the part of a pod the operator builds (pure: no I/O).

A stage pod is privileged and its containers' ends are stage results, so the operator counts only a
pod it made, running what it built (`gate.lifecycle.ownership`). Its "shape" is the projection of a
pod onto what decides what runs and how the operator reads it:

* every container (init, regular and ephemeral, in order): name, image, command, args, env and
  envFrom, working directory, mounts and devices, security context, lifecycle hooks, stdin/tty;
* the pod: node, host namespaces, volumes, service account and its token, security context, runtime
  class, deadline;
* the labels and annotations under `nodegate.io/` (the steps, round and attempt the result is read
  by, the node facts the agent reads through the Downward API).

Decisions:

* **Fields, not the whole spec.** The API server fills defaults in (`imagePullPolicy`,
  `terminationMessagePath`, a volume's `defaultMode`, a fieldRef's `apiVersion`) and other
  controllers may add labels and annotations of their own; none of that is what the operator built.
  A field the list leaves out is one that decides nothing about what runs (tolerations, resources).
* **Two comparisons.** A pod the operator created is recorded with the digest of its shape as the API
  server returned it (`shape_digest`), and compared with that digest on every look: any later change
  of an image (the one container field that may change on a live pod), a label or an annotation
  shows. A pod found under a name the operator was about to use (a crash between the create and the
  record) is compared with what the operator builds now (`shape_differences`), a field the operator
  left empty matching only an empty one, and only the defaults the server fills in (`_DEFAULTED`)
  matching what the manifest left out.
* **Taken again only when it may have changed.** The cache takes the digest at every event of a stage
  pod, and most are the kubelet's status updates, which cannot touch the shape: a pod's copy keeps its
  `shape_basis` beside the digest, and the next copy of the same pod reuses the digest when its basis
  is equal (`digest_since`). The basis holds what may differ between two copies of one pod: the uid
  (another pod under the name), the `metadata.generation` (the API server bumps it at every change of
  the pod's spec from Kubernetes 1.34 on: PodObservedGenerationTracking, GA in 1.35), the fields of the
  shape a live pod's spec may change on any version (its containers' images, its ephemeral containers,
  its deadline), its node, and its `nodegate.io/` labels and annotations. Every other field of the
  shape is immutable on a live pod (the API server's pod update validation), so even where the
  generation stays put, a copy with the same basis has the same shape.
"""

from __future__ import annotations

import hashlib
import json

from gate.api import keys
from gate.api.common import Obj
from gate.api.facts import FACTS_ANNOTATION

SHAPE_FIELD = f"{keys.GROUP}/shape"
"""Where the operator's pod cache keeps a pod's shape digest (`gate.controller.pods.stage_pod_fields`),
computed from the whole pod before the cache drops its containers' specs."""
BASIS_FIELD = f"{keys.GROUP}/shape-basis"
"""Where the cache keeps the `shape_basis` the digest under `SHAPE_FIELD` was taken with."""
BUILT_FIELD = f"{keys.GROUP}/built"
"""Where the cache keeps a staging or undo pod's `built_digest` (taken with the same basis)."""
SIGNATURE_ANNOTATION = f"{keys.GROUP}/signature"
"""On a staging or undo pod: the operator's signature of its name and `built_digest`
(`gate.api.records.sign_pod`). Not part of any digest."""

_CONTAINER_FIELDS = ("name", "image", "command", "args", "env", "envFrom", "workingDir", "volumeMounts",
                     "volumeDevices", "securityContext", "lifecycle", "stdin", "stdinOnce", "tty", "restartPolicy")
_POD_FIELDS = ("nodeName", "hostPID", "hostNetwork", "hostIPC", "hostUsers", "shareProcessNamespace", "volumes",
               "serviceAccountName", "automountServiceAccountToken", "securityContext", "runtimeClassName",
               "activeDeadlineSeconds")
_PREFIX = f"{keys.GROUP}/"
# The keys the API server fills in inside the fields above when a manifest leaves them out: a volume's
# (and a projection's) `defaultMode`, a fieldRef's `apiVersion`. Any other key the manifest did not set
# is a difference: a `subPath` on the host mount, a `valueFrom` on an env entry.
_DEFAULTED = frozenset({"defaultMode", "apiVersion"})


def _ours(mapping: object) -> Obj:
    return {k: v for k, v in sorted((mapping or {}).items()) if k.startswith(_PREFIX)} \
        if isinstance(mapping, dict) else {}


def pod_shape(pod: Obj) -> Obj:
    """The projection of `pod` that `shape_digest` hashes; absent fields are None."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    containers = {kind: [{f: c.get(f) for f in _CONTAINER_FIELDS} for c in spec.get(kind) or []]
                  for kind in ("initContainers", "containers", "ephemeralContainers")}
    return {"labels": _ours(meta.get("labels")), "annotations": _ours(meta.get("annotations")),
            **containers, **{f: spec.get(f) for f in _POD_FIELDS}}


def shape_digest(pod: Obj) -> str:
    """A digest of the pod's shape: equal for two pods that run the same thing the same way."""
    blob = json.dumps(pod_shape(pod), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def built_digest(pod: Obj) -> str:
    """A digest of the pod's shape as the operator built it, equal for its manifest and for the pod the API
    server stores from it: the keys the server fills in (`_DEFAULTED`) and empty values are left out, and
    so is the signature annotation. What a staging or undo pod's signature covers: such a pod is signed in
    its create (no write after it), so before the server's defaults are in."""
    shape = pod_shape(pod)
    shape["annotations"] = {k: v for k, v in shape["annotations"].items() if k != SIGNATURE_ANNOTATION}
    blob = json.dumps(_as_built(shape), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def _as_built(value: object) -> object:
    if isinstance(value, dict):
        kept = {k: _as_built(v) for k, v in value.items() if k not in _DEFAULTED}
        return {k: v for k, v in kept.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_as_built(v) for v in value]
    return value


def built_shape(pod: Obj) -> str:
    """The `built_digest` of a staging or undo pod, whole or as the cache keeps it."""
    return str(pod.get(BUILT_FIELD) or built_digest(pod))


def recorded_shape(pod: Obj) -> str:
    """The shape digest of a stage pod, whole or as the cache keeps it."""
    return str(pod.get(SHAPE_FIELD) or shape_digest(pod))


def shape_basis(pod: Obj) -> tuple[object, ...]:
    """What may differ between two copies of one pod whose shapes differ (see the module's docstring):
    equal for the copies of a pod that only its status (or a key not under `nodegate.io/`) told apart."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    return (meta.get("uid"), meta.get("generation"), _ours(meta.get("labels")), _ours(meta.get("annotations")),
            tuple(c.get("image") for c in spec.get("initContainers") or ()),
            tuple(c.get("image") for c in spec.get("containers") or ()),
            spec.get("ephemeralContainers"), spec.get("activeDeadlineSeconds"), spec.get("nodeName"))


def digest_since(pod: Obj, previous: Obj | None) -> tuple[str, tuple[object, ...]]:
    """(the pod's `shape_digest`, its `shape_basis`), the digest taken from `previous` (the cache's copy of
    the pod before this one, with its `SHAPE_FIELD` and `BASIS_FIELD`) when the basis is the same."""
    basis = shape_basis(pod)
    if previous is not None and previous.get(BASIS_FIELD) == basis and isinstance(previous.get(SHAPE_FIELD), str):
        return previous[SHAPE_FIELD], basis
    return shape_digest(pod), basis


def shape_differences(built: Obj, live: Obj) -> list[str]:
    """Where the live pod does not run what `built` (the operator's manifest) says: the paths that differ,
    empty when it does. The API server's defaults in `live` (a key `built` does not set inside an object
    it does set) are no difference; anything else is, a list of another length among them.

    The node facts annotation is left out of this comparison (not of the recorded digest): it is a
    snapshot of the node's labels and annotations taken when the pod was built, and they change while
    other gates work on the same node (their status labels), so the pod the operator created a moment
    before would differ from the one it builds now. The facts are data a step reads, not what runs; a
    pod with host access under a stage pod's name can only come from the operator's ServiceAccount (the
    chart's host-access policy), and every other field must still match."""
    out: list[str] = []
    want, have = pod_shape(built), pod_shape(live)
    for shape in (want, have):
        shape["annotations"] = {k: v for k, v in shape["annotations"].items() if k != FACTS_ANNOTATION}
    _compare(want, have, "", out)
    return out


def _compare(want: object, have: object, path: str, out: list[str]) -> None:
    if isinstance(want, dict) and isinstance(have, dict):
        for key, value in want.items():
            _compare(value, have.get(key), f"{path}.{key}" if path else key, out)
        out.extend(f"{path}.{k}" if path else k for k in have
                   if k not in want and k not in _DEFAULTED and have[k] not in (None, {}, [], False))
        return
    if isinstance(want, list) and isinstance(have, list) and len(want) == len(have):
        for i, (w, h) in enumerate(zip(want, have, strict=True)):
            _compare(w, h, f"{path}[{i}]", out)
        return
    if want in (None, {}, []) and have in (None, {}, []):
        return  # the API server leaves an empty list or object out
    if want != have:
        out.append(path)
