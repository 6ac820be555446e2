"""The provider's claims: each user's e-mail and groups from knobs.json, read at every token (a test
changes someone's groups between two sign-ins), and the faults a test asks for: another audience or
issuer, an ID token already expired, a broken signature."""

import json
import time

from django.conf import settings
from oauth2_provider.oauth2_validators import OAuth2Validator


def knobs() -> dict:
    return json.loads((settings.DIR / "knobs.json").read_text())


class Validator(OAuth2Validator):
    oidc_claim_scope = None  # every claim, groups included, whatever the scopes

    def get_additional_claims(self, request):
        user = knobs()["users"].get(request.user.username, {})
        return {
            "preferred_username": request.user.username,
            "email": user.get("email", ""),
            "groups": user.get("groups", []),
        }

    # prompt=none (the relying party's session renewal): django-oauth-toolkit leaves these to its user.
    # A request that reaches them has a signed-in user (its view answers login_required before), and
    # the application skips the consent page.
    def validate_silent_login(self, request):
        return True

    def validate_silent_authorization(self, request):
        return True

    def get_id_token_dictionary(self, token, token_handler, request):
        claims, expiration = super().get_id_token_dictionary(token, token_handler, request)
        fault = knobs().get("id_token", {})
        for name in ("aud", "iss"):
            if name in fault:
                claims[name] = fault[name]
        if "exp_in" in fault:
            claims["exp"] = int(time.time()) + fault["exp_in"]
        return claims, expiration

    def finalize_id_token(self, id_token, token, token_handler, request):
        signed = super().finalize_id_token(id_token, token, token_handler, request)
        if knobs().get("id_token", {}).get("bad_signature"):
            head, body, signature = signed.split(".")
            signed = ".".join([head, body, ("A" if signature[0] != "A" else "B") + signature[1:]])
        return signed
