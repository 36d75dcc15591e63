"""A pod's steps in turn, though its containers start together.

The kubelet starts a pod's init containers one after another, and on its default (generic) PLEG
each one only at the relist after the one before ended: a second per step, on a node that is out of
service. So the operator makes the steps of a round that must run one after another the pod's
containers, started together (`gate.controller.steporder.in_turn`), and each waits here for its turn:
step `i` runs once step `i - 1` has recorded its end with success. A step whose predecessor failed
runs nothing, touches nothing on the host, and exits with `NOT_RUN`: the pod's failure is still the
first step that did not succeed, in the steps' order (`gate.controller.pods.stage_pod_view`), as in
a chain of init containers.

A pod that ends with a reboot keeps its steps in a chain of init containers (`gate.controller.steporder`
says why). The record is a file per step in an emptyDir of the pod (`TURNS_DIR`): it lives as long as the pod,
a retry is a new pod with an empty one, and only the pod's agent containers mount it (a payload copy,
which runs the package image's `cp`, does not). A step that dies without a record (killed, its node
gone) leaves the steps after it waiting: the pod's deadline bounds them, and the operator ends the
pod as soon as it reads the first step's failure.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Final

TURNS_DIR: Final = "/nodegate-turns"
NOT_RUN: Final = 3  # the exit code of a step whose predecessor did not succeed: it ran nothing
_POLL_SECONDS: Final = 0.05
_OK: Final = "ok"


def _record(directory: Path, index: int) -> Path:
    return directory / str(index)


def wait_for_turn(directory: Path, index: int, poll: float = _POLL_SECONDS) -> bool:
    """Wait until step `index - 1` recorded its end; whether it succeeded. The first step's turn is at
    once. No bound of its own: the pod's activeDeadlineSeconds bounds every step of it, waiting or not."""
    if index <= 0:
        return True
    record = _record(directory, index - 1)
    while True:
        try:
            return record.read_text() == _OK
        except FileNotFoundError:
            time.sleep(poll)


def end_turn(directory: Path, index: int, ok: bool) -> None:
    """Record step `index`'s end, whole or not at all (written aside, then renamed), for the step after it."""
    directory.mkdir(parents=True, exist_ok=True)  # the pod's emptyDir is there; by hand it may not be
    record = _record(directory, index)
    aside = record.with_name(f".{record.name}.tmp")
    aside.write_text(_OK if ok else "failed")
    os.replace(aside, record)
