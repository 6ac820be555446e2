"""A small client of the gpuquota REST API (/api/v1/). Every method returns the server's JSON.

HTTP goes through a socket of the standard library (StdlibSession, one kept-alive connection per client):
importing `requests` alone takes longer than a whole `gpuquota submit`. A `requests.Session` can still be
given. Its imports are few and cheap (no typing, urllib, http.client or pathlib): `gpuquota submit` runs
as a fresh process each time."""

from __future__ import annotations

import io  # loaded with the interpreter itself
import sys
import time

from gpuquota_client import quickjson as jsonlib  # json.dumps/loads without importing json (re)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from datetime import datetime
    from typing import Any

OPEN_STATES = ("QUEUED", "HELD", "ADMITTED", "RUNNING", "PREEMPTING", "CANCELLING")
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
JOB_PAGE = 100  # the API's page size (PAGE_SIZE)


class ClientError(Exception):
    """The server could not be reached, or answered something that is not the API."""


class ApiError(ClientError):
    """The server refused the request (4xx) or failed (5xx). `message` is the server's own words."""

    def __init__(self, status: int, message: str, data: Any = None):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.data = data


def split_url(url: str) -> tuple[str, str, str, str]:
    """(scheme, netloc, path, query) of an absolute http(s) URL, as urllib.parse.urlsplit gives them
    (without importing it); the fragment is dropped."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        return parts.scheme, parts.netloc, parts.path, parts.query
    rest = rest.partition("#")[0]
    rest, _, query = rest.partition("?")
    slash = rest.find("/")
    netloc, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    return scheme.lower(), netloc, path, query


def error_message(data: Any) -> str:
    """The server's error body as one line: its detail, or each field with its messages."""
    if isinstance(data, dict):
        if isinstance(data.get("detail"), str) and len(data) == 1:
            return data["detail"]
        parts = []
        for field, messages in data.items():
            text = "; ".join(_flatten(messages))
            parts.append(text if field in ("detail", "non_field_errors") else f"{field}: {text}")
        return " | ".join(parts)
    if isinstance(data, list):
        return "; ".join(_flatten(data))
    return str(data)


def _flatten(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [f"{k}: {m}" for k, v in value.items() for m in _flatten(v)]
    if isinstance(value, (list, tuple)):
        return [m for v in value for m in _flatten(v)]
    return [str(value)]


def _yaml_error(body: str) -> dict | None:
    """The few shapes of an error the server answers in YAML (config's YAMLRenderer), read without a
    YAML library: `key: value` and `key:` followed by `- item` lines."""
    data: dict[str, Any] = {}
    key = None
    for line in body.splitlines():
        if line.startswith("- ") and key is not None:
            data.setdefault(key, []).append(line[2:].strip().strip("'\""))
        elif ":" in line and not line.startswith(" "):
            key, _, value = line.partition(":")
            key = key.strip().strip("'\"")
            if value.strip():
                data[key] = value.strip().strip("'\"")
    return data or None


class _Response:
    def __init__(self, status: int, reason: str, headers: Mapping[str, str], body: bytes):
        self.status_code, self.reason, self.headers, self.content = status, reason, headers, body

    def json(self) -> Any:
        return jsonlib.loads(self.content)


class _Headers(dict):
    def get(self, key, default=None):
        return super().get(key.lower(), default)


class HttpProtocolError(OSError):
    """The server's answer is not HTTP/1.x as this client reads it."""


def _plain_connection(host, port: int, timeout: float | None):
    """A connected TCP socket, as socket.create_connection makes it (each address in turn), but from
    the _socket extension itself: the socket module's import (enum conversions, selectors) costs more
    than the rest of a plain-HTTP `gpuquota submit`'s client side."""
    import _socket

    error: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as e:
            sock.close()
            error = e
            continue
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        return sock
    raise error or OSError(f"no address found for {host!r}")


class _SocketRaw(io.RawIOBase):
    def __init__(self, sock) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._sock.recv_into(buffer)


def _socket_file(sock) -> io.BufferedReader:
    """A buffered reader of a _socket.socket (what socket.makefile("rb") gives)."""
    return io.BufferedReader(_SocketRaw(sock))


class StdlibSession:
    """The little of requests.Session the client uses: HTTP/1.1 over a socket (TLS for https), one
    kept-alive connection. Written out rather than taken from http.client, whose import (it parses
    headers with the email package) costs more than the rest of a `gpuquota submit`."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self._sock = None
        self._file = None
        self._origin: tuple[str, str] | None = None

    def _connect(self, scheme: str, netloc: str, timeout: float | None) -> None:
        if self._sock is not None and self._origin == (scheme, netloc):
            return
        self.close()
        if scheme not in ("http", "https"):
            raise HttpProtocolError(f"unsupported URL scheme {scheme!r}")
        host, _, port = netloc.rpartition(":") if netloc.rpartition(":")[2].isdigit() else (netloc, "", "")
        host = host.strip("[]")
        port = int(port or (443 if scheme == "https" else 80))
        # An ASCII host name as bytes: a str would load the idna codec for the address lookup.
        address = host.encode() if host.isascii() else host
        if scheme == "https":
            import socket
            import ssl

            sock = socket.create_connection((address, port), timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            self._sock, self._file, self._origin = sock, sock.makefile("rb"), (scheme, netloc)
            return
        sock = _plain_connection(address, port, timeout)
        self._sock, self._file, self._origin = sock, _socket_file(sock), (scheme, netloc)

    def request(self, method, url, *, params=None, json=None, headers=None, timeout=None) -> _Response:
        scheme, netloc, path, query = split_url(url)
        target = (path or "/") + (f"?{query}" if query else "")
        if params:
            from urllib.parse import urlencode

            target += ("&" if query else "?") + urlencode(params, doseq=True)
        body = b"" if json is None else jsonlib.dumps(json).encode()
        head = {"Host": netloc, "Connection": "keep-alive", **self.headers, **(headers or {})}
        if json is not None:
            head["Content-Type"] = "application/json"
        if body or method in ("POST", "PUT", "PATCH"):
            head["Content-Length"] = str(len(body))
        raw = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n"
        for retry in (True, False):  # a kept-alive connection the server has closed: reconnect once
            fresh = self._sock is None or self._origin != (scheme, netloc)
            self._connect(scheme, netloc, timeout)
            try:
                self._sock.sendall(raw.encode("latin-1") + body)
                return self._read(method)
            except (ConnectionError, HttpProtocolError):
                self.close()
                if retry and not fresh:
                    continue
                raise
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def _read(self, method: str) -> _Response:
        f = self._file
        status_line = f.readline(65537)
        if not status_line:
            raise ConnectionResetError("the server closed the connection")
        try:
            version, code, *reason = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
            status = int(code)
        except ValueError as e:
            raise HttpProtocolError(f"not an HTTP answer: {status_line[:80]!r}") from e
        headers = _Headers()
        while True:
            line = f.readline(65537)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            data = b""
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(f.readline(65537).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while f.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(f.read(size))
                f.readline(65537)
            data = b"".join(chunks)
        elif headers.get("content-length") is not None:
            data = f.read(int(headers["content-length"]))
        else:
            data = f.read()
            self.close()
        if headers.get("connection", "").lower() == "close" or version == "HTTP/1.0":
            self.close()
        return _Response(status, reason[0] if reason else "", headers, data)

    def close(self) -> None:
        for thing in (self._file, self._sock):
            if thing is not None:
                try:
                    thing.close()
                except OSError:
                    pass
        self._sock = self._file = None


def _transport_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (OSError,)
    requests = sys.modules.get("requests")
    if requests is not None:
        errors += (requests.RequestException,)
    return errors


class Client:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        session: Any = None,
    ):
        self.url = url.rstrip("/")
        self.token = token
        self.limits: dict | None = None  # what a job may ask for, as the server told at login
        self.timeout = timeout
        self.session = session or StdlibSession()
        self.session.headers.setdefault("User-Agent", "gpuquota-client/0.1")

    # --- plumbing --------------------------------------------------------------------------------

    def request(
        self, method: str, path: str, *, params=None, json=None, auth: bool = True, text: bool = False
    ) -> Any:
        """The server's JSON answer; with text=True the body as text (e.g. the layout as YAML: the
        client needs no YAML library)."""
        headers = {"Accept": "application/yaml" if text else "application/json"}
        if auth and self.token:
            headers["Authorization"] = f"Token {self.token}"
        url = path if path.startswith("http") else f"{self.url}/api/v1/{path.lstrip('/')}"
        try:
            response = self.session.request(
                method, url, params=params, json=json, headers=headers, timeout=self.timeout
            )
        except _transport_errors() as e:
            raise ClientError(f"cannot reach {self.url}: {e}") from e
        if response.status_code == 204:
            return None
        if text and response.status_code < 400:
            return response.content.decode("utf-8")
        try:
            data = response.json()
        except ValueError:
            data = None
        if text and data is None:  # an error answered in YAML: "detail: ..." or "path:\n- message"
            data = _yaml_error(response.content.decode("utf-8", "replace"))
        if response.status_code >= 400:
            message = error_message(data) if data is not None else (response.reason or "error")
            if response.status_code == 429 and response.headers.get("Retry-After"):
                message = f"{message} (retry after {response.headers['Retry-After']} s)"
            raise ApiError(response.status_code, message, data)
        if data is None:
            raise ClientError(f"{url} did not answer JSON (is {self.url} a gpuquota server?)")
        return data

    def _pages(self, path: str, params: Mapping[str, Any] | None = None) -> Iterator[list[dict]]:
        """A paginated list, page by page: the next page is asked for only when the caller wants it."""
        data = self.request("GET", path, params=dict(params or {}))
        yield list(data["results"])
        while data.get("next"):
            data = self.request("GET", data["next"])
            yield list(data["results"])

    def _all(self, path: str, params: Mapping[str, Any] | None = None) -> list[dict]:
        """Every item of a paginated list."""
        return [item for page in self._pages(path, params) for item in page]

    # --- auth ------------------------------------------------------------------------------------

    def login(self, username: str, password: str) -> str:
        data = self.request(
            "POST", "auth/token/", json={"username": username, "password": password}, auth=False
        )
        self.token = data["token"]
        self.limits = data.get("limits")
        return self.token

    def logout(self) -> None:
        self.request("DELETE", "auth/token/current/")
        self.token = None

    # --- reads -----------------------------------------------------------------------------------

    def shares(self) -> list[dict]:
        return self._all("shares/")

    def share(self, name: str) -> dict:
        return self.request("GET", f"shares/{name}/")

    def set_share(self, name: str, **fields: Any) -> dict:
        """PATCH a share's settings (admins): e.g. min_runtime_s=600."""
        return self.request("PATCH", f"shares/{name}/", json=fields)

    def groups(self) -> list[dict]:
        """The organisation tree's groups, each with its numbers per GPU type (GET /api/v1/groups/)."""
        return self.request("GET", "groups/")

    def nodes(self) -> list[dict]:
        return self._all("nodes/")

    def jobs(self, **filters: Any) -> list[dict]:
        """Jobs you may see; by default only those not yet finished (states=None: all). See job_pages."""
        return [job for page in self.job_pages(**filters) for job in page]

    def job_pages(
        self,
        *,
        states: Sequence[str] | None = OPEN_STATES,
        share: str | None = None,
        team: str | None = None,
        mine: bool | None = None,
        array: int | None = None,
        limit: int | None = None,
        since: datetime | None = None,
    ) -> Iterator[list[dict]]:
        """Jobs you may see, newest first, a page at a time (a long history starts printing before its
        last page is read); at most `limit` of them, and none submitted before `since`. The API lists
        jobs newest first, so the pages stop at the first job older than `since`."""
        pages = self._pages("jobs/", self._job_params(states, share, team, mine, array, limit))
        left = limit
        for page in pages:
            older = False
            if since is not None:
                from datetime import datetime

                kept = [j for j in page if datetime.fromisoformat(j["submitted_at"]) >= since]
                older, page = len(kept) < len(page), kept
            if left is not None:
                page = page[:left]
                left -= len(page)
            if page:
                yield page
            if older or left == 0:
                return

    @staticmethod
    def _job_params(states, share, team, mine, array, limit) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if limit is not None:
            params["limit"] = min(limit, JOB_PAGE)  # a short listing is one short page
        if array is not None:
            params["array"] = int(array)
        if states:
            params["state"] = list(states)
        if share:
            params["share"] = share
        if team:
            params["team"] = team
        if mine is not None:
            params["mine"] = "true" if mine else "false"
        return params

    def job(self, job_id: int) -> dict:
        return self.request("GET", f"jobs/{int(job_id)}/")

    def queue(self, share: str | None = None) -> dict:
        return self.request("GET", "queue/", params={"share": share} if share else None)

    def logs(
        self,
        job_id: int,
        *,
        attempt: int | None = None,
        tail: int | None = None,
        after: int | None = None,
        node: str | None = None,
        rank: int | None = None,
    ) -> dict:
        params = {
            k: v
            for k, v in {"attempt": attempt, "tail": tail, "after": after, "node": node, "rank": rank}.items()
            if v is not None
        }
        return self.request("GET", f"jobs/{int(job_id)}/logs/", params=params)

    def follow_logs(
        self,
        job_id: int,
        *,
        tail: int | None = None,
        poll_s: float = 2.0,
        node: str | None = None,
        rank: int | None = None,
    ) -> Iterator[str]:
        """Yield log text as it arrives, attempt after attempt, until the job has finished: of rank 0,
        or of the rank given (`node` or `rank`)."""
        attempt, cursor, first = None, None, True
        while True:
            data = self.logs(
                job_id, tail=tail if first else None, after=cursor, attempt=attempt, node=node, rank=rank
            )
            first = False
            if data["text"]:
                yield data["text"]
            cursor = data["cursor"]
            if data["more"]:
                continue
            if data["attempt"] is not None:
                attempt = data["attempt"]
            job = self.job(job_id)
            newer = job["attempt_count"] and attempt is not None and job["attempt_count"] > attempt
            if newer:
                attempt, cursor = job["attempt_count"], None
                yield f"--- attempt {attempt} ---\n"
                continue
            if job["state"] in TERMINAL_STATES and (data["finished"] or data["attempt"] is None):
                return
            time.sleep(poll_s)

    def follow_every_rank(
        self, job_id: int, *, tail: int | None = None, poll_s: float = 2.0
    ) -> Iterator[tuple[int, str, str, int]]:
        """Yield (rank, node, text, number of ranks) as each rank's log grows, interleaved as it arrives,
        attempt after attempt, until the job has finished (a one-node attempt has rank 0 only)."""
        attempt, cursors, first = None, {}, True
        while True:
            head = self.logs(job_id, tail=tail if first else None, attempt=attempt, after=cursors.get(0))
            ranks = [head]
            for rank in range(1, len(head["nodes"])):
                ranks.append(
                    self.logs(
                        job_id,
                        tail=tail if first else None,
                        attempt=head["attempt"],
                        rank=rank,
                        after=cursors.get(rank),
                    )
                )
            first = False
            more = False
            for rank, data in enumerate(ranks):
                if data["text"]:
                    yield rank, data["node"], data["text"], len(ranks)
                cursors[rank] = data["cursor"]
                more = more or data["more"]
            if more:
                continue
            if head["attempt"] is not None:
                attempt = head["attempt"]
            job = self.job(job_id)
            if job["attempt_count"] and attempt is not None and job["attempt_count"] > attempt:
                attempt, cursors = job["attempt_count"], {}
                yield -1, "", f"--- attempt {attempt} ---\n", 0
                continue
            if job["state"] in TERMINAL_STATES and (head["finished"] or head["attempt"] is None):
                return
            time.sleep(poll_s)

    def wait(self, job_id: int, *, poll_s: float = 2.0, timeout_s: float | None = None) -> dict:
        """Block until the job has finished; returns it. Raises TimeoutError after timeout_s."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if job["state"] in TERMINAL_STATES:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job['state']} after {timeout_s} s")
            time.sleep(poll_s)

    # --- writes ----------------------------------------------------------------------------------

    def submit(
        self,
        *,
        share: str,
        gpus: int,
        gpu_type: str,
        command: Sequence[str],
        name: str = "",
        priority: int = 0,
        env: Mapping[str, str] | None = None,
        max_runtime_s: int | None = None,
        **extra: Any,
    ) -> dict:
        body: dict[str, Any] = {
            "share": share,
            "gpus": gpus,
            "gpu_type": gpu_type,
            "command": list(command),
            "name": name,
            "priority": priority,
            "env": dict(env or {}),
            **extra,
        }
        if max_runtime_s is not None:
            body["max_runtime_s"] = max_runtime_s
        return self.request("POST", "jobs/", json=body)

    def array(self, array_id: int) -> dict:
        return self.request("GET", f"arrays/{int(array_id)}/")

    def arrays(self) -> list[dict]:
        return self._all("arrays/")

    def cancel_array(self, array_id: int) -> dict:
        return self.request("POST", f"arrays/{int(array_id)}/cancel/")

    def set_array_priority(self, array_id: int, priority: int) -> dict:
        return self.request("PATCH", f"arrays/{int(array_id)}/", json={"priority": priority})

    def wait_array(self, array_id: int, *, poll_s: float = 2.0, timeout_s: float | None = None) -> dict:
        """Block until every task of the array has finished; returns the array with its counts."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            array = self.array(array_id)
            if array["done"]:
                return array
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"array A{array_id} is not done after {timeout_s} s: {array['counts']}")
            time.sleep(poll_s)

    # --- the layout (admins; a team manager reads its own team's part) -------------------------------

    def layout_text(self) -> str:
        """The layout as the server writes it: YAML with comments."""
        return self.request("GET", "layout/", params={"format": "yaml"}, text=True)

    def layout(self) -> dict:
        return self.request("GET", "layout/")

    def layout_plan(
        self, *, document: str | None = None, rollback: int | None = None, whatif: bool = True
    ) -> dict:
        """Plan a layout (YAML or JSON text, sent as it is) or a rollback to a version."""
        body: dict[str, Any] = {"whatif": whatif}
        if rollback is not None:
            body["rollback"] = rollback
        else:
            body["document"] = document
        return self.request("POST", "layout/plan/", json=body)

    def layout_plan_get(self, plan_id: str) -> dict:
        return self.request("GET", f"layout/plans/{plan_id}/")

    def layout_apply(self, plan_id: str, *, confirm: bool = False) -> dict:
        """Apply a plan; one that adds to an over-commit only with confirm=True (else a 400 under
        "confirm" that names it)."""
        return self.request(
            "POST", f"layout/plans/{plan_id}/apply/", json={"confirm": True} if confirm else None
        )

    def advice_start(self, *, weeks: int) -> dict:
        """Start an advice run: the last `weeks` weeks replayed with variants of the layout (admins)."""
        return self.request("POST", "advice/", json={"weeks": weeks})

    def advice_get(self, run_id: str) -> dict:
        return self.request("GET", f"advice/{run_id}/")

    def advice_cancel(self, run_id: str) -> dict:
        return self.request("POST", f"advice/{run_id}/cancel/")

    def advice_plan(self, run_id: str, point: int) -> dict:
        """A layout plan of frontier point `point` (apply it with layout_apply)."""
        return self.request("POST", f"advice/{run_id}/plan/", json={"point": point})

    def layout_versions(self, limit: int = 20) -> list[dict]:
        return self.request("GET", "layout/versions/", params={"limit": limit})["results"]

    def layout_temporary(self) -> list[dict]:
        return self._all("layout/temporary/")

    def cancel(self, job_id: int) -> dict:
        """Cancel a job. A running one answers CANCELLING (stopping, its GPUs still held); wait() for
        CANCELLED."""
        return self.request("POST", f"jobs/{int(job_id)}/cancel/")

    def release(self, job_id: int) -> dict:
        """Queue a HELD job again (admins)."""
        return self.request("POST", f"jobs/{int(job_id)}/release/")

    def set_priority(self, job_id: int, priority: int) -> dict:
        return self.request("PATCH", f"jobs/{int(job_id)}/", json={"priority": priority})
