from django.urls import path

from directory import views

urlpatterns = [
    path("oidc/authenticate/", views.SignInView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", views.CallbackView.as_view(), name="oidc_authentication_callback"),
    path("account/tokens/", views.tokens, name="account-tokens"),
]
