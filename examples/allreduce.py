#!/usr/bin/env python3
"""A small multi-node "training" program with no dependency: one process per node, a real all-reduce
over TCP between the nodes, checkpoints and resume. It finds its peers with the variables gpuquota gives
every rank of a multi-node job, as torchrun would (README, "Real GPU hosts"):

    MASTER_ADDR, MASTER_PORT   rank 0's host and the port chosen for this attempt
    NODE_RANK, NNODES          this node's rank and the number of nodes

Rank 0 listens on MASTER_PORT; the others connect to it (retrying while rank 0 starts). Each step every
rank contributes a gradient, rank 0 sums them and sends the sum back (reduce, then broadcast), and every
rank applies it: the parameters stay the same on every rank. Every --checkpoint-every steps each rank
saves its parameters into its node's $GPUQUOTA_CHECKPOINT_DIR under a name of its rank's (keeping its
last two): ranks whose nodes share a checkpoint root (one host, shared storage) share the directory. A
new attempt resumes from the latest step that every rank has saved. SIGTERM on any rank (a pre-emption) stops all of
them at the next step, each with a checkpoint of that step, exit 143.

At the end each rank checks its parameters against the closed form (rank r contributes (r+1)*(t+1) at
step t) and exits 1 if they differ: a lost or doubled step shows.

    python allreduce.py --steps 60 --step-seconds 0.5 --checkpoint-every 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

stop_requested = False


def on_sigterm(signum, frame):
    global stop_requested
    stop_requested = True


# --- messages: a 4-byte length, then JSON ---------------------------------------------------------


def send(sock: socket.socket, message) -> None:
    data = json.dumps(message).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def receive(sock: socket.socket):
    header = _exactly(sock, 4)
    return json.loads(_exactly(sock, struct.unpack("!I", header)[0]))


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("a peer closed the connection")
        data += chunk
    return data


# --- the group: rank 0 and a socket to each other rank ----------------------------------------------


class Group:
    def __init__(self, rank: int, nodes: int, addr: str, port: int, timeout_s: float):
        self.rank, self.nodes = rank, nodes
        self.peers: dict[int, socket.socket] = {}
        self.conn: socket.socket | None = None
        if nodes == 1:
            return
        if rank == 0:
            server = socket.create_server(("", port), family=socket.AF_INET, reuse_port=False, backlog=nodes)
            server.settimeout(timeout_s)
            while len(self.peers) < nodes - 1:
                conn, _ = server.accept()
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello = receive(conn)
                self.peers[int(hello["rank"])] = conn
            server.close()
        else:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    self.conn = socket.create_connection((addr, port), timeout=5)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)  # rank 0 is not listening yet
            self.conn.settimeout(None)
            self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send(self.conn, {"rank": rank})

    def all_reduce(self, vector: list[int], stop: bool) -> tuple[list[int], bool]:
        """The element-wise sum over all ranks, and whether any rank asked to stop."""
        if self.nodes == 1:
            return vector, stop
        if self.rank != 0:
            send(self.conn, {"v": vector, "stop": stop})
            reply = receive(self.conn)
            return reply["v"], reply["stop"]
        total, any_stop = list(vector), stop
        for peer in self.peers.values():
            got = receive(peer)
            total = [a + b for a, b in zip(total, got["v"], strict=True)]
            any_stop = any_stop or got["stop"]
        for peer in self.peers.values():
            send(peer, {"v": total, "stop": any_stop})
        return total, any_stop

    def agree(self, mine: list[int]) -> int:
        """The latest checkpoint step every rank holds (0: none in common)."""
        if self.nodes == 1:
            return max(mine, default=0)
        if self.rank != 0:
            send(self.conn, {"steps": mine})
            return int(receive(self.conn)["step"])
        common = set(mine)
        for peer in self.peers.values():
            common &= set(receive(peer)["steps"])
        step = max(common, default=0)
        for peer in self.peers.values():
            send(peer, {"step": step})
        return step


# --- checkpoints: one file per step, the last two kept ---------------------------------------------


def checkpoint_path(folder: Path, rank: int, step: int) -> Path:
    return folder / f"allreduce-{step}.rank{rank}.json"


def checkpoints(folder: Path, rank: int) -> list[int]:
    steps = []
    for path in folder.glob(f"allreduce-*.rank{rank}.json"):
        try:
            steps.append(int(path.name.split("-")[1].split(".")[0]))
        except (IndexError, ValueError):
            continue
    return sorted(steps)


def save(folder: Path, rank: int, step: int, params: list[int]) -> None:
    tmp = folder / f".allreduce-{step}.rank{rank}.tmp"
    tmp.write_text(json.dumps({"step": step, "params": params}))
    tmp.replace(checkpoint_path(folder, rank, step))  # atomic: a kill mid-write leaves no torn file
    for old in checkpoints(folder, rank)[:-2]:
        checkpoint_path(folder, rank, old).unlink(missing_ok=True)


def expected(step: int, nodes: int) -> int:
    """Each parameter after `step` steps: the sum over t < step of (t+1) * (1 + 2 + ... + nodes)."""
    return nodes * (nodes + 1) // 2 * step * (step + 1) // 2


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--checkpoint-every", type=int, default=5, help="steps")
    parser.add_argument("--size", type=int, default=4, help="parameters")
    parser.add_argument("--connect-timeout", type=float, default=300.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)

    rank, nodes = int(os.environ.get("NODE_RANK", "0")), int(os.environ.get("NNODES", "1"))
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    attempt = os.environ.get("GPUQUOTA_ATTEMPT", "?")
    folder = Path(os.environ.get("GPUQUOTA_CHECKPOINT_DIR", "."))
    folder.mkdir(parents=True, exist_ok=True)
    say = lambda text: print(f"attempt {attempt} rank {rank}/{nodes}: {text}", flush=True)  # noqa: E731

    t0 = time.monotonic()
    group = Group(rank, nodes, addr, port, args.connect_timeout)
    say(
        f"connected through {addr}:{port} in {time.monotonic() - t0:.2f} s (GPUs [{os.environ.get('CUDA_VISIBLE_DEVICES', '')}])"
    )
    step = group.agree(checkpoints(folder, rank))
    params = [0] * args.size
    if step:
        params = json.loads(checkpoint_path(folder, rank, step).read_text())["params"]
        say(f"resumed from step {step}")
    else:
        say("starting at step 0")
    while step < args.steps:
        gradient = [(rank + 1) * (step + 1)] * args.size
        total, stop = group.all_reduce(gradient, stop_requested)
        if stop:  # every rank stops at this same step, with its checkpoint of it
            save(folder, rank, step, params)
            say(f"stopping at step {step} (SIGTERM), checkpoint saved")
            return 143
        params = [p + g for p, g in zip(params, total, strict=True)]
        step += 1
        if step % args.checkpoint_every == 0:
            save(folder, rank, step, params)
        if step % 10 == 0:
            say(f"step {step}/{args.steps}")
        time.sleep(args.step_seconds)
    save(folder, rank, step, params)
    want = expected(step, nodes)
    if params != [want] * args.size:
        say(f"WRONG: parameters {params[:2]}..., expected {want}")
        return 1
    say(f"done: {step} steps, every parameter {want} as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
