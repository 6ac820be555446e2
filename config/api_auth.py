"""API tokens: log in with a username and password for a token; list and revoke tokens (their owner
and admins). Tokens are django-rest-knox's: only a digest is stored, each expires (API_TOKEN_TTL_HOURS),
and changing the password revokes them (config/auth.py). Each login gives a new token; revoking logs
that user out everywhere. Wrong passwords count towards the lockout and delays of config/logins.py like
dashboard logins. Session auth works beside it for the browser."""

from django.contrib.auth.signals import user_logged_in
from django.http import Http404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from knox.models import AuthToken
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ApiSchema, ApiViewMixin, StrictSerializer
from config.logins import LoginThrottle


class LoginSerializer(StrictSerializer, AuthTokenSerializer):
    pass


class TokenSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    prefix = serializers.SerializerMethodField(help_text="The first characters of the key, to recognise it.")

    class Meta:
        model = AuthToken
        fields = ["user", "prefix", "created", "expiry"]
        read_only_fields = fields

    def get_prefix(self, token) -> str:
        return token.token_key[:6]


class ObtainTokenView(ApiViewMixin, APIView):
    schema = ApiSchema()
    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = [LoginThrottle]

    @extend_schema(
        request=LoginSerializer,
        responses={
            200: inline_serializer(
                "TokenKey",
                {
                    "token": serializers.CharField(),
                    "limits": serializers.DictField(
                        child=serializers.DictField(),
                        help_text="What a job may ask for: {field: {min, max, message}} (jobs/limits.py), "
                        "so that a client can refuse a bad submit in the server's words before sending it.",
                    ),
                },
            )
        },
        auth=[],
    )
    def post(self, request):
        """Exchange a username and password for the user's API token (and the limits a job is held to)."""
        # The Django request, not DRF's wrapper: django-axes marks a lockout on it, and its middleware
        # then answers 429 (a locked-out login fails whatever the password).
        serializer = LoginSerializer(data=request.data, context={"request": request._request})
        serializer.is_valid(raise_exception=True)
        user = serializer.validated_data["user"]
        # A login like the dashboard's: django-axes resets this username's failures from this address
        # and notes the address as one the user logs in from; last_login is set.
        user_logged_in.send(sender=user.__class__, request=request._request, user=user)
        AuthToken.objects.filter(user=user, expiry__lt=timezone.now()).delete()  # the user's expired ones
        _, key = AuthToken.objects.create(user=user)
        from jobs.limits import job_limits

        return Response({"token": key, "limits": job_limits()})


class TokenViewSet(ApiViewMixin, mixins.ListModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Your tokens (an admin: every user's). DELETE /tokens/{user}/ revokes all of that user's tokens."""

    schema = ApiSchema()
    serializer_class = TokenSerializer
    lookup_field = "user__username"
    lookup_url_kwarg = "user"
    lookup_value_regex = r"[\w.@+-]+"
    filterset_class = None
    queryset = AuthToken.objects.none()  # for the schema; get_queryset() is what answers

    def get_queryset(self):
        qs = AuthToken.objects.select_related("user").order_by("user__username", "created")
        user = self.request.user
        if getattr(self, "swagger_fake_view", False):
            return qs.none()
        return qs if user.is_superuser else qs.filter(user=user)

    def destroy(self, request, *args, **kwargs):
        tokens = self.get_queryset().filter(user__username=kwargs[self.lookup_url_kwarg])
        if not tokens.exists():
            raise Http404
        tokens.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class CurrentTokenView(ApiViewMixin, APIView):
    schema = ApiSchema()

    @extend_schema(request=None, responses={204: None})
    def delete(self, request):
        """Log out: revoke the tokens of the logged-in user (everywhere)."""
        AuthToken.objects.filter(user=request.user).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
