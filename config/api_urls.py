"""The REST API under /api/v1/, its OpenAPI schema at /api/schema/ and Swagger UI at /api/docs/ (assets
served locally by drf-spectacular-sidecar)."""

from django.http import JsonResponse
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from config.api_auth import CurrentTokenView, ObtainTokenView, TokenViewSet
from gpunodes.api.views import NodeViewSet
from jobs.api.views import JobArrayViewSet, JobViewSet, QueueView
from quotas.api.advice import AdviceCancelView, AdviceDetailView, AdvicePlanView, AdviceView
from quotas.api.groups import GroupViewSet
from quotas.api.views import (
    AuditEntryViewSet,
    LayoutPlanViewSet,
    LayoutVersionViewSet,
    LayoutViewSet,
    ShareViewSet,
    TeamViewSet,
    TemporaryChangeViewSet,
    UsageView,
)

router = DefaultRouter()
router.include_root_view = False
router.register("teams", TeamViewSet, basename="team")
router.register("shares", ShareViewSet, basename="share")
router.register("groups", GroupViewSet, basename="group")
router.register("nodes", NodeViewSet, basename="node")
router.register("jobs", JobViewSet, basename="job")
router.register("arrays", JobArrayViewSet, basename="array")
router.register("auth/tokens", TokenViewSet, basename="token")
router.register("audit", AuditEntryViewSet, basename="audit")
router.register("layout/plans", LayoutPlanViewSet, basename="layout-plan")
router.register("layout/versions", LayoutVersionViewSet, basename="layout-version")
router.register("layout/temporary", TemporaryChangeViewSet, basename="layout-temporary")
router.register("layout", LayoutViewSet, basename="layout")


def index(request):
    """GET /api/v1/: where everything is (the schema has the details)."""
    root = request.build_absolute_uri("/api/")
    endpoints = {
        name: f"{root}v1/{name}/" for name in ("advice", "auth/token", "auth/token/current", "queue", "usage")
    }
    endpoints.update({prefix: f"{root}v1/{prefix}/" for prefix, _viewset, _basename in router.registry})
    return JsonResponse(
        {"endpoints": dict(sorted(endpoints.items())), "schema": f"{root}schema/", "docs": f"{root}docs/"}
    )


v1 = [
    path("", index, name="index"),
    path("auth/token/", ObtainTokenView.as_view(), name="token-obtain"),
    path("auth/token/current/", CurrentTokenView.as_view(), name="token-current"),
    path("queue/", QueueView.as_view(), name="queue"),
    path("usage/", UsageView.as_view(), name="usage"),
    path("advice/", AdviceView.as_view(), name="advice"),
    path("advice/<slug:run_id>/", AdviceDetailView.as_view(), name="advice-detail"),
    path("advice/<slug:run_id>/cancel/", AdviceCancelView.as_view(), name="advice-cancel"),
    path("advice/<slug:run_id>/plan/", AdvicePlanView.as_view(), name="advice-plan"),
    *router.urls,
]


@csrf_exempt  # it changes nothing; a POST to a wrong path gets the same JSON 404
def not_found(request, *args, **kwargs):
    # Under /api/ even an unknown path answers JSON, as the schema says.
    return JsonResponse({"detail": "Not found."}, status=404)


urlpatterns = [
    path("v1/", include((v1, "api"), namespace="api")),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves its init script from a URL of its own: no inline script (CSP script-src 'self').
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    re_path(r"^", not_found),
]
