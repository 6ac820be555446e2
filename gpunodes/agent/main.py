"""The agent process: inventory, a heartbeat thread, a reaper thread, a GPU health thread (health.py), a
disk guard (disk.py), and a Celery worker (threads pool) bound to the queue `node.<name>`."""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
import warnings
from pathlib import Path
from urllib.parse import urlsplit

from celery.exceptions import SecurityWarning
from django.conf import settings

from config.celery import CONTROL_QUEUE, app, consume_as, node_queue, report_queue
from gpunodes import signing
from gpunodes.agent import AGENT_VERSION, inventory, joblog
from gpunodes.agent import tasks as agent_tasks
from gpunodes.agent.containment import LimitPolicy, protect_from_oom
from gpunodes.agent.disk import DiskGuard
from gpunodes.agent.fence import FENCED_FILE, Watchdog
from gpunodes.agent.health import APPLICATION_XIDS, FakeNvml, Fault, HealthWatcher
from gpunodes.agent.identity import UidPool
from gpunodes.agent.runner import Runner

log = logging.getLogger("gpunodes.agent")
HEARTBEAT = "gpunodes.tasks.node_heartbeat"
UNSAFE_FLAG = "--unsafe-run-jobs-as-agent-user"
MAKE_RUN_ENV = "GPUQUOTA_MAKE_RUN"  # set by `make run` for its processes


def job_uids(*, uid_range: str, unsafe_run_as_self: bool = False) -> UidPool | None:
    """Who the jobs run as. A root agent: a uid of their own per attempt, from `uid_range`. A non-root
    agent cannot switch users, and running jobs as itself hands every job the agent's files, broker
    credentials and the other jobs of the host: it refuses, unless explicitly told (single-user demo)."""
    if os.geteuid() == 0:
        if unsafe_run_as_self:
            log.warning(
                "%s ignored: a root agent runs each job as a uid of its own, never as root", UNSAFE_FLAG
            )
        return UidPool.parse(uid_range, shared_dirs=settings.JOB_SHARED_DIRS)
    if not unsafe_run_as_self:
        raise ValueError(
            f"this agent runs as uid {os.geteuid()}, not root: it cannot give each job a uid of its own, "
            "and it will not run jobs as itself (any job could then read the agent's files and broker "
            "credentials, and every other job on this host). Start it as root, or pass "
            f"{UNSAFE_FLAG} for a single-user setup such as `make run`."
        )
    if os.environ.get(MAKE_RUN_ENV) == "1":
        # `make run` passes the flag itself (the README says what it means): one line, not three WARNINGs
        # at every start of each of its agents about its own choice.
        log.info("single-user demo (make run): jobs run as this agent's own user (uid %d)", os.geteuid())
        return None
    for _ in range(3):
        log.warning(
            "UNSAFE: %s: jobs run as this agent's own user (uid %d) and can read and change everything "
            "it can, including the state directory, the broker and each other. Single-user demos only.",
            UNSAFE_FLAG,
            os.geteuid(),
        )
    return None


def new_boot_id() -> str:
    """A new id for this agent process: its start time in milliseconds, then a random part. The time
    prefix orders the boots of one host (by that host's own clock), so the control side can tell a
    late heartbeat of a previous boot from a restart."""
    return f"{time.time_ns() // 1_000_000:014d}-{uuid.uuid4().hex}"


def primary_address() -> str:
    """The address this host's peers reach it at, unless --advertise-address says otherwise: the source
    address of its default route (a UDP socket "connected" outwards sends nothing), else the one it
    reaches the broker from, else its name's, else the loopback address (a one-host cluster)."""
    broker = urlsplit(settings.REDIS_URL).hostname if settings.REDIS_URL else None
    for target in ("192.0.2.1", broker):  # 192.0.2.1: TEST-NET-1, routed by the default route if any
        if not target:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))
                return s.getsockname()[0]
        except OSError:
            continue
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def send_report(name: str, kwargs: dict, queue: str = CONTROL_QUEUE) -> bool:
    """Whether the broker took it. Pushed straight onto `queue` (the node's own intake list on Redis:
    config.celery.report_queue), declaring nothing (a node's Redis ACL user may push there and nothing
    more: README, "Redis")."""
    try:
        app.send_task(name, kwargs=kwargs, queue=queue, declare=[])
    except Exception:
        log.exception("could not send %s", name)
        return False
    return True


class Agent:
    def __init__(
        self,
        *,
        name: str,
        gpu_type: str | None,
        fake_gpus: int | None,
        uids: UidPool | None = None,
        workdir: Path | None = None,
        pass_env: tuple[str, ...] = (),
        labels: dict | None = None,
        join_token: str = "",
        advertise_address: str | None = None,
        fake_gpu_faults: Path | None = None,
    ):
        self.name = name
        if fake_gpus is not None:
            if not gpu_type:
                raise ValueError("--fake-gpus needs --gpu-type")
            self.gpus = inventory.fake_inventory(name, fake_gpus)
        else:
            self.gpus = inventory.discover()
        if not self.gpus:
            raise ValueError("this host has no GPUs; use --fake-gpus N --gpu-type T for a simulated host")
        self.gpu_type = gpu_type or inventory.gpu_type_from_model(self.gpus[0].model)
        self.labels = labels or {}
        self.boot_id = new_boot_id()
        self.address = advertise_address or primary_address()
        state_dir = Path(settings.VAR_DIR) / "agent" / name
        # GPU health (health.py): through NVML, or a fake one that reads the faults a test injects.
        if fake_gpus is not None:
            nvml = FakeNvml(
                name,
                fake_gpus,
                fake_gpu_faults or state_dir / "fake-gpu-faults.jsonl",
                state_file=state_dir / "fake-gpu-faults.read.json",  # a restart goes on from there
            )
        else:
            import pynvml as nvml
        self._beat_now = threading.Event()
        self.health = HealthWatcher(
            nvml,
            {g.index: g.uuid for g in self.gpus},
            on_fault=self._gpu_fault,
            ignored_xids=APPLICATION_XIDS | set(settings.GPU_HEALTH_IGNORED_XIDS),
            check_every_s=settings.GPU_HEALTH_CHECK_S,
            stuck_after_s=settings.GPU_STUCK_PROCESS_S,
        )
        consume_as(f"node:{name}")
        self.send = functools.partial(send_report, queue=report_queue(name))
        if settings.MESSAGE_SIGNING_KEY:
            # The nonces of the messages it ran, kept across restarts: a captured start is refused then too.
            signing.use_nonce_store(signing.SqliteNonces(state_dir / "seen-messages.sqlite3"))
        self.runner = Runner(
            node=name,
            log_dir=settings.JOB_LOG_DIR,
            checkpoint_root=settings.CHECKPOINT_ROOT,
            report=self.send,
            state_path=state_dir / "running.json",
            work_root=settings.JOB_ROOT / "work",
            workdir=workdir,
            uids=uids,
            pass_env=pass_env,
            log_cap_bytes=settings.JOB_LOG_CAP_BYTES,
            gpu_devices=inventory.device_paths() if fake_gpus is None else None,
            gpu_holders=self.health.holders,
            limits=LimitPolicy(
                memory_max_bytes=settings.JOB_MEMORY_MAX_BYTES,
                memory_reserve_bytes=settings.AGENT_MEMORY_RESERVE_BYTES,
                pids_max=settings.JOB_PIDS_MAX,
                cpu_weight_per_gpu=settings.JOB_CPU_WEIGHT_PER_GPU,
            ),
            rlimit_as=settings.JOB_RLIMIT_AS,
            workdir_bytes=settings.JOB_WORKDIR_MAX_BYTES,
            user_namespaces=settings.JOB_ALLOW_USER_NAMESPACES,
            gpu_health=self.health,
            checkpoint_scan_s=settings.CHECKPOINT_SCAN_S,
            checkpoint_settle_s=settings.CHECKPOINT_SETTLE_S,
            image_cache_bytes=settings.AGENT_IMAGE_CACHE_BYTES,
        )
        self.runner.gpu_indexes = {g.index for g in self.gpus}
        # Its room on its own disks: a reserve for its own files, no start (and no job output) below
        # AGENT_MIN_FREE_BYTES (agent/disk.py).
        self.disk = DiskGuard(
            [self.runner.state_path.parent, self.runner.log_dir],
            min_free_bytes=settings.AGENT_MIN_FREE_BYTES,
            reserve_bytes=settings.AGENT_DISK_RESERVE_BYTES,
        )
        self.join_token = join_token
        self.watchdog: Watchdog | None = None
        self._stop = threading.Event()

    def heartbeat(self) -> None:
        running = [list(r) for r in self.runner.running()]  # before the outbox: an end is in one of them
        took = self.send(
            HEARTBEAT,
            {
                "name": self.name,
                "gpu_type": self.gpu_type,
                "inventory": [g.__dict__ for g in self.gpus],
                "running": running,
                # The unacknowledged reports, oldest first; acknowledged by outbox_ack (agent/outbox.py).
                "outbox": [e.as_message() for e in self.runner.outbox.pending()],
                "outbox_epoch": self.runner.outbox.epoch,
                "boot_id": self.boot_id,
                "agent_version": AGENT_VERSION,
                "hostname": socket.gethostname(),
                "labels": self.labels,
                "sent_at": time.time(),
                "join_token": self.join_token,
                "address": self.address,
                # The GPUs found broken (sticky until a re-check), and the re-checks done.
                "unhealthy": self.health.unhealthy(),
                "rechecked": [[i, token] for i, token in sorted(self.health.rechecked().items())],
                # The state this agent was last told (it starts work only while READY): the control side
                # tells it again where the two differ (a message of an older state may land last).
                "node_state": self.runner.node_state,
            },
        )
        if took and self.watchdog is not None:
            self.watchdog.renew()  # the broker took it: the lease runs FENCE_AFTER_S from now

    def _gpu_fault(self, index: int, fault: Fault) -> None:
        """A GPU found broken: its attempts are killed, and the control side hears it now, not at the
        next heartbeat."""
        self.runner.gpu_failed(index, fault)
        self._beat_now.set()

    def _heartbeats(self) -> None:
        """Every HEARTBEAT_INTERVAL_S, or at once when something cannot wait (a GPU failed, a re-check)."""
        while not self._stop.is_set():
            self._beat_now.wait(settings.HEARTBEAT_INTERVAL_S)
            self._beat_now.clear()
            if self._stop.is_set():
                return
            try:
                self.heartbeat()
            except Exception:
                log.exception("agent loop heartbeat failed")

    def prune(self) -> None:
        """Host files of attempts that are over: logs (their bytes went to the control side) and the
        checkpoints of jobs that have not run here for a while."""
        removed = self.runner.prune_logs(settings.JOB_LOG_KEEP_DAYS * 86400)
        if removed:
            log.info("removed %d job log file(s) older than %d days", removed, settings.JOB_LOG_KEEP_DAYS)
        removed = self.runner.prune_checkpoints(settings.CHECKPOINT_KEEP_DAYS * 86400)
        if removed:
            log.info("removed %d checkpoint(s) unused for %d days", removed, settings.CHECKPOINT_KEEP_DAYS)

    def _loop(self, every: float, fn) -> None:
        while not self._stop.wait(every):
            try:
                fn()
            except Exception:
                log.exception("agent loop %s failed", fn.__name__)

    def run(self, concurrency: int = 4) -> None:
        # When the host runs short of memory the kernel takes the jobs (oom_score_adj 1000), not the
        # agent that reports their ends, nor its fence watchdog (which inherits this).
        protect_from_oom()
        self.runner.kill_orphans()
        (self.runner.state_path.parent / FENCED_FILE).unlink(missing_ok=True)
        # The jobs never outlive this process, nor its lease (gpunodes/agent/fence.py).
        self.watchdog = Watchdog(
            state_path=self.runner.state_path,
            tree=self.runner.cgroups.base if self.runner.cgroups is not None else None,
            uids=(self.runner.uids.first, self.runner.uids.last) if self.runner.uids is not None else None,
            fence_after_s=settings.FENCE_AFTER_S,
            grace_s=settings.FENCE_GRACE_S,
        )
        self.runner.lease_lapsed = self.watchdog.lapsed
        self.prune()
        agent_tasks.RUNNER = self.runner
        agent_tasks.HEALTH = self.health
        agent_tasks.BEAT_NOW = self._beat_now
        agent_tasks.DISK = self.disk
        agent_tasks.LOG_BYTES_PER_JOB = settings.JOB_LOG_HOST_BYTES_PER_JOB
        agent_tasks.LOG_BYTES_PER_USER = settings.JOB_LOG_HOST_BYTES_PER_USER
        joblog.ROOM = self.disk.room_for_output
        self.disk.check()  # the reserve taken (or, on a short disk, the alert) before any start
        self.health.start()  # a GPU already gone is reported by the first heartbeat
        self.heartbeat()  # register before taking work
        threads = [
            threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True),
            threading.Thread(target=self.health.run, args=(self._stop,), name="gpu-health", daemon=True),
            threading.Thread(target=self._loop, args=(0.2, self.runner.poll), name="reaper", daemon=True),
            threading.Thread(
                target=self._loop, args=(3600, self.prune), name="host-file-rotation", daemon=True
            ),
            threading.Thread(target=self._loop, args=(1.0, self.disk.check), name="disk-guard", daemon=True),
        ]
        for t in threads:
            t.start()
        watcher = threads[1]
        log.info(
            "agent %s: %d × %s, queue %s, address %s, pid %d",
            self.name,
            len(self.gpus),
            self.gpu_type,
            node_queue(self.name),
            self.address,
            os.getpid(),
        )
        # Celery's "running the worker with superuser privileges: absolutely not recommended" is wrong
        # here: an agent runs as root by design, each job under a uid of its own (README).
        warnings.filterwarnings("ignore", category=SecurityWarning)
        # No remote control (pidbox) and no worker events: the agent then needs no Redis pub/sub channel,
        # and its ACL user is granted none (README, "Redis").
        app.conf.worker_enable_remote_control = False
        try:
            app.worker_main(
                [
                    "worker",
                    "-Q",
                    node_queue(self.name),
                    "-P",
                    "threads",
                    "-c",
                    str(concurrency),
                    "-n",
                    f"agent.{self.name}@%h",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                    "-l",
                    "INFO",
                ]
            )
        finally:
            self._stop.set()
            self._beat_now.set()
            self.runner.shutdown()
            watcher.join(timeout=5)  # NVML's event set is freed only once no thread waits on it
            if not watcher.is_alive():
                self.health.close()
            if self.watchdog is not None:
                self.watchdog.close()
