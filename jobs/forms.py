"""Dashboard forms for jobs: submit and priority. Types are checked here; the rules (may this user
submit, does the request fit a node, is the share enabled) are jobs.services.job_submit's."""

from __future__ import annotations

import shlex

from django import forms

from config.validators import printable
from jobs.limits import MAX_INT
from jobs.models import MAX_PRIORITY


class SubmitForm(forms.Form):
    share = forms.ChoiceField()
    name = forms.CharField(max_length=200, required=False, validators=[printable])
    gpu_type = forms.ChoiceField(label="GPU type")
    gpus = forms.IntegerField(min_value=1, max_value=4096, initial=1, label="GPUs")
    priority = forms.IntegerField(min_value=0, max_value=MAX_PRIORITY, initial=0)
    command = forms.CharField(
        max_length=16 * 1024,
        help_text="Split like a shell would (quotes group words); it is not run through a shell.",
    )
    max_runtime_s = forms.IntegerField(
        min_value=1, max_value=MAX_INT, required=False, label="Max runtime (s)"
    )
    preemption_grace_s = forms.IntegerField(min_value=0, max_value=86400, required=False, label="Grace (s)")
    array_size = forms.IntegerField(
        min_value=1,
        max_value=2**31 - 1,
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

    def clean_command(self):
        try:
            argv = shlex.split(self.cleaned_data["command"])
        except ValueError as e:
            raise forms.ValidationError(f"Cannot split the command: {e}.") from e
        if not argv:
            raise forms.ValidationError("Give a command to run.")
        return argv


class PriorityForm(forms.Form):
    priority = forms.IntegerField(min_value=0, max_value=MAX_PRIORITY)
