from django.urls import path
from mozilla_django_oidc.views import OIDCLogoutView

from directory import views

urlpatterns = [
    path("oidc/authenticate/", views.SignInView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", views.CallbackView.as_view(), name="oidc_authentication_callback"),
    path("oidc/logout/", OIDCLogoutView.as_view(), name="oidc_logout"),
    path("account/tokens/", views.tokens, name="account-tokens"),
]
