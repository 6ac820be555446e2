"""Benchmark 8: Slurm beside gpuquota on this machine, the same measures alternating in one run.

A one-node Slurm of our own (munge, slurmctld, slurmd; gres `gpu` Count=8 backed by /dev/null,
select/cons_tres, partitions `low` and `high` with PreemptType=preempt/partition_prio and
PreemptMode=REQUEUE), on private ports and a private munge socket under a temporary directory, and
gpuquota's web server (granian, PostgreSQL + Redis) as in benchmark 3. Measures, each round Slurm then
gpuquota:

- submits/s with 16 concurrent clients (16 `sbatch` loops / bench 3's 16 HTTP clients);
- submits/s with one process per submission, one after another (`sbatch` / `gpuquota submit`);
- array tasks/s (`sbatch --array=0-999` / `"array": {"size": 1000}`);
- then latency, Slurm's block then gpuquota's (benchmark 4's live cluster): submit to the job's first
  line on a free GPU (`sbatch` and `srun` / the agent's start report), and reclaim, a submit that needs
  the GPUs of lower-priority work until that work's SIGTERM (partition_prio REQUEUE / gpuquota's reclaim).

Slurm's intake jobs are submitted held (they measure intake, not running), gpuquota's have no control
worker (its jobs queue). Intake ratios are gpuquota / Slurm (> 1: gpuquota takes work in faster);
latency ratios Slurm / gpuquota (> 1: gpuquota is quicker). Every daemon the
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


VICTIM = """#!/usr/bin/env python3
import signal, sys, time
def term(*_):
    open(sys.argv[1], "w").write(repr(time.time()))
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
open(sys.argv[1] + ".ready", "w").close()
while True:
    time.sleep(3600)
"""


def _wait(predicate, timeout: float, what: str, every: float = 0.002):
    return wait_for(predicate, timeout, what, every)


def slurm_first_line(slurm: Slurm, n: int) -> tuple[list[float], list[float]]:
    """Submit to a free GPU until the job's first line: (batch via sbatch, interactive via srun)."""
    script = slurm.dir / "hello.sh"
    script.write_text("#!/bin/sh\necho started\n")
    script.chmod(0o755)
    batch, interactive = [], []
    for i in range(n):
        out = slurm.dir / "out" / f"hello-{i}.out"
        t0 = time.perf_counter()
        slurm.run(["sbatch", "-p", "low", "--gres=gpu:1", "-o", str(out), str(script)])
        _wait(lambda out=out: out.exists() and out.read_text().strip(), 60, "the batch job's first line")
        batch.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            ["srun", "-p", "low", "--gres=gpu:1", "echo", "started"],
            env=slurm.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        proc.stdout.readline()
        interactive.append(time.perf_counter() - t0)
        proc.wait(30)
    slurm.clear()
    return batch, interactive


def slurm_reclaim(slurm: Slurm, n: int) -> list[float]:
    """A low-partition job holds all 8 GPUs; a high-partition job asks for them: submit to the
    victim's SIGTERM (partition_prio pre-emption, REQUEUE)."""
    script = slurm.dir / "victim.py"
    script.write_text(VICTIM)
    script.chmod(0o755)
    times = []
    for i in range(n):
        term = slurm.dir / "out" / f"term-{i}"
        slurm.run(["sbatch", "-p", "low", "--gres=gpu:8", "-o", "/dev/null", str(script), str(term)])
        _wait(lambda term=term: Path(str(term) + ".ready").exists(), 60, "the victim to run", 0.01)
        t0 = time.time()
        slurm.run(["sbatch", "-p", "high", "--gres=gpu:8", "-o", "/dev/null", "--wrap", "sleep 1"])
        at = _wait(lambda term=term: term.exists() and term.read_text(), 120, "the victim's SIGTERM")
        times.append(float(at) - t0)
        slurm.clear()
    return times


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
    latency: list[dict] = []
    latency_error = ""
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
        stop([web])
        web = None
        # Latency: Slurm's, then gpuquota's live cluster (benchmark 4: control worker, fake agents).
        samples, reclaims = (3, 2) if quick else (10, 5)
        batch, interactive = slurm_first_line(slurm, samples)
        victim = slurm_reclaim(slurm, reclaims)
        from bench import bench_latency

        try:
            latency = bench_latency.run(samples=samples, reclaims=reclaims)
        except Exception as exc:  # noqa: BLE001 - Slurm's side is still worth reporting
            latency_error = f"gpuquota's live cluster failed: {exc}"
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
    if latency_error:
        for what, slurm_s in (
            ("submit to first line, free GPU: sbatch", statistics.median(batch)),
            ("submit to first line, free GPU: srun", statistics.median(interactive)),
            ("reclaim: submit to the victim's SIGTERM", statistics.median(victim)),
        ):
            rows.append(
                {
                    "bench": "8 slurm",
                    "size": what,
                    "met": False,
                    "note": f"Slurm {slurm_s * 1000:,.0f} ms (median); {latency_error}",
                    "slurm": slurm_s,
                }
            )
        return rows
    g_start, g_reclaim = latency[0]["median_s"], latency[1]["median_s"]
    for what, slurm_s, gpuquota_s in (
        ("submit to first line, free GPU: sbatch", statistics.median(batch), g_start),
        ("submit to first line, free GPU: srun", statistics.median(interactive), g_start),
        ("reclaim: submit to the victim's SIGTERM", statistics.median(victim), g_reclaim),
    ):
        rows.append(
            {
                "bench": "8 slurm",
                "size": what,
                "note": f"Slurm {slurm_s * 1000:,.0f} ms, gpuquota {gpuquota_s * 1000:,.0f} ms (medians): "
                f"Slurm/gpuquota {slurm_s / gpuquota_s:.2f}",
                "slurm": slurm_s,
                "gpuquota": gpuquota_s,
                "ratio": slurm_s / gpuquota_s,
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
