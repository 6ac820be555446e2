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

Selected by settings.CELERY_BROKER_TRANSPORT when REDIS_URL is set.
"""

from __future__ import annotations

import redis
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict:
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection was closed while in use")
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel
