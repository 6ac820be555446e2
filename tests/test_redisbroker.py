"""The Redis broker transport (config/redisbroker.py): a connection closed under a channel is a
connection error the consumer recovers from, not an AttributeError that stops the worker (the agents
of the fault test "Redis restarted mid-burst" died of it)."""

import uuid

import pytest
from django.conf import settings

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL (a Redis server)")


def _unacked_channel(transport):
    from kombu import Connection

    conn = Connection(settings.REDIS_URL, transport=transport)
    channel = conn.channel()
    queue = f"test-redisbroker-{uuid.uuid4().hex}"
    channel.queue_declare(queue)
    channel.basic_publish(channel.prepare_message("hello"), exchange="", routing_key=queue)
    message = channel.basic_get(queue, no_ack=False)
    assert message is not None and channel.qos._delivered  # delivered, not acknowledged
    return conn, channel, queue


def test_the_settings_select_our_transport_for_redis():
    from config.celery import app

    assert settings.CELERY_BROKER_TRANSPORT == "config.redisbroker:Transport"
    assert type(app.connection().transport).__module__ == "config.redisbroker"


def test_closing_a_channel_after_its_connection_went_away_is_a_connection_error():
    from kombu.common import ignore_errors

    from config.redisbroker import Transport

    conn, channel, queue = _unacked_channel(Transport)
    try:
        conn.transport.client = None  # what a second quick Redis restart left behind
        channel._pool = None
        ignore_errors(conn, channel.close)  # the consumer's own way of closing: must not raise
        assert channel.closed
    finally:
        import redis

        redis.Redis.from_url(settings.REDIS_URL).delete(queue)


def test_a_channel_still_restores_its_unacknowledged_messages_on_a_normal_close():
    import redis

    from config.redisbroker import Transport

    conn, channel, queue = _unacked_channel(Transport)
    try:
        channel.close()
        assert redis.Redis.from_url(settings.REDIS_URL).llen(queue) == 1
    finally:
        redis.Redis.from_url(settings.REDIS_URL).delete(queue)
        conn.release()
