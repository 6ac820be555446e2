"""The test OpenID Connect provider (tests/oidc_provider/) in its own process, and a sign-in through it:
the relying party's side with Django's test client, the provider's side over real HTTP with requests,
following each redirect to whichever side it names, as a browser would."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID = "gpuquota-test"
CLIENT_SECRET = "test-client-secret-123"
PASSWORD = "directory-pw-123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Provider:
    def __init__(self, directory: Path, redirect_uris: list[str]):
        self.dir = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.issuer = f"{self.url}/o"
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (directory / "key.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        self.knobs = {
            "users": {
                name: {"password": PASSWORD, "email": f"{name}@example.org", "groups": []}
                for name in ("dana", "erin", "alice")
            },
            "id_token": {},
        }
        self._write()
        env = {
            **os.environ,
            "PROVIDER_DIR": str(directory),
            "CLIENT_ID": CLIENT_ID,
            "CLIENT_SECRET": CLIENT_SECRET,
            "RP_REDIRECT_URI": " ".join(redirect_uris),
        }
        env.pop("DJANGO_SETTINGS_MODULE", None)
        self.log = open(directory / "provider.log", "w")  # noqa: SIM115 (open while the provider runs)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.oidc_provider.serve", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            self.stop()
            raise RuntimeError(
                f"the test provider did not start: {(directory / 'provider.log').read_text()[-2000:]}"
            )

    def _write(self) -> None:
        (self.dir / "knobs.json").write_text(json.dumps(self.knobs))

    def set_groups(self, user: str, groups: list[str]) -> None:
        self.knobs["users"][user]["groups"] = groups
        self._write()

    def fault(self, **faults) -> None:
        """What the next ID tokens get wrong (aud=, iss=, exp_in=, bad_signature=True); none: all right."""
        self.knobs["id_token"] = faults
        self._write()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self.log.close()


class SignIn:
    """One person's browser: a Django test client for gpuquota, a requests session for the provider."""

    def __init__(self, client, provider: Provider, username: str):
        self.client = client
        self.provider = provider
        self.username = username
        self.provider_session = requests.Session()

    def follow(self, response, limit: int = 12):
        """Follow redirects between the two sides until a page that is not one."""
        for _ in range(limit):
            if response.status_code not in (301, 302, 303):
                return response
            location = (
                response["Location"] if hasattr(response, "wsgi_request") else response.headers["Location"]
            )
            parts = urlsplit(location)
            if parts.netloc == urlsplit(self.provider.url).netloc:
                response = self._provider_get(location)
            else:
                response = self.client.get(parts.path + (f"?{parts.query}" if parts.query else ""))
        raise AssertionError("too many redirects")

    def _provider_get(self, url: str):
        response = self.provider_session.get(url, allow_redirects=False, timeout=10)
        if response.status_code == 200 and 'name="password"' in response.text:
            csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.text).group(1)
            response = self.provider_session.post(
                url,
                data={
                    "csrfmiddlewaretoken": csrf,
                    "username": self.username,
                    "password": PASSWORD,
                    "next": re.search(r'name="next" value="([^"]*)"', response.text)
                    .group(1)
                    .replace("&amp;", "&"),
                },
                headers={"Referer": url},
                allow_redirects=False,
                timeout=10,
            )
        if "Location" in response.headers:  # the provider's own redirects are relative
            response.headers["Location"] = urljoin(url, response.headers["Location"])
        return response

    def start(self):
        """gpuquota's sign-in up to the redirect back from the provider (not followed): the callback URL."""
        response = self.client.get("/oidc/authenticate/")
        assert response.status_code == 302, response
        for _ in range(8):
            location = (
                response["Location"] if hasattr(response, "wsgi_request") else response.headers["Location"]
            )
            if "/oidc/callback/" in location:
                parts = urlsplit(location)
                return f"{parts.path}?{parts.query}"
            response = self._provider_get(location)
        raise AssertionError("the provider never sent the browser back")

    def sign_in(self):
        callback = self.start()
        return self.follow(self.client.get(callback))


def wait_until(check, timeout: float = 5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False
