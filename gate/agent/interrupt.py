"""`nodegate agent interrupt`: restart services or reboot the node, through the host's own systemd.

The operator merges the interrupts of every package on a node into one and runs it once. Commands run
chrooted into the host root, so they are the host's `systemctl` talking to the host's systemd over the
host's /run (the pod mounts the host root recursively and runs with hostPID).

A reboot ends this pod: systemd stops everything, the agent included. So the agent records success
*before* asking for the reboot, and counts its own death by the shutdown (SIGTERM while waiting, or
the reboot command killed under it) as success. Returning normally from a reboot request without
being killed within the wait is the failure: the node did not go down.

A reboot pod asks for its reboot once (`gate.agent.reboots`): given its pod's UID, the agent keeps on the
host the boot it asks on, and the same pod run again on a later boot by the kubelet ends its reboot step
with success and no second reboot.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, Final, Literal

from gate.agent import logs, reboots
from gate.agent.errors import HostError, UsageError
from gate.agent.host import INTERRUPT_LOGS, boot_id, check_root, resolve_in_root
from gate.agent.plan import HOST_PATH
from gate.agent.process import run_command
from gate.agent.summary import Summary, tail

InterruptType = Literal["service", "restartAllServices", "reboot"]
INTERRUPT_TYPES: Final[tuple[InterruptType, ...]] = ("service", "restartAllServices", "reboot")

# restartAllServices leaves these alone: restarting them breaks the machine's own plumbing (systemd's
# units, the system bus) or ends people's logins, and no host-layer change needs them restarted.
PROTECTED_UNITS: Final = (
    "systemd-*.service",
    "dbus.service",
    "dbus-broker.service",
    "user@*.service",
    "user-runtime-dir@*.service",
    "getty@*.service",
    "serial-getty@*.service",
    "console-getty.service",
    "container-getty@*.service",
)
LIST_RUNNING: Final = ("systemctl", "list-units", "--type=service", "--state=running", "--no-legend", "--plain")
DEFAULT_REBOOT_WAIT: Final = 600.0
COMMAND_TIMEOUT: Final = 600.0


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]

    @property
    def label(self) -> str:
        return " ".join(self.argv)


@dataclass(frozen=True)
class InterruptSettings:
    type: InterruptType
    root: Path
    services: tuple[str, ...] = ()
    reboot_wait: float = DEFAULT_REBOOT_WAIT
    pod: str | None = None  # the UID of the pod the reboot runs in: it reboots the node once (`gate.agent.reboots`)


@dataclass
class InterruptResult:
    summary: Summary
    commands: list[str] = field(default_factory=list)
    log_path: Path | None = None


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


def plan_service_restart(services: Sequence[str]) -> list[Command]:
    """daemon-reload first: a package may have changed unit files, and restart would use the old ones."""
    if not services:
        raise UsageError("an interrupt of type service needs at least one --service")
    return [Command(("systemctl", "daemon-reload"))] + [
        Command(("systemctl", "restart", unit)) for unit in _unique(services)
    ]


def running_services(listing: str) -> list[str]:
    """Unit names from `systemctl list-units --plain --no-legend` output (the first column)."""
    names = [line.split()[0] for line in listing.splitlines() if line.strip()]
    return [name for name in names if name.endswith(".service")]


def plan_restart_all(running: Sequence[str]) -> list[Command]:
    units = [u for u in _unique(running) if not any(fnmatch.fnmatchcase(u, p) for p in PROTECTED_UNITS)]
    return [Command(("systemctl", "restart", unit)) for unit in units]


def plan_reboot(has_systemctl: bool) -> Command:
    # Hosts without systemd still have a reboot(8); with systemd, `systemctl reboot` is the orderly way.
    return Command(("systemctl", "reboot")) if has_systemctl else Command(("reboot",))


def _on_host(root: Path, program: str) -> bool:
    return any(os.path.lexists(resolve_in_root(root, f"{d}/{program}")) for d in HOST_PATH.split(":"))


class ShutdownObserved(Exception):
    """The agent got SIGTERM after asking for a reboot: the node is going down as intended."""


def _raise_shutdown(signum: int, frame: FrameType | None) -> None:
    raise ShutdownObserved()


def run_interrupt(
    settings: InterruptSettings,
    report: Callable[[Summary], object],
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    echo: IO[str] | None = None,
) -> InterruptResult:
    """Carry out the interrupt; `report` writes a summary early (a reboot may not let us write later)."""
    check_root(settings.root, needs_shell=False, needs_chroot=True)
    if settings.type not in INTERRUPT_TYPES:
        raise UsageError(f"unknown interrupt type {settings.type!r}; use one of {', '.join(INTERRUPT_TYPES)}")
    has_systemctl = _on_host(settings.root, "systemctl")
    if settings.type != "reboot" and not has_systemctl:
        raise HostError(f"host root {settings.root} has no systemctl; cannot restart services")
    if settings.type == "reboot" and not has_systemctl and not _on_host(settings.root, "reboot"):
        raise HostError(f"host root {settings.root} has neither systemctl nor reboot")
    # Refused before anything is logged or run on the host.
    plan = plan_service_restart(settings.services) if settings.type == "service" else []
    if settings.pod is not None:
        reboots.checked_uid(settings.pod)

    started = time.monotonic()
    log_path = resolve_in_root(settings.root, INTERRUPT_LOGS) / logs.log_name(now(), settings.type)
    env = {"PATH": HOST_PATH, "HOME": "/root"}
    ran: list[str] = []

    def summary(ok: bool, message: str, failed: str | None = None, code: int | None = 0) -> Summary:
        return Summary(package="", version="", stage="interrupt", ok=ok, failed_step=failed, exit_code=code,
                       message=message, duration_seconds=time.monotonic() - started, interrupt=settings.type)

    with logs.RunLog(log_path, echo) as log:

        def run(command: Command) -> tuple[int, str]:
            log.line(f"Running {command.label} on the host.")
            ran.append(command.label)
            lines: list[str] = []  # all of it: the tail kept by run_command is too short for a unit listing

            def sink(line: str) -> None:
                lines.append(line)
                log.line(line, "  ")

            outcome = run_command(command.argv, env, "/", settings.root, COMMAND_TIMEOUT, sink)
            return outcome.returncode, "\n".join(lines)

        if settings.type == "reboot":
            result = _reboot(settings, has_systemctl, run, report, summary, log.line)
        elif settings.type == "restartAllServices":
            result = _restart_all(run, summary)
        else:
            result = _run_all(plan, run, summary)
        log.line(f"Finished interrupt {settings.type}: {'passed' if result.ok else 'FAILED'}.")
    _prune_interrupt_logs(log_path.parent)
    return InterruptResult(result, ran, log_path)


def _restart_all(run: Callable[[Command], tuple[int, str]], summary: Callable[..., Summary]) -> Summary:
    reload = Command(("systemctl", "daemon-reload"))
    code, out = run(reload)
    if code != 0:
        return summary(False, tail(out) or f"{reload.label} exited {code}", reload.label, code)
    listing = Command(LIST_RUNNING)
    code, out = run(listing)
    if code != 0:
        return summary(False, tail(out) or f"{listing.label} exited {code}", listing.label, code)
    return _run_all(plan_restart_all(running_services(out)), run, summary)


def _run_all(
    plan: list[Command],
    run: Callable[[Command], tuple[int, str]],
    summary: Callable[..., Summary],
) -> Summary:
    """Run every command even after a failure: one unit failing to restart must not leave the rest stale."""
    first_failure: tuple[Command, int, str] | None = None
    for command in plan:
        code, out = run(command)
        if code != 0 and first_failure is None:
            first_failure = (command, code, out)
        if code != 0 and command.argv[-1] == "daemon-reload":
            break  # restarting on stale unit files would be worse than not restarting
    if first_failure:
        command, code, out = first_failure
        return summary(False, tail(out) or f"{command.label} exited {code}", command.label,
                       128 - code if code < 0 else code)
    return summary(True, f"{len(plan)} commands passed")


def _reboot(
    settings: InterruptSettings,
    has_systemctl: bool,
    run: Callable[[Command], tuple[int, str]],
    report: Callable[[Summary], object],
    summary: Callable[..., Summary],
    say: Callable[[str], None],
) -> Summary:
    command = plan_reboot(has_systemctl)
    if settings.pod is not None:
        booted = boot_id(settings.root)
        asked = reboots.asked_on(settings.root, settings.pod)
        if asked is not None and booted is not None and asked != booted:
            say(f"This pod asked for its reboot on boot {asked}, and the node has booted since: not again.")
            return summary(True, f"the node rebooted after this pod asked for it on boot {asked} (now boot "
                           f"{booted}): this pod's reboot is done, and the node is not rebooted again")
        reboots.record(settings.root, settings.pod, booted or "")
    previous = {sig: signal.signal(sig, _raise_shutdown) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        # Written first: the shutdown may kill us before we could write anything afterwards.
        report(summary(True, "reboot requested; the shutdown ends this pod"))
        code, out = run(command)
        if code < 0:
            return summary(True, f"{command.label} was killed by the shutdown (signal {-code})")
        if code != 0:
            return summary(False, tail(out) or f"{command.label} exited {code}", command.label, code)
        say(f"Reboot accepted; waiting up to {settings.reboot_wait:g}s to be stopped by the shutdown.")
        deadline = time.monotonic() + settings.reboot_wait
        while time.monotonic() < deadline:
            time.sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))
        if settings.reboot_wait > 0:
            return summary(False, f"the node did not shut down within {settings.reboot_wait:g}s of {command.label}",
                           command.label, 1)
        return summary(True, f"{command.label} accepted the reboot")
    except ShutdownObserved:
        return summary(True, "stopped by the shutdown after the reboot was requested")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _prune_interrupt_logs(directory: Path, keep: int = logs.KEEP_RUNS) -> None:
    names = sorted((p for p in directory.glob("*.log") if p.is_file()), reverse=True)
    for old in names[keep:]:
        old.unlink(missing_ok=True)
