"""With real processes: the control worker stores the queue's forecast after a pass, without anyone asking."""

import pytest

from jobs.services import job_submit
from quotas.models import QueueForecast
from tests.live.conftest import wait_for
from tests.live.test_cluster import member, nodes_ready, share, train

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def test_the_control_worker_stores_a_forecast_after_a_pass(cluster, django_user_model):
    team, user = member(django_user_model, "fc")
    s = share(team, "team-fc", 1)
    cluster.start_control_plane()
    cluster.start_agent("f1", 1)
    wait_for(lambda: nodes_ready("f1"), 60, what="node READY")
    job_submit(
        user=user,
        share=s,
        name="busy",
        gpus=1,
        gpu_type="a10g",
        command=train(cluster, 200),
        max_runtime_s=600,
    )
    waiting = job_submit(user=user, share=s, name="waits", gpus=1, gpu_type="a10g", command=["true"])
    # A forecast that read the queue before "busy" was admitted may be stored first (it counts "busy"
    # as queued); the pass that admitted it marks the forecast stale and a later pass stores it again.
    wait_for(
        lambda: QueueForecast.objects.filter(job=waiting, position_in_share=1).exists(),
        30,
        what="a stored forecast after busy was admitted",
        jobs=[waiting],
    )
    f = QueueForecast.objects.get(job=waiting)
    assert (f.position_in_share, f.position_overall, f.kind) == (1, 1, "bound")
    assert f.reason.startswith("needs 1 a10g")
