"""Dashboard forms for shares. They parse and check types; the rules live in quotas.services, whose
ValidationError({field: [message]}) is put back beside the field by `add_service_errors`."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from config.validators import printable
from quotas.choices import ShareState, Strategy
from quotas.models import GPU_TYPE_RE, Team


def add_service_errors(form: forms.Form, error: ValidationError, aliases: dict[str, str] | None = None):
    """Put a service's ValidationError beside the form's fields (unknown fields: at the top)."""
    aliases = aliases or {}
    messages = error.message_dict if hasattr(error, "error_dict") else {None: error.messages}
    for field, msgs in messages.items():
        target = aliases.get(field, field)
        for msg in msgs:
            form.add_error(target if target in form.fields else None, msg)


class ShareForm(forms.Form):
    name = forms.RegexField(
        regex=r"^[a-z0-9-]{1,63}$",
        max_length=63,
        help_text="1 to 63 lower-case letters, digits or hyphens.",
        error_messages={"invalid": "Use 1 to 63 lower-case letters, digits or hyphens."},
    )
    team = forms.ModelChoiceField(queryset=Team.objects.order_by("name"), to_field_name="slug")
    description = forms.CharField(max_length=200, required=False, validators=[printable])
    strategy = forms.ChoiceField(choices=Strategy.choices, initial=Strategy.LEND_AND_BORROW)
    borrow_limit = forms.IntegerField(
        min_value=-1,
        max_value=2**31 - 1,
        initial=-1,
        help_text="Percent of own capacity it may borrow; -1 = no limit. Only for Lend and borrow.",
    )
    in_share_preemption = forms.BooleanField(
        required=False, label="In-share pre-emption", help_text="Higher priority may pre-empt lower."
    )
    # Parsed here; its limit (jobs.limits.MIN_RUNTIME) is the service's, whose words go beside it.
    min_runtime_s = forms.IntegerField(
        initial=0,
        required=False,
        label="Protection window (s)",
        help_text="min_runtime_s: each job runs at least this long after a start before a reclaim or "
        "in-share pre-emption may take it (0: never protected). Owners may wait up to this long for them.",
    )
    state = forms.ChoiceField(choices=ShareState.choices, initial=ShareState.ENABLED)
    new_gpu_type = forms.RegexField(
        regex=GPU_TYPE_RE,
        required=False,
        label="Another GPU type",
        error_messages={"invalid": "A GPU type is a lower-case name such as a10g or h100."},
    )
    new_gpu_count = forms.IntegerField(min_value=0, max_value=2**31 - 1, required=False, label="its GPUs")

    def __init__(self, *args, gpu_types=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.gpu_types = sorted(set(gpu_types))
        for gpu_type in self.gpu_types:
            self.fields[f"cap_{gpu_type}"] = forms.IntegerField(
                min_value=0, max_value=2**31 - 1, required=False, label=f"{gpu_type} GPUs"
            )

    def capacity_fields(self):
        return [self[f"cap_{t}"] for t in self.gpu_types]

    def clean(self):
        data = super().clean()
        new_type, new_count = data.get("new_gpu_type"), data.get("new_gpu_count")
        if new_type and new_count is None:
            self.add_error("new_gpu_count", f"How many {new_type} GPUs?")
        if new_count is not None and not new_type and "new_gpu_type" not in self.errors:
            self.add_error("new_gpu_type", "Name the GPU type these GPUs are of.")
        return data

    def capacity(self) -> dict[str, int]:
        """{gpu_type: GPUs}; a type left empty or at 0 is not part of the share."""
        data = self.cleaned_data
        out = {t: data[f"cap_{t}"] for t in self.gpu_types if data.get(f"cap_{t}")}
        if data.get("new_gpu_type") and data.get("new_gpu_count"):
            out[data["new_gpu_type"]] = data["new_gpu_count"]
        return out

    def share_fields(self) -> dict:
        data = self.cleaned_data
        return {
            "name": data["name"],
            "team": data["team"],
            "description": data.get("description", ""),
            "strategy": data["strategy"],
            "borrow_limit": data["borrow_limit"],
            "in_share_preemption": data.get("in_share_preemption", False),
            "min_runtime_s": data.get("min_runtime_s") or 0,  # left empty: not protected
            "state": data["state"],
        }

    @classmethod
    def initial_for(cls, share) -> dict:
        initial = {
            "name": share.name,
            "team": share.team.slug,
            "description": share.description,
            "strategy": share.strategy,
            "borrow_limit": share.borrow_limit,
            "in_share_preemption": share.in_share_preemption,
            "min_runtime_s": share.min_runtime_s,
            "state": share.state,
        }
        for gpu_type, n in share.capacity_map().items():
            initial[f"cap_{gpu_type}"] = n
        return initial


SWEEP_MAX_VALUES = 8


class SweepForm(forms.Form):
    """One setting of one share over several values (the what-if sweep). `setting` is "borrow_limit",
    "strategy", "min_runtime_s" or "capacity:<gpu type>"; `values` a comma-separated list of 2 to
    SWEEP_MAX_VALUES."""

    setting = forms.ChoiceField(label="Setting to sweep")
    values = forms.CharField(
        label="Values",
        max_length=200,
        help_text="2 to 8 values, separated by commas: e.g. 0, 50, 100, 200 (borrow limit, %), "
        "RESERVE, LEND, LEND_AND_BORROW (strategy), 0, 300, 600, 1800 (protection window, s), or GPU counts "
        "(capacity).",
    )

    def __init__(self, *args, gpu_types=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["setting"].choices = [
            ("borrow_limit", "borrow limit (%)"),
            ("strategy", "strategy"),
            ("min_runtime_s", "protection window, min_runtime_s (s)"),
            *[(f"capacity:{t}", f"capacity of {t} (GPUs)") for t in sorted(set(gpu_types))],
        ]

    def clean(self):
        data = super().clean()
        setting, raw = data.get("setting"), data.get("values")
        if not setting or raw is None:
            return data
        words = [w.strip() for w in raw.split(",") if w.strip()]
        if not 2 <= len(words) <= SWEEP_MAX_VALUES:
            self.add_error("values", f"Give 2 to {SWEEP_MAX_VALUES} values, separated by commas.")
            return data
        if setting == "strategy":
            values: list = [w.upper() for w in words]
            wrong = [w for w in values if w not in Strategy.values]
            if wrong:
                self.add_error(
                    "values", f"Not a strategy: {', '.join(wrong)} (use {', '.join(Strategy.values)})."
                )
                return data
        else:
            low = -1 if setting == "borrow_limit" else 0
            try:
                values = [int(w) for w in words]
            except ValueError:
                self.add_error("values", "Give whole numbers, separated by commas.")
                return data
            if any(v < low or v > 2**31 - 1 for v in values):
                self.add_error("values", f"Each value must be {low} or more.")
                return data
            if setting == "min_runtime_s":
                from jobs.limits import MIN_RUNTIME

                wrong = [MIN_RUNTIME.problem(v) for v in values if MIN_RUNTIME.problem(v)]
                if wrong:
                    self.add_error("values", wrong[0])
                    return data
        if len(set(values)) != len(values):
            self.add_error("values", "Each value once.")
            return data
        data["parsed"] = values
        return data

    def labels(self) -> list[str]:
        setting, values = self.cleaned_data["setting"], self.cleaned_data["parsed"]
        if setting == "borrow_limit":
            return ["no limit" if v == -1 else f"{v} %" for v in values]
        if setting.startswith("capacity:"):
            return [f"{v} GPUs" for v in values]
        if setting == "min_runtime_s":
            from quotas.services import duration_words

            return ["none" if v == 0 else duration_words(v) for v in values]
        return [str(v) for v in values]


class UsageForm(forms.Form):
    """The usage page's (and its API's) question: how many days back, and which share (all if none)."""

    days = forms.IntegerField(
        min_value=1,
        max_value=90,
        initial=7,
        required=False,
        error_messages={
            "min_value": "Give 1 to 90 days (usage samples are kept 90 days).",
            "max_value": "Give 1 to 90 days (usage samples are kept 90 days).",
            "invalid": "Give 1 to 90 days (usage samples are kept 90 days).",
        },
    )
    share = forms.CharField(max_length=63, required=False)

    def clean_share(self):
        from quotas.models import Share

        name = self.cleaned_data.get("share") or ""
        if name and not Share.objects.filter(name=name).exists():
            raise ValidationError(f'No share named "{name}".')
        return name

    def clean_days(self):
        return self.cleaned_data.get("days") or 7
