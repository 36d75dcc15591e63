"""Which refusals of a write fail the node at once, and which go back to the queue."""

from __future__ import annotations

import pytest

from gate.controller.executor import refused_for_good
from gate.kube.errors import api_error


@pytest.mark.parametrize("status", [400, 403, 413, 422])
def test_admission_validation_rbac_and_size_refusals_are_for_good(status: int) -> None:
    assert refused_for_good(api_error(status, {"message": "denied"}))


@pytest.mark.parametrize("status", [401, 404, 408, 409, 429, 500, 503])
def test_what_asking_again_can_change_is_retried(status: int) -> None:
    # 401 is the operator's own credentials: every node would fail alike, the node is not the problem
    assert not refused_for_good(api_error(status, {"message": "later"}))
