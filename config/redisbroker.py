"""The Redis broker: kombu's Redis transport with one fix, so that a Redis restart is a reconnect and
never the end of a worker.

When Redis goes away, Celery's consumer closes its connection and opens a new one. Closing a channel
restores its unacknowledged messages (virtual Channel.close -> QoS.restore_unacked), which asks for a
fresh connection pool built from the transport's `client`; after a couple of quick restarts that client
can already be None, and the AttributeError ("'NoneType' object has no attribute 'hostname'", from
Channel._connparams) is not one of the connection errors the consumer tolerates: the worker logged
"Unrecoverable error" and stopped. In a GPU agent that ended the agent (and its fence watchdog then
stopped every job on the host); in the fault test "Redis restarted mid-burst" all four agents went
that way within three restarts and the cluster stalled. A closed connection is a connection error: said
so here, the close goes on, the consumer reconnects, and the messages left unacknowledged come back
through Redis' visibility timeout (a lost start is also sent again by the heartbeat, see
gpunodes.services.node_heartbeat).

Two more things keep one node's messages away from another (README, "Redis"): each consumer keeps
what it took but has not acknowledged under keys of its own (`unacked_keys`; kombu's default is one
`unacked` hash for every consumer, which every node's ACL user had to be granted), and a message taken
from a queue goes back to that queue when it is restored, whatever its own delivery_info says (a node
writes the messages it publishes, delivery_info included).

What a node may do on the shared broker (issue 41, item 1) is `node_acl`: only the commands its agent
uses, each on its own keys; what it sends the control side goes onto a list of its own
(`intake_queue`), which the control worker moves onto `control` a few messages per node at a time
(`Intake`), so one node's flood waits in its own list and never in front of the others' heartbeats.

Selected by settings.CELERY_BROKER_TRANSPORT when REDIS_URL is set.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual

from config.queues import CONTROL_QUEUE, INTAKE_PREFIX, intake_queue, node_queue

log = logging.getLogger(__name__)


# What an ack or a restore meets while Redis is away (down, restarting, the socket closed under it).
OUTAGE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class QoS(kombu_redis.QoS):
    """An acknowledgement that cannot reach Redis still frees its prefetch slot here (and then fails,
    so the consumer logs it). kombu's keeps the message counted as delivered: when every slot of a
    worker was taken by a task that ended while Redis was away (an agent with 4 starts at a Redis
    restart), it never asked Redis for another message, so never saw that the connection had gone,
    and took no start again (the fault test "Redis restarted mid-burst": agents alive, heartbeating,
    their starts re-sent every second for minutes). Its entry in the unacked index, if Redis kept it,
    is restored after the visibility timeout, as after any lost ack; a repeated start is refused."""

    def ack(self, delivery_tag):
        try:
            super().ack(delivery_tag)
        except OUTAGE:
            kombu_virtual.QoS.ack(self, delivery_tag)
            raise

    def reject(self, delivery_tag, requeue=False):
        try:
            super().reject(delivery_tag, requeue=requeue)
        except OUTAGE:
            kombu_virtual.QoS.ack(self, delivery_tag)
            raise

    def restore_visible(self, start=0, num=10, interval=10):
        """kombu's, with its restore lock taken by SET NX PX and let go by DEL: kombu releases it with
        a Lua script, and a node's ACL user may run none (one busy script stops the server for every
        node: node_acl). A lock that outlived its expiry (5 minutes) at worst lets two restores of the
        same consumer overlap, which each restore's own transaction (WATCH on the hash) tolerates."""
        self._vrestore_count += 1
        if (self._vrestore_count - 1) % (interval or 1):
            return
        with self.channel.conn_or_acquire() as client:
            expire_ms = int(self.unacked_mutex_expire * 1000)
            if not client.set(self.unacked_mutex_key, uuid.uuid4().hex, nx=True, px=expire_ms):
                return  # another restore of this consumer's is under way
            try:
                ceil = time.time() - self.visibility_timeout
                visible = client.zrange(
                    self.unacked_index_key,
                    ceil,
                    0,
                    desc=True,
                    byscore=True,
                    offset=num and start,
                    num=num,
                    withscores=True,
                )
                for tag, _ in visible or []:
                    self.restore_by_tag(tag, client)
            finally:
                client.delete(self.unacked_mutex_key)

    def restore_by_tag(self, tag, client=None, leftmost=False):
        # An entry this consumer's Redis user may not push back where it names (planted in its own keys:
        # nothing it took says so) would stop every start of its worker: dropped, with a log line.
        try:
            super().restore_by_tag(tag, client=client, leftmost=leftmost)
        except redis.exceptions.NoPermissionError as e:
            log.warning("dropped unacknowledged message %s: this consumer may not put it back (%s)", tag, e)
            with self.channel.conn_or_acquire(client) as conn:
                self._remove_from_indices(tag, conn.pipeline()).execute()


class Channel(kombu_redis.Channel):
    QoS = QoS

    def _connparams(self, asynchronous: bool = False) -> dict:
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection was closed while in use")
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel

    def _deliver(self, message, queue):
        info = message.get("properties", {}).get("delivery_info") if isinstance(message, dict) else None
        if isinstance(info, dict) and queue:
            info["exchange"], info["routing_key"] = "", queue
        super()._deliver(message, queue)


def unacked_keys(consumer: str) -> dict[str, str]:
    """kombu's Redis transport options for where `consumer` ('control', or 'node:<name>' for an agent;
    ':' is in no node name) keeps its unacknowledged messages, their index and its restore lock."""
    return {
        "unacked_key": f"{consumer}:unacked",
        "unacked_index_key": f"{consumer}:unacked_index",
        "unacked_mutex_key": f"{consumer}:unacked_mutex",
    }


def node_acl(node: str, password: str) -> list[str]:
    """The rules of node `node`'s Redis ACL user (README, "Redis"; `manage.py node_acl` prints them):
    only the commands its agent uses, each on the one key it uses it on. No GET, SCAN, KEYS, CLIENT,
    MEMORY, SCRIPT/EVAL, CONFIG, no pub/sub: it sees no other key's name or value, runs nothing that
    holds the server, and the only value it can read back (HGET of its own unacknowledged messages) is
    what it wrote there, within the output buffer limit. `reset` first: an earlier line's grants and
    selectors go."""
    queue, own = node_queue(node), unacked_keys(f"node:{node}")
    return [
        "reset",
        "on",
        f">{password}",
        # The connection and transactions (no key).
        "+hello",
        "+auth",
        "+ping",
        "+select",
        "+multi",
        "+exec",
        "+discard",
        "+unwatch",
        # Its queue: take from it, and give back (at shutdown, or a restore) what it took.
        f"(~{queue} +brpop +lpush +rpush +llen)",
        # What it took and has not acknowledged yet (kombu's ack emulation), the index by time, the lock
        # of a restore (SET NX PX, then DEL: QoS.restore_visible).
        f"(~{own['unacked_key']} +hset +hget +hdel +watch)",
        f"(~{own['unacked_index_key']} +zadd +zrem +zrange)",
        f"(~{own['unacked_mutex_key']} +set +del)",
        # Its queue's binding, declared by its worker at start.
        f"(~_kombu.binding.{queue} ~_kombu.binding_permanent.{queue} +sadd +smembers)",
        # What it sends the control side: pushed onto its own intake list, nothing else.
        f"(~{intake_queue(node)} +lpush)",
    ]


def node_keys(node: str) -> list[str]:
    """Every key a node's ACL user can write (node_acl)."""
    queue = node_queue(node)
    return [
        intake_queue(node),
        queue,
        *unacked_keys(f"node:{node}").values(),
        f"_kombu.binding.{queue}",
        f"_kombu.binding_permanent.{queue}",
    ]


NODE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$")  # gpunodes.models.NODE_NAME_RE


class Intake:
    """The control worker's thread that moves what the nodes sent (each node onto its own list,
    config.queues.intake_queue) onto `control`, oldest first: each round at most `per_node` messages
    of each node that has some, the turns rotating, and only while `control` holds fewer than
    `backlog`. A node that pushes 20,000 messages at once then has `per_node` of them beside each other
    node's next heartbeat, never all of them in front of it, and what waits on `control` (passes
    included) is at most `backlog` messages.

    And it keeps each node's keys bounded (`police`, every `police_every_s`): an intake list longer
    than `node_max_messages`, or holding more than `node_max_bytes`, loses its oldest messages (all of
    them are sent again: heartbeats every few seconds, reports from the agent's outbox, log bytes asked
    for again at the attempt's end); the node's other keys (its queue, its unacknowledged messages)
    never hold that much from a well-behaved agent, and are removed if they do (its starts are sent
    again with its heartbeats). Each such cut is logged with the node's name."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        backlog: int = 200,
        per_node: int = 20,
        node_max_messages: int = 2000,
        node_max_bytes: int = 16 * 2**20,
        idle_s: float = 0.05,
        police_every_s: float = 0.25,
        forget_after_s: float = 600.0,
    ) -> None:
        self.client = client
        self.control = CONTROL_QUEUE
        self.prefix = INTAKE_PREFIX
        self.backlog, self.per_node = backlog, per_node
        self.node_max_messages, self.node_max_bytes = node_max_messages, node_max_bytes
        self.idle_s, self.police_every_s, self.forget_after_s = idle_s, police_every_s, forget_after_s
        self.nodes: dict[str, float] = {}  # node name: when its list last held something (monotonic)
        self._turn = 0
        self._policed = self._discovered = 0.0
        self.discover_every_s = 1.0  # a new node's first messages wait at most this
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._no_memory_usage = False

    @classmethod
    def from_settings(cls) -> Intake:
        from django.conf import settings

        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10, socket_connect_timeout=5)
        return cls(
            client,
            backlog=settings.BROKER_INTAKE_BACKLOG,
            per_node=settings.BROKER_INTAKE_PER_NODE,
            node_max_messages=settings.BROKER_NODE_MAX_MESSAGES,
            node_max_bytes=settings.BROKER_NODE_MAX_BYTES,
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="broker-intake", daemon=True)
        self._thread.start()
        log.info("moving the nodes' intake lists onto %s (at most %d waiting)", self.control, self.backlog)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def run(self) -> None:
        down = False
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if now - self._discovered >= self.discover_every_s:
                    self.discover()
                    self._discovered = now
                if now - self._policed >= self.police_every_s:
                    self.police()
                    self._policed = now
                moved = self.round()
                if down:
                    log.info("the broker is back: moving the nodes' messages again")
                    down = False
            except OUTAGE as e:
                if not down:
                    log.warning("cannot move the nodes' messages: the broker is away (%s)", e)
                    down = True
                self._stop.wait(1.0)
                continue
            except redis.RedisError:
                log.exception("moving the nodes' messages failed")
                self._stop.wait(1.0)
                continue
            if not moved:
                self._stop.wait(self.idle_s)

    def discover(self) -> None:
        """The nodes with something on their intake list (a SCAN of the key names)."""
        now = time.monotonic()
        for key in self.client.scan_iter(match=f"{self.prefix}*", count=1000, _type="list"):
            name = key.decode(errors="replace")[len(self.prefix) :]
            if NODE_NAME.match(name):
                self.nodes[name] = now
        for name, seen in list(self.nodes.items()):
            if now - seen > self.forget_after_s:
                del self.nodes[name]

    def _lengths(self, names: list[str]) -> tuple[int, list[int]]:
        pipe = self.client.pipeline(transaction=False)
        pipe.llen(self.control)
        for name in names:
            pipe.llen(self.prefix + name)
        lengths = pipe.execute()
        return lengths[0], lengths[1:]

    def round(self) -> int:
        """One turn of every node with messages waiting; returns how many were moved."""
        if not self.nodes:
            return 0
        names = sorted(self.nodes)
        start = self._turn % len(names)
        names = names[start:] + names[:start]  # who is served first when room runs short
        self._turn += 1
        waiting, lengths = self._lengths(names)
        room = self.backlog - waiting
        now = time.monotonic()
        busy = [(name, n) for name, n in zip(names, lengths, strict=True) if n > 0]
        for name, _ in busy:
            self.nodes[name] = now
        if room <= 0 or not busy:
            return 0
        share = max(1, min(self.per_node, room // len(busy)))
        pipe = self.client.pipeline(transaction=False)
        moved = 0
        for name, n in busy:
            take = min(n, share, room - moved)
            if take <= 0:
                break
            for _ in range(take):
                pipe.lmove(self.prefix + name, self.control, "RIGHT", "LEFT")
            moved += take
        return sum(1 for m in pipe.execute() if m is not None)

    def police(self) -> None:
        """Each node's keys within bounds (see the class)."""
        names = sorted(self.nodes)
        if not names:
            return
        _, lengths = self._lengths(names)
        for name, n in zip(names, lengths, strict=True):
            if n > self.node_max_messages:
                self._trim(name, n, self.node_max_messages, f"more than {self.node_max_messages} messages")
        if self._no_memory_usage:
            return
        pipe = self.client.pipeline(transaction=False)
        keys = {name: node_keys(name) for name in names}
        for name in names:
            # Every element of an intake list (at most node_max_messages now): an estimate from a few
            # would miss big messages among small ones.
            pipe.memory_usage(keys[name][0], samples=0)
            for key in keys[name][1:]:
                pipe.memory_usage(key)
        try:
            usage = iter(pipe.execute())
        except redis.exceptions.NoPermissionError:
            log.warning("the control side's Redis user may not use MEMORY USAGE: nodes' keys not measured")
            self._no_memory_usage = True
            return
        for name in names:
            sizes = [next(usage) or 0 for _ in keys[name]]
            intake, rest = sizes[0], sum(sizes[1:])
            if intake > self.node_max_bytes:
                self._trim_bytes(name, intake)
            if rest > self.node_max_bytes:
                self.client.delete(*keys[name][1:])
                log.error(
                    "node %s held %d bytes in its queue and unacknowledged messages (BROKER_NODE_MAX_BYTES"
                    " %d, far more than an agent writes): removed; its starts are sent again",
                    name,
                    rest,
                    self.node_max_bytes,
                )

    def _trim_bytes(self, name: str, usage: int) -> None:
        """Keep the newest messages of a node's intake list that fit node_max_bytes (halving until they
        do: the sizes of its messages need not be alike)."""
        key, length = self.prefix + name, self.client.llen(self.prefix + name)
        keep = length
        while usage > self.node_max_bytes and keep > 1:
            keep = max(1, min(keep // 2, keep * self.node_max_bytes // usage))
            self.client.ltrim(key, 0, keep - 1)
            usage = self.client.memory_usage(key, samples=0) or 0
        log.warning(
            "node %s had more than %d bytes waiting (BROKER_NODE_MAX_BYTES): dropped its %d oldest (each is "
            "sent again: heartbeats, the outbox, log gaps)",
            name,
            self.node_max_bytes,
            length - keep,
        )

    def _trim(self, name: str, length: int, keep: int, why: str) -> None:
        self.client.ltrim(self.prefix + name, 0, keep - 1)  # LPUSHed: the newest are at the head
        log.warning(
            "node %s had %s waiting: dropped its %d oldest (each is sent again: heartbeats, the outbox, "
            "log gaps)",
            name,
            why,
            max(0, length - keep),
        )
