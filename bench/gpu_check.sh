#!/usr/bin/env bash
# The agent against a host's real NVIDIA GPUs, in one short run (issue 29; README, "Real GPU hosts"):
#
#   1. NVML discovery: the GPUs, their model and the GPU type the agent names from it, and how long it takes;
#   2. a health check of every GPU (the agent's watcher: reachable, ECC, pending retirement / remapping,
#      the events it can register);
#   3. a cluster of its own (embedded file broker, SQLite, a temporary state directory): a control worker,
#      beat, and the agent on the real GPUs (no --fake-gpus), which must register and be READY with every
#      GPU HEALTHY;
#   4. one 1-GPU job that prints what it sees: CUDA_VISIBLE_DEVICES, `nvidia-smi -L`, the CUDA devices the
#      driver API counts (libcuda through ctypes, no framework needed), and which /dev/nvidiaN it may open
#      (the device cgroup must refuse the GPUs it was not given, where the host has v1 device cgroups);
#   5. the figures: discovery time, admission to start, the job's exit, what held and what did not.
#
# Run from the checkout, as root (a uid per attempt, device cgroups), on a host with the NVIDIA driver:
#     sudo bench/gpu_check.sh                     # prints everything; exit 0 when every check held
# On a host without GPUs, GPU_CHECK_FAKE=N rehearses the same run with N fake GPUs (the NVML and CUDA
# parts then say they were skipped). GPU_CHECK_KEEP=1 keeps the temporary directory (logs, database).
set -uo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
FAKE=${GPU_CHECK_FAKE:-}
TIMEOUT_S=${GPU_CHECK_TIMEOUT_S:-120}
JOB_PY=${GPU_CHECK_JOB_PYTHON:-/usr/bin/python3}  # a Python the job's uid can run (not the checkout's venv)

if [ -z "$FAKE" ] && ! command -v nvidia-smi >/dev/null; then
  echo "gpu_check: no nvidia-smi on this host: no NVIDIA GPU to check (GPU_CHECK_FAKE=2 rehearses the run)" >&2
  exit 2
fi

WORK=$(mktemp -d /var/tmp/gpuquota-gpu-check.XXXXXX)
chmod 711 "$WORK"
mkdir -p "$WORK/var"
export GPUQUOTA_VAR_DIR="$WORK/var" DATABASE_URL="sqlite:///$WORK/var/gpuquota.sqlite3" REDIS_URL=""
export JOB_ROOT="$WORK/jobs" JOB_LOG_DIR="$WORK/logs" CHECKPOINT_ROOT="$WORK/jobs/checkpoints"
export HEARTBEAT_INTERVAL_S=1 SCHEDULER_INTERVAL_S=1 NODE_LOST_AFTER_S=60 FENCE_AFTER_S=0
export GPU_HEALTH_CHECK_S=2 LOG_LEVEL=INFO PYTHONUNBUFFERED=1 DJANGO_SETTINGS_MODULE=config.settings
export GPU_CHECK_FAKE="$FAKE" GPU_CHECK_TIMEOUT_S="$TIMEOUT_S" GPU_CHECK_JOB_PYTHON="$JOB_PY"
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null
  done
  if [ "${GPU_CHECK_KEEP:-0}" = 1 ]; then echo "kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

spawn() {  # name, argv...: in a session of its own, output to $WORK/<name>.log
  local name=$1
  shift
  setsid "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
}

echo "== host"
uname -srm
if [ -z "$FAKE" ]; then
  nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader
else
  echo "rehearsal: $FAKE fake GPUs (GPU_CHECK_FAKE)"
fi

echo "== 1. discovery and 2. health, as the agent does them"
"$PY" - <<'EOF' || exit 1
import os, time
import django
django.setup()
from gpunodes.agent import inventory
from gpunodes.agent.health import FakeNvml, HealthWatcher

fake = os.environ["GPU_CHECK_FAKE"]
t0 = time.perf_counter()
gpus = inventory.fake_inventory("check", int(fake)) if fake else inventory.discover()
took = (time.perf_counter() - t0) * 1000
print(f"discovered {len(gpus)} GPU(s) in {took:.1f} ms" + (" (fake)" if fake else " through NVML"))
for g in gpus:
    print(f"  GPU {g.index}: {g.model!r} -> type {inventory.gpu_type_from_model(g.model)!r}, {g.memory_mb} MiB, {g.uuid}")
if not fake:
    paths = inventory.device_paths()
    print("  device nodes: " + ", ".join(f"GPU {i} {p}" for i, p in sorted(paths.items())))
    import pynvml as nvml
else:
    nvml = FakeNvml("check", int(fake))
found = []
watcher = HealthWatcher(nvml, {g.index: g.uuid for g in gpus}, on_fault=lambda i, f: found.append((i, f)))
t0 = time.perf_counter()
watcher.start()
print(f"health watcher started in {(time.perf_counter() - t0) * 1000:.1f} ms; NVML events "
      + ("registered" if watcher._events is not None else "NOT available: checks only"))
for g in gpus:
    t0 = time.perf_counter()
    fault = watcher.check(g.index)
    took = (time.perf_counter() - t0) * 1000
    print(f"  GPU {g.index}: " + ("healthy" if fault is None else f"UNHEALTHY ({fault.reason}: {fault.detail})") + f", checked in {took:.1f} ms")
watcher.step(wait_ms=500)
for i, f in found:
    print(f"  GPU {i}: UNHEALTHY from an event or at start: {f.reason}: {f.detail}")
watcher.close()
EOF

echo "== 3. a cluster of its own, the agent on the real GPUs"
"$PY" manage.py migrate -v 0 || exit 1
AGENT=(--name gpu-check)
if [ -n "$FAKE" ]; then AGENT+=(--fake-gpus "$FAKE" --gpu-type a10g); fi
if [ "$(id -u)" != 0 ]; then AGENT+=(--unsafe-run-jobs-as-agent-user); echo "not root: jobs run as this user, no device cgroup"; fi
spawn control "$PY" -m celery -A config worker -Q control -n "gpu-check-control@%h" -P threads -c 4 -l INFO --without-gossip --without-mingle --without-heartbeat
spawn beat "$PY" -m celery -A config beat -l INFO --schedule "$WORK/beat-schedule"
spawn agent "$PY" manage.py gpu_agent "${AGENT[@]}"

"$PY" - <<'EOF'
import os, sys, time
import django
django.setup()
from gpunodes.choices import GpuHealth, NodeState
from gpunodes.models import Gpu, Node
from jobs.choices import JOB_TERMINAL_STATES
from jobs.models import Attempt, Job, LogChunk
from jobs.services import job_submit
from quotas.choices import Role
from quotas.models import Membership, Share, ShareCapacity, Team
from django.contrib.auth import get_user_model

timeout = float(os.environ["GPU_CHECK_TIMEOUT_S"])
ok = True


def wait(what, predicate):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    print(f"FAILED: no {what} after {timeout:.0f} s (logs: GPU_CHECK_KEEP=1)")
    sys.exit(1)


t0 = time.monotonic()
node = wait("READY node", lambda: Node.objects.filter(name="gpu-check", state=NodeState.READY).first())
print(f"node {node.name} READY {time.monotonic() - t0:.1f} s after start: type {node.gpu_type!r}, address {node.address!r}")
gpus = list(Gpu.objects.filter(node=node).order_by("index"))
for g in gpus:
    print(f"  GPU {g.index}: {g.model!r} {g.memory_mb} MiB, {g.health}" + (f" ({g.health_reason}: {g.health_detail})" if g.health_detail else ""))
if any(g.health != GpuHealth.HEALTHY for g in gpus):
    ok = False
    print("FAILED: not every GPU is HEALTHY")

team = Team.objects.create(name="check", slug="check")
share = Share.objects.create(team=team, name="check")
ShareCapacity.objects.create(share=share, gpu_type=node.gpu_type, max_gpus=len(gpus))
user = get_user_model().objects.create_user("check", password="check-pw-123")
Membership.objects.create(team=team, user=user, role=Role.MEMBER)

py = os.environ["GPU_CHECK_JOB_PYTHON"]
script = f"""
echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
echo "-- nvidia-smi -L"; nvidia-smi -L 2>&1 || echo "(nvidia-smi failed or is missing)"
echo "-- CUDA driver API"
{py} - <<'PYEOF'
import ctypes
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print(f"cuda_devices=skipped (no libcuda: {{e}})")
else:
    n = ctypes.c_int()
    rc = cuda.cuInit(0)
    rc = rc or cuda.cuDeviceGetCount(ctypes.byref(n))
    print(f"cuda_devices={{n.value}}" if rc == 0 else f"cuda_devices=error {{rc}}")
PYEOF
echo "-- device nodes"
for d in /dev/nvidia[0-9]*; do
  [ -e "$d" ] || continue
  if head -c 0 "$d" 2>/dev/null; then echo "open $d"; else echo "refused $d"; fi
done
"""
job = job_submit(user=user, share=share, gpus=1, gpu_type=node.gpu_type, command=[script], use_shell=True, name="gpu-check")
t1 = time.monotonic()
wait("end of the job", lambda: Job.objects.filter(pk=job.pk, state__in=list(JOB_TERMINAL_STATES)).exists())
job.refresh_from_db()
attempt = Attempt.objects.filter(job=job).order_by("-number").first()
time.sleep(2)  # the last log chunks
log = "".join(LogChunk.objects.filter(attempt=attempt).order_by("offset").values_list("text", flat=True))
print(f"job {job.pk}: {job.state} (exit code {job.exit_code}) {time.monotonic() - t1:.1f} s after submit")
if attempt.started_at:
    print(f"  admitted -> started: {(attempt.started_at - attempt.admitted_at).total_seconds() * 1000:.0f} ms on {attempt.placement}")
print("== 4. what the job saw")
print("\n".join("  " + line for line in log.splitlines()))
given = attempt.placement[0]["gpus"]
visible = next((l.split("=", 1)[1] for l in log.splitlines() if l.startswith("CUDA_VISIBLE_DEVICES=")), None)
listed = [l for l in log.splitlines() if l.startswith("GPU ") and "UUID" in l]
cuda = next((l.split("=", 1)[1] for l in log.splitlines() if l.startswith("cuda_devices=")), "?")
opened = [l.split()[1] for l in log.splitlines() if l.startswith("open /dev/nvidia")]
refused = [l.split()[1] for l in log.splitlines() if l.startswith("refused /dev/nvidia")]
print("== 5. figures")
checks = [
    ("the job succeeded", job.state == "SUCCEEDED"),
    (f"CUDA_VISIBLE_DEVICES is its GPU ({given})", visible == ",".join(map(str, given))),
]
if not os.environ["GPU_CHECK_FAKE"]:
    checks.append((f"nvidia-smi -L inside the job lists 1 GPU (it listed {len(listed)})", len(listed) == 1))
    checks.append((f"the CUDA driver counts 1 device (it counted {cuda})", cuda == "1"))
    from gpunodes.agent.containment import cgroup1_mount

    if len(gpus) < 2:
        print("  not checked: one GPU on this host, no other GPU for the device cgroup to refuse")
    elif os.geteuid() != 0 or cgroup1_mount("devices") is None:
        print(
            "  not checked: no v1 devices controller here (or not root): the agent cannot refuse the other GPUs' "
            f"device nodes, CUDA_VISIBLE_DEVICES alone keeps the job to its GPU (README, Security model); the job "
            f"could open {opened}"
        )
    else:
        checks.append((f"the device cgroup refuses the other {len(gpus) - 1} GPU(s) (refused {refused}, opened {opened})", len(refused) == len(gpus) - 1))
healthy = Gpu.objects.filter(node=node, health=GpuHealth.HEALTHY).count()
checks.append((f"every GPU still HEALTHY after the job ({healthy} of {len(gpus)})", healthy == len(gpus)))
for what, held in checks:
    print(f"  {'ok    ' if held else 'FAILED'} {what}")
    ok = ok and held
sys.exit(0 if ok else 1)
EOF
RC=$?
if [ $RC != 0 ]; then
  echo "== agent log (last 40 lines)"
  tail -n 40 "$WORK/agent.log"
fi
# 6. The container path (issue 39): a 1-GPU container job given its GPU by CDI (bench/gpu_container_check.py).
echo "== 6. a container job (podman, CDI)"
"$PY" bench/gpu_container_check.py
CT=$?
if [ $CT = 1 ]; then RC=1; fi  # 2: podman or its parts missing here, said above; not a failure of the GPUs
exit $RC
