"""Host paths seen from the pod: symlinks are followed as the host would follow them, never out of the root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gate.agent.errors import HostError
from gate.agent.host import PackageLayout, check_root, resolve_in_root


def test_an_absolute_symlink_on_the_host_resolves_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "usr/lib/sysctl.d").mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/sysctl.d").symlink_to("/usr/lib/sysctl.d")
    assert resolve_in_root(tmp_path, "/etc/sysctl.d/90.conf") == tmp_path / "usr/lib/sysctl.d/90.conf"


def test_relative_symlinks_and_dotdot_never_climb_above_the_root(tmp_path: Path) -> None:
    (tmp_path / "var").mkdir()
    (tmp_path / "var/up").symlink_to("../../../../etc")
    assert resolve_in_root(tmp_path, "/var/up/passwd") == tmp_path / "etc/passwd"
    assert resolve_in_root(tmp_path, "/../../etc/shadow") == tmp_path / "etc/shadow"


def test_missing_components_are_kept_so_the_path_can_be_created(tmp_path: Path) -> None:
    assert resolve_in_root(tmp_path, "/var/lib/nodegate/g/p") == tmp_path / "var/lib/nodegate/g/p"


def test_a_symlink_loop_is_an_error_not_a_hang(tmp_path: Path) -> None:
    os.symlink("/b", tmp_path / "a")
    os.symlink("/a", tmp_path / "b")
    with pytest.raises(HostError, match="too many symlinks"):
        resolve_in_root(tmp_path, "/a/x")


def test_a_missing_root_or_one_without_a_shell_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HostError, match="does not exist or is not a directory"):
        check_root(tmp_path / "nope", needs_shell=False)
    with pytest.raises(HostError, match="has no /bin/sh"):
        check_root(tmp_path, needs_shell=True)
    check_root(tmp_path, needs_shell=False)


def test_chrooting_without_root_privileges_is_refused_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/sh").write_text("")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(HostError, match="needs root: run the agent privileged"):
        check_root(tmp_path, needs_shell=True)
    check_root(tmp_path, needs_shell=False)  # an overlay-only package copies files, no chroot


def test_the_layout_separates_gates_and_packages() -> None:
    layout = PackageLayout(Path("/host"), "gpu-base", "module-blocklist")
    assert str(layout.host_package_dir("1.0.0")) == "/var/lib/nodegate/gpu-base/module-blocklist/package/1.0.0"
    assert str(layout.host_log_dir) == "/var/log/nodegate/gpu-base/module-blocklist"
    assert layout.history_file == Path("/host/var/lib/nodegate/gpu-base/module-blocklist/history.json")
