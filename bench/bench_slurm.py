"""Benchmark 8: Slurm beside gpuquota on this machine, the same measures alternating in one run.

A one-node Slurm of our own (munge, slurmctld, slurmd; gres `gpu` Count=8 backed by /dev/null,
select/cons_tres, partitions `low` and `high` with PreemptType=preempt/partition_prio and
PreemptMode=REQUEUE), on private ports and a private munge socket under a temporary directory, and
gpuquota's web server (gunicorn, PostgreSQL + Redis) as in benchmark 3. Measures, each round Slurm then
gpuquota:

- submits/s with 16 concurrent clients (16 `sbatch` loops / bench 3's 16 HTTP clients);
- submits/s with one process per submission, one after another (`sbatch` / `gpuquota submit`);
- array tasks/s (`sbatch --array=0-999` / `"array": {"size": 1000}`).

Slurm's jobs are submitted held (they measure intake, not running), gpuquota's have no control worker
(its jobs queue). Ratios are gpuquota / Slurm (> 1: gpuquota takes work in faster). Every daemon the
benchmark started is stopped at the end, whatever happens. Needs root, slurm-wlm (`apt-get install -y
slurm-wlm`), DATABASE_URL (`*_bench`) and REDIS_URL.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.common import free_port, stop, wait_for

MEASURES = ("16 clients", "one process each", "arrays")


def problem() -> str | None:
    """Why Slurm cannot run here, or None."""
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "munged", "scontrol") if not shutil.which(b)]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install -y slurm-wlm)"
    if os.geteuid() != 0:
        return "starting slurmd needs root"
    return None


class Slurm:
    """A private one-node Slurm: start() / stop(); run commands with env()."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gpuquota-slurm-"))
        self.host = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen] = []
        self.conf = self.dir / "slurm.conf"

    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        d = self.dir
        for sub in ("state", "spool", "out"):
            (d / sub).mkdir()
        key = d / "munge.key"
        shutil.copyfile("/etc/munge/munge.key", key)
        key.chmod(0o400)
        (d / "plugstack.conf").write_text("")
        # Eight GPUs without GPUs: slurmd counts a gres/gpu by its device files, so each is /dev/null.
        for i in range(8):
            (d / f"gpu{i}").symlink_to("/dev/null")
        (d / "gres.conf").write_text(f"NodeName={self.host} Name=gpu File={d}/gpu[0-7] Count=8\n")
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=gpuquota-bench",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    "SlurmUser=root",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={d / 'munge.sock'}",
                    f"StateSaveLocation={d / 'state'}",
                    f"SlurmdSpoolDir={d / 'spool'}",
                    f"SlurmctldPidFile={d / 'slurmctld.pid'}",
                    f"SlurmdPidFile={d / 'slurmd.pid'}",
                    f"SlurmctldLogFile={d / 'slurmctld.log'}",
                    f"SlurmdLogFile={d / 'slurmd.log'}",
                    f"PlugStackConfig={d / 'plugstack.conf'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "SchedulerType=sched/backfill",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "GresTypes=gpu",
                    "PreemptType=preempt/partition_prio",
                    "PreemptMode=REQUEUE",
                    "JobRequeue=1",
                    "MaxJobCount=1000000",
                    "MaxArraySize=100001",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "SlurmctldDebug=error",
                    "SlurmdDebug=error",
                    f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 Gres=gpu:8 "
                    "State=UNKNOWN",
                    f"PartitionName=low Nodes={self.host} Default=YES PriorityTier=1 PreemptMode=REQUEUE "
                    "OverSubscribe=FORCE:8",
                    f"PartitionName=high Nodes={self.host} PriorityTier=10 PreemptMode=OFF OverSubscribe=FORCE:8",
                    "",
                ]
            )
        )

    def _daemon(self, argv: list[str], name: str) -> subprocess.Popen:
        log = open(self.dir / f"{name}.out", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        self._write_config()
        d = self.dir
        self._daemon(
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={d / 'munge.sock'}",
                f"--key-file={d / 'munge.key'}",
                f"--pid-file={d / 'munged.pid'}",
                f"--log-file={d / 'munged.log'}",
                f"--seed-file={d / 'munged.seed'}",
            ],
            "munged",
        )
        wait_for(lambda: (d / "munge.sock").exists(), 15, "munged")
        self._daemon(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        wait_for(lambda: self._ok(["scontrol", "ping"]), 30, "slurmctld")
        self._daemon(["slurmd", "-D", "-N", self.host, "-f", str(self.conf)], "slurmd")
        wait_for(lambda: self._idle(), 60, "slurmd (node idle)", every=0.5)

    def _ok(self, argv: list[str]) -> bool:
        done = subprocess.run(argv, env=self.env(), capture_output=True, text=True)
        return done.returncode == 0 and "DOWN" not in done.stdout

    def _idle(self) -> bool:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], env=self.env(), capture_output=True, text=True
        )
        return done.returncode == 0 and done.stdout.strip().startswith(("idle", "mixed", "allocated"))

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True)

    def clear(self) -> None:
        self.run(["scancel", "--user", "root", "--full"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            left = self.run(["squeue", "-h", "-o", "%i"]).stdout.split()
            if not left:
                return
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop every daemon this object started (slurmd, slurmctld, then munged)."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()


def _sbatch(*extra: str) -> list[str]:
    return ["sbatch", "--hold", "-p", "low", "--gres=gpu:1", "-o", "/dev/null", *extra, "--wrap", "true"]


def slurm_concurrent(slurm: Slurm, clients: int, per_client: int) -> tuple[float, int]:
    errors = []
    barrier = threading.Barrier(clients + 1)

    def loop():
        barrier.wait()
        for _ in range(per_client):
            if slurm.run(_sbatch()).returncode != 0:
                errors.append(1)

    pool = [threading.Thread(target=loop) for _ in range(clients)]
    for t in pool:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return clients * per_client / (time.perf_counter() - t0), len(errors)


def slurm_sequential(slurm: Slurm, n: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    errors = sum(slurm.run(_sbatch()).returncode != 0 for _ in range(n))
    return n / (time.perf_counter() - t0), errors


def slurm_arrays(slurm: Slurm, arrays: int, size: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    errors = sum(slurm.run(_sbatch(f"--array=0-{size - 1}")).returncode != 0 for _ in range(arrays))
    return arrays * size / (time.perf_counter() - t0), errors


def run(quick: bool = False, rounds: int | None = None) -> list[dict]:
    why = problem()
    if why:
        return [{"bench": "8 slurm", "size": "-", "skipped": True, "note": f"skipped: {why}"}]
    from bench import bench_api, bench_cli

    rounds = rounds or (1 if quick else 3)
    clients, per_client = 16, (10 if quick else 25)
    sequential, arrays, size = (10 if quick else 40), (2 if quick else 5), 1000
    figures: dict[tuple[str, str], list[float]] = {}
    errors = {"slurm": 0, "gpuquota": 0}
    slurm = Slurm()
    web = None
    try:
        slurm.start()
        web, url, tokens = bench_cli.start_server(clients)
        cli_env = bench_cli.cli_env(url, tokens[0])
        job = {"share": "bench-main", "gpu_type": "a10g", "gpus": 1, "command": ["true"]}
        for _ in range(rounds):
            rate, bad = slurm_concurrent(slurm, clients, per_client)
            figures.setdefault(("16 clients", "slurm"), []).append(rate)
            errors["slurm"] += bad
            got = bench_api._hammer(url, tokens, per_client, job, 120, web.pid)
            figures.setdefault(("16 clients", "gpuquota"), []).append(len(got["latencies"]) / got["wall"])
            errors["gpuquota"] += len(got["errors"])

            rate, bad = slurm_sequential(slurm, sequential)
            figures.setdefault(("one process each", "slurm"), []).append(rate)
            errors["slurm"] += bad
            times, bad_cli = bench_cli.submit_loop(cli_env, sequential)
            figures.setdefault(("one process each", "gpuquota"), []).append(len(times) / sum(times))
            errors["gpuquota"] += len(bad_cli)

            rate, bad = slurm_arrays(slurm, arrays, size)
            figures.setdefault(("arrays", "slurm"), []).append(rate)
            errors["slurm"] += bad
            payload = {**job, "array": {"size": size}}
            got = bench_api._hammer(url, tokens[:1], arrays, payload, 120, web.pid)
            figures.setdefault(("arrays", "gpuquota"), []).append(arrays * size / got["wall"])
            errors["gpuquota"] += len(got["errors"])
            slurm.clear()
    finally:
        if web is not None:
            stop([web])
        slurm.stop()
        shutil.rmtree(slurm.dir, ignore_errors=True)
    rows = []
    for measure in MEASURES:
        s = statistics.median(figures[(measure, "slurm")])
        g = statistics.median(figures[(measure, "gpuquota")])
        unit = "tasks/s" if measure == "arrays" else "submits/s"
        rows.append(
            {
                "bench": "8 slurm",
                "size": f"{measure}, {rounds} alternating rounds",
                "target": ">= 1.0 (gpuquota / Slurm)" if measure == "16 clients" else "",
                "met": (g / s >= 1.0) if measure == "16 clients" else None,
                "note": f"Slurm {s:,.1f} {unit}, gpuquota {g:,.1f} {unit}: ratio {g / s:.2f}; errors: "
                f"Slurm {errors['slurm']}, gpuquota {errors['gpuquota']}",
                "slurm": s,
                "gpuquota": g,
                "ratio": g / s,
            }
        )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int)
    args = parser.parse_args()
    for r in run(args.quick, args.rounds):
        print(r)
