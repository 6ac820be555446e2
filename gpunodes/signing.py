"""Signed control messages: Celery's message signing (celery.security's SecureSerializer, RSA-PSS over
the serialized body), with a certificate per sender, each message bound whole to its sender, its task
and its moment.

Who signs: the control side (web, control worker, beat) with the `control` certificate; each agent with
its node's certificate (subject CN `node:<name>`). Who trusts whom:

- the control worker trusts `control` and every node's certificate in its trust directory; an agent
  trusts only `control` (a start, stop or state message signed by anyone else is refused before it is
  decoded);
- a node may send only NODE_TASKS, each about itself (its heartbeat's `name`, its reports' `node`), with
  no positional args and no callbacks, errbacks, chains or chords (a callback would be published by the
  control worker, signed as control);
- the task name travels in the message's headers, which are not signed: every message carries an
  envelope inside its signed kwargs (ENVELOPE: the task it was sent for, when, and a random nonce),
  added when it is published (`add_envelope`, Celery's before_task_publish signal). The task that
  receives it (SignedTask, every task's base class) runs it only if the envelope names that task, it is
  at most MESSAGE_MAX_AGE_S old (and not dated more than MESSAGE_CLOCK_SKEW_S ahead), and its nonce was
  never seen (NonceStore: Redis through Django's cache on the control side, SQLite in the agent's state
  directory, so a captured start is refused after the agent restarts too). A nonce that cannot be
  recorded (the agent's state disk is full) never turns a message into nothing: a task that running
  twice changes nothing (`replay_safe`: a stop, an ack) runs anyway; any other is refused, and its
  task's `on_unrecorded` says so (a start is refused back to the control side: re-queued, no strike).

Whatever fails a check is refused: the deserializer raises Refused (Consumer logs it and drops the
message); SignedTask logs it and returns without running. Each cause is logged once per sender and
minute (`refused`), with a count of the repeats. A job's env is sealed to its node's key (`seal`,
`unseal`): other nodes cannot read it on the broker.

Enabled by MESSAGE_SIGNING_KEY / MESSAGE_SIGNING_CERT / MESSAGE_TRUSTED_CERTS (README, "Signed control
messages"); `python manage.py message_credentials NAME` makes a key and certificate.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import math
import os
import secrets
import sqlite3
import threading
import time
from pathlib import Path

from celery import Task
from celery.exceptions import SecurityError
from celery.security.certificate import Certificate, FSCertStore
from celery.security.key import PrivateKey
from celery.security.serialization import SecureSerializer
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.serialization import loads, registry

log = logging.getLogger(__name__)

SERIALIZER = "gpuquota-auth"
CONTROL = "control"
NODE_PREFIX = "node:"
ENVELOPE = "_signed"
# What a node may send, and the keyword that names the node it speaks for.
NODE_TASKS = {
    "gpunodes.tasks.node_heartbeat": "name",
    "jobs.tasks.attempt_started": "node",
    "jobs.tasks.attempt_finished": "node",
    "jobs.tasks.attempt_checkpoint": "node",
    "jobs.tasks.attempt_log": "node",
    "jobs.tasks.attempt_pulling": "node",  # a container job's pull, as it goes (agent/containers.py)
}
# A protocol-2 body's third part; anything else in it becomes an attribute of the task's request.
EMBED_KEYS = frozenset({"callbacks", "errbacks", "chain", "chord"})
REFUSAL_LOG_EVERY_S = 60.0


class Refused(SecurityError):
    def __init__(self, sender: str, cause: str, detail: str = ""):
        self.sender, self.cause, self.detail = sender, cause, detail
        super().__init__(f"refused a message from {sender}: {cause}" + (f" ({detail})" if detail else ""))


_logged: dict[tuple[str, str], list] = {}  # (sender, cause) -> [when last logged, repeats since]
_logged_lock = threading.Lock()


def refused(sender: str, cause: str, detail: str = "", level: int = logging.WARNING) -> None:
    """Log a refused message: the first of each sender and cause at once, then at most once every
    REFUSAL_LOG_EVERY_S with the number of repeats in between (a replay every second must not flood the
    log, nor go unseen)."""
    key, now = (sender, cause), time.monotonic()
    with _logged_lock:
        seen = _logged.get(key)
        if seen is not None and now - seen[0] < REFUSAL_LOG_EVERY_S:
            seen[1] += 1
            return
        repeats = seen[1] if seen is not None else 0
        _logged[key] = [now, 0]
    log.log(
        level,
        "refused a message from %s: %s%s%s",
        sender,
        cause,
        f" ({detail})" if detail else "",
        f"; {repeats} more since the last report" if repeats else "",
    )


def common_name(cert: Certificate) -> str:
    from cryptography.x509.oid import NameOID

    names = cert._cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def _printable(value, limit: int = 80) -> str:
    return repr(value)[:limit]


class BoundSerializer(SecureSerializer):
    """SecureSerializer whose deserialize also binds a node's message to the node and its few tasks.
    `nodes`: whether messages signed by nodes are taken at all (not by an agent: it hears control only)."""

    def __init__(self, *args, nodes: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.nodes = nodes
        self._node_certs: dict[str, Certificate] | None = None

    def deserialize(self, data):
        try:
            payload = self._unpack(data)
        except Exception as e:
            raise Refused("an unknown sender", "unsigned or malformed message", _printable(e)) from e
        try:
            cert = self._cert_store[payload["signer"]]
        except SecurityError as e:
            raise Refused("an unknown sender", "unknown certificate", _printable(payload["signer"])) from e
        signer = common_name(cert)
        try:
            cert.verify(payload["body"], payload["signature"], self._digest)
        except Exception as e:  # celery's reraise_errors turns a bad signature into a TypeError
            raise Refused(signer, "bad signature", type(e).__name__) from e
        body = loads(payload["body"], payload["content_type"], payload["content_encoding"], force=True)
        if signer == CONTROL:
            _stamp(body, signer)
        elif signer.startswith(NODE_PREFIX) and self.nodes:
            check_node_message(signer[len(NODE_PREFIX) :], body)
        else:
            raise Refused(signer, "a sender this process does not take messages from")
        return body

    def node_certificate(self, node: str) -> Certificate:
        if self._node_certs is None:
            self._node_certs = {common_name(c): c for c in self._cert_store._certs.values()}
        try:
            return self._node_certs[f"{NODE_PREFIX}{node}"]
        except KeyError:
            raise SecurityError(f"no certificate of node {node!r} in the trusted directory") from None


def _stamp(body, signer: str) -> None:
    """Write who signed a task message into its envelope (read by SignedTask, for its log lines)."""
    if isinstance(body, list | tuple) and len(body) == 3 and isinstance(body[1], dict):
        envelope = body[1].get(ENVELOPE)
        if isinstance(envelope, dict):
            envelope["signer"] = signer


def check_node_message(node: str, body) -> None:
    """A node's message: a protocol-2 task body (args, kwargs, embed) for one of NODE_TASKS, about this
    node, with no positional args and nothing that would make the receiver run or send anything else."""
    sender = f"node {node}"
    if not (isinstance(body, list | tuple) and len(body) == 3):
        raise Refused(sender, "not a task message")
    args, kwargs, embed = body
    if args:
        raise Refused(sender, "positional args", _printable(args))
    if not isinstance(kwargs, dict):
        raise Refused(sender, "not a task message")
    if not isinstance(embed, dict) or set(embed) - EMBED_KEYS or any(embed.values()):
        raise Refused(sender, "callbacks or extra request fields", _printable(embed))
    envelope = kwargs.get(ENVELOPE)
    if not isinstance(envelope, dict):
        raise Refused(sender, "no envelope (task name, issue time, nonce)")
    task = envelope.get("task")
    field = NODE_TASKS.get(task) if isinstance(task, str) else None
    if field is None:
        raise Refused(sender, "a task nodes may not send", _printable(task))
    if kwargs.get(field) != node:
        raise Refused(sender, "it speaks for another node", f"{field}={_printable(kwargs.get(field))}")
    envelope["signer"] = sender


# --- the envelope: added when published, checked by the task that receives it -------------------------


def envelope(task: str) -> dict:
    return {"task": task, "at": time.time(), "nonce": secrets.token_hex(16)}


def add_envelope(sender=None, body=None, **_) -> None:
    """before_task_publish: put the task's name, the time and a nonce inside what gets signed (the
    kwargs of a protocol-2 body); the caller's kwargs dict is the body's, so a resend gets a new one."""
    if isinstance(body, list | tuple) and len(body) == 3 and isinstance(body[1], dict):
        body[1][ENVELOPE] = envelope(sender)


def signing_on() -> bool:
    from django.conf import settings

    return bool(settings.MESSAGE_SIGNING_KEY)


class Unrecorded(Exception):
    """A fresh message whose nonce the store could not record (a full disk, a broken file, Redis away):
    whether it was seen before cannot be told."""


def accept(task: str, sealed, *, replay_safe: bool = False, redelivered_ok: bool = False) -> bool:
    """Whether a received message's envelope lets `task` run it: sent for this task, fresh, not seen
    before (its nonce is then remembered until it would be stale anyway). A refusal is logged. A nonce
    the store cannot record: True for a `replay_safe` task (running it twice changes nothing), else
    Unrecorded. A `redelivered_ok` task skips the age and the nonce: see SignedTask."""
    from django.conf import settings

    sender = (
        str(sealed.get("signer", "an unknown sender")) if isinstance(sealed, dict) else "an unknown sender"
    )
    if not isinstance(sealed, dict):
        refused(sender, "no envelope (task name, issue time, nonce)", task)
        return False
    if sealed.get("task") != task:
        refused(sender, "signed for another task", f"{_printable(sealed.get('task'))}, delivered as {task}")
        return False
    at, nonce, now = sealed.get("at"), sealed.get("nonce"), time.time()
    if type(at) not in (int, float) or not math.isfinite(at):
        refused(sender, "no issue time", task)
        return False
    max_age, skew = settings.MESSAGE_MAX_AGE_S, settings.MESSAGE_CLOCK_SKEW_S
    if redelivered_ok:
        if at - now > skew:
            refused(sender, "message from the future", f"{task}, issued in {at - now:.0f} s")
            return False
        return True
    if now - at > max_age:
        refused(sender, "stale message", f"{task}, issued {now - at:.0f} s ago, MESSAGE_MAX_AGE_S {max_age}")
        return False
    if at - now > skew:
        refused(
            sender, "message from the future", f"{task}, issued in {at - now:.0f} s: are the clocks in sync?"
        )
        return False
    if not (isinstance(nonce, str) and 16 <= len(nonce) <= 64 and nonce.isalnum()):
        refused(sender, "no nonce", task)
        return False
    try:
        fresh = nonce_store().add(nonce, max(1, math.ceil(at + max_age - now) + 1))
    except Exception as e:  # sqlite3's "database or disk is full", an OSError, Redis away
        why = f"{type(e).__name__}: {e}"
        if replay_safe:
            refused(
                sender, "nonce not recorded, run anyway (running it twice changes nothing)", f"{task}: {why}"
            )
            return True
        refused(sender, "nonce not recorded, refused", f"{task}: {why}", level=logging.ERROR)
        raise Unrecorded(why) from e
    if not fresh:
        refused(sender, "repeated message", task)
        return False
    return True


class SignedTask(Task):
    """The base class of every task (config/celery.py): with signing on, a task run by a worker from a
    message runs only if accept() takes the message's envelope. Direct calls (one task applying another's
    report) and eager runs are not messages. `replay_safe` (a task option): running it twice changes
    nothing, so it runs even when its nonce cannot be recorded; `on_unrecorded(task, kwargs, why)` (a
    task option): what to do with a message refused for that reason. `redelivered_ok` (a task option,
    for the what-if's replays only): the broker redelivers the same message when the worker that held it
    is lost, maybe long after it was sent (a replay waits behind the others of an advice), and running it
    twice gives the same figures; so neither its age nor a repeated nonce refuses it. It is still only
    the control side's: a node may send only NODE_TASKS (the deserializer refuses anything else)."""

    replay_safe = False
    redelivered_ok = False
    on_unrecorded = None

    def __call__(self, *args, **kwargs):
        sealed = kwargs.pop(ENVELOPE, None)
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)
        if not request.is_eager and (sealed is not None or signing_on()):
            try:
                if not accept(
                    self.name, sealed, replay_safe=self.replay_safe, redelivered_ok=self.redelivered_ok
                ):
                    return None
            except Unrecorded as e:
                if self.on_unrecorded is not None:
                    type(self).on_unrecorded(self, kwargs, str(e))
                return None
        # The tracer pushed this request already (Task.__call__ would push a bare one).
        return self.run(*args, **kwargs)


class Consumer(CeleryConsumer):
    """The worker's consumer: a message the deserializer refused is logged as a refusal (sender, cause;
    once per minute and cause) and dropped, instead of Celery's critical line with the raw message."""

    def on_decode_error(self, message, exc):
        cause = exc.args[0] if exc.args and isinstance(exc.args[0], Refused) else exc.__context__
        if not isinstance(cause, Refused):
            return super().on_decode_error(message, exc)
        refused(cause.sender, cause.cause, cause.detail)
        message.ack()


# --- nonces seen: a replay is refused ------------------------------------------------------------


class CacheNonces:
    """The control side's, with Redis: Django's cache (one SET NX with an expiry per message, shared by
    every control process)."""

    def add(self, nonce: str, ttl_s: int) -> bool:
        from django.core.cache import cache

        return bool(cache.add(f"gq-nonce:{nonce}", 1, timeout=ttl_s))


class SqliteNonces:
    """A file of nonces with their expiry (an agent's state directory; the control side on the embedded
    file broker): kept across restarts. WAL, and a busy timeout for processes that share it."""

    PRUNE_EVERY_S = 60.0

    def __init__(self, path: Path | str):
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._pid = 0
        self._next_prune = 0.0

    def _connection(self) -> sqlite3.Connection:
        if self._db is None or self._pid != os.getpid():
            self._db = sqlite3.connect(self.path, timeout=10, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS seen (nonce TEXT PRIMARY KEY, expires REAL NOT NULL)"
            )
            self._pid = os.getpid()
            os.chmod(self.path, 0o600)
        return self._db

    def add(self, nonce: str, ttl_s: int) -> bool:
        now = time.time()
        with self._lock:
            db = self._connection()
            if now >= self._next_prune:
                db.execute("DELETE FROM seen WHERE expires < ?", (now,))
                self._next_prune = now + self.PRUNE_EVERY_S
            cur = db.execute(
                "INSERT OR IGNORE INTO seen (nonce, expires) VALUES (?, ?)", (nonce, now + ttl_s)
            )
            return cur.rowcount == 1


_nonces: CacheNonces | SqliteNonces | None = None


def use_nonce_store(store: CacheNonces | SqliteNonces | None) -> None:
    global _nonces
    _nonces = store


def nonce_store() -> CacheNonces | SqliteNonces:
    """The agent sets its own (its state directory); else Redis where there is one, else a file."""
    global _nonces
    if _nonces is None:
        from django.conf import settings

        _nonces = (
            CacheNonces()
            if settings.REDIS_URL
            else SqliteNonces(Path(settings.VAR_DIR) / "seen-messages.sqlite3")
        )
    return _nonces


# --- a job's env, sealed to its node --------------------------------------------------------------

SEALED_PREFIX = "gq-sealed-1."


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


def _aad(node: str, attempt_id, number) -> bytes:
    return f"{node}/{attempt_id}/{number}".encode()


def seal(env: dict, *, node: str, attempt_id: int, number: int) -> str:
    """`env` encrypted for `node` alone: AES-256-GCM under a fresh key, that key wrapped with RSA-OAEP
    for the node's certificate, the attempt bound in as associated data."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    public = _serializer().node_certificate(node)._cert.public_key()
    key, iv = AESGCM.generate_key(bit_length=256), os.urandom(12)
    data = AESGCM(key).encrypt(iv, json.dumps(env).encode(), _aad(node, attempt_id, number))
    oaep = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    return SEALED_PREFIX + ".".join(_b64(x) for x in (public.encrypt(key, oaep), iv, data))


def unseal(sealed: str, *, node: str, attempt_id: int, number: int) -> dict:
    """What seal() made for this node and attempt, opened with this process's key; ValueError if it
    cannot be (another node's, another attempt's, no key, damaged)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        wrapped, iv, data = (
            base64.urlsafe_b64decode(p) for p in sealed.removeprefix(SEALED_PREFIX).split(".")
        )
        oaep = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
        key = _serializer()._key._key.decrypt(wrapped, oaep)
        env = json.loads(AESGCM(key).decrypt(iv, data, _aad(node, attempt_id, number)))
    except Exception as e:
        raise ValueError(f"the sealed env cannot be opened here ({type(e).__name__})") from None
    if not isinstance(env, dict):
        raise ValueError("the sealed env is not a mapping")
    return env


# --- keys, certificates, the serializer --------------------------------------------------------------

_registered: BoundSerializer | None = None


def _serializer() -> BoundSerializer:
    if _registered is None:
        raise SecurityError("message signing is not set up in this process")
    return _registered


def make_serializer(
    key: str, cert: str, trusted: str, password: str | None = None, *, nodes: bool = True
) -> BoundSerializer:
    return BoundSerializer(
        PrivateKey(Path(key).read_text(), password=password),
        Certificate(Path(cert).read_text()),
        FSCertStore(trusted),
        nodes=nodes,
    )


def register(key: str, cert: str, trusted: str, *, nodes: bool = True) -> None:
    global _registered
    _registered = make_serializer(key, cert, trusted, nodes=nodes)
    registry.register(
        SERIALIZER,
        _registered.serialize,
        _registered.deserialize,
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
