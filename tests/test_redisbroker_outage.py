"""The Redis broker transport (config/redisbroker.py) while Redis is away: an acknowledgement that
cannot reach it frees the consumer's prefetch slot anyway. Otherwise a worker whose every slot was
taken when Redis restarted (an agent running its 4 starts) never asks for another message again:
it never notices the lost connection and takes no start, for ever (seen in the fault test "Redis
restarted mid-burst"). No Redis needed: the client points at a port where nothing listens."""

from contextlib import contextmanager

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from config.redisbroker import QoS


class ChannelWithoutRedis:
    """What the Redis QoS uses of its channel, with a client that cannot connect."""

    unacked_key = "c:unacked"
    unacked_index_key = "c:unacked_index"
    unacked_mutex_key = "c:unacked_mutex"
    unacked_mutex_expire = 300
    visibility_timeout = 3600
    unacked_restore_limit = None
    do_restore = False  # nothing to restore at exit

    def __init__(self):
        self.client = redis.Redis(
            host="127.0.0.1", port=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )

    @contextmanager
    def conn_or_acquire(self, client=None):
        yield client or self.client


@pytest.fixture
def full_qos():
    qos = QoS(ChannelWithoutRedis(), prefetch_count=2)
    for tag in ("t1", "t2"):
        qos._delivered[tag] = object()  # delivered to a task, not acknowledged
    assert not qos.can_consume()
    return qos


def test_an_ack_that_cannot_reach_redis_frees_its_prefetch_slot_and_says_so(full_qos):
    with pytest.raises(redis.exceptions.ConnectionError):
        full_qos.ack("t1")  # the consumer logs it
    assert full_qos.can_consume()  # so it asks Redis again, and finds the connection gone
    full_qos._flush()
    assert list(full_qos._delivered) == ["t2"]


@pytest.mark.parametrize("requeue", [False, True], ids=["reject", "requeue"])
def test_a_reject_that_cannot_reach_redis_frees_its_slot_too(full_qos, requeue):
    with pytest.raises(redis.exceptions.ConnectionError):
        full_qos.reject("t2", requeue=requeue)
    assert full_qos.can_consume()
