"""Jobs: submit, list and filter, detail with queue position and ETA, priority, cancel, logs; and the
queue as the policy would admit it. Members see and act on their teams' jobs; other teams' jobs show
only as anonymous entries of the queue."""

import logging

from django import forms
from django.db.models import F, Prefetch
from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ApiSchema, ApiViewMixin
from config.pagination import BoundedLimitOffsetPagination
from jobs import services
from jobs.api.serializers import (
    JobArraySerializer,
    JobDetailSerializer,
    JobPrioritySerializer,
    JobSerializer,
    JobSubmitSerializer,
    JobUpdateSerializer,
    LogQuerySerializer,
    LogSerializer,
    QueueQuerySerializer,
    QueueSerializer,
    submitted_data,
)
from jobs.api.throttles import SubmitThrottle
from jobs.choices import JobState
from jobs.limits import MAX_INT
from jobs.models import Attempt, Job, JobArray, JobEvent
from quotas.models import Share, likely_range

log = logging.getLogger(__name__)


class IdFilter(filters.NumberFilter):
    """A row id: a whole number a database column can hold (a NumberFilter took 1e308 as a decimal, and
    the database refused it: a 500 found by the schema fuzz test); anything else is a 400."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_INT)
        super().__init__(*args, **kwargs)


class JobFilter(filters.FilterSet):
    share = filters.CharFilter(field_name="share__name", help_text="Share name.")
    team = filters.CharFilter(field_name="share__team__slug", help_text="Team slug.")
    state = filters.MultipleChoiceFilter(choices=JobState.choices, help_text="Repeat for several states.")
    mine = filters.BooleanFilter(method="filter_mine", help_text="Only jobs I submitted.")
    array = IdFilter(field_name="array_id", help_text="Only the tasks of this array.")

    class Meta:
        model = Job
        fields = ["share", "team", "state", "mine", "array"]

    def filter_mine(self, queryset, name, value):
        if value is None:
            return queryset
        user = self.request.user
        return queryset.filter(submitted_by=user) if value else queryset.exclude(submitted_by=user)


class JobViewSet(ApiViewMixin, viewsets.ModelViewSet):
    schema = ApiSchema()
    filterset_class = JobFilter
    http_method_names = ["get", "post", "patch", "head", "options"]
    queryset = Job.objects.none()  # for the schema; get_queryset() is what answers

    def get_queryset(self):
        return services.visible_jobs(
            self.request.user, Job.objects.select_related("share__team", "submitted_by", "forecast")
        )

    def get_serializer_class(self):
        return JobDetailSerializer if self.action == "retrieve" else JobSerializer

    def get_throttles(self):
        if self.action == "create":
            return [SubmitThrottle()]
        return super().get_throttles()

    def _detail(self, job, status_code=status.HTTP_200_OK):
        job = (
            self.get_queryset()
            .prefetch_related(
                Prefetch("attempts", queryset=Attempt.objects.order_by("number")),
                Prefetch("events", queryset=JobEvent.objects.order_by("at", "id")),
            )
            .get(pk=job.pk)
        )
        return Response(
            JobDetailSerializer(job, context=self.get_serializer_context()).data, status=status_code
        )

    @extend_schema(
        request=JobSubmitSerializer,
        responses={
            201: PolymorphicProxySerializer(
                component_name="SubmitAnswer",
                serializers=[JobDetailSerializer, JobArraySerializer],
                resource_type_field_name=None,
            )
        },
    )
    def create(self, request, *args, **kwargs):
        """Submit a job to a share of one of your teams."""
        serializer = JobSubmitSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        fields = dict(serializer.validated_data)
        spec = fields.pop("array", None)
        if spec is not None:
            array = services.job_array_submit(
                user=request.user, size=spec["size"], first_index=spec["start"], **fields
            )
            return Response(JobArraySerializer(array).data, status=status.HTTP_201_CREATED)
        job = services.job_submit(user=request.user, **fields)
        return Response(submitted_data(job), status=status.HTTP_201_CREATED)

    def retrieve(self, request, *args, **kwargs):
        """A job with its queue position, ETA, attempts and events."""
        return self._detail(self.get_object())

    @extend_schema(request=JobUpdateSerializer, responses={200: JobDetailSerializer})
    def partial_update(self, request, *args, **kwargs):
        """Change the priority and/or the grace (preemption_grace_s) of a job that has not ended (owner,
        team manager, admin). A new grace applies from the job's next stop."""
        job = self.get_object()
        serializer = JobUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        job = services.job_update(user=request.user, job=job, **serializer.validated_data)
        return self._detail(job)

    @extend_schema(request=None, responses={200: JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel a job (owner, team manager, admin). Queued or held: CANCELLED at once. Running: it is
        stopped as a pre-emption stops it (SIGTERM, SIGKILL when its grace ends) and answers CANCELLING,
        its GPUs held, until its host reports it stopped; then CANCELLED. A finished job answers 409."""
        job = services.job_cancel(user=request.user, job=self.get_object())
        return self._detail(job)

    @extend_schema(request=None, responses={200: JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        """Release a HELD job (admins): it is queued again with its original submit time. A job is held
        when its strikes (attempts that ended with their host's agent) reach HOLD_AFTER_NODE_LOST different
        hosts. 409 if not held."""
        job = services.job_release(user=request.user, job=self.get_object())
        return self._detail(job)

    @extend_schema(parameters=[LogQuerySerializer], responses={200: LogSerializer})
    @action(detail=True, methods=["get"], filterset_class=None, pagination_class=None)
    def logs(self, request, pk=None):
        """An attempt's output (default: the latest attempt, its first node, rank 0; `node` or `rank`
        picks another rank's: `nodes` lists them). `tail` keeps the last N lines; `after` (a cursor from
        an earlier read) returns only what came since."""
        job = self.get_object()
        query = LogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(services.job_logs(job=job, **query.validated_data))


class JobArrayViewSet(ApiViewMixin, viewsets.ReadOnlyModelViewSet):
    """Job arrays: each with its number of tasks per state. The tasks are jobs (`GET jobs/?array=ID`).
    Re-prioritise (PATCH) or cancel (POST cancel/) every task that has not ended, as one."""

    schema = ApiSchema()
    serializer_class = JobArraySerializer
    queryset = JobArray.objects.none()
    filterset_class = None
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self):
        qs = JobArray.objects.select_related("share__team", "submitted_by").order_by("-submitted_at", "-id")
        user = self.request.user
        if not user.is_superuser:
            qs = qs.filter(share__team_id__in=services.team_ids_of(user))
        return qs

    def list(self, request, *args, **kwargs):
        """Arrays of your teams, newest first, with their task counts."""
        page = self.paginate_queryset(self.get_queryset())
        counts = services.array_counts([a.pk for a in page])
        return self.get_paginated_response(
            JobArraySerializer(page, many=True, context={"counts": counts}).data
        )

    @extend_schema(request=JobPrioritySerializer, responses={200: JobArraySerializer})
    def partial_update(self, request, *args, **kwargs):
        """Set the priority of every task that has not ended (owner, team manager, admin)."""
        array = self.get_object()
        serializer = JobPrioritySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.array_set_priority(
            user=request.user, array=array, priority=serializer.validated_data["priority"]
        )
        return Response(JobArraySerializer(array).data)

    @extend_schema(request=None, responses={200: JobArraySerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel every task that has not ended (owner, team manager, admin). 409 if all have ended."""
        array = self.get_object()
        services.array_cancel(user=request.user, array=array)
        return Response(JobArraySerializer(array).data)


class QueueView(ApiViewMixin, APIView):
    """The queue in the order the policy would admit it, with positions and ETAs, a page at a time
    (?limit=&offset=). Every share's queue is visible (so teams see where capacity goes); other teams'
    jobs show no name and no owner."""

    schema = ApiSchema()

    pagination_class = BoundedLimitOffsetPagination

    @extend_schema(
        parameters=[
            OpenApiParameter("share", str, description="Share name; every share if left out."),
            OpenApiParameter("limit", int, description="Jobs per page (at most API_MAX_PAGE_SIZE)."),
            OpenApiParameter("offset", int, description="Jobs to skip."),
        ],
        responses={200: QueueSerializer},
    )
    def get(self, request):
        query = QueueQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        name = query.validated_data.get("share")
        if name is not None and not Share.objects.filter(name=name).exists():
            return Response({"share": [f'No share named "{name}".']}, status=status.HTTP_400_BAD_REQUEST)
        # The stored forecast (QueueForecast), in its order; jobs not forecast yet come last in queue
        # order. No replay here.
        qs = Job.objects.filter(state=JobState.QUEUED)
        if name is not None:
            qs = qs.filter(share__name=name)
        rows = (
            qs.select_related("forecast")
            .order_by(F("forecast__position_overall").asc(nulls_last=True), "-priority", "submitted_at", "id")
            .values(
                "pk",
                "name",
                "gpu_type",
                "gpus",
                "priority",
                "submitted_at",
                "share__name",
                "submitted_by__username",
                "share__team_id",
                "share__team__slug",
                "forecast__position_in_share",
                "forecast__position_overall",
                "forecast__eta",
                "forecast__eta_low",
                "forecast__eta_high",
                "forecast__kind",
                "forecast__basis",
                "forecast__reason",
                "forecast__computed_at",
            )
        )
        paginator = self.pagination_class()
        rows = paginator.paginate_queryset(rows, request, view=self)
        user = request.user
        mine = None if user.is_superuser else set(services.team_ids_of(user))
        entries = []
        oldest = None
        for job in rows:
            shown = mine is None or job["share__team_id"] in mine
            at = job["forecast__computed_at"]
            if at is not None and (oldest is None or at < oldest):
                oldest = at
            low, high = likely_range(
                job["forecast__eta"], job["forecast__eta_low"], job["forecast__eta_high"]
            )
            entries.append(
                {
                    "id": job["pk"],
                    "share": job["share__name"],
                    "team": job["share__team__slug"],
                    "name": job["name"] if shown else None,
                    "submitted_by": job["submitted_by__username"] if shown else None,
                    "gpu_type": job["gpu_type"],
                    "gpus": job["gpus"],
                    "priority": job["priority"],
                    "submitted_at": job["submitted_at"],
                    "position": None
                    if at is None
                    else {
                        "in_share": job["forecast__position_in_share"],
                        "overall": job["forecast__position_overall"],
                    },
                    "eta": job["forecast__eta"],
                    "eta_low": low,
                    "eta_high": high,
                    "eta_kind": job["forecast__kind"],
                    "eta_basis": job["forecast__basis"] or "",
                    "waiting_reason": job["forecast__reason"] or "",
                }
            )
        data = {
            "count": paginator.count,
            "next": paginator.get_next_link(),
            "previous": paginator.get_previous_link(),
            "share": name,
            "planned": oldest is not None or not entries,
            "forecast_at": oldest,
            "jobs": entries,
        }
        return Response(QueueSerializer(data).data)
