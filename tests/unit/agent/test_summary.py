"""The termination-message summary always fits Kubernetes' 4096 bytes and keeps the end of the output."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gate.agent.summary import TERMINATION_MESSAGE_LIMIT, Summary, render, tail


def test_a_short_summary_carries_every_field_the_operator_reads() -> None:
    wire = json.loads(render(Summary(package="p", version="1.0.0", stage="apply", ok=False,
                                     failed_step="apply-check/x", exit_code=3, message="boom",
                                     duration_seconds=1.23456)))
    assert wire == {"package": "p", "version": "1.0.0", "stage": "apply", "ok": False,
                    "failedStep": "apply-check/x", "exitCode": 3, "message": "boom", "durationSeconds": 1.235}


def test_the_interrupt_type_appears_only_for_interrupts() -> None:
    assert "interrupt" not in json.loads(render(Summary("p", "1", "apply", True)))
    assert json.loads(render(Summary("", "", "interrupt", True, interrupt="reboot")))["interrupt"] == "reboot"


def test_a_long_message_is_cut_from_the_front_so_the_reason_at_the_end_survives() -> None:
    output = "\n".join(f"line {i} of noisy output" for i in range(5000)) + "\nFATAL: the real reason"
    text = render(Summary("p", "1.0.0", "apply", False, "apply/x", 1, output))
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    message = json.loads(text)["message"]
    assert message.startswith("…") and message.endswith("FATAL: the real reason")


@given(st.text(min_size=0, max_size=20000))
def test_any_message_renders_as_valid_json_within_the_limit_keeping_a_suffix(message: str) -> None:
    text = render(Summary("pkg", "1.0.0", "upgrade", False, "upgrade/s", 2, message))
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    kept = json.loads(text)["message"]
    assert message.endswith(kept.removeprefix("…"))


def test_tail_keeps_whole_last_lines() -> None:
    text = "\n".join(str(i) * 10 for i in range(100))
    kept = tail(text, max_chars=65)
    assert kept == "\n".join(str(i) * 10 for i in (97, 98, 99))
    assert tail("short\n") == "short"
