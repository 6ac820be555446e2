"""Dashboard test helpers: logged-in clients for alice (admin), bob (vision), charlie (language); no
messages leave the process; and `constant_queries`, which proves a page's query count does not grow
with the number of jobs."""

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from jobs.services import job_submit


@pytest.fixture(autouse=True)
def _quiet(no_messages):
    return no_messages


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def as_alice(alice):
    return logged_in(alice)


@pytest.fixture
def as_bob(bob):
    return logged_in(bob)


@pytest.fixture
def as_charlie(charlie):
    return logged_in(charlie)


def hx(client, url, **kwargs):
    return client.get(url, HTTP_HX_REQUEST="true", **kwargs)


def submit(user, share, gpus=1, **kwargs):
    kwargs.setdefault("command", ["python", "train.py"])
    return job_submit(user=user, share=share, gpus=gpus, gpu_type=kwargs.pop("gpu_type", "a10g"), **kwargs)


def count_queries(client, url, **kwargs) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, **kwargs)
    assert response.status_code in (200, 286), response.status_code
    return len(ctx)


@pytest.fixture
def constant_queries(django_assert_num_queries):
    """constant_queries(client, url, grow) -> count: the page's queries, measured, then `grow()` adds
    data and the same page must run exactly as many queries again."""

    def check(client, url, grow, **kwargs):
        from django.core.cache import cache

        from quotas.usage import LIVE_KEY

        client.get(url, **kwargs)  # warm: the session, content types
        cache.delete(LIVE_KEY)  # measure a page that builds the live picture, both times
        n = count_queries(client, url, **kwargs)
        grow()
        cache.delete(LIVE_KEY)
        with django_assert_num_queries(n):
            response = client.get(url, **kwargs)
        assert response.status_code in (200, 286)
        return n

    return check
