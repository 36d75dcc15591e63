"""The JSON summary a stage or interrupt leaves in the pod's termination message.

Kubernetes keeps at most 4096 bytes of a termination message, and cuts longer ones wherever the limit
falls, which would leave the operator unparseable JSON. So the summary is rendered to fit: the
message (the tail of the failing output, where the reason usually is) gives way first.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

TERMINATION_MESSAGE_LIMIT: Final = 4096
# Some headroom below the limit: the kubelet counts bytes, and we keep a margin for a trailing newline.
_BUDGET: Final = TERMINATION_MESSAGE_LIMIT - 96
_ELLIPSIS: Final = "…"


@dataclass(frozen=True)
class Summary:
    package: str
    version: str
    stage: str
    ok: bool
    failed_step: str | None = None
    exit_code: int | None = None
    message: str = ""
    duration_seconds: float = 0.0
    interrupt: str | None = None  # set for `agent interrupt`: the interrupt type that ran
    # Set for a staging (`--part serving`): the node's boot ID when it ended, so that the operator knows
    # a reboot since (`gate.lifecycle.staging`: a staged node that reboots on its own).
    boot_id: str | None = None

    def to_wire(self) -> dict[str, object]:
        names = {"failed_step": "failedStep", "exit_code": "exitCode", "duration_seconds": "durationSeconds",
                 "boot_id": "bootId"}
        out = {names.get(k, k): v for k, v in asdict(self).items()}
        out["durationSeconds"] = round(self.duration_seconds, 3)
        for optional in ("interrupt", "bootId"):
            if out[optional] is None:
                del out[optional]
        return out


def _encode(wire: dict[str, object]) -> bytes:
    return json.dumps(wire, separators=(",", ":"), ensure_ascii=False).encode()


def render(summary: Summary, limit: int = _BUDGET) -> str:
    """The summary as compact JSON of at most `limit` bytes, keeping the end of the message."""
    wire = summary.to_wire()
    encoded = _encode(wire)
    if len(encoded) <= limit:
        return encoded.decode()
    # Keep characters from the end while they fit; JSON escapes make a character cost 1 to 6 bytes,
    # so the room is measured on each character's encoded form, not on the character count.
    room = limit - len(_encode({**wire, "message": _ELLIPSIS}))
    kept: list[str] = []
    for char in reversed(summary.message):
        room -= len(json.dumps(char, ensure_ascii=False).encode()) - 2
        if room < 0:
            break
        kept.append(char)
    wire["message"] = _ELLIPSIS + "".join(reversed(kept))
    encoded = _encode(wire)
    if len(encoded) > limit:
        # Only reachable with absurd names (package.yaml bounds them); still return valid JSON.
        wire |= {"message": "", "failedStep": (summary.failed_step or "")[:256] or None,
                 "package": summary.package[:256], "version": summary.version[:128]}
        encoded = _encode(wire)
    return encoded.decode()


def tail(text: str, max_chars: int = 3000) -> str:
    """The last lines of `text` that fit `max_chars`, where a failure usually explains itself."""
    text = text.rstrip()
    if len(text) <= max_chars:
        return text
    cut = text[-max_chars:]
    newline = cut.find("\n")
    return cut[newline + 1 :] if 0 <= newline < len(cut) - 1 else cut


def write_termination_message(path: Path | None, summary: Summary) -> str:
    """Write the summary where Kubernetes reads the termination message; print it either way."""
    text = render(summary)
    print(f"nodegate summary: {text}", flush=True)
    if path is None:
        return text
    try:
        path.write_text(text)
    except OSError as exc:  # outside a pod the default path may not be writable: the log line above suffices
        print(f"warning: could not write the termination message to {path}: {exc}", file=sys.stderr)
    return text
