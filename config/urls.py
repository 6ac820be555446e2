from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from directory.views import LoginView
from quotas.metrics import metrics_view


def healthz(request):
    return JsonResponse({"status": "ok"})


# A body over MAX_REQUEST_BYTES: the submit form back with the limit in words, not a bare 400.
handler400 = "quotas.views.bad_request"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    # Browsers ask for /favicon.ico on every page.
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("metrics", metrics_view, name="metrics"),
    path("api/", include("config.api_urls")),
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Sign-in with the directory (OpenID Connect) and the API token page.
    path("", include("directory.urls")),
    # What each user (and team) is told about their jobs, and where.
    path("", include("notify.urls")),
    # The dashboard (templates/, static/): the overview at "/", team, job, node and share pages.
    path("", include("jobs.urls")),
    path("", include("gpunodes.urls")),
    path("", include("quotas.urls")),
]
