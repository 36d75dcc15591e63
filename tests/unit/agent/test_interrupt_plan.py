"""Planning interrupts: daemon-reload before restarts, what restartAllServices leaves alone, reboot's command."""

from __future__ import annotations

import pytest

from gate.agent.errors import UsageError
from gate.agent.interrupt import plan_reboot, plan_restart_all, plan_service_restart, running_services

LISTING = """\
chrony.service            loaded active running chrony, an NTP client/server
containerd.service        loaded active running containerd container runtime
dbus.service              loaded active running D-Bus System Message Bus
getty@tty1.service        loaded active running Getty on tty1
kubelet.service           loaded active running kubelet: The Kubernetes Node Agent
systemd-journald.service  loaded active running Journal Service
user@0.service            loaded active running User Manager for UID 0
session-3.scope           loaded active running Session 3 of User root

"""


def test_service_restart_reloads_systemd_first_then_restarts_each_unit_once_in_order() -> None:
    plan = plan_service_restart(["tuned.service", "chrony.service", "tuned.service"])
    assert [c.label for c in plan] == ["systemctl daemon-reload", "systemctl restart tuned.service",
                                      "systemctl restart chrony.service"]


def test_a_service_interrupt_without_services_is_refused() -> None:
    with pytest.raises(UsageError, match="at least one --service"):
        plan_service_restart([])


def test_running_services_reads_unit_names_and_ignores_other_unit_types() -> None:
    assert running_services(LISTING) == ["chrony.service", "containerd.service", "dbus.service", "getty@tty1.service",
                                         "kubelet.service", "systemd-journald.service", "user@0.service"]


def test_restart_all_leaves_systemd_the_bus_and_logins_alone() -> None:
    plan = plan_restart_all(running_services(LISTING))
    assert [c.argv[-1] for c in plan] == ["chrony.service", "containerd.service", "kubelet.service"]


def test_reboot_goes_through_systemd_when_the_host_has_it() -> None:
    assert plan_reboot(True).argv == ("systemctl", "reboot")
    assert plan_reboot(False).argv == ("reboot",)
