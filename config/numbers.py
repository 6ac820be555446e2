"""A number too large says the largest allowed (issue 42.6). DRF answers an integer given as a string of
more than 1,000 characters with "String value too large.", and Django's forms one of more than 4,300
digits (past Python's conversion limit) with "Enter a whole number.": neither says what the field takes.
Both fields know their max_value: say it, as their own max_value message does. Installed once, from
quotas.apps (every app's serializers and forms go through these two classes)."""

from __future__ import annotations

_INSTALLED = False


def _digits(value) -> bool:
    text = str(value).strip()
    return text.lstrip("+-").isdigit() and not text.startswith("-")


def install() -> None:
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    from django import forms
    from rest_framework import serializers

    drf_to_internal = serializers.IntegerField.to_internal_value

    def drf_integer(self, data):
        if (
            isinstance(data, str)
            and len(data) > self.MAX_STRING_LENGTH
            and self.max_value is not None
            and _digits(data)
        ):
            self.fail("max_value", max_value=self.max_value)
        return drf_to_internal(self, data)

    serializers.IntegerField.to_internal_value = drf_integer

    form_to_python = forms.IntegerField.to_python

    def form_integer(self, value):
        try:
            return form_to_python(self, value)
        except forms.ValidationError:
            if self.max_value is not None and value is not None and _digits(value):
                raise forms.ValidationError(
                    self.error_messages.get(
                        "max_value", "Ensure this value is less than or equal to %(limit_value)s."
                    )
                    % {"limit_value": self.max_value},
                    code="max_value",
                ) from None
            raise

    forms.IntegerField.to_python = form_integer
