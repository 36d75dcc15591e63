"""`agent run` reads flags and environment in one place; a flag wins over its variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.cli.agent import stage_settings
from gate.cli.errors import CliError
from gate.cli.main import parser


def parse(*args: str):  # type: ignore[no-untyped-def]
    return parser().parse_args(["agent", "run", *args])


def test_flags_win_over_the_operators_environment() -> None:
    env = {"NODEGATE_STAGE": "config", "NODEGATE_PACKAGE": "env-pkg", "NODEGATE_VERSION": "9.9.9",
           "NODEGATE_GATE": "env-gate", "NODEGATE_PREVIOUS_VERSION": "0.1.0", "NODEGATE_GENERATION": "7"}
    settings = stage_settings(parse("--stage", "upgrade", "--package", "flag-pkg", "--version", "1.0.0",
                                    "--generation", "3", "--previous-version", "0.9.0"), env)
    r = settings.request
    assert (r.stage, r.package, r.version, r.gate, r.generation, r.previous_version) == (
        "upgrade", "flag-pkg", "1.0.0", "env-gate", 3, "0.9.0")
    assert settings.environ == env


def test_the_environment_fills_in_missing_flags() -> None:
    env = {"NODEGATE_STAGE": "apply", "NODEGATE_PACKAGE": "p", "NODEGATE_VERSION": "1.0.0", "NODEGATE_GATE": "g"}
    settings = stage_settings(parse("--root", "/r", "--payload", "/p", "--config-dir", "/c"), env)
    assert (settings.request.stage, settings.request.generation) == ("apply", 0)
    assert (settings.root, settings.payload, settings.config_dir) == (Path("/r"), Path("/p"), Path("/c"))


def test_everything_missing_is_named_in_one_error() -> None:
    with pytest.raises(CliError, match=r"agent run needs --stage, --package, --version, --gate"):
        stage_settings(parse(), {})


def test_a_bad_stage_or_generation_from_the_environment_is_refused() -> None:
    env = {"NODEGATE_PACKAGE": "p", "NODEGATE_VERSION": "1.0.0", "NODEGATE_GATE": "g"}
    with pytest.raises(CliError, match="--stage 'reboot' is not one of"):
        stage_settings(parse(), {**env, "NODEGATE_STAGE": "reboot"})
    with pytest.raises(CliError, match="--generation wants a number"):
        stage_settings(parse(), {**env, "NODEGATE_STAGE": "apply", "NODEGATE_GENERATION": "x"})
