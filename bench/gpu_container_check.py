"""The container path of bench/gpu_check.sh (issue 39): a 1-GPU container job on this host's real GPUs,
through the agent's Runner (root, a uid per attempt), given its GPU by CDI (`--device nvidia.com/gpu=N`).

The image is built here from busybox-static (no network); the NVIDIA Container Toolkit's CDI spec puts
nvidia-smi and the driver's libraries into it. Checks: the job sees exactly its GPU (`nvidia-smi -L`
lists 1), only its /dev/nvidiaN, and says where the CDI spec is missing. GPU_CHECK_FAKE=N: the same run
with fake GPUs (only the variables, no devices). Exit 0 when every check held, 2 when it cannot run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def main() -> int:
    import django

    django.setup()
    from gpunodes.agent import containers
    from tests.containers import conftest as ct
    from tests.security.agent_helpers import Reports, make_runner, uid_pool

    if ct.WHY_NOT:
        print(f"  not checked: {ct.WHY_NOT}")
        return 2
    fake = os.environ.get("GPU_CHECK_FAKE")
    if not fake and not containers.cdi_spec_present():
        print(f"  FAILED {containers.CDI_HINT}")
        return 1
    podman = containers.Podman.detect()[0]
    work = Path(tempfile.mkdtemp(prefix="gpuquota-gpu-ct-", dir="/var/tmp"))
    work.chmod(0o711)
    image = f"localhost/gpuquota-gpu-check/bb:{uuid.uuid4().hex[:6]}"
    subprocess.run(
        [
            *podman.base(),
            "import",
            "--change",
            "ENV=PATH=/bin:/usr/bin",
            ct.rootfs_tar(work / "r.tar"),
            image,
        ],
        check=True,
        capture_output=True,
    )
    devices = {} if fake else {0: "/dev/nvidia0"}
    reports = Reports()
    runner = make_runner(
        work, reports, uids=uid_pool(), podman=podman, gpu_devices=devices, device_cgroups=None
    )
    runner.node = f"gpuct{uuid.uuid4().hex[:4]}"
    script = 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; nvidia-smi -L; ls /dev | grep nvidia'
    began = time.monotonic()
    try:
        runner.start(
            attempt_id=1, number=1, job_id=1, command=[script], use_shell=True, image=image, gpus=[0]
        )
        while not reports.finished(1) and time.monotonic() - began < 120:
            runner.poll()
            time.sleep(0.05)
    finally:
        runner.shutdown(grace_s=1)
        podman._run("rmi", "-f", image)
        shutil.rmtree(work, ignore_errors=True)
    out = reports.log_of(1)
    done = reports.finished(1) or {}
    print("  what the container job saw:")
    print("\n".join("    " + line for line in out.splitlines()))
    print(
        f"  ended {done.get('how')} (exit code {done.get('exit_code')}) {time.monotonic() - began:.1f} s after start"
    )
    listed = [line for line in out.splitlines() if line.startswith("GPU ") and "UUID" in line]
    nodes = [line for line in out.splitlines() if line.startswith("nvidia") and line[6:].isdigit()]
    checks = [("CUDA_VISIBLE_DEVICES is set", "CUDA_VISIBLE_DEVICES=0" in out)]
    if not fake:
        checks += [
            (f"nvidia-smi -L in the container lists 1 GPU (it listed {len(listed)})", len(listed) == 1),
            (f"the container has one /dev/nvidiaN (it has {nodes})", len(nodes) == 1),
            ("the job succeeded", done.get("how") == "exited" and done.get("exit_code") == 0),
        ]
    ok = True
    for what, held in checks:
        print(f"  {'ok    ' if held else 'FAILED'} {what}")
        ok = ok and held
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
