"""API tokens: log in with a username and password for a token; list and revoke tokens (their owner
and admins). One token per user (DRF's authtoken): logging in again returns the same token, and revoking
it logs that user out everywhere. Session auth works beside it for the browser."""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authtoken.models import Token
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from config.api import ApiSchema, ApiViewMixin, StrictSerializer


class LoginThrottle(AnonRateThrottle):
    """Password guesses per client address (REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["login"])."""

    scope = "login"


class LoginSerializer(StrictSerializer, AuthTokenSerializer):
    pass


class TokenSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    prefix = serializers.SerializerMethodField(help_text="The first characters of the key, to recognise it.")

    class Meta:
        model = Token
        fields = ["user", "prefix", "created"]
        read_only_fields = fields

    def get_prefix(self, token) -> str:
        return token.key[:6]


class ObtainTokenView(ApiViewMixin, APIView):
    schema = ApiSchema()
    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = [LoginThrottle]

    @extend_schema(
        request=LoginSerializer,
        responses={200: inline_serializer("TokenKey", {"token": serializers.CharField()})},
        auth=[],
    )
    def post(self, request):
        """Exchange a username and password for the user's API token."""
        serializer = LoginSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        token, _ = Token.objects.get_or_create(user=serializer.validated_data["user"])
        return Response({"token": token.key})


class TokenViewSet(ApiViewMixin, mixins.ListModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Your token (an admin: every user's). DELETE /tokens/{user}/ revokes it."""

    schema = ApiSchema()
    serializer_class = TokenSerializer
    lookup_field = "user__username"
    lookup_url_kwarg = "user"
    lookup_value_regex = r"[\w.@+-]+"
    filterset_class = None
    queryset = Token.objects.none()  # for the schema; get_queryset() is what answers

    def get_queryset(self):
        qs = Token.objects.select_related("user").order_by("user__username")
        user = self.request.user
        if getattr(self, "swagger_fake_view", False):
            return qs.none()
        return qs if user.is_superuser else qs.filter(user=user)


class CurrentTokenView(ApiViewMixin, APIView):
    schema = ApiSchema()

    @extend_schema(request=None, responses={204: None})
    def delete(self, request):
        """Log out: revoke the token of the logged-in user."""
        Token.objects.filter(user=request.user).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
