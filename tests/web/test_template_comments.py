"""Template comments stay comments: Django's `{# … #}` is one line only; spread over two it is printed
as text (the overview showed one to every user)."""

import re
from pathlib import Path

import pytest
from django.conf import settings

pytestmark = pytest.mark.django_db

TEMPLATES = Path(settings.BASE_DIR) / "templates"


def test_no_template_comment_spans_lines():
    broken = []
    for path in sorted(TEMPLATES.rglob("*.html")):
        text = path.read_text()
        for m in re.finditer(r"\{#(.*?)(#\}|$)", text, re.MULTILINE):
            if m.group(2) != "#}":
                broken.append(f"{path.relative_to(TEMPLATES)}:{text.count(chr(10), 0, m.start()) + 1}")
    assert not broken, f"multi-line {{# #}} comments (use {{% comment %}}): {broken}"


def test_overview_shows_no_template_syntax(as_bob, vision_share, nodes):
    body = as_bob.get("/").content.decode()
    assert "{#" not in body and "#}" not in body
