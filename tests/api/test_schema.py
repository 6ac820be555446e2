"""The OpenAPI schema and Swagger UI, and a short schemathesis run against the schema: no input it
generates gets a 500 or a response that contradicts the schema."""

import os

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from knox.models import AuthToken
from schemathesis import checks

from tests.api.conftest import submit

app = get_wsgi_application()
schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
schema.app = app  # checks that send their own requests go to the same in-process application


def test_the_schema_is_served(anon, db):
    r = anon.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    for path in (
        "/api/v1/jobs/",
        "/api/v1/jobs/{id}/cancel/",
        "/api/v1/queue/",
        "/api/v1/auth/token/",
        "/api/v1/shares/{name}/",
        "/api/v1/nodes/{name}/drain/",
    ):
        assert path in paths


def test_swagger_ui_uses_local_assets_only(anon, db):
    r = anon.get("/api/docs/")
    assert r.status_code == 200
    html = r.content.decode()
    assert "drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower() and "unpkg" not in html.lower()


@pytest.fixture
def world(bob, vision_share, language_share, nodes):
    """Some data to find, bob's token, and the WSGI handler kept from closing the test's connection
    after each request (as Django's test client does)."""
    submit(bob, vision_share, gpus=1)
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield {"Authorization": f"Token {AuthToken.objects.create(user=bob)[1]}"}
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


# What the issue asks (no 500, responses as documented) plus auth and method checks. Not the checks
# that want every lenient input refused: DRF's pagination ignores a bad ?offset= by design.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.ignored_auth,
    checks.unsupported_method,
]


@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("SCHEMATHESIS_EXAMPLES", 4)),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@pytest.mark.django_db
def test_no_generated_request_breaks_the_api(case, world):
    case.call_and_validate(headers=world, checks=CHECKS)
