"""The digest of a package's config as a stage pod receives it: one rule for the operator and the agent.

The operator renders a package's config into a ConfigMap and puts this digest of it into the stage
pod's spec (`agent run --config-digest`); the agent computes it again over the files it finds in the
mounted ConfigMap and refuses to run on a mismatch. So a ConfigMap replaced, swapped or created ahead
under the content-addressed name never reaches the host unnoticed: the pod spec that carries the
digest cannot be changed after its creation (the chart's host-access policy).

Full SHA-256, not the 16-hex-digit hashes of the node state (`gate.api.state.config_hash`): those
detect change, this one must resist someone who writes a ConfigMap to match it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def config_digest(files: Mapping[str, bytes]) -> str:
    """`sha256:<hex>` over every key and the bytes of its value; no two configs share one (a key's
    value is hashed on its own, and the keys with their hashes are one canonical JSON text)."""
    each = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    blob = json.dumps(each, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def text_config_digest(config: Mapping[str, str]) -> str:
    """The digest of a gate's `config` (text values, as a ConfigMap's `data` holds and its volume
    writes them: UTF-8)."""
    return config_digest({name: text.encode() for name, text in config.items()})
