"""The REST API under /api/v1/, its OpenAPI schema at /api/schema/ and Swagger UI at /api/docs/ (assets
served locally by drf-spectacular-sidecar)."""

from django.http import JsonResponse
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from config.api_auth import CurrentTokenView, ObtainTokenView, TokenViewSet
from gpunodes.api.views import NodeViewSet
from jobs.api.views import JobArrayViewSet, JobViewSet, QueueView
from quotas.api.views import AuditEntryViewSet, ShareViewSet, TeamViewSet

router = DefaultRouter()
router.include_root_view = False
router.register("teams", TeamViewSet, basename="team")
router.register("shares", ShareViewSet, basename="share")
router.register("nodes", NodeViewSet, basename="node")
router.register("jobs", JobViewSet, basename="job")
router.register("arrays", JobArrayViewSet, basename="array")
router.register("auth/tokens", TokenViewSet, basename="token")
router.register("audit", AuditEntryViewSet, basename="audit")

v1 = [
    path("auth/token/", ObtainTokenView.as_view(), name="token-obtain"),
    path("auth/token/current/", CurrentTokenView.as_view(), name="token-current"),
    path("queue/", QueueView.as_view(), name="queue"),
    *router.urls,
]


@csrf_exempt  # it changes nothing; a POST to a wrong path gets the same JSON 404
def not_found(request, *args, **kwargs):
    # Under /api/ even an unknown path answers JSON, as the schema says.
    return JsonResponse({"detail": "Not found."}, status=404)


urlpatterns = [
    path("v1/", include((v1, "api"), namespace="api")),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    re_path(r"^", not_found),
]
