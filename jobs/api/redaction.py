"""A job's environment values are for its owner and admins: the rest of the team sees the names only
(a team shares a queue, not its members' tokens)."""

REDACTED = "********"
# jobs.api.serializers.FRESH: set on a job that is being answered to its submitter (the submit's answer,
# built without a request in the serializer's context for speed).
JUST_SUBMITTED = "_gpuquota_fresh"


def may_see_env(user, job) -> bool:
    return bool(user and user.is_authenticated and (user.is_superuser or user.pk == job.submitted_by_id))


class EnvRedactionMixin:
    def to_representation(self, job):
        data = super().to_representation(job)
        if data.get("env"):
            request = self.context.get("request")
            if request is None:
                allowed = getattr(job, JUST_SUBMITTED, False)
            else:
                allowed = may_see_env(getattr(request, "user", None), job)
            if not allowed:
                data["env"] = dict.fromkeys(data["env"], REDACTED)
        return data
