#!/usr/bin/env python3
"""A small, dependency-free "training" program for gpuquota demos and tests.

It counts steps, checkpoints every --checkpoint-every seconds into $GPUQUOTA_CHECKPOINT_DIR, resumes
from the checkpoint on a new attempt, prints progress, and on SIGTERM saves and exits cleanly (code 0
is not used then: it exits 143 so that a pre-emption is not mistaken for success).

It has no code for gpuquota's checkpoint reports: its host's agent sees each save (a file renamed into
place), so a pre-emption picks the job that loses the least and counts only the work since its last
save (README, "Checkpoints").
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

stop_requested = False


def on_sigterm(signum, frame):
    global stop_requested
    stop_requested = True


def load(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def save(path: Path, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "saved_at": time.time()}))
    tmp.replace(path)  # atomic: a kill mid-write never leaves a torn checkpoint


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-seconds", type=float, default=1.0)
    parser.add_argument("--checkpoint-every", type=float, default=3.0)
    parser.add_argument("--fail-at", type=int, default=None, help="exit 1 at this step (for tests)")
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, on_sigterm)
    ckpt_dir = Path(os.environ.get("GPUQUOTA_CHECKPOINT_DIR", "."))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_dir / "train.json"
    step = load(ckpt)
    attempt = os.environ.get("GPUQUOTA_ATTEMPT", "?")
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    print(
        f"attempt {attempt} on GPUs [{gpus}]: {'resuming from' if step else 'starting at'} step {step}",
        flush=True,
    )
    last_save = time.monotonic()
    while step < args.steps:
        if stop_requested:
            save(ckpt, step)
            print(f"SIGTERM: saved checkpoint at step {step}, exiting", flush=True)
            return 143
        time.sleep(args.step_seconds)
        step += 1
        if args.fail_at is not None and step == args.fail_at:
            print(f"failing at step {step} as asked", flush=True)
            return 1
        if step % 10 == 0 or step == args.steps:
            print(f"step {step}/{args.steps}", flush=True)
        if time.monotonic() - last_save >= args.checkpoint_every:
            save(ckpt, step)
            last_save = time.monotonic()
    save(ckpt, step)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
