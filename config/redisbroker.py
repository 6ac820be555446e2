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

Selected by settings.CELERY_BROKER_TRANSPORT when REDIS_URL is set.
"""

from __future__ import annotations

import logging

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual

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
