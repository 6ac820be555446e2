"""Dashboard forms for jobs: submit and priority. Types are checked here, the limits are jobs.limits'
(the same bounds and words as the API and the CLI); the rules (may this user submit, does the request
fit a node, is the share enabled) are jobs.services.job_submit's."""

from __future__ import annotations

import shlex

from django import forms

from config.validators import printable
from jobs import limits


class LimitedIntegerField(forms.IntegerField):
    """An integer held to a limit of jobs.limits, refused in the limit's own words (any integer is read
    first, so a huge one is this message too, and never reaches the database). The browser's min/max
    are the limit's, read when the form is made (a limit may be a setting)."""

    def __init__(self, limit: limits.IntLimit, **kwargs):
        self.limit = limit
        super().__init__(**kwargs)

    def validate(self, value):
        super().validate(value)
        if value not in self.empty_values and (problem := self.limit.problem(value)):
            raise forms.ValidationError(problem, code="limit")

    def show_bounds(self) -> None:
        self.widget.attrs.update(min=self.limit.low, max=self.limit.top)


class SubmitForm(forms.Form):
    share = forms.ChoiceField()
    name = forms.CharField(max_length=limits.MAX_NAME, required=False, validators=[printable])
    gpu_type = forms.ChoiceField(label="GPU type")
    gpus = LimitedIntegerField(limits.GPUS, initial=1, label="GPUs")
    priority = LimitedIntegerField(limits.PRIORITY, initial=0)
    command = forms.CharField(
        max_length=16 * 1024,
        help_text="Split like a shell would (quotes group words); it is not run through a shell.",
    )
    image = forms.CharField(
        max_length=255,
        required=False,
        help_text="Optional: a container image to run the command in (registry/path:tag); empty runs it "
        "on the host.",
    )
    mounts = forms.CharField(
        max_length=8 * 1024,
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Datasets",
        help_text="Optional, with an image: host directories to mount read-only, one HOST[:CONTAINER] a line "
        "(e.g. /datasets/imagenet:/data), as the cluster or the share allows.",
    )
    max_runtime_s = LimitedIntegerField(limits.MAX_RUNTIME, required=False, label="Max runtime (s)")
    preemption_grace_s = LimitedIntegerField(limits.PREEMPTION_GRACE, required=False, label="Grace (s)")
    array_size = LimitedIntegerField(
        limits.ARRAY_SIZE,
        required=False,
        label="Array tasks",
        help_text="Leave empty for one job; N submits N tasks with GPUQUOTA_ARRAY_INDEX 0 … N-1.",
    )

    def __init__(self, *args, shares=(), gpu_types=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["share"].choices = [(s.name, s.name) for s in shares]
        types = sorted(set(gpu_types)) or ["a10g"]
        self.fields["gpu_type"].choices = [(t, t) for t in types]
        self.fields["gpu_type"].initial = types[0]
        for field in self.fields.values():
            if isinstance(field, LimitedIntegerField):
                field.show_bounds()

    def clean_mounts(self):
        return [line.strip() for line in self.cleaned_data["mounts"].splitlines() if line.strip()]

    def clean_command(self):
        try:
            argv = shlex.split(self.cleaned_data["command"])
        except ValueError as e:
            raise forms.ValidationError(f"Cannot split the command: {e}.") from e
        if not argv:
            raise forms.ValidationError("Give a command to run.")
        return argv


class PriorityForm(forms.Form):
    priority = LimitedIntegerField(limits.PRIORITY)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["priority"].show_bounds()
