"""Jobs that name a container image (README "Container images"): podman, started by the agent for each
attempt (no daemon), runs the job's command in the image with the attempt's own confinement.

What this module owns: finding podman and an OCI runtime that works on this host (crun refuses to start
anything on a host whose cgroups are in hybrid mode; runc works there), the `podman run` command line of
an attempt, pulling an image (a phase of its own: it does not count against max_runtime_s, since the
attempt is reported started only once its container starts), the host's image cache (a disk cap,
least recently used images removed first, never one an attempt uses), and the containers an agent that
was killed left behind (each is labelled with its node and attempt).

How an attempt's container is confined, with a root agent:
- it runs as the attempt's own uid and gid (`--user`, plus the groups its checkpoint hold gives), the
  same per-attempt identity a host command gets; rootful podman maps no user namespace, so its files
  on the host belong to that uid;
- no capabilities (`--cap-drop=all`), `no-new-privileges`, never `--privileged`, podman's default
  seccomp profile, a read-only root (`--read-only`) with the attempt's working directory and its job's
  checkpoint directory mounted read-write at the paths its environment names;
- its processes live in a cgroup under the attempt's own (`--cgroup-parent`) and conmon stays in the
  attempt's (`--cgroups=no-conmon`: podman is started inside it), with the attempt's memory, task and
  CPU limits set again on the container itself (`--memory`, `--pids-limit`, `--cpu-shares`);
- a pid namespace of its own (it sees only its own processes), the host's network (as a host command:
  gangs reach each other at their hosts' addresses and the attempt's rendezvous port);
- its environment is written to an env file only root reads (never on podman's command line, which
  every user of the host can read), and podman itself runs with the agent's clean environment;
- the datasets its share allows (host directories, read-only, nosuid, nodev), each resolved here on the
  host (symlinks followed) and refused unless it still lies under the directory that allowed it.

Registry credentials are the admin's: one auth file on the host (REGISTRY_AUTH_FILE, podman's format),
root's and readable by nobody else (refused otherwise, as the signing keys are), given to `podman pull`
with --authfile and to the manifest request that sizes a pull; never in podman's environment, the job's
env file, its log or its events.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import platform
import re
import resource
import shutil
import ssl
import stat
import subprocess
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LABEL_NODE = "gpuquota.node"
LABEL_ATTEMPT = "gpuquota.attempt"
# Where the NVIDIA Container Toolkit writes its CDI spec (`nvidia-ctk cdi generate`).
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
CDI_HINT = (
    "this host has no CDI spec for NVIDIA GPUs in /etc/cdi or /var/run/cdi: install the NVIDIA Container "
    "Toolkit and run `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`"
)
PULL_TIMEOUT_S = 3600
# What podman's own process may see of the agent's environment (the job's goes through the env file).
# The registry credentials are not among them: podman gets their file with --authfile (Podman.authfile).
PODMAN_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "HOME",
    "TZ",
    "CONTAINERS_REGISTRIES_CONF",
    "CONTAINERS_CONF",
)
# How often a pull's progress is reported (each report is a message to the control side).
PULL_REPORT_EVERY_S = 1.0
PULL_WATCH_EVERY_S = 0.25
MANIFEST_TIMEOUT_S = 10
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
# Where a container may never have a dataset mounted (its own root's machinery and the attempt's paths).
RESERVED_TARGETS = ("/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/usr", "/tmp", "/run")


class ContainerError(Exception):
    """An image the host cannot run (a failed pull, a missing CDI spec): the job's attempt ends with
    this message, in plain words."""


@dataclass(frozen=True)
class Podman:
    """podman on this host, with the OCI runtime chosen for it."""

    path: str
    runtime: str | None  # None: podman's default
    cgroups: str  # "v1" (hybrid or legacy) or "v2"
    # The admin's registry credentials (podman's auth.json), or None: pulls go without any.
    authfile: str | None = None

    @classmethod
    def detect(cls, podman: str | None = None, authfile: str | None = None) -> tuple[Podman | None, str]:
        """podman and a runtime that works here, or None and why not. The choice is logged once.
        `authfile`: the registry credentials' file (default: REGISTRY_AUTH_FILE of the agent's
        environment), used only if root's and readable by nobody else."""
        if authfile is None:
            authfile = os.environ.get("REGISTRY_AUTH_FILE") or None
        if authfile:
            problem = authfile_problem(authfile)
            if problem:
                return None, problem
        path = podman or shutil.which("podman")
        if not path:
            return None, "podman is not installed (apt-get install podman runc)"
        try:
            out = subprocess.run(
                [path, "info", "--format", "json"], capture_output=True, text=True, timeout=60, check=True
            ).stdout
            info = json.loads(out)
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            return None, f"podman info failed: {getattr(e, 'stderr', None) or e}"
        host = info.get("host", {})
        cgroups = host.get("cgroupVersion", "v2")
        default = (host.get("ociRuntime") or {}).get("name", "")
        runtime = None
        if cgroups == "v1" and default != "runc":
            # crun refuses every container on a hybrid host; runc runs them.
            if not shutil.which("runc"):
                return (
                    None,
                    f"cgroups {cgroups} need runc here ({default or 'crun'} refuses): apt-get install runc",
                )
            runtime = "runc"
        log.info(
            "containers: podman %s with runtime %s (cgroups %s)",
            (info.get("version") or {}).get("Version", "?"),
            runtime or default or "default",
            cgroups,
        )
        if authfile:
            log.info("containers: registry credentials from %s (given to podman with --authfile)", authfile)
        return cls(path, runtime, cgroups, authfile), ""

    def base(self) -> list[str]:
        argv = [self.path, "--cgroup-manager", "cgroupfs"]
        if self.runtime:
            argv += ["--runtime", self.runtime]
        return argv

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.base(), *args], capture_output=True, text=True, timeout=timeout, env=podman_env()
        )

    # --- images -------------------------------------------------------------------------------

    def has_image(self, image: str) -> bool:
        return self._run("image", "exists", image).returncode == 0

    def image_size(self, image: str) -> int:
        r = self._run("image", "inspect", "--format", "{{.Size}}", image)
        try:
            return int(r.stdout.strip())
        except ValueError:
            return 0

    def pull(
        self,
        image: str,
        say=lambda _line, progress=False: None,
        timeout: float = PULL_TIMEOUT_S,
        tmp_root: Path | None = None,
    ) -> float:
        """Pull an image; `say` gets the progress in words (`progress=True` for the byte counts, at most
        every PULL_REPORT_EVERY_S: "pulling image X, 1.2 of 3.4 GB"). Returns the seconds it took.
        Raises ContainerError with the registry's message in plain words (once: no retry loop).

        The bytes: podman prints no progress without a terminal, so the layers' sizes come from the
        registry's manifest (registry_layers, with the same credentials) and the bytes that arrived
        from the size of podman's download files, in a temporary directory of this pull's own
        (TMPDIR, where podman writes each blob as it downloads it). A layer podman says it already has
        ("skipped: already exists") leaves the total. Without a manifest the words say the bytes so far."""
        began = time.monotonic()
        layers = registry_layers(image, authfile=self.authfile) or {}
        total = sum(layers.values())
        say(f"pulling image {image}" + (f", 0 of {size_words(total)}" if total else ""))
        with tempfile.TemporaryDirectory(prefix="pull-", dir=tmp_root) as tmp:
            proc = subprocess.Popen(
                [*self.base(), "pull", *self.auth_args(), image],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**podman_env(), "TMPDIR": tmp},
            )
            lines: list[str] = []
            skipped: set[str] = set()
            done = threading.Event()

            def watch() -> None:
                seen: dict[str, int] = {}
                last_said, last_bytes = time.monotonic(), 0
                while not done.wait(PULL_WATCH_EVERY_S):
                    got = downloaded(Path(tmp), seen)
                    now = time.monotonic()
                    if got != last_bytes and now - last_said >= PULL_REPORT_EVERY_S:
                        left = total - sum(layers.get(d, 0) for d in set(skipped))
                        say(progress_words(image, got, left), progress=True)
                        last_said, last_bytes = now, got

            watcher = threading.Thread(target=watch, daemon=True, name=f"pull-watch-{image[:40]}")
            watcher.start()
            timer = threading.Timer(timeout, proc.kill)
            timer.start()
            try:
                for line in proc.stdout:
                    line = line.strip()
                    lines.append(line)
                    # "Copying blob sha256:abc… skipped: already exists": not downloaded.
                    m = re.match(r"Copying blob (?:sha256:)?([0-9a-f]+) skipped", line)
                    if m:
                        skipped.update(d for d in layers if d.removeprefix("sha256:").startswith(m[1]))
                code = proc.wait()
            finally:
                timer.cancel()
                done.set()
                watcher.join(5)
        if code != 0:
            raise ContainerError(f"could not pull image {image}: {pull_error(lines)}")
        took = time.monotonic() - began
        size = self.image_size(image)
        say(f"pulled image {image}: {size_words(size)} in {took:.1f} s")
        return took

    def auth_args(self) -> list[str]:
        if not self.authfile:
            return []
        problem = authfile_problem(self.authfile)  # changed since the agent started: refused now
        if problem:
            raise ContainerError(problem)
        return ["--authfile", self.authfile]

    def images(self) -> list[dict]:
        """[{"id", "names", "size"}] of the host's images."""
        r = self._run("images", "--format", "json")
        try:
            rows = json.loads(r.stdout or "[]")
        except ValueError:
            return []
        return [
            {"id": i.get("Id", ""), "names": i.get("Names") or [], "size": int(i.get("Size") or 0)}
            for i in rows
        ]

    def remove_image(self, image_id: str) -> bool:
        return self._run("rmi", image_id).returncode == 0

    # --- containers -----------------------------------------------------------------------------

    def containers(self, node: str) -> list[tuple[str, str]]:
        """(name, attempt label) of every container this node's agents made, running or not."""
        r = self._run("ps", "-a", "--filter", f"label={LABEL_NODE}={node}", "--format", "json")
        try:
            rows = json.loads(r.stdout or "[]")
        except ValueError:
            return []
        out = []
        for row in rows:
            names = row.get("Names") or []
            labels = row.get("Labels") or {}
            if names:
                out.append((names[0], labels.get(LABEL_ATTEMPT, "")))
        return out

    def signal(self, name: str, sig: int) -> None:
        """Send a signal to a container's init (which passes it on), without waiting for podman."""
        threading.Thread(
            target=self._run, args=("kill", "--signal", str(int(sig)), name), daemon=True, name=f"kill-{name}"
        ).start()

    def state(self, name: str) -> dict | None:
        """A container's state as podman records it: {"status": "running", "exited", ..., "exit_code",
        "oom_killed"}; None where podman has no such container."""
        r = self._run("container", "inspect", "--format", "json", name)
        try:
            rows = json.loads(r.stdout or "[]") if r.returncode == 0 else []
            found = (rows[0] or {}).get("State") or {} if rows else None
        except (ValueError, AttributeError, IndexError):
            return None
        if found is None:
            return None
        return {
            "status": str(found.get("Status", "")).lower(),
            "exit_code": found.get("ExitCode"),
            "oom_killed": bool(found.get("OOMKilled")),
        }

    def wait_argv(self, name: str) -> list[str]:
        """`podman wait`: a process that ends when the container does (what the agent follows once the
        `podman run` it started died under a container that still runs)."""
        return [*self.base(), "wait", name]

    def remove(self, name: str) -> None:
        """End a container (SIGKILL to all of it) and remove it; nothing if it is gone."""
        r = self._run("rm", "--force", "--time", "0", name)
        if r.returncode != 0 and "no such container" not in (r.stderr or "").lower():
            log.warning("podman rm %s: %s", name, (r.stderr or "").strip())

    def images_in_use(self) -> set[str]:
        r = self._run("ps", "-a", "--format", "{{.ImageID}}")
        return {line.strip() for line in (r.stdout or "").splitlines() if line.strip()}


def podman_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in PODMAN_ENV}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def authfile_problem(path: str) -> str:
    """Why the registry credentials' file may not be used: it must be a plain file of the agent's own
    user (root), readable and writable by it alone, as the signing keys are."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError as e:
        return f"the registry credentials file {path} cannot be read: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"the registry credentials file {path} is not a plain file"
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return (
            f"the registry credentials file {path} must be the agent's own and readable by it alone "
            f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): chown root and chmod 600 it"
        )
    return ""


def size_words(n: int, unit_of: int | None = None) -> str:
    """Bytes in the unit `unit_of` (default: `n`) calls for: "3.4 GB", "21.1 MB", "512 kB"."""
    ref = n if unit_of is None else unit_of
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if ref >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.0f} kB"


def progress_words(image: str, got: int, total: int) -> str:
    """ "pulling image X, 1.2 of 3.4 GB" (both in the total's unit), or "..., 1.2 GB so far" without
    a known total (no manifest, or more arrived than it listed)."""
    if total > 0 and got <= total:
        return f"pulling image {image}, {size_words(got, total).split()[0]} of {size_words(total)}"
    return f"pulling image {image}, {size_words(got)} so far"


def downloaded(tmp: Path, seen: dict[str, int]) -> int:
    """The bytes podman has written under `tmp` so far: each file's largest size seen (a blob it has
    finished with and removed still counts)."""
    for dirpath, _dirs, files in os.walk(tmp):
        for name in files:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                seen[path] = max(seen.get(path, 0), os.stat(path, follow_symlinks=False).st_size)
    return sum(seen.values())


def _registry_conf() -> dict:
    path = os.environ.get("CONTAINERS_REGISTRIES_CONF") or "/etc/containers/registries.conf"
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _insecure(host: str) -> bool:
    """The registry is marked insecure in registries.conf (podman then allows plain HTTP and unchecked
    TLS there): the manifest request does the same."""
    for reg in _registry_conf().get("registry") or []:
        location = str(reg.get("location") or reg.get("prefix") or "")
        if location.split("/")[0] == host and reg.get("insecure"):
            return True
    return False


def _credentials(host: str, authfile: str | None) -> str | None:
    """The auth.json entry of a registry ("user:password" in base64), or None."""
    if not authfile:
        return None
    try:
        auths = json.loads(Path(authfile).read_text()).get("auths") or {}
    except (OSError, ValueError, AttributeError):
        return None
    # Docker Hub's credentials are often kept under its old index's name.
    names = {host, "index.docker.io", "registry-1.docker.io"} if host == "docker.io" else {host}
    for key, entry in auths.items():
        netloc = urllib.parse.urlsplit(key if "//" in key else f"//{key}").netloc
        if netloc in names and isinstance(entry, dict):
            return entry.get("auth") or None
    return None


def _platform() -> tuple[str, str]:
    machine = platform.machine().lower()
    return "linux", {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def registry_layers(image: str, authfile: str | None = None) -> dict[str, int] | None:
    """The compressed size of each blob of the image (its layers and config, by digest), read from its
    registry's manifest (for a multi-platform image, this host's platform's), with the admin's
    credentials (Basic or a Bearer token); None when the registry cannot tell (never an error: the
    pull goes on without a total)."""
    m = re.match(r"^([^/]+)/(.+?)(?::([\w][\w.-]{0,127}))?(?:@(sha256:[a-f0-9]{64}))?$", image)
    if not m:
        return None
    host, repo, tag, digest = m.groups()
    api_host = "registry-1.docker.io" if host == "docker.io" else host
    try:
        manifest = _get_manifest(api_host, host, repo, digest or tag or "latest", authfile)
        if manifest.get("manifests"):
            want = _platform()
            entry = next(
                (
                    e
                    for e in manifest["manifests"]
                    if (e.get("platform") or {}).get("os") == want[0]
                    and (e.get("platform") or {}).get("architecture") == want[1]
                ),
                None,
            )
            if entry is None:
                return None
            manifest = _get_manifest(api_host, host, repo, entry["digest"], authfile)
        blobs = [*(manifest.get("layers") or []), *([manifest["config"]] if manifest.get("config") else [])]
        sizes = {str(b["digest"]): int(b["size"]) for b in blobs}
        return sizes or None
    except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError) as e:
        log.info("no manifest of %s to size its pull: %s", image, e)
        return None


def _get_manifest(api_host: str, host: str, repo: str, reference: str, authfile: str | None) -> dict:
    insecure = _insecure(host)
    context = ssl.create_default_context()
    if insecure:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    path = f"/v2/{repo}/manifests/{reference}"
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    schemes = ["https", "http"] if insecure else ["https"]
    last: Exception | None = None
    for scheme in schemes:
        url = f"{scheme}://{api_host}{path}"
        try:
            return _fetch_json(url, headers, context, host, repo, authfile)
        except urllib.error.HTTPError:
            raise
        except (OSError, urllib.error.URLError) as e:
            last = e
    raise last or OSError("no manifest")


def _fetch_json(url: str, headers: dict, context, host: str, repo: str, authfile: str | None) -> dict:
    def get(h: dict) -> dict:
        req = urllib.request.Request(url, headers=h)
        with urllib.request.urlopen(req, timeout=MANIFEST_TIMEOUT_S, context=context) as r:
            return json.loads(r.read(4 << 20))

    try:
        return get(headers)
    except urllib.error.HTTPError as e:
        if e.code != 401:
            raise
        challenge = e.headers.get("WWW-Authenticate", "")
    creds = _credentials(host, authfile)
    if challenge.lower().startswith("basic"):
        if not creds:
            raise OSError("the registry asks for credentials and the host has none for it")
        return get({**headers, "Authorization": f"Basic {creds}"})
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", "")
    if not challenge.lower().startswith("bearer") or not realm:
        raise OSError(f"an unknown challenge: {challenge[:80]}")
    params.setdefault("scope", f"repository:{repo}:pull")
    req = urllib.request.Request(
        f"{realm}?{urllib.parse.urlencode(params)}",
        headers={"Authorization": f"Basic {creds}"} if creds else {},
    )
    with urllib.request.urlopen(req, timeout=MANIFEST_TIMEOUT_S, context=context) as r:
        answer = json.loads(r.read(1 << 20))
    token = answer.get("token") or answer.get("access_token")
    if not token:
        raise OSError("the registry's token service gave no token")
    return get({**headers, "Authorization": f"Bearer {token}"})


def pull_error(lines: list[str]) -> str:
    """The registry's reason out of podman's output: its last "Error: ..." line without the
    "initializing source docker://..." prefix and with its repeats dropped (e.g. "reading manifest 1 in
    reg/x: manifest unknown", "pinging container registry reg: ...: connection refused")."""
    errors = [ln for ln in lines if ln.startswith("Error")] or lines[-1:] or ["podman pull failed"]
    text = errors[-1].removeprefix("Error:").strip()
    parts: list[str] = []
    for part in (p.strip() for p in text.split(": ")):
        if part and not part.startswith("initializing source") and (not parts or parts[-1] != part):
            parts.append(part)
    return re.sub(r"\s+", " ", ": ".join(parts) or text)[:500]


def container_name(node: str, attempt_id: int, number: int) -> str:
    return f"gpuquota-{node}-a{attempt_id}-{number}"


def attempt_label(attempt_id: int, number: int) -> str:
    return f"{attempt_id}-{number}"


def cdi_spec_present(dirs=CDI_DIRS) -> bool:
    for d in dirs:
        with contextlib.suppress(OSError):
            if any(p.suffix in (".yaml", ".yml", ".json") and "nvidia" in p.name for p in Path(d).iterdir()):
                return True
    return False


MS_BIND, MS_REC, MNT_DETACH = 0x1000, 0x4000, 2


def mount_idmapped(path: Path, target: Path, userns_fd: int) -> None:
    """Bind `path` at `target` (made here), then mount an idmapped copy over it (identity.idmap_over):
    what the container gets as its checkpoint directory. Undone by unmount()."""
    from gpunodes.agent import identity

    libc = ctypes.CDLL(None, use_errno=True)
    target.mkdir(mode=0o700, exist_ok=True)
    if libc.mount(str(path).encode(), str(target).encode(), None, MS_BIND, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot bind {path}: {os.strerror(err)}")
    try:
        identity.idmap_over(libc, str(target), userns_fd)
    except OSError:
        unmount(target)
        raise


def unmount(target: Path) -> None:
    """Detach whatever is mounted at `target` (the idmapped copy and the bind below it), then remove
    the directory; nothing if it is not there."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(4):
        if libc.umount2(str(target).encode(), MNT_DETACH) != 0:
            break
    with contextlib.suppress(OSError):
        target.rmdir()


def cgroup_parent(paths) -> str | None:
    """The one cgroup path (relative to each hierarchy's mount) of the attempt's cgroups, if they share
    it: podman's cgroupfs manager makes the container's cgroup under it in every hierarchy."""
    rel = set()
    for path in paths:
        parts = Path(path).parts
        # /sys/fs/cgroup/<controller>/<rel...> (v1) or /sys/fs/cgroup/<rel...> (v2, unified).
        if len(parts) < 4 or parts[:3] != ("/", "sys", "fs"):
            return None
        rest = parts[4:] if parts[3] == "cgroup" else parts[3:]
        if parts[3] == "cgroup" and rest and rest[0] in _V1_NAMES:
            rest = rest[1:]
        rel.add("/" + "/".join(rest))
    return rel.pop() if len(rel) == 1 else None


_V1_NAMES = {"memory", "pids", "cpu", "cpuacct", "cpu,cpuacct", "devices", "unified"}


def _plain_path(path: str) -> bool:
    """Absolute, no "." or ".." part, no empty part, nothing podman's --volume would read as syntax."""
    return (
        isinstance(path, str)
        and path.startswith("/")
        and len(path) <= 4096
        and not re.search(r"[:,\x00-\x1f]", path)
        and all(part not in ("", ".", "..") for part in path.split("/")[1:])
    ) or path == "/"


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolve_dataset(host: str, target: str, allowed_by: str, avoid=()) -> tuple[str, str]:
    """A dataset mount, checked on the host it runs on: (its real path, its path in the container).
    The control side checked the names against the rules (jobs/mounts.py); here what they lead to:
    the path with every symlink followed must still lie under the real path of the directory that
    allowed it (a link inside a dataset cannot hand out the host's /etc), must exist, and may neither
    lie in nor hold one of `avoid` (the agent's own and the attempt's directories)."""
    for what, path in (("dataset", host), ("allowed directory", allowed_by), ("container path", target)):
        if not _plain_path(path):
            raise ContainerError(f"the {what} {path!r} is not a plain absolute path")
    if not _under(host, allowed_by):
        raise ContainerError(f"the dataset {host} is not under {allowed_by}, the directory said to allow it")
    if target == "/" or any(_under(target, r) for r in RESERVED_TARGETS):
        raise ContainerError(f"a dataset may not be mounted at {target} in the container")
    root = os.path.realpath(allowed_by)
    real = os.path.realpath(host)
    if not _under(real, root):
        raise ContainerError(
            f"the dataset {host} leads to {real} on this host (a symlink), outside {allowed_by}, which "
            "allowed it: not mounted"
        )
    if not os.path.exists(real):
        raise ContainerError(f"the dataset {host} does not exist on this host")
    if not _plain_path(real):
        raise ContainerError(f"the dataset {host} leads to {real!r}, which podman cannot mount")
    for own in avoid:
        own = os.path.realpath(own)
        if _under(real, own) or _under(own, real):
            raise ContainerError(f"the dataset {host} holds or lies in the agent's own {own}: not mounted")
        if _under(target, str(own)) or _under(str(own), target):
            raise ContainerError(f"a dataset may not be mounted at {target}, over the attempt's {own}")
    return real, target


def write_env_file(path: Path, env: dict[str, str]) -> None:
    """The container's environment, readable by root only. A value with a newline cannot be written
    in podman's format: refused in words."""
    bad = [k for k, v in env.items() if "\n" in v or "\r" in v]
    if bad:
        raise ContainerError(
            f"a container job's variables may not hold line breaks: {', '.join(sorted(bad))}"
        )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in env.items()))


def run_argv(
    podman: Podman,
    *,
    name: str,
    image: str,
    command: list[str],
    node: str,
    attempt_id: int,
    number: int,
    env_file: Path,
    uid: int | None,
    gid: int | None,
    workdir: Path,
    checkpoint: Path,
    checkpoint_source: Path,
    memory_bytes: int | None,
    pids: int | None,
    cpu_weight: int | None,
    parent: str | None,
    gpus: list[int],
    real_gpus: bool,
    tmpfs_bytes: int = 0,
    datasets: list[tuple[str, str]] = (),
) -> list[str]:
    """`podman run` for one attempt (module docstring)."""
    nofile_soft, nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # podman's default ulimits exceed some hosts' hard limits (then nothing starts): the agent's own.
    nofile = nofile_hard if nofile_hard != resource.RLIM_INFINITY else 1 << 20
    nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = pids or (nproc_hard if nproc_hard != resource.RLIM_INFINITY else 1 << 16)
    argv = [
        *podman.base(),
        "run",
        # No --rm: the container's record stays until the agent removes it (Runner._end_container), so
        # its state and exit code can still be read when podman itself died under it (Podman.state).
        "--name",
        name,
        "--label",
        f"{LABEL_NODE}={node}",
        "--label",
        f"{LABEL_ATTEMPT}={attempt_label(attempt_id, number)}",
        "--pull",
        "never",  # pulled before, as a phase of its own
        "--log-driver",
        "none",  # the output goes to the attempt's log through podman's stdout, not twice to disk
        "--cgroups",
        "no-conmon",
        "--read-only",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "--network",
        "host",
        "--ulimit",
        f"nofile={min(nofile_soft, nofile)}:{nofile}",
        "--ulimit",
        f"nproc={nproc}:{nproc}",
        "--env-file",
        str(env_file),
        "--volume",
        f"{workdir}:{workdir}:rw",
        "--volume",
        f"{checkpoint_source}:{checkpoint}:rw",
        "--workdir",
        str(workdir),
    ]
    if shutil.which("catatonit") or Path("/usr/libexec/podman/catatonit").exists():
        argv.append("--init")  # signals reach the job's program; zombies are reaped
    if tmpfs_bytes > 0:
        argv += ["--tmpfs", f"/tmp:rw,nosuid,nodev,size={tmpfs_bytes}"]
    if uid is not None:
        argv += ["--user", f"{uid}:{gid}"]
    if parent:
        argv += ["--cgroup-parent", parent]
    if memory_bytes:
        argv += ["--memory", str(memory_bytes), "--memory-swap", str(memory_bytes)]
    if pids:
        argv += ["--pids-limit", str(pids)]
    if cpu_weight:
        argv += ["--cpu-shares", str(max(2, cpu_weight * 1024 // 100))]
    if real_gpus:
        for i in gpus:
            argv += ["--device", f"nvidia.com/gpu={i}"]
    for host, target in datasets:  # resolve_dataset's: real paths, no ":" or ","
        argv += ["--volume", f"{host}:{target}:ro,nosuid,nodev"]
    argv += ["--", image, *command]
    return argv


# --- the host's image cache ---------------------------------------------------------------------


class ImageCache:
    """When each image was last used here (a small JSON file of the agent's), and the cap: after a
    pull, the least recently used images go until the rest fit, never one a container (running or
    not yet removed) uses."""

    def __init__(self, podman: Podman, path: Path, cap_bytes: int) -> None:
        self.podman, self.path, self.cap_bytes = podman, Path(path), cap_bytes
        self._lock = threading.Lock()

    def _read(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text())
            return {k: float(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def used(self, image: str) -> None:
        with self._lock:
            data = self._read()
            data[image] = time.time()
            tmp = self.path.with_suffix(".tmp")
            with contextlib.suppress(OSError):
                tmp.write_text(json.dumps(data))
                tmp.replace(self.path)

    def prune(self, keep: set[str] = frozenset()) -> list[str]:
        """Remove least recently used images until the cache fits its cap; `keep`: image names that
        must stay (the one about to start). Returns the removed names."""
        if self.cap_bytes <= 0:
            return []
        with self._lock:
            images = self.podman.images()
            total = sum(i["size"] for i in images)
            if total <= self.cap_bytes:
                return []
            in_use = self.podman.images_in_use()
            last = self._read()
            removable = [
                i
                for i in images
                if not any(i["id"].startswith(u) or u.startswith(i["id"]) for u in in_use if u)
                and not set(i["names"]) & set(keep)
            ]
            removable.sort(key=lambda i: max((last.get(n, 0.0) for n in i["names"]), default=0.0))
            removed = []
            for i in removable:
                if total <= self.cap_bytes:
                    break
                if self.podman.remove_image(i["id"]):
                    total -= i["size"]
                    removed += i["names"] or [i["id"]]
            if removed:
                log.info("image cache over %d bytes: removed %s", self.cap_bytes, ", ".join(removed))
            return removed
