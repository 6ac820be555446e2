"""The organisation tree in /metrics (issue 37, item 3): each share's fair-share value, what each group
takes from outside and lends outside, per GPU type; a scrape still costs a fixed number of queries."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from quotas.metrics import render
from tests import org_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(no_messages, alice, bob, charlie, vision_share, language_share, nodes):
    return org_world.build(alice, bob, vision_share, language_share, nodes)


def samples(text: str) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_fair_share_values_and_what_groups_take_and_lend(world):
    data = samples(render().decode())
    # vision-main: (2 taken + 0 history) / (weight 2 x 4 capacity)
    assert data[("gpuquota_fair_share_value", (("gpu_type", "a10g"), ("share", "vision-main")))] == 0.25
    assert (
        data[("gpuquota_group_taken_from_outside_gpus", (("gpu_type", "a10g"), ("group", "research")))] == 2
    )
    assert data[("gpuquota_group_taken_from_outside_gpus", (("gpu_type", "a10g"), ("group", "lang")))] == 0
    assert data[("gpuquota_group_lent_outside_gpus", (("gpu_type", "a10g"), ("group", "lang")))] > 0
    assert not any(
        name == "gpuquota_group_taken_from_outside_gpus" and ("group", "vision-main") in labels
        for name, labels in data
    )


def test_a_scrape_of_the_tree_costs_the_same_queries_with_more_jobs(
    world, bob, vision_share, django_assert_num_queries
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.api.conftest import submit

    render()  # warm caches
    with CaptureQueriesContext(connection) as few:
        render()
    for _ in range(20):
        submit(bob, vision_share, gpus=1)
    with django_assert_num_queries(len(few.captured_queries)):
        render()
