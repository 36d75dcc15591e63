"""Operator settings read from flags and the environment: the boolean ones (gate.controller.settings)."""

from __future__ import annotations

import argparse

import pytest

from gate.controller.settings import OperatorSettings


def parse(argv: list[str], env: dict[str, str]) -> OperatorSettings:
    parser = argparse.ArgumentParser()
    OperatorSettings.add_arguments(parser)
    return OperatorSettings.from_args(parser.parse_args(argv), env=env)


def test_digest_resolution_is_on_by_default_and_a_later_flag_wins() -> None:
    assert parse([], {}).resolve_digests is True
    assert parse([], {"NODEGATE_RESOLVE_DIGESTS": "false"}).resolve_digests is False
    # the dev cluster passes false first; a test's extra flag after it turns it on again
    assert parse(["--resolve-digests", "false", "--resolve-digests", "true"], {}).resolve_digests is True
    assert parse(["--resolve-digests", "off"], {"NODEGATE_RESOLVE_DIGESTS": "true"}).resolve_digests is False


def test_a_boolean_that_is_neither_true_nor_false_is_refused() -> None:
    with pytest.raises(ValueError, match="'maybe' is not true or false"):
        OperatorSettings.from_args(None, env={"NODEGATE_RESOLVE_DIGESTS": "maybe"})
    with pytest.raises(SystemExit):
        parse(["--resolve-digests", "maybe"], {})
