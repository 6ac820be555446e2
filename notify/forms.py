from django import forms

from notify import urlcheck
from notify.models import Event, Kind


class EmailForm(forms.Form):
    events = forms.MultipleChoiceField(
        choices=Event.choices,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        label="E-mail me when a job of mine",
    )


class ChannelForm(forms.Form):
    owner = forms.ChoiceField(label="For")
    kind = forms.ChoiceField(choices=[(Kind.WEBHOOK, Kind.WEBHOOK.label), (Kind.CHAT, Kind.CHAT.label)])
    url = forms.URLField(max_length=500, label="URL", assume_scheme="https")
    # Write-only: never put back into the page (render_value=False), never shown after saving.
    secret = forms.CharField(
        max_length=200, required=False, widget=forms.PasswordInput(render_value=False), label="Signing secret"
    )
    events = forms.MultipleChoiceField(choices=Event.choices, widget=forms.CheckboxSelectMultiple)

    def __init__(self, *args, owners: list[tuple[str, str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["owner"].choices = owners

    def clean_url(self):
        url = self.cleaned_data["url"]
        try:
            urlcheck.check(url)
        except urlcheck.Refused as exc:
            raise forms.ValidationError(f"This URL {exc}.") from exc
        return url

    def clean(self):
        data = super().clean()
        if data.get("kind") == Kind.WEBHOOK and not data.get("secret"):
            self.add_error(
                "secret", "A JSON webhook is signed: give it a secret (its receiver checks the HMAC)."
            )
        return data
