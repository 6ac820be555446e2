"""A refused or missing page is one line in the log, not a traceback; a server error keeps its own."""

import logging

import pytest


def request_log_lines(caplog) -> list[str]:
    formatter = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    return [formatter.format(r) for r in caplog.records if r.name == "django.request"]


@pytest.mark.django_db
def test_a_403_is_one_log_line(as_charlie, caplog):
    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert as_charlie.get("/shares/").status_code == 403
    lines = request_log_lines(caplog)
    assert len(lines) == 1
    assert "\n" not in lines[0] and "Traceback" not in lines[0]
    assert lines[0].startswith("WARNING django.request: Forbidden")


@pytest.mark.django_db
def test_a_404_is_one_log_line_at_info(as_charlie, caplog):
    """The client's own doing: not a WARNING line each (issue 42.6); a 403 stays one (above)."""
    with caplog.at_level(logging.INFO, logger="django.request"):
        assert as_charlie.get("/jobs/999999/").status_code == 404
    lines = request_log_lines(caplog)
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("INFO django.request: Not Found")


@pytest.mark.django_db
def test_a_bad_request_is_info_too(as_alice, caplog):
    with caplog.at_level(logging.INFO, logger="django.request"):
        assert as_alice.post("/layout/plan/", {"document": "x: ["}).status_code == 400
    lines = request_log_lines(caplog)
    assert lines and all(line.startswith("INFO django.request: Bad Request") for line in lines)


def test_a_server_error_keeps_its_traceback():
    from config.logfilters import ClientErrorsWithoutTraceback

    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        record = logging.LogRecord("django.request", logging.ERROR, __file__, 1, "boom", (), sys.exc_info())
    record.status_code = 500
    assert ClientErrorsWithoutTraceback().filter(record)
    assert "Traceback" in logging.Formatter().format(record)
