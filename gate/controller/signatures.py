"""Image signature verification against the cluster's policy (issue 34): work in progress.

The interface is stable (`SignatureVerifier(policy, timeout=, token_hosts=)`, `await verify(reference,
digest, credentials) -> Verdict`); the registry reading and the crypto follow in the next commits.
"""

from __future__ import annotations

from collections.abc import Collection

from gate.api.signatures import SignaturePolicy, Verdict


class SignatureVerifier:
    """Finds an image digest's cosign signatures and judges them by the policy, once per digest."""

    def __init__(self, policy: SignaturePolicy, *, timeout: float = 10.0, token_hosts: Collection[str] = ()) -> None:
        self.policy = policy
        self.timeout = timeout
        self.token_hosts = tuple(token_hosts)

    async def verify(self, reference: str, digest: str, credentials: tuple[str, str] | None = None) -> Verdict:
        raise NotImplementedError("issue 34: the verifier lands in the next commit on t34-verify")
