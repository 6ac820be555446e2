"""Signed control messages: Celery's message signing (celery.security's SecureSerializer, RSA-PSS over
the serialized body), with a certificate per sender, bound to the name it speaks for.

Who signs: the control side (web, control worker, beat) with the `control` certificate; each agent with
its node's certificate (subject CN `node:<name>`). Who trusts whom:

- the control worker trusts `control` and every accepted node's certificate (its trust directory); a
  message signed by a node must speak for that node (its `node`, or a heartbeat's `name`, equals the
  certificate's name): a node cannot report about another node's attempts or heartbeat as another node;
- an agent trusts only `control`: a start, stop or state message signed by anyone else (another node,
  a process that can write the broker but holds no key) is refused before it is decoded.

A message that fails any check raises SecurityError in the consumer: Celery logs it and drops it.
Enabled by MESSAGE_SIGNING_KEY / MESSAGE_SIGNING_CERT / MESSAGE_TRUSTED_CERTS (README, "Security
model"); `python manage.py message_credentials NAME` makes a key and certificate.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from celery.exceptions import SecurityError
from celery.security.certificate import Certificate, FSCertStore
from celery.security.key import PrivateKey
from celery.security.serialization import SecureSerializer
from kombu.serialization import loads, registry

SERIALIZER = "gpuquota-auth"
CONTROL = "control"
NODE_PREFIX = "node:"


def common_name(cert: Certificate) -> str:
    from cryptography.x509.oid import NameOID

    names = cert._cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


class BoundSerializer(SecureSerializer):
    """SecureSerializer whose deserialize also checks that a node speaks only for itself."""

    def deserialize(self, data):
        try:
            payload = self._unpack(data)
            cert = self._cert_store[payload["signer"]]
            cert.verify(payload["body"], payload["signature"], self._digest)
        except SecurityError:
            raise
        except Exception as e:
            raise SecurityError(f"unsigned or malformed message: {e!r}") from e
        body = loads(payload["body"], payload["content_type"], payload["content_encoding"], force=True)
        signer = common_name(cert)
        if signer == CONTROL:
            return body
        if signer.startswith(NODE_PREFIX):
            name = signer[len(NODE_PREFIX) :]
            kwargs = body[1] if isinstance(body, list | tuple) and len(body) > 1 else {}
            claimed = kwargs.get("node", kwargs.get("name")) if isinstance(kwargs, dict) else None
            if claimed != name:
                raise SecurityError(f"a message signed by node {name!r} speaks for {claimed!r}")
            return body
        raise SecurityError(f"a message signed by an unknown kind of sender {signer!r}")


def make_serializer(key: str, cert: str, trusted: str, password: str | None = None) -> BoundSerializer:
    return BoundSerializer(
        PrivateKey(Path(key).read_text(), password=password),
        Certificate(Path(cert).read_text()),
        FSCertStore(trusted),
    )


def register(key: str, cert: str, trusted: str) -> None:
    s = make_serializer(key, cert, trusted)
    registry.register(
        SERIALIZER,
        s.serialize,
        s.deserialize,
        content_type="application/x-gpuquota-auth",
        content_encoding="utf-8",
    )


def make_credentials(name: str, out: Path, days: int = 3650) -> tuple[Path, Path]:
    """A 3072-bit RSA key (0600) and a self-signed certificate for `control` or `node:<name>`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    cn = CONTROL if name == CONTROL else f"{NODE_PREFIX}{name}"
    key = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_path, cert_path = out / f"{name}.key", out / f"{name}.pem"
    key_path.touch(mode=0o600)
    key_path.chmod(0o600)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path
