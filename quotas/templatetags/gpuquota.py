"""Template filters of the dashboard: wording that reads right for small numbers."""

import functools
import hashlib
import pickle
from datetime import UTC, datetime, timedelta

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince
from django.utils.translation import get_language

register = template.Library()


@register.filter
def ago(value: datetime | None, now: datetime | None = None) -> str:
    """'just now' under a minute ('0 minutes ago' says nothing), else '3 minutes ago'."""
    if not value:
        return ""
    now = now or timezone.now()
    if (now - value).total_seconds() < 60:
        return "just now"
    return f"{span(value, now)} ago"


@register.filter
def until(value: datetime | None, now: datetime | None = None) -> str:
    """Django's `timeuntil`, through span(): '3 minutes'; under a minute '< 1 min' (not '0 minutes')."""
    if not value:
        return ""
    now = now or timezone.now()
    if (value - now).total_seconds() < 60:
        return "< 1 min"
    return span(now, value)


@register.filter
def starts_in(eta: datetime | None, now: datetime | None = None) -> str:
    """An ETA not yet passed, in words: 'in 3 minutes', or 'due now' within the minute ('in 0 minutes'
    said nothing)."""
    if not eta:
        return ""
    now = now or timezone.now()
    return "due now" if (eta - now).total_seconds() < 60 else f"in {until(eta, now)}"


@register.filter
def clock(t: datetime | None, now: datetime | None = None) -> str:
    """An instant as a local clock time, as a likely range says it ("14:10", "Tue 09:30")."""
    from quotas.services import clock_words

    return clock_words(t, now) if t else ""


@register.filter
def shell(command) -> str:
    """A command (a list of arguments) as a shell would take it back: quoted where it must be."""
    import shlex

    return (
        shlex.join(str(arg) for arg in command) if isinstance(command, list | tuple) else str(command or "")
    )


@register.filter
def gpu_hours(hours: float | None) -> str:
    """GPU-hours as /usage/ prints them: one decimal, but a small amount keeps two significant digits
    ("0.014", where one decimal said "0.0" of work that was there); nothing at all is "0"."""
    import math

    if hours is None:
        return ""
    if hours == 0:
        return "0"
    if abs(hours) >= 0.1:
        return f"{hours:,.1f}"
    return f"{hours:.{1 - math.floor(math.log10(abs(hours)))}f}"


@register.filter
def duration(seconds: float | None) -> str:
    """Seconds in a few words: "42 s", "3 min", "2 h" (quotas.services.duration_words)."""
    from quotas.services import duration_words

    return "" if seconds is None else duration_words(seconds)


@register.filter
def gpu_time(gpu_seconds: float | None) -> str:
    """GPU time in a few words: "45 GPU-s", "12 GPU-min", "3.5 GPU-h" (work run or lost), as the job's
    events say it (jobs.lifecycle.gpu_time_words)."""
    from jobs.lifecycle import gpu_time_words

    return "" if gpu_seconds is None else gpu_time_words(gpu_seconds)


_SHORT_S = 27 * 86400  # under 4 weeks timesince's words depend only on the whole minutes between


@functools.lru_cache(maxsize=8192)
def _minutes_words(minutes: int, language: str | None) -> str:
    ref = datetime(2001, 1, 1, tzinfo=UTC)
    return timesince(ref - timedelta(minutes=minutes), ref)


def span(earlier: datetime, later: datetime) -> str:
    """timesince(earlier, later): the same words, remembered by whole minutes for spans under four weeks
    (a long table asks for a hundred of them per render; each costs a calendar walk and translations)."""
    seconds = (later - earlier).total_seconds()
    if 0 <= seconds < _SHORT_S:
        return _minutes_words(int(seconds // 60), get_language())
    return timesince(earlier, later)


_PATHS: dict[str, str] = {}
_MARK = "987654321"


@register.simple_tag
def job_path(name: str, pk) -> str:
    """`{% url name pk %}` for the per-job URLs of long tables (a queue of 50 rows reversed 500 URLs
    per render, a quarter of the team page's time): reversed once, then formatted."""
    pattern = _PATHS.get(name)
    if pattern is None:
        pattern = _PATHS[name] = reverse(name, args=[int(_MARK)]).replace(_MARK, "{}")
    return pattern.format(int(pk))


@register.filter
def digest(value) -> str:
    """A short fingerprint of plain data (the share cards of a picture) for `{% cache %}`'s key: equal
    data, equal key, so a cached fragment is reused exactly while what it shows is unchanged."""
    return hashlib.blake2b(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), digest_size=16).hexdigest()


@register.filter
def unbound_digest(form) -> str | None:
    """The key of an unbound form's rendered fields (its fields' choices, initial values, labels, help and
    widgets' attributes: what a blank form shows), or None for a bound form (its data and errors vary)."""
    if getattr(form, "is_bound", True):  # bound, or no form at all
        return None
    fields = [
        (
            name,
            type(f).__name__,
            getattr(f, "choices", None),
            f.initial,
            form.initial.get(name),
            f.required,
            str(f.label),
            str(f.help_text),
            f.widget.attrs,
            f.max_length if hasattr(f, "max_length") else None,
            getattr(f, "min_value", None),
            getattr(f, "max_value", None),
        )
        for name, f in form.fields.items()
    ]
    try:
        return digest([type(form).__name__, form.prefix, form.auto_id, fields])
    except Exception:  # something that does not pickle (a callable initial): render it each time
        return None


_NAME = "\x00job-name\x00"  # NUL: in no stored name (PostgreSQL refuses it in text)
_PRIORITY = "876543219"


@register.simple_tag(takes_context=True)
def job_actions(context, job, origin: str) -> str:
    """templates/jobs/partials/_job_actions.html for one job of a long table: the partial is rendered
    once per render (with markers for the job's id, priority and name), then each row fills the markers
    in, instead of an {% include %} per row (two forms, four URLs and two CSRF tokens each)."""
    skeletons = context.render_context.setdefault("job_actions", {})
    key = (origin, bool(job.name))
    skeleton = skeletons.get(key)
    if skeleton is None:
        from types import SimpleNamespace

        fake = SimpleNamespace(pk=int(_MARK), name=_NAME if job.name else "", priority=_PRIORITY)
        with context.push(job=fake, **{"from": origin}):
            skeleton = skeletons[key] = context.template.engine.get_template(
                "jobs/partials/_job_actions.html"
            ).render(context)
    # The priority, then the id, then the name: no value filled in is searched for a later marker.
    html = skeleton.replace(_PRIORITY, str(int(job.priority))).replace(_MARK, str(int(job.pk)))
    return mark_safe(html.replace(escape(_NAME), escape(job.name)) if job.name else html)  # noqa: S308


class _FragmentNode(template.Node):
    def __init__(self, nodelist, name: str, vary_on: list):
        self.nodelist, self.name, self.vary_on = nodelist, name, vary_on

    def render(self, context):
        from django.core.cache import cache
        from django.core.cache.utils import make_template_fragment_key

        vary_on = [v.resolve(context) for v in self.vary_on]
        if vary_on and vary_on[0] is None:  # no key: this one is rendered, not cached
            return self.nodelist.render(context)
        key = make_template_fragment_key(self.name, vary_on)
        try:
            html = cache.get(key)
        except Exception:  # a broken cache only costs the rendering (as the live picture's does)
            html = None
        if html is None:
            html = self.nodelist.render(context)
            try:
                cache.set(key, html, FRAGMENT_TTL_S)
            except Exception:
                pass
        return html


FRAGMENT_TTL_S = 120  # a fragment is reused while what it shows is unchanged: seconds when busy


@register.tag
def fragment(parser, token):
    """`{% fragment name var1 var2 ... %}...{% endfragment %}`: Django's `{% cache %}` for what a key
    fully determines (vary on everything the fragment shows), without failing the page while the cache
    (Redis) is away. A first var that is None renders the fragment uncached."""
    bits = token.split_contents()
    if len(bits) < 2:
        raise template.TemplateSyntaxError("fragment needs a name")
    nodelist = parser.parse(("endfragment",))
    parser.delete_first_token()
    return _FragmentNode(nodelist, bits[1], [parser.compile_filter(b) for b in bits[2:]])
