"""/api/v1/advice/: the advisor (issue 38). Admins only.

POST /api/v1/advice/ {"weeks": 1-4} starts a run (202, its status); GET /api/v1/advice/<id>/ its
progress and, when done, ADVICE.json's shape under "advice"; POST .../cancel/ stops the rest of its
replays; POST .../plan/ {"point": i} makes a layout plan of frontier point i (the plan flow, its
what-if included: nothing changes until the plan is applied).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ApiSchema, ApiViewMixin, IsAdmin, StrictJSONParser
from quotas import advice


class AdviceRequestSerializer(serializers.Serializer):
    weeks = serializers.IntegerField(
        min_value=1, max_value=advice.MAX_WEEKS, default=2, help_text="How much history to replay (weeks)."
    )


class AdvicePlanSerializer(serializers.Serializer):
    point = serializers.IntegerField(min_value=0, help_text="The index of a point of the frontier.")


def _with_urls(request, st: dict) -> dict:
    return {**st, "url": request.build_absolute_uri(reverse("api:advice-detail", args=[st["id"]]))}


def _status_or_404(run_id: str) -> dict:
    st = advice.status(run_id)
    if st is None:
        raise NotFound("No such advice run (it may have expired).")
    return st


class AdviceView(ApiViewMixin, APIView):
    """Start an advice run: the last `weeks` weeks replayed with variants of the layout."""

    schema = ApiSchema()
    permission_classes = [IsAdmin]
    parser_classes = [StrictJSONParser]

    @extend_schema(request=AdviceRequestSerializer, responses={202: OpenApiTypes.OBJECT})
    def post(self, request):
        data = AdviceRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        run_id = advice.start(weeks=data.validated_data["weeks"], actor=request.user)
        return Response(_with_urls(request, advice.status(run_id)), status=status.HTTP_202_ACCEPTED)


class AdviceDetailView(ApiViewMixin, APIView):
    """A run's progress; when done, its advice (replays, today, frontier, recommended)."""

    schema = ApiSchema()
    permission_classes = [IsAdmin]

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request, run_id: str):
        return Response(_with_urls(request, _status_or_404(run_id)))


class AdviceCancelView(ApiViewMixin, APIView):
    schema = ApiSchema()
    permission_classes = [IsAdmin]
    parser_classes = [StrictJSONParser]

    @extend_schema(request=None, responses={200: OpenApiTypes.OBJECT})
    def post(self, request, run_id: str):
        _status_or_404(run_id)
        advice.cancel(run_id)
        return Response(_with_urls(request, advice.status(run_id)))


class AdvicePlanView(ApiViewMixin, APIView):
    """A layout plan of one point of the frontier (then GET/apply it under /api/v1/layout/plans/)."""

    schema = ApiSchema()
    permission_classes = [IsAdmin]
    parser_classes = [StrictJSONParser]

    @extend_schema(request=AdvicePlanSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request, run_id: str):
        st = _status_or_404(run_id)
        data = AdvicePlanSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if st["advice"] is None:
            return Response({"point": ["The run has no answer yet."]}, status=status.HTTP_409_CONFLICT)
        index = data.validated_data["point"]
        if index >= len(st["advice"]["frontier"]):
            return Response(
                {"point": [f"Must be 0 to {len(st['advice']['frontier']) - 1} (the frontier's points)."]},
                status=status.HTTP_400_BAD_REQUEST,
            )
        try:
            planned = advice.make_plan(run_id=run_id, index=index, actor=request.user)
        except (LookupError, ValidationError) as e:
            detail = (
                e.message_dict if isinstance(e, ValidationError) and hasattr(e, "error_dict") else [str(e)]
            )
            return Response({"point": detail} if isinstance(detail, list) else detail, status=400)
        return Response(
            {
                "plan": str(planned.id),
                "url": request.build_absolute_uri(reverse("api:layout-plan-detail", args=[planned.id])),
                "page": request.build_absolute_uri(reverse("share_layout_plan_show", args=[planned.id])),
                "whatif_run": planned.whatif_run,
                "diff": planned.diff,
            },
            status=status.HTTP_201_CREATED,
        )
