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


def test_the_authorizers_refusal_is_retried_and_admissions_is_not() -> None:
    # The operator's own rights: every node would fail alike, and a kube-apiserver just restarted
    # refuses for a moment what its RBAC caches have not loaded (a node failed so in CI's chaos run).
    rbac = ('configmaps is forbidden: User "system:serviceaccount:nodegate-system:nodegate-operator" '
            'cannot create resource "configmaps" in API group "" in the namespace "nodegate-system"')
    assert not refused_for_good(api_error(403, {"reason": "Forbidden", "message": rbac}))
    for admission in ('pods "s" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1',
                      'admission webhook "v.example.com" denied the request: no',
                      "pods \"s\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no"):
        assert refused_for_good(api_error(403, {"reason": "Forbidden", "message": admission})), admission
