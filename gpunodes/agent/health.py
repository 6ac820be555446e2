"""The health of the host's GPUs, watched through NVML by one thread of the agent.

What is watched (the NVIDIA Kubernetes device plugin's checks, and a little more):

- critical Xid events (nvmlEventTypeXidCriticalError), except the application errors that are the job's
  fault, not the GPU's: Xids 13, 31, 43, 45 and 68 (the device plugin's list; GPU_HEALTH_IGNORED_XIDS adds
  more), and double-bit ECC events;
- uncorrectable ECC errors since the last reset (the volatile count), pages pending retirement (before
  Ampere) and rows pending remapping or a remapping that failed (Ampere and later): the GPU needs a reset,
  or a replacement;
- a GPU that NVML can no longer reach (NVML_ERROR_GPU_IS_LOST: it fell off the bus);
- an attempt's process that still holds a GPU GPU_STUCK_PROCESS_S after its attempt was killed and reaped (the
  runner tells the watcher which GPUs an attempt gave back: `released`).

A GPU found broken stays so in this process (`faults`: its reason, in words, and when) until a re-check
finds it well (`recheck`: an admin marked it healthy, after a reset; the control side sends the request).
Unlike the device plugin, one wait error or one unreadable event does not take every GPU of the host out:
the per-GPU checks run at once instead, and find the GPU that is really gone.

`nvml` is the pynvml module on a real host, or a FakeNvml (below) that reads the faults a test injects
from a file: the same watcher runs either way.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Why a GPU is unhealthy (the heartbeat's `unhealthy[].reason`; the control side's GpuFailureReason).
XID, ECC, RETIRED_PAGES, ROW_REMAP, OFF_BUS, STUCK_PROCESS = (
    "xid",
    "ecc",
    "retired_pages",
    "row_remap",
    "off_bus",
    "stuck_process",
)
REASONS = frozenset({XID, ECC, RETIRED_PAGES, ROW_REMAP, OFF_BUS, STUCK_PROCESS})
# Xids that are the application's errors, not the GPU's (as the NVIDIA k8s device plugin ignores them).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})
# What the common Xids mean (NVIDIA's Xid catalogue), for the reason an admin reads.
XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapper failure",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
# The event types registered: critical Xids and double-bit ECC errors (single-bit ones are corrected).
XID_CRITICAL = 0x8
DOUBLE_BIT_ECC = 0x2
DETAIL_MAX = 300


@dataclass(frozen=True)
class Fault:
    reason: str  # one of REASONS
    detail: str  # in words, for the node page
    at: float  # when it was found (this host's clock)

    def as_message(self, index: int) -> dict:
        return {"index": index, "reason": self.reason, "detail": self.detail[:DETAIL_MAX], "at": self.at}


def xid_words(xid: int) -> str:
    name = XID_NAMES.get(xid)
    return f"Xid {xid} ({name})" if name else f"Xid {xid}"


def _error_code(e: BaseException) -> int | None:
    return getattr(e, "value", None)


class HealthWatcher:
    """The GPUs of one host (`gpus`: index -> uuid), watched through `nvml`. `on_fault(index, fault)` is
    called once for each GPU found broken (from the watcher's thread, or from `released`/`recheck`'s
    callers). `clock` is time.time, `monotonic` time.monotonic (tests pass their own)."""

    def __init__(
        self,
        nvml,
        gpus: dict[int, str],
        *,
        on_fault: Callable[[int, Fault], None],
        ignored_xids: Iterable[int] = APPLICATION_XIDS,
        check_every_s: float = 5.0,
        stuck_after_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml = nvml
        self.gpus = dict(gpus)
        self.on_fault = on_fault
        self.ignored_xids = frozenset(ignored_xids)
        self.check_every_s = check_every_s
        self.stuck_after_s = stuck_after_s
        self.clock = clock
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._faults: dict[int, Fault] = {}
        self._rechecked: dict[int, int] = {}  # index -> the control side's token of the last re-check
        self._handles: dict[int, object] = {}
        self._events = None
        self._started = False
        self._next_check = 0.0
        # GPUs an attempt gave back: index -> (by when its processes must be gone, which attempt, and
        # which pids are its)
        self._releasing: dict[int, tuple[float, str, Callable[[int], bool] | None]] = {}
        self._wait_errors = 0

    # --- what the agent reads ----------------------------------------------------------------------

    def faults(self) -> dict[int, Fault]:
        with self._lock:
            return dict(self._faults)

    def rechecked(self) -> dict[int, int]:
        with self._lock:
            return dict(self._rechecked)

    def unhealthy(self) -> list[dict]:
        """The heartbeat's `unhealthy` field."""
        return [f.as_message(i) for i, f in sorted(self.faults().items())]

    # --- setting up --------------------------------------------------------------------------------

    def start(self) -> None:
        """Initialise NVML, take a handle of each GPU and register the events. A GPU whose handle NVML
        cannot give is unhealthy from the start (it fell off the bus before the agent started)."""
        nvml = self.nvml
        nvml.nvmlInit()
        self._started = True
        try:
            self._events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as e:
            log.warning(
                "NVML events are not available on this host (%s): GPUs are checked every %.0f s only",
                e,
                self.check_every_s,
            )
            self._events = None
        for index in sorted(self.gpus):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as e:
                self._found(index, Fault(OFF_BUS, f"NVML cannot reach the GPU: {e}", self.clock()))
                continue
            self._handles[index] = handle
            if self._events is None:
                continue
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                nvml.nvmlDeviceRegisterEvents(
                    handle, (XID_CRITICAL | DOUBLE_BIT_ECC) & supported, self._events
                )
            except nvml.NVMLError as e:
                if _error_code(e) == nvml.NVML_ERROR_GPU_IS_LOST:
                    self._found(index, Fault(OFF_BUS, f"NVML cannot reach the GPU: {e}", self.clock()))
                else:  # too old a GPU or driver: the checks still run
                    log.warning(
                        "GPU %d: no NVML events (%s); checked every %.0f s", index, e, self.check_every_s
                    )

    def close(self) -> None:
        if not self._started:
            return
        nvml = self.nvml
        if self._events is not None:
            try:
                nvml.nvmlEventSetFree(self._events)
            except nvml.NVMLError:
                pass
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
        self._started = False

    # --- the loop ----------------------------------------------------------------------------------

    def run(self, stop: threading.Event, wait_ms: int = 1000) -> None:
        """Until `stop`: wait for events (at most wait_ms at a time), check every GPU every
        check_every_s, and look at the GPUs that attempts gave back."""
        while not stop.is_set():
            try:
                self.step(wait_ms)
            except Exception:
                log.exception("the GPU health watcher failed a round")
                stop.wait(1.0)

    def step(self, wait_ms: int = 1000) -> None:
        self.wait_events(wait_ms)
        now = self.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.check_every_s
            self.check_all()
        self.check_released()

    def wait_events(self, wait_ms: int) -> None:
        """Wait for one NVML event (or the timeout) and act on it."""
        nvml = self.nvml
        if self._events is None:
            time.sleep(wait_ms / 1000)
            return
        try:
            event = nvml.nvmlEventSetWait_v2(self._events, wait_ms)
        except nvml.NVMLError as e:
            if _error_code(e) == nvml.NVML_ERROR_TIMEOUT:
                return
            # The device plugin takes every GPU out here; the checks find the one that is gone.
            self._wait_errors += 1
            if self._wait_errors in (1, 10, 100) or self._wait_errors % 1000 == 0:
                log.warning(
                    "waiting for NVML events failed (%s, %d times): checking every GPU", e, self._wait_errors
                )
            self.check_all()
            time.sleep(min(1.0, wait_ms / 1000))
            return
        self._wait_errors = 0
        self.on_event(event)

    def on_event(self, event) -> None:
        kind, data = int(event.eventType), int(event.eventData)
        if kind == DOUBLE_BIT_ECC:
            fault = Fault(ECC, "double-bit (uncorrectable) ECC error", self.clock())
        elif kind == XID_CRITICAL:
            if data in self.ignored_xids:
                log.info("%s: an application error, not the GPU's; ignored", xid_words(data))
                return
            fault = Fault(XID, f"critical {xid_words(data)}", self.clock())
        else:
            return
        index = self._index_of(event.device)
        if index is not None:
            self._found(index, fault)
            return
        # An event whose GPU NVML cannot name: the one that is really gone shows in the checks.
        log.warning("%s on a GPU NVML could not name: checking every GPU", fault.detail)
        found = self.check_all()
        if not found:
            for i in sorted(self.gpus):
                self._found(
                    i, Fault(fault.reason, f"{fault.detail} on an unnamed GPU of this host", fault.at)
                )

    def _index_of(self, device) -> int | None:
        for index, handle in self._handles.items():
            if handle is device or handle == device:
                return index
        nvml = self.nvml
        try:
            uuid = nvml.nvmlDeviceGetUUID(device)
        except nvml.NVMLError:
            return None
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return next((i for i, u in self.gpus.items() if u == uuid), None)

    # --- the checks --------------------------------------------------------------------------------

    def check_all(self) -> list[int]:
        """Check every GPU not already known broken; returns those found broken now."""
        found = []
        for index in sorted(self.gpus):
            if index in self.faults():
                continue
            fault = self.check(index)
            if fault is not None:
                self._found(index, fault)
                found.append(index)
        return found

    def check(self, index: int) -> Fault | None:
        """One GPU's state now: None where it is well."""
        nvml = self.nvml
        now = self.clock()
        lost = nvml.NVML_ERROR_GPU_IS_LOST
        try:
            handle = self._handles.get(index)
            if handle is None:
                handle = self._handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
            nvml.nvmlDeviceGetUUID(handle)
        except nvml.NVMLError as e:
            return Fault(OFF_BUS, f"NVML cannot reach the GPU (fallen off the bus?): {e}", now)
        checks = (
            (ECC, lambda: self._ecc(handle)),
            (RETIRED_PAGES, lambda: self._retired(handle)),
            (ROW_REMAP, lambda: self._remap(handle)),
        )
        for reason, check in checks:
            try:
                detail = check()
            except nvml.NVMLError as e:
                if _error_code(e) == lost:
                    return Fault(OFF_BUS, f"NVML cannot reach the GPU (fallen off the bus?): {e}", now)
                continue  # not supported by this GPU or driver
            if detail:
                return Fault(reason, detail, now)
        return None

    def _ecc(self, handle) -> str:
        nvml = self.nvml
        count = nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        )
        return f"{count} uncorrectable ECC error(s) since the last reset" if count else ""

    def _retired(self, handle) -> str:
        nvml = self.nvml
        pending = nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
        return (
            "memory pages pending retirement: reset the GPU" if pending == nvml.NVML_FEATURE_ENABLED else ""
        )

    def _remap(self, handle) -> str:
        _corrected, _uncorrected, pending, failed = self.nvml.nvmlDeviceGetRemappedRows(handle)
        if failed:
            return "row remapping failed: the GPU needs to be replaced"
        return "memory rows pending remapping: reset the GPU" if pending else ""

    # --- processes that outlive their attempt ------------------------------------------------------

    def holders(self, indexes: Iterable[int]) -> dict[int, list[int]]:
        """The pids NVML sees on each of these GPUs (compute and graphics)."""
        nvml = self.nvml
        found = {}
        for index in indexes:
            try:
                handle = self._handles.get(index) or nvml.nvmlDeviceGetHandleByIndex(index)
                pids = {p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
                pids |= {p.pid for p in nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)}
            except nvml.NVMLError:
                continue
            if pids:
                found[index] = sorted(pids)
        return found

    def released(
        self, indexes: Iterable[int], attempt: str, owns: Callable[[int], bool] | None = None
    ) -> None:
        """An attempt that held these GPUs was killed and reaped: none of its processes may still use
        them GPU_STUCK_PROCESS_S (stuck_after_s) from now. `owns(pid)`: whether a pid is that attempt's
        (its uid or cgroup; the runner knows): only those are stuck. Another process on the GPU (a live
        attempt that was not given it) is not this GPU's fault: the runner stops that attempt. Without
        `owns` every holder counts."""
        deadline = self.monotonic() + self.stuck_after_s
        with self._lock:
            for index in indexes:
                self._releasing[index] = (deadline, attempt, owns)

    def claimed(self, indexes: Iterable[int]) -> None:
        """A new attempt was given these GPUs after the runner found no process on them: what an earlier
        attempt left is gone, and the new attempt's own processes are not stuck ones."""
        with self._lock:
            for index in indexes:
                self._releasing.pop(index, None)

    def check_released(self) -> None:
        with self._lock:
            watched = dict(self._releasing)
        if not watched:
            return
        held = self.holders(watched)
        now = self.monotonic()
        for index, (deadline, attempt, owns) in watched.items():
            if owns is not None and index in held:
                held[index] = [pid for pid in held[index] if owns(pid)]
                if not held[index]:
                    del held[index]
            if index not in held:
                with self._lock:
                    if self._releasing.get(index, (None,))[0] == deadline:
                        del self._releasing[index]
            elif now >= deadline:
                with self._lock:
                    self._releasing.pop(index, None)
                pids = ", ".join(map(str, held[index]))
                self._found(
                    index,
                    Fault(
                        STUCK_PROCESS,
                        f"pid {pids} still uses the GPU {self.stuck_after_s:.0f} s after attempt {attempt} "
                        "was killed: it cannot be reaped (reset the GPU, or reboot)",
                        self.clock(),
                    ),
                )

    def report(self, index: int, fault: Fault) -> None:
        """A fault found outside the watcher (the runner: an attempt's processes that cannot be killed)."""
        self._found(index, fault)

    # --- broken, and well again --------------------------------------------------------------------

    def _found(self, index: int, fault: Fault) -> None:
        if index not in self.gpus:
            return
        with self._lock:
            if index in self._faults:
                return
            self._faults[index] = fault
        log.error("GPU %d is UNHEALTHY: %s", index, fault.detail)
        self.on_fault(index, fault)

    def recheck(self, index: int, token: int) -> Fault | None:
        """The control side asks (an admin marked the GPU healthy, after a reset): check it now. Well,
        its fault is forgotten and it may take work again; else it stays (or becomes) unhealthy with
        what was found. Either way `token` is remembered, so the control side knows the answer is new."""
        if index not in self.gpus:
            return None
        self._handles.pop(index, None)  # a reset GPU may have a new handle
        fault = self.check(index)
        with self._lock:
            self._rechecked[index] = token
            before = self._faults.pop(index, None)
        if fault is None:
            if before is not None:
                log.warning("GPU %d re-checked: healthy again (was: %s)", index, before.detail)
            return None
        self._found(index, Fault(fault.reason, f"re-check failed: {fault.detail}", fault.at))
        return fault


# --- a fake NVML for hosts without GPUs: the faults a test injects, from a file --------------------


class FakeNvml:
    """The part of pynvml the watcher and the runner use, for `--fake-gpus` hosts: `count` GPUs named
    like fake_inventory's. Faults are read from `fault_file` (JSON lines, appended by a test or an
    operator; read as they come):

        {"gpu": 2, "xid": 79}                 an Xid event
        {"gpu": 2, "ecc_uncorrected": 1}      the volatile count of uncorrectable ECC errors
        {"gpu": 2, "double_bit_ecc": true}    a double-bit ECC event
        {"gpu": 2, "retired_pending": true}   pages pending retirement
        {"gpu": 2, "remap_pending": true}     rows pending remapping ("remap_failed": true, failed)
        {"gpu": 2, "lost": true}              fallen off the bus: every call about it fails
        {"gpu": 2, "processes": [1234]}       pids using it
        {"gpu": 2, "reset": true}             a GPU reset: all of the above cleared

    With `state_file` (the agent's state directory), how far the file was read and what its lines left
    (ECC counts, lost GPUs, processes) are kept there: an agent that restarts goes on from where it
    was, as a real host's NVML would, and does not replay the file from its first line (an Xid already
    seen, and handled, would fail the GPU again after an admin brought it back).
    """

    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_UNKNOWN = 999
    NVML_FEATURE_ENABLED = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    class NVMLError(Exception):
        def __init__(self, value: int):
            super().__init__(
                {3: "Not Supported", 10: "Timeout", 15: "GPU is lost"}.get(value, f"error {value}")
            )
            self.value = value

    @dataclass(frozen=True)
    class Event:
        device: object
        eventType: int  # noqa: N815 - pynvml's name
        eventData: int  # noqa: N815
        gpuInstanceId: int = 0xFFFFFFFF  # noqa: N815
        computeInstanceId: int = 0xFFFFFFFF  # noqa: N815

    @dataclass(frozen=True)
    class Process:
        pid: int

    def __init__(
        self,
        node: str,
        count: int,
        fault_file: Path | str | None = None,
        *,
        poll_s: float = 0.05,
        state_file: Path | str | None = None,
    ):
        self.node = node
        self.count = count
        self.fault_file = Path(fault_file) if fault_file else None
        self.state_file = Path(state_file) if state_file else None
        self.poll_s = poll_s
        self._offset = 0
        self._inode: int | None = None  # the fault file's, when the offset was kept
        self._partial = b""
        self._lock = threading.Lock()
        self._file_lock = threading.Lock()  # the watcher's thread and the runner's read the file
        self._state = {i: self._well() for i in range(count)}
        self._events: list[FakeNvml.Event] = []
        self._load()

    def _load(self) -> None:
        """Where an earlier agent left the fault file, if it kept it: its offset (unless the file was
        replaced or cut shorter since: then from its start) and the GPUs' state."""
        if self.state_file is None or self.fault_file is None:
            return
        try:
            kept = json.loads(self.state_file.read_text())
            offset, inode, partial = int(kept["offset"]), kept["inode"], str(kept.get("partial", ""))
            gpus = {int(i): {**self._well(), **g} for i, g in kept["gpus"].items() if int(i) in self._state}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning(
                "fake NVML: ignoring %s (%s): reading the fault file from its start", self.state_file, e
            )
            return
        try:
            st = self.fault_file.stat()
        except OSError:
            return
        if st.st_ino != inode or st.st_size < offset:
            return  # another file now: its lines are all new
        self._offset, self._inode, self._partial = offset, inode, partial.encode()
        self._state.update(gpus)

    def _save(self) -> None:
        if self.state_file is None:
            return
        with self._lock:
            gpus = {str(i): dict(g) for i, g in self._state.items()}
        kept = {
            "offset": self._offset,
            "inode": self._inode,
            "partial": self._partial.decode("utf-8", "replace"),
            "gpus": gpus,
        }
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp.write_text(json.dumps(kept))
            tmp.replace(self.state_file)
        except OSError as e:  # a full disk: the next line read tries again
            log.warning("fake NVML: cannot write %s: %s", self.state_file, e)

    @staticmethod
    def _well() -> dict:
        return {
            "ecc": 0,
            "retired": False,
            "remap_pending": False,
            "remap_failed": False,
            "lost": False,
            "pids": [],
        }

    def inject(self, fault: dict) -> None:
        """Apply one fault line (what the file's reader does with each)."""
        index = fault.get("gpu")
        if type(index) is not int or index not in self._state:
            log.warning("fake NVML: ignoring %r (no such GPU)", fault)
            return
        with self._lock:
            state = self._state[index]
            if fault.get("reset"):
                self._state[index] = self._well()
                self._events = [e for e in self._events if e.device != index]
                return
            if "xid" in fault:
                self._events.append(self.Event(index, XID_CRITICAL, int(fault["xid"])))
            if fault.get("double_bit_ecc"):
                self._events.append(self.Event(index, DOUBLE_BIT_ECC, 0))
            if "ecc_uncorrected" in fault:
                state["ecc"] = int(fault["ecc_uncorrected"])
            for key, field in (("retired_pending", "retired"), ("remap_pending", "remap_pending")):
                if key in fault:
                    state[field] = bool(fault[key])
            if "remap_failed" in fault:
                state["remap_failed"] = bool(fault["remap_failed"])
            if "lost" in fault:
                state["lost"] = bool(fault["lost"])
            if "processes" in fault:
                state["pids"] = [int(p) for p in fault["processes"]]

    def _read(self) -> None:
        if self.fault_file is None:
            return
        with self._file_lock:
            try:
                with open(self.fault_file, "rb") as f:
                    inode = os.fstat(f.fileno()).st_ino
                    if self._inode is not None and inode != self._inode:
                        self._offset, self._partial = 0, b""  # replaced: a new file from its start
                    self._inode = inode
                    f.seek(self._offset)
                    data = f.read()
            except FileNotFoundError:
                return
            if not data:
                return
            self._offset += len(data)
            lines = (self._partial + data).split(b"\n")
            self._partial = lines.pop()  # a line still being written
            self._apply(lines)
            self._save()  # after its lines took effect: a restart neither replays nor skips one

    def _apply(self, lines: list[bytes]) -> None:
        for line in lines:
            if not line.strip():
                continue
            try:
                fault = json.loads(line)
            except ValueError:
                log.warning("fake NVML: ignoring a line of %s that is not JSON: %.80r", self.fault_file, line)
                continue
            if isinstance(fault, dict):
                self.inject(fault)

    def _gpu(self, handle) -> dict:
        self._read()
        state = self._state.get(handle)
        if state is None:
            raise self.NVMLError(self.NVML_ERROR_UNKNOWN)
        if state["lost"]:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return state

    # pynvml's functions

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names, here and below
        self._read()

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int):  # noqa: N802
        if not 0 <= index < self.count:
            raise self.NVMLError(self.NVML_ERROR_UNKNOWN)
        self._gpu(index)
        return index

    def nvmlDeviceGetUUID(self, handle) -> str:  # noqa: N802
        self._gpu(handle)
        return f"GPU-fake-{self.node}-{handle}"

    def nvmlDeviceGetSupportedEventTypes(self, handle) -> int:  # noqa: N802
        self._gpu(handle)
        return XID_CRITICAL | DOUBLE_BIT_ECC

    def nvmlEventSetCreate(self):  # noqa: N802
        return "fake-event-set"

    def nvmlDeviceRegisterEvents(self, handle, types: int, event_set) -> None:  # noqa: N802
        self._gpu(handle)

    def nvmlEventSetFree(self, event_set) -> None:  # noqa: N802
        pass

    def nvmlEventSetWait_v2(self, event_set, timeout_ms: int):  # noqa: N802
        end = time.monotonic() + timeout_ms / 1000
        while True:
            self._read()
            with self._lock:
                if self._events:
                    return self._events.pop(0)
            if time.monotonic() >= end:
                raise self.NVMLError(self.NVML_ERROR_TIMEOUT)
            time.sleep(min(self.poll_s, max(0.0, end - time.monotonic())))

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type: int, counter_type: int) -> int:  # noqa: N802
        return self._gpu(handle)["ecc"]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle) -> int:  # noqa: N802
        return int(self._gpu(handle)["retired"])

    def nvmlDeviceGetRemappedRows(self, handle) -> tuple[int, int, int, int]:  # noqa: N802
        state = self._gpu(handle)
        return (0, 0, int(state["remap_pending"]), int(state["remap_failed"]))

    def nvmlDeviceGetComputeRunningProcesses(self, handle) -> list:  # noqa: N802
        return [self.Process(pid) for pid in self._gpu(handle)["pids"]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle) -> list:  # noqa: N802
        self._gpu(handle)
        return []
