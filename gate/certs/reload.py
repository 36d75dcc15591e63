"""A server-side TLS context whose certificate can be replaced while it serves.

New handshakes use the new certificate, connections already open keep theirs: nothing fails during a
rotation. The pair is checked on a scratch context first, so a broken pair (a key that does not match,
a half-written file) never reaches the live context: the old certificate keeps serving instead.
"""

from __future__ import annotations

import hashlib
import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509


class CertificateError(ValueError):
    """A certificate and key that cannot serve TLS; the message says why."""


class ReloadableCertificate:
    def __init__(self) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.set_alpn_protocols(["http/1.1"])
        self.fingerprint: str | None = None
        self.not_after: str | None = None
        self.reloads = 0

    @property
    def loaded(self) -> bool:
        return self.fingerprint is not None

    def load(self, cert_pem: bytes, key_pem: bytes) -> bool:
        """Serve this pair from the next handshake on. False when it is the one already served."""
        fingerprint = hashlib.sha256(cert_pem + key_pem).hexdigest()
        if fingerprint == self.fingerprint:
            return False
        # ssl only loads chains from files: a private directory, removed right after.
        with tempfile.TemporaryDirectory(prefix="nodegate-tls-", dir=_private_tmp()) as tmp:
            cert_file, key_file = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
            key_file.touch(mode=0o600)
            key_file.write_bytes(key_pem)
            cert_file.write_bytes(cert_pem)
            scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                scratch.load_cert_chain(cert_file, key_file)
            except (ssl.SSLError, OSError) as exc:
                raise CertificateError(f"the certificate and key do not form a usable pair: {exc}") from exc
            self.context.load_cert_chain(cert_file, key_file)
        self.fingerprint = fingerprint
        self.not_after = x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc.isoformat()
        self.reloads += 1
        return True

    def load_files(self, cert_file: Path, key_file: Path) -> bool:
        """Load from files (a mounted Secret); a pair caught mid-update raises CertificateError."""
        try:
            cert_pem, key_pem = cert_file.read_bytes(), key_file.read_bytes()
        except OSError as exc:
            raise CertificateError(f"cannot read {cert_file} and {key_file}: {exc}") from exc
        return self.load(cert_pem, key_pem)


def _private_tmp() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
