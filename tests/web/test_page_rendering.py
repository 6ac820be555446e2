"""The team page's and overview's cheap rendering (issue 15, pages under 100 ms at 100k jobs): the job
actions of a long table filled into one rendered _job_actions.html, the wording of spans remembered by
minute, and the share cards cached by what they show. Each must print what the plain template would."""

import re
from datetime import timedelta

import pytest
from django.template import Context, Template
from django.utils import timezone
from django.utils.timesince import timesince

from quotas.templatetags.gpuquota import ago, span, until
from tests.api.conftest import run
from tests.web.conftest import hx, submit

pytestmark = pytest.mark.django_db


def _csrf_free(html: str) -> str:
    return re.sub(r'value="[A-Za-z0-9]{64}"', 'value="CSRF"', html)


@pytest.mark.parametrize("name", ["", "plain", "<b>\"x\" & 'y'</b>", "987654321 876543219", "<a>&amp;"])
def test_job_actions_print_what_the_partial_prints(bob, vision_share, nodes, name):
    job = submit(bob, vision_share, name=name, priority=7)
    context = {"job": job, "csrf_token": "t" * 64}
    included = Template('{% include "jobs/partials/_job_actions.html" with from="team" %}').render(
        Context(context)
    )
    filled = Template('{% load gpuquota %}{% job_actions job "team" %}').render(Context(context))
    assert filled == included
    assert f'value="{job.priority}"' in filled and f"Cancel job {job.pk}" in filled


def test_job_actions_of_many_rows_each_their_own(bob, vision_share, nodes):
    jobs = [submit(bob, vision_share, name=n, priority=p) for n, p in [("a", 1), ("", 2), ("<c>", 3)]]
    html = Template('{% load gpuquota %}{% for j in jobs %}{% job_actions j "team" %}|{% endfor %}').render(
        Context({"jobs": jobs, "csrf_token": "t" * 64})
    )
    rows = html.split("|")[:-1]
    for job, row in zip(jobs, rows, strict=True):
        assert f"/jobs/{job.pk}/priority/" in row and f'value="{job.priority}"' in row
        assert ("(&lt;c&gt;)" in row) == (job.name == "<c>")


@pytest.mark.parametrize(
    "seconds",
    [
        0,
        1,
        59,
        60,
        61,
        119,
        3599,
        3600,
        3661,
        86399,
        86400,
        90061,
        6 * 86400 + 5,
        14 * 86400 + 7200,
        26 * 86400,
    ],
)
def test_span_says_what_timesince_says(seconds):
    now = timezone.now()
    then = now - timedelta(seconds=seconds, microseconds=250_000)
    assert span(then, now) == timesince(then, now)
    later = now + timedelta(seconds=seconds, microseconds=250_000)
    if seconds < 60:
        assert until(later, now) == "< 1 min"  # timeuntil's "0 minutes" says nothing
    else:
        assert until(later, now) == Template("{{ t|timeuntil:now }}").render(
            Context({"t": later, "now": now})
        )


def test_ago_and_long_spans():
    now = timezone.now()
    assert ago(now - timedelta(seconds=30), now) == "just now"
    assert ago(now - timedelta(minutes=3), now) == "3\xa0minutes ago"
    long_ago = now - timedelta(days=400)
    assert span(long_ago, now) == timesince(long_ago, now)


def test_team_queue_rows_print_as_before(as_bob, bob, vision_share, nodes):
    """The queue's rows come ready to print: ids, positions, sizes, who and when, a running job's
    placement and state, and the job actions with the job's own name and priority."""
    running = submit(bob, vision_share, gpus=2, name="<run>")
    run(running, nodes[0], [0, 1])
    queued = submit(bob, vision_share, gpus=1, name='q"1', priority=5)
    body = _csrf_free(hx(as_bob, "/teams/vision/?part=queue").content.decode())
    assert f'<tr data-job="{queued.pk}">' in body
    assert f'<a href="/jobs/{queued.pk}/">{queued.pk} q&quot;1</a>' in body
    assert '<div class="muted small">bob · just now</div>' in body
    assert "<td>1 × a10g</td>" in body and '<td class="num">5</td>' in body
    assert (
        f"Cancel job {queued.pk} (q&quot;1)?" in body
        and 'name="priority" min="0" max="9999" value="5"' in body
    )
    assert f'<a href="/jobs/{running.pk}/">{running.pk} &lt;run&gt;</a>' in body
    assert '<span class="badge state-running">RUNNING</span>' in body
    assert f"<td>{nodes[0].name} [0,1]</td>" in body and "<td>2 × a10g</td>" in body


def test_cards_follow_the_picture(as_bob, bob, vision_share, nodes):
    """The cached cards change as soon as what they show changes (their key is their data)."""

    def cards():
        body = hx(as_bob, "/teams/vision/?part=cards").content.decode()
        return re.search(r"(\d+) used of \d+ own · (\d+) running · (\d+) queued", body).groups()

    assert cards() == ("0", "0", "0")
    job = submit(bob, vision_share, gpus=2)
    assert cards() == ("0", "0", "1")
    run(job, nodes[0], [0, 1])
    assert cards() == ("2", "1", "0")
    overview = as_bob.get("/").content.decode()
    assert "2 used of" in overview and 'hx-get="/?part=cards"' not in overview


def test_a_blank_submit_form_is_rendered_once_a_filled_one_each_time(as_bob, vision, vision_share, nodes):
    """The blank form's fields are cached by what they show; a form with errors never comes from the
    cache, and a share added to the team shows in the next blank form."""
    from quotas.models import Share

    def form_html(body: str) -> str:
        return _csrf_free(
            body[body.index('<form id="submit-form"') : body.index("</form>", body.index("submit-form"))]
        )

    first = form_html(as_bob.get("/teams/vision/").content.decode())
    assert form_html(as_bob.get("/teams/vision/").content.decode()) == first
    bad = {"share": "vision-main", "gpu_type": "a10g", "gpus": "0", "priority": "0", "command": "x"}
    response = as_bob.post("/teams/vision/submit/", bad, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and 'id="id_gpus-error"' in response.content.decode()
    assert 'value="0"' in re.search(r'<input[^>]*id="id_gpus"[^>]*>', response.content.decode()).group()
    again = form_html(as_bob.get("/teams/vision/").content.decode())
    assert "id_gpus-error" not in again and again == first
    Share.objects.create(name="vision-extra", team=vision, strategy="LEND")
    assert '<option value="vision-extra">' in form_html(as_bob.get("/teams/vision/").content.decode())


def test_no_form_or_a_bound_one_has_no_cache_key():
    from jobs.forms import SubmitForm
    from quotas.templatetags.gpuquota import unbound_digest

    assert unbound_digest("") is None and unbound_digest(None) is None
    assert unbound_digest(SubmitForm({"share": "x"}, gpu_types=["a10g"])) is None
    blank = unbound_digest(SubmitForm(shares=[], gpu_types=["a10g"]))
    assert blank and blank != unbound_digest(SubmitForm(shares=[], gpu_types=["a10g", "h100"]))


def test_cards_render_without_a_cache(as_bob, vision_share, nodes, settings):
    """A cache that is away (Redis down) costs the rendering, not the page."""
    from django.core.cache import cache

    settings.CACHES = {"default": {"BACKEND": "tests.web.test_page_rendering.BrokenCache"}}
    with pytest.raises(ConnectionError):
        cache.get("anything")
    assert 'data-share="vision-main"' in as_bob.get("/teams/vision/").content.decode()


from django.core.cache.backends.locmem import LocMemCache  # noqa: E402


class BrokenCache(LocMemCache):
    def get(self, *args, **kwargs):
        raise ConnectionError("cache away")

    def set(self, *args, **kwargs):
        raise ConnectionError("cache away")
