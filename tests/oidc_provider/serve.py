"""Run the test provider: `python -m tests.oidc_provider.serve PORT` with PROVIDER_DIR set (and
RP_REDIRECT_URI, CLIENT_ID, CLIENT_SECRET): migrates its database, registers the relying party and
the users of knobs.json, then serves on 127.0.0.1:PORT until killed."""

import json
import os
import sys
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def main() -> None:
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.core.wsgi import get_wsgi_application
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0)
    Application.objects.create(
        name="gpuquota",
        client_id=os.environ["CLIENT_ID"],
        client_secret=os.environ["CLIENT_SECRET"],
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=os.environ["RP_REDIRECT_URI"],
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )
    for name, user in json.loads((settings.DIR / "knobs.json").read_text())["users"].items():
        User.objects.create_user(name, password=user["password"])
    server = make_server("127.0.0.1", int(sys.argv[1]), get_wsgi_application(), Server, QuietHandler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
