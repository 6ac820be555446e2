"""gpuquota settings: one file, read from the environment, with safe local defaults.

Local default (nothing set): SQLite under var/, Celery's file-system broker under var/broker/, DEBUG off
unless asked. Production: DATABASE_URL (PostgreSQL) and REDIS_URL (broker + cache).
"""

import hashlib
import os
import secrets
import sys
from datetime import timedelta
from pathlib import Path

import dj_database_url

# Everything gpuquota writes (database, broker messages, logs, keys) is private to its user: set before
# anything is written. The state directory itself is 0700.
os.umask(0o077)
BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("GPUQUOTA_VAR_DIR", BASE_DIR / "var"))
# `make test` runs the in-process tests on pytest-xdist workers (tests/conftest.py): each worker keeps its
# own files (broker, cache, keys, the SQLite test database) and, below, its own Redis database; the
# PostgreSQL test database is its own already (pytest-django names it after the worker).
# The worker's values go back into the environment, marked as applied: a process a test starts (with
# os.environ, or with the values of these settings) gets the same ones, not the worker's applied twice.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if os.environ.get("GPUQUOTA_XDIST_APPLIED") == XDIST_WORKER:
    XDIST_WORKER = ""
if XDIST_WORKER:
    VAR_DIR = VAR_DIR / XDIST_WORKER
    os.environ["GPUQUOTA_VAR_DIR"] = str(VAR_DIR)
VAR_DIR.mkdir(parents=True, exist_ok=True)
if VAR_DIR.stat().st_uid == os.geteuid():
    VAR_DIR.chmod(0o700)
# The GPU host agent needs only the broker: no database, no secret key (README, "Security model").
AGENT_PROCESS = sys.argv[1:2] == ["gpu_agent"]


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def xdist_redis_url(url: str, worker: str) -> str:
    """The Redis database of a test worker: gw0 keeps REDIS_URL's, gwN takes the one N below it (mod 16):
    a worker's `cache.clear()` or broker purge must not empty another's."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0)
    n = int(worker.removeprefix("gw") or 0)
    return urlunsplit(parts._replace(path=f"/{(db - n) % 16}"))


def _secret_key() -> str:
    # Never committed: taken from the environment, or generated once into var/ on first run (not in
    # production: there it comes from the environment only).
    if os.environ.get("SECRET_KEY"):
        return os.environ["SECRET_KEY"]
    if AGENT_PROCESS:
        return secrets.token_urlsafe(50)  # signs nothing: the agent serves no pages
    if os.environ.get("DJANGO_ENV", "development") == "production":
        raise RuntimeError("SECRET_KEY must come from the environment when DJANGO_ENV=production")
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


DJANGO_ENV = os.environ.get("DJANGO_ENV", "development")
SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "rest_framework",
    "knox",
    "axes",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "quotas",
    "gpunodes",
    "jobs",
    "directory",
    "notify",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # A token-authenticated plain submit is answered here, without the session, CSRF, auth, message,
    # htmx and axes middleware below (none applies to it); everything else goes on down the chain.
    "jobs.api.fast_submit.FastSubmitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A directory user's session checked with the provider again every OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS.
    "directory.middleware.DirectorySessionRefresh",
    # Login tries per client address on /login/ and /admin/login/ (config/logins.py).
    "config.logins.LoginRateMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its lockout answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "config.wsgi.application"

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'gpuquota.sqlite3'}",
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60),
    )
}
if AGENT_PROCESS:
    DATABASES = {"default": {"ENGINE": "django.db.backends.dummy"}}  # any database use fails loudly
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE transactions take SQLite's write lock up front, which is what serialises scheduling
    # passes on the embedded default (PostgreSQL uses an advisory lock instead).
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
    # Not a rule: revokes the user's API tokens whenever the password changes (config/auth.py).
    {"NAME": "config.auth.RevokeTokensOnPasswordChange"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# Requests larger than this are refused (413) before anything parses them.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BYTES", 256 * 1024)

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL and XDIST_WORKER:
    REDIS_URL = os.environ["REDIS_URL"] = xdist_redis_url(REDIS_URL, XDIST_WORKER)
if XDIST_WORKER:
    os.environ["GPUQUOTA_XDIST_APPLIED"] = XDIST_WORKER
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "config.cache.ReusingRedisCache", "LOCATION": REDIS_URL}}
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
        }
    }

# --- Celery -----------------------------------------------------------------------------------
BROKER_DIR = VAR_DIR / "broker"
if REDIS_URL:
    from config.redisbroker import unacked_keys

    CELERY_BROKER_URL = REDIS_URL
    # kombu's Redis transport with a fix: a Redis restart is a reconnect, never a dead worker.
    CELERY_BROKER_TRANSPORT = "config.redisbroker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": 3600,
        # A broker that vanished without closing the TCP connection (a partition, a NAT timeout) must
        # not hold a publish forever (a heartbeat stuck on a dead socket lapses the agent's lease),
        # and a consumer on a half-open connection must notice: kombu drops a BRPOP whose reply is
        # overdue by health_check_interval, so a healed partition rejoins in about 1 + 2 x 5 s (the
        # default 25 s took 47-48 s in the network-namespace fault test).
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
        "socket_keepalive": True,
        "health_check_interval": 5,
        # One queue key per queue (no priority sub-queues: nothing here sets a priority), so that a
        # node's ACL user can be granted its queue by its exact name (README, "Redis").
        "priority_steps": [0],
        # Where kombu keeps what a consumer took but has not acknowledged: the control side's own keys
        # (an agent uses its node's, config.celery.consume_as): never one hash that every node reads.
        **unacked_keys("control"),
    }
else:
    for sub in ("queue", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    # Our subclass of kombu's transport: atomic puts, undecodable messages skipped, quick polling.
    CELERY_BROKER_TRANSPORT = "config.filebroker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        # Exchange tables for broadcast/fanout; kombu's default is ./control in the working directory.
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TIMEZONE = TIME_ZONE
# A what-if worker (it consumes `whatif` alone: config.celery.whatif_worker_options) keeps what it took
# under keys of its own, and a replay it took is given to another worker when it has not acknowledged it
# after WHATIF_VISIBILITY_TIMEOUT_S (its host went away): longer than the longest replay (a 4-week window
# of 20,000-job weeks: a few minutes), so a live worker's replay is never taken from it; checked every
# WHATIF_RESTORE_INTERVAL_S by each what-if worker.
WHATIF_VISIBILITY_TIMEOUT_S = env_int("WHATIF_VISIBILITY_TIMEOUT_S", 900)
WHATIF_RESTORE_INTERVAL_S = env_int("WHATIF_RESTORE_INTERVAL_S", 30)
# Signed control messages (gpunodes/signing.py, Celery's message signing with a certificate per node):
# on when a key is given. The embedded file broker (0700, this user's own processes) runs without.
MESSAGE_SIGNING_KEY = os.environ.get("MESSAGE_SIGNING_KEY", "")
MESSAGE_SIGNING_CERT = os.environ.get("MESSAGE_SIGNING_CERT", "")
MESSAGE_TRUSTED_CERTS = os.environ.get("MESSAGE_TRUSTED_CERTS", "")
if MESSAGE_SIGNING_KEY:
    CELERY_TASK_SERIALIZER = "gpuquota-auth"
    CELERY_ACCEPT_CONTENT = ["gpuquota-auth"]
    # Refused messages logged as refusals (sender, cause), not as undecodable ones.
    CELERY_WORKER_CONSUMER = "gpunodes.signing:Consumer"
# A signed message issued longer ago than this is refused (its nonce is remembered this long), and one
# dated more than MESSAGE_CLOCK_SKEW_S ahead: hosts need synchronised clocks (NTP). A heartbeat dated
# ahead holds its node's order of heartbeats for at most MESSAGE_CLOCK_SKEW_S, signed or not.
MESSAGE_MAX_AGE_S = env_int("MESSAGE_MAX_AGE_S", 300)
MESSAGE_CLOCK_SKEW_S = env_int("MESSAGE_CLOCK_SKEW_S", 30)
# On Redis each node sends onto a list of its own, moved onto `control` by the control worker
# (config.redisbroker.Intake): at most BROKER_INTAKE_PER_NODE of a node's messages per turn, while
# `control` holds fewer than BROKER_INTAKE_BACKLOG; a node's list past BROKER_NODE_MAX_MESSAGES or
# BROKER_NODE_MAX_BYTES loses its oldest (all are sent again).
BROKER_INTAKE_BACKLOG = env_int("BROKER_INTAKE_BACKLOG", 200)
BROKER_INTAKE_PER_NODE = env_int("BROKER_INTAKE_PER_NODE", 20)
BROKER_NODE_MAX_MESSAGES = env_int("BROKER_NODE_MAX_MESSAGES", 2000)
BROKER_NODE_MAX_BYTES = env_int("BROKER_NODE_MAX_BYTES", 16 * 1024 * 1024)

# --- gpuquota ---------------------------------------------------------------------------------
SCHEDULER_INTERVAL_S = env_int("SCHEDULER_INTERVAL_S", 2)
# The organisation a job's "why it waits", the organisation page and /api/v1/groups/ read is reused in a
# process for this long while no pass runs (quotas.organisation.load_recent); 0: read every time.
ORGANISATION_RECENT_S = env_int("ORGANISATION_RECENT_S", 5)
# How often the control side looks for temporary layout changes whose time has come (quotas/layout.py).
LAYOUT_REVERT_INTERVAL_S = env_int("LAYOUT_REVERT_INTERVAL_S", 30)
# A node silent this long while others are heard is LOST (quotas/hearing.py). An agent that could not
# renew its lease (a heartbeat the broker took) for FENCE_AFTER_S stops its jobs first: SIGTERM,
# FENCE_GRACE_S, SIGKILL (gpunodes/agent/fence.py); gpunodes/checks.py holds the margin. README, "Failures
# and timing", says why 180/120/30.
NODE_LOST_AFTER_S = env_int("NODE_LOST_AFTER_S", 180)
FENCE_AFTER_S = env_int("FENCE_AFTER_S", 120)
FENCE_GRACE_S = env_int("FENCE_GRACE_S", 30)
HEARTBEAT_INTERVAL_S = env_int("HEARTBEAT_INTERVAL_S", 5)
PREEMPT_ACK_TIMEOUT_S = env_int("PREEMPT_ACK_TIMEOUT_S", 30)
STARVATION_S = env_int("STARVATION_S", 3600)
# The stored queue forecast (SEMANTICS "Forecast"): recomputed after a pass that decided something, at
# most every FORECAST_MIN_INTERVAL_S, and at least every FORECAST_MAX_AGE_S; one replay may take
# FORECAST_BUDGET_S (jobs it does not reach keep their position and get no ETA).
FORECAST_MIN_INTERVAL_S = env_int("FORECAST_MIN_INTERVAL_S", 3)
FORECAST_MAX_AGE_S = env_int("FORECAST_MAX_AGE_S", 30)
FORECAST_BUDGET_S = env_int("FORECAST_BUDGET_S", 5)
# The likely ranges (two more replays) come with each forecast where its replay took under
# FORECAST_RANGES_INLINE_S, else in a second write at most every FORECAST_RANGES_INTERVAL_S.
FORECAST_RANGES_INLINE_S = env_int("FORECAST_RANGES_INLINE_S", 1)
FORECAST_RANGES_INTERVAL_S = env_int("FORECAST_RANGES_INTERVAL_S", 30)
# Each of those replays (and the one with the work expected to arrive) may take this long.
FORECAST_RANGES_BUDGET_S = env_int("FORECAST_RANGES_BUDGET_S", 15)
DEFAULT_PREEMPTION_GRACE_S = env_int("DEFAULT_PREEMPTION_GRACE_S", 30)
# The longest grace a job may ask for (SEMANTICS.md "Jobs"): no job holds a reclaimed GPU, or a cancelled
# job its GPUs, longer than this after its SIGTERM. The same limit in the form, the API and the CLI
# (jobs/limits.py); a stop is never sent with more, whatever a job stored before asked for.
MAX_PREEMPTION_GRACE_S = env_int("MAX_PREEMPTION_GRACE_S", 3600)
# Job arrays: the most tasks one array may have, and the most jobs a share may hold queued once an array
# is added (an array that would pass it is refused whole, with both numbers in the error).
MAX_ARRAY_SIZE = env_int("MAX_ARRAY_SIZE", 10_000)
MAX_QUEUED_PER_SHARE = env_int("MAX_QUEUED_PER_SHARE", 100_000)
# The most jobs one user may have queued: single submits and arrays count alike (a submit past it is
# refused with both numbers).
MAX_QUEUED_PER_USER = env_int("MAX_QUEUED_PER_USER", 20_000)
# Container images every share may run (README "Container images"): registries or image prefixes,
# comma-separated (e.g. "registry.example.com/ml/,ghcr.io/acme/"). Empty: only what a share allows.
ALLOWED_IMAGES = env_list("ALLOWED_IMAGES")
# Host directories every share's container jobs may mount read-only (datasets; README "Container
# images"), comma-separated absolute paths (e.g. "/datasets,/models/public"). Empty: only what a share allows.
ALLOWED_MOUNTS = env_list("ALLOWED_MOUNTS")
# A job whose attempts ended with their host's agent while they ran (NODE_LOST: the agent died, the node
# went silent or was fenced alone) on this many different hosts in a row is HELD until an admin releases
# it, instead of run again for ever (a refused start, an orderly agent stop, hosts lapsing together: no
# strike). 0: never held.
HOLD_AFTER_NODE_LOST = env_int("HOLD_AFTER_NODE_LOST", 3)
# The output of a job (its log chunks on the control side) is removed this many days after the job
# ended (a beat task, jobs.tasks.prune_job_output). 0: kept for ever.
JOB_OUTPUT_KEEP_DAYS = env_int("JOB_OUTPUT_KEEP_DAYS", 30)
# The most bytes of output the control side stores for one team's jobs (all of them, until they are
# pruned by JOB_OUTPUT_KEEP_DAYS): past it an attempt's new output is cut, with a note where (0: no bound).
TEAM_OUTPUT_MAX_BYTES = env_int("TEAM_OUTPUT_MAX_BYTES", 4 * 1024**3)
JOB_LOG_DIR = Path(os.environ.get("JOB_LOG_DIR", VAR_DIR / "logs"))
# Where jobs on an agent host get their private working directories (and, by default, checkpoints):
# outside the checkout and the state directory, reachable by the jobs' uids. The default is per state
# directory, so that two checkouts on one host stay apart.
JOB_ROOT = Path(
    os.environ.get("JOB_ROOT")
    or f"/var/tmp/gpuquota-jobs-{hashlib.sha256(str(VAR_DIR.resolve()).encode()).hexdigest()[:10]}"
)
CHECKPOINT_ROOT = Path(os.environ.get("CHECKPOINT_ROOT", JOB_ROOT / "checkpoints"))
# A root agent runs each attempt as a uid of its own from this range (no accounts may lie in it).
JOB_UID_RANGE = os.environ.get("JOB_UID_RANGE", "2000000-2099999")
# Bytes of one attempt's output kept on the control side (first half and last half).
JOB_LOG_CAP_BYTES = env_int("JOB_LOG_CAP_BYTES", 8 * 1024 * 1024)
# Per-attempt log files on an agent host are removed this many days after they were last written.
JOB_LOG_KEEP_DAYS = env_int("JOB_LOG_KEEP_DAYS", 7)
# ... and bounded per job and per job owner: before an attempt starts, the oldest finished log files of
# its job and of its owner's jobs go past these (bytes on disk; 0: no bound).
JOB_LOG_HOST_BYTES_PER_JOB = env_int("JOB_LOG_HOST_BYTES_PER_JOB", 64 * 1024 * 1024)
JOB_LOG_HOST_BYTES_PER_USER = env_int("JOB_LOG_HOST_BYTES_PER_USER", 512 * 1024 * 1024)
# The agent's room on its own disks (gpunodes/agent/disk.py): below this free on the disk of its state
# directory or of JOB_LOG_DIR it refuses starts (re-queued, no strike) and writes no job output, with an
# alert in its log; and it keeps a reserve file of this size there, given back when the disk runs short
# so that its own files (outbox, nonces, state) still have room. 0: neither.
AGENT_MIN_FREE_BYTES = env_int("AGENT_MIN_FREE_BYTES", 64 * 1024 * 1024)
AGENT_DISK_RESERVE_BYTES = env_int("AGENT_DISK_RESERVE_BYTES", 16 * 1024 * 1024)
# What one attempt may use on its host (gpunodes/agent/containment.py: cgroup v2 where the controllers
# are delegated, cgroup v1 on hybrid hosts, rlimits otherwise). Memory: 0 gives each attempt its share
# of the host's memory by its share of the host's GPUs, less AGENT_MEMORY_RESERVE_BYTES (0: a
# sixteenth of the host's memory, at least 1 GiB) kept for the agent and the system; a job past it is
# killed whole and ends FAILED ("out of memory"). Tasks (processes and threads) and a CPU weight per
# GPU (cgroup v2's scale: 100 is the default of an unlimited process).
JOB_MEMORY_MAX_BYTES = env_int("JOB_MEMORY_MAX_BYTES", 0)
AGENT_MEMORY_RESERVE_BYTES = env_int("AGENT_MEMORY_RESERVE_BYTES", 0)
JOB_PIDS_MAX = env_int("JOB_PIDS_MAX", 4096)
# What a GPU host's container images may take on its disk (README "Container images"): after a pull,
# the least recently used go until the rest fit, never one an attempt uses. 0: no cap.
AGENT_IMAGE_CACHE_BYTES = env_int("AGENT_IMAGE_CACHE_BYTES", 50 * 2**30)
JOB_CPU_WEIGHT_PER_GPU = env_int("JOB_CPU_WEIGHT_PER_GPU", 100)
# Without a memory cgroup, limit each job process's address space to the memory limit instead (off by
# default: CUDA reserves far more address space than it uses, so GPU jobs do not start under it).
JOB_RLIMIT_AS = env_bool("JOB_RLIMIT_AS", False)
# A root agent's attempts work in a tmpfs of this size (their HOME, TMPDIR, cwd, /tmp and /var/tmp),
# charged to their memory limit: 0 is half the attempt's memory limit, -1 keeps it on JOB_ROOT's disk
# (no quota: one job can then fill the disk its neighbours' checkpoints are on).
JOB_WORKDIR_MAX_BYTES = env_int("JOB_WORKDIR_MAX_BYTES", 0)
# A root agent's jobs may not create user namespaces (`unshare -Ur`: "root" inside one reaches kernel
# code an unprivileged process cannot), enforced with a seccomp filter, unless this allows them
# (rootless containers in jobs). The host-wide alternative is the sysctl user.max_user_namespaces=0.
JOB_ALLOW_USER_NAMESPACES = env_bool("JOB_ALLOW_USER_NAMESPACES", False)
# Checkpoints of jobs that have not run on a host for this many days are removed from it.
CHECKPOINT_KEEP_DAYS = env_int("CHECKPOINT_KEEP_DAYS", 30)
# Checkpoint reports (gpunodes/agent/checkpoints.py): the agent looks at each running attempt's
# checkpoint directory every CHECKPOINT_SCAN_S; a change counts once nothing in the directory has been
# written for CHECKPOINT_SETTLE_S (not a file still being written). Seconds, may be fractional.
CHECKPOINT_SCAN_S = env_float("CHECKPOINT_SCAN_S", 1.0)
CHECKPOINT_SETTLE_S = env_float("CHECKPOINT_SETTLE_S", 2.0)
# The longest protection window a share may give its jobs (Share.min_runtime_s, SEMANTICS rule 10): an
# owner whose GPUs are held by protected jobs waits at most this long for them.
MAX_MIN_RUNTIME_S = env_int("MAX_MIN_RUNTIME_S", 86400)
# The host's directories every uid may write, where a job uid that left files is not handed out again
# (an attempt gets its own /tmp, /var/tmp and /dev/shm where the host allows mount namespaces).
JOB_SHARED_DIRS = env_list("JOB_SHARED_DIRS", "/tmp,/var/tmp,/dev/shm,/run/lock,/dev/mqueue")
# GPU health on an agent host (gpunodes/agent/health.py): every GPU is checked this often through NVML
# (ECC, pending page retirement / row remapping, reachable at all; Xid events arrive at once), a process
# that still uses a GPU this long after its attempt was killed makes the GPU unhealthy, and these Xids
# are ignored besides the application errors 13, 31, 43, 45 and 68 (comma-separated numbers).
GPU_HEALTH_CHECK_S = env_int("GPU_HEALTH_CHECK_S", 5)
GPU_STUCK_PROCESS_S = env_int("GPU_STUCK_PROCESS_S", 30)
GPU_HEALTH_IGNORED_XIDS = [int(x) for x in env_list("GPU_HEALTH_IGNORED_XIDS")]
# The ports an attempt's rank 0 listens on for its ranks (MASTER_PORT), FIRST-LAST: one is chosen per
# attempt at admission, none that another live attempt with the same rank-0 host holds, never the
# previous attempt's. Keep them free of other services on the GPU hosts.
RENDEZVOUS_PORTS = os.environ.get("RENDEZVOUS_PORTS", "29500-30499")
# /metrics (Prometheus): a bearer token, or client addresses/networks allowed without one. Neither: 403.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
METRICS_ALLOWED_IPS = env_list("METRICS_ALLOWED_IPS")
# A node heard of for the first time joins PENDING until an admin accepts it, unless its agent presents
# this token (`gpu_agent --join-token`, or the same variable on the agent host). On the embedded file
# broker (no REDIS_URL: only this user's own processes can write it) new nodes are accepted at once.
NODE_JOIN_TOKEN = os.environ.get("NODE_JOIN_TOKEN", "")
NODE_AUTO_ACCEPT = env_bool("NODE_AUTO_ACCEPT", not REDIS_URL)

# The most items one page of an API list may hold (?limit=).
API_MAX_PAGE_SIZE = env_int("API_MAX_PAGE_SIZE", 1000)

# --- REST framework -----------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "config.auth.TokenAuthentication",  # knox's, less a query per call
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # ?limit=&offset= on every list, at most API_MAX_PAGE_SIZE a page; a bad value is a 400 (config/pagination.py).
    "DEFAULT_PAGINATION_CLASS": "config.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    # Submits per user and login attempts per client address; a throttled call gets 429 + Retry-After.
    "DEFAULT_THROTTLE_RATES": {
        "submit": os.environ.get("SUBMIT_RATE", "120/min"),
        "login": os.environ.get("LOGIN_RATE", "30/min"),
    },
    # Reverse proxies in front that append to X-Forwarded-For: throttles key on the address the first of
    # them saw. 0: REMOTE_ADDR, whatever X-Forwarded-For a client sends.
    "NUM_PROXIES": env_int("NUM_PROXIES", 0),
}

# --- Logins ----------------------------------------------------------------------------------------
# config/logins.py: django-axes locks out one username from one client address (config.auth.client_ip,
# NUM_PROXIES-aware) after LOGIN_FAILURE_LIMIT wrong passwords, for LOGIN_COOLOFF_MINUTES, the right
# password included; a success resets only that username's failures from that address. A username
# guessed at from many addresses is slowed (1, 2, 4 ... LOGIN_DELAY_MAX_S seconds between tries), never
# locked, and not at all from an address its user has logged in from; every login endpoint takes at most
# LOGIN_RATE tries a minute per address. /login/, /admin/login/ and POST /api/v1/auth/token/ alike.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # Passwords: Django's ModelBackend, off with LOCAL_LOGIN=0 but for LOCAL_LOGIN_USERS.
    "directory.backends.LocalBackend",
    # Sign-in with the organisation's directory (OpenID Connect), where OIDC_ISSUER is set.
    "directory.backends.DirectoryBackend",
]
# --- Sign-in with the directory (OpenID Connect; directory/, README "Sign-in with your directory") ---
# mozilla-django-oidc's code flow; the endpoints come from OIDC_ISSUER's discovery document.
OIDC_ISSUER = os.environ.get("OIDC_ISSUER", "")
OIDC_RP_CLIENT_ID = os.environ.get("OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = os.environ.get("OIDC_CLIENT_SECRET", "")
OIDC_RP_SIGN_ALGO = os.environ.get("OIDC_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = os.environ.get("OIDC_SCOPES", "openid email profile")
OIDC_PROVIDER_NAME = os.environ.get("OIDC_PROVIDER_NAME", "your organisation")
# The claim that lists the user's groups ("groups" in Keycloak with a group mapper, Entra ID, Okta, Dex).
OIDC_GROUPS_CLAIM = os.environ.get("OIDC_GROUPS_CLAIM", "groups")
# A first sign-in of someone the directory knows makes their account (0: only identities an admin linked
# to an account in the Django admin may sign in). Accounts are matched by issuer and subject only.
OIDC_CREATE_USER = env_bool("OIDC_CREATE_USER", True)
# A directory user's session is checked with the provider again (its groups read again) this often; a
# directory user's API token lasts at most OIDC_API_TOKEN_TTL_HOURS: someone removed from a group or
# from the directory loses its teams at their next page view after this, and the API at their token's end.
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = env_int("OIDC_RENEW_SECONDS", 900)
OIDC_API_TOKEN_TTL_HOURS = env_int("OIDC_API_TOKEN_TTL_HOURS", 12)
OIDC_LEEWAY_S = env_int("OIDC_LEEWAY_S", 30)  # clock skew allowed on exp / iat
OIDC_USE_PKCE = True
OIDC_TIMEOUT = env_int("OIDC_TIMEOUT_S", 10)
OIDC_VERIFY_SSL = env_bool("OIDC_VERIFY_SSL", True)
OIDC_AUTHENTICATE_CLASS = "directory.views.SignInView"
OIDC_CALLBACK_CLASS = "directory.views.CallbackView"
LOGIN_REDIRECT_URL_FAILURE = "login"
# Passwords (the login page, the admin, POST /api/v1/auth/token/): LOCAL_LOGIN=0 turns them off for all
# but LOCAL_LOGIN_USERS (the first admin, break-glass; their form is at /login/?local). API tokens
# already made (robots) keep working.
LOCAL_LOGIN = env_bool("LOCAL_LOGIN", True)
LOCAL_LOGIN_USERS = env_list("LOCAL_LOGIN_USERS")

# --- Notifications (notify/, README "Notifications") -------------------------------------------------
# E-mail through SMTP at EMAIL_HOST (each user their own events); webhooks may not point at private, loopback or
# link-local addresses, nor at the database's or Redis' hosts, unless NOTIFY_ALLOWED_HOSTS lists them
# (host names, addresses or networks such as 10.20.0.0/16).
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT_S", 10)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "gpuquota@localhost")
NOTIFY_ALLOWED_HOSTS = env_list("NOTIFY_ALLOWED_HOSTS")
# A channel's news waits this long for more before it is sent as one message (a burst: one message).
NOTIFY_BATCH_S = env_int("NOTIFY_BATCH_S", 10)
# A failing endpoint is tried again with back-off (1 s, 2 s, 4 s ... at most an hour apart) and switched
# off this many hours after its first failure; its owner sees it on the notifications page.
NOTIFY_GIVE_UP_AFTER_H = env_float("NOTIFY_GIVE_UP_AFTER_H", 24)
NOTIFY_TIMEOUT_S = env_int("NOTIFY_TIMEOUT_S", 10)

AXES_HANDLER = "config.logins.LoginAttemptHandler"
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = env_int("LOGIN_COOLOFF_MINUTES", 15) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]  # the combination, not each on its own
AXES_RESET_ON_SUCCESS = True  # of the (username, address) that logged in, and nothing else
# A try refused while locked out or delayed is not counted again (else a guesser keeps the owner out).
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_CLIENT_IP_CALLABLE = "config.auth.client_ip"
AXES_HTTP_RESPONSE_CODE = 429
AXES_LOCKOUT_CALLABLE = "config.logins.lockout_response"
AXES_VERBOSE = False  # no "AXES: BEGIN" from every process
LOGIN_DELAY_MAX_S = env_int("LOGIN_DELAY_MAX_S", 60)

# Content-Security-Policy (django-csp): scripts only from our own static files, no inline script, no
# eval (htmx runs with allowEval off; templates use data attributes handled in static/js). Styles may
# be inline (bar widths, plotly's own), which runs no code.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
# django-rest-knox: API tokens stored as digests, expiring, sent as `Authorization: Token <key>`.
REST_KNOX = {
    "AUTH_HEADER_PREFIX": "Token",
    "AUTH_TOKEN_CHARACTER_LENGTH": 40,  # 160 bits, as long as the tokens the CLI has always handled
    "TOKEN_TTL": timedelta(hours=env_int("API_TOKEN_TTL_HOURS", 30 * 24)),
    "AUTO_REFRESH": False,
}
# The quick submit path (jobs.api.fast_submit) keeps a token's user in each web process's memory for
# this many seconds: a token revoked (logout, password change, admin) or a user deactivated in another
# process stops working within it (at once in the process that did it). 0: ask the database each time.
API_TOKEN_CACHE_S = env_int("API_TOKEN_CACHE_S", 5)
# The quick submit path itself (0: every submit goes through DRF's view).
FAST_SUBMIT = env_bool("FAST_SUBMIT", True)
SPECTACULAR_SETTINGS = {
    "TITLE": "gpuquota API",
    "DESCRIPTION": "GPU quota shares: lend, borrow, reclaim and pre-empt.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Stable enum names in the schema (the generated client and docs refer to them).
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "jobs.choices.JobState",
        "NodeStateEnum": "gpunodes.choices.NodeState",
        "ShareStateEnum": "quotas.choices.ShareState",
        "AttemptStateEnum": "jobs.choices.AttemptState",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # A 4xx is one line, without the traceback of the PermissionDenied / Http404 behind it.
    "filters": {"client_errors_one_line": {"()": "config.logfilters.ClientErrorsWithoutTraceback"}},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "django.request": {"filters": ["client_errors_one_line"]},
        # Quiet at INFO: no line per request (errors come from django.request), per task received or
        # done (a heartbeat, a log chunk, a pass every 2 s) or per beat send. The pass logs at INFO
        # when it decides something; failures are still logged.
        "django.server": {"level": "ERROR"},
        # A body over MAX_REQUEST_BYTES is the client's doing: quotas.views.bad_request logs one line,
        # not Django's ERROR with a traceback.
        "django.security.RequestDataTooBig": {"level": "CRITICAL"},
        "celery.app.trace": {"level": "WARNING"},
        "celery.worker.strategy": {"level": "WARNING"},
        "celery.beat": {"level": "WARNING"},
        # django-axes says four INFO lines per login; a failure and a lockout are still WARNINGs.
        "axes": {"level": "WARNING"},
    },
}

if DJANGO_ENV == "production":
    if DEBUG:
        raise RuntimeError("DEBUG must be off when DJANGO_ENV=production")
    if not os.environ.get("SECRET_KEY") and not AGENT_PROCESS:
        raise RuntimeError("SECRET_KEY must come from the environment when DJANGO_ENV=production")
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

CELERY_BEAT_SCHEDULE = {
    "scheduling-pass": {
        "task": "quotas.tasks.scheduling_pass",
        "schedule": float(SCHEDULER_INTERVAL_S),
        "options": {"expires": float(SCHEDULER_INTERVAL_S) * 2},
    },
    "prune-pass-records": {"task": "quotas.tasks.prune_pass_records", "schedule": 3600.0},
    # The dashboard's usage history: a sample a minute, thinned after a day, pruned after 90 days.
    "sample-usage": {"task": "quotas.tasks.sample_usage", "schedule": 60.0, "options": {"expires": 60.0}},
    "compact-usage": {"task": "quotas.tasks.compact_usage", "schedule": 3600.0},
    "prune-job-output": {"task": "jobs.tasks.prune_job_output", "schedule": 3600.0},
    # Temporary layout changes (`until:` in a plan) go back at their time, within this many seconds.
    "revert-temporary-changes": {
        "task": "quotas.tasks.revert_temporary_changes",
        "schedule": float(LAYOUT_REVERT_INTERVAL_S),
        "options": {"expires": float(LAYOUT_REVERT_INTERVAL_S)},
    },
    "prune-layout-plans": {"task": "quotas.tasks.prune_layout_plans", "schedule": 3600.0},
    # Queued jobs still waiting past the end of their likely range, for those who asked to be told.
    "notify-overdue": {"task": "notify.tasks.overdue", "schedule": 60.0, "options": {"expires": 60.0}},
}
