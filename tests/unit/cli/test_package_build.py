"""`nodegate package build` refuses what it must before any image tool runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.cli.main import main


def test_a_package_that_does_not_lint_clean_is_not_built(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "package.yaml").write_text("apiVersion: nodegate.io/v1alpha1\nkind: Package\nname: demo\n"
                                           "version: 1.0.0\nconfig: {keys: {mode: {type: enum}}}\n")
    (tmp_path / "Dockerfile").write_text("FROM busybox:1.37\nCOPY package.yaml /nodegate-package/package.yaml\n")
    assert main(["package", "build", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "config.keys.mode: a key of type enum needs its values in enum" in err
    assert f"error: {tmp_path} does not lint clean; not building its image" in err


def test_push_needs_a_running_dev_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "package.yaml").write_text("apiVersion: nodegate.io/v1alpha1\nkind: Package\nname: demo\n"
                                           "version: 1.0.0\n")
    (tmp_path / "Dockerfile").write_text("FROM busybox:1.37\nCOPY package.yaml /nodegate-package/package.yaml\n")
    assert main(["package", "build", str(tmp_path), "--push", "--state-dir", str(tmp_path / "no-cluster")]) == 2
    assert "--push needs the dev cluster's control plane" in capsys.readouterr().err
