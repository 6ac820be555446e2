"""The host's GPUs: through NVML (nvidia-ml-py) when present, or an explicit fake inventory."""

from __future__ import annotations

import re

from gpunodes.services import GpuInfo, fake_inventory

__all__ = ["GpuInfo", "discover", "fake_inventory", "gpu_type_from_model"]


def gpu_type_from_model(model: str) -> str:
    """'NVIDIA A10G' → 'a10g', 'NVIDIA H100 80GB HBM3' → 'h100', 'Tesla V100-SXM2-16GB' → 'v100'."""
    name = re.sub(r"^(nvidia|tesla|geforce|quadro)\s+", "", model.strip(), flags=re.I)
    name = re.sub(r"^(nvidia|tesla|geforce|quadro)\s+", "", name, flags=re.I)
    token = re.split(r"[\s_-]+", name)[0] if name else "gpu"
    return re.sub(r"[^a-z0-9-]", "", token.lower()) or "gpu"


def discover() -> list[GpuInfo]:
    """Real GPUs through NVML. Raises RuntimeError when NVML is not available on this host."""
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is in requirements.txt
        raise RuntimeError("nvidia-ml-py is not installed") from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise RuntimeError(f"NVML is not available on this host ({e}); use --fake-gpus N") from e
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            model = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            gpus.append(GpuInfo(index=index, uuid=_text(uuid), model=_text(model), memory_mb=int(memory)))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def device_paths() -> dict[int, str]:
    """The device node of each real GPU by index (/dev/nvidia<minor>, the minor number from NVML: it
    need not equal the index). Empty where NVML is not available."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        return {
            index: f"/dev/nvidia{pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(index))}"
            for index in range(pynvml.nvmlDeviceGetCount())
        }
    except Exception:
        return {}
    finally:
        pynvml.nvmlShutdown()


def gpu_processes(indexes) -> dict[int, list[int]]:
    """The pids NVML sees using each of the given GPUs (compute and graphics), for the agent's check
    before it hands GPUs to an attempt. Empty where NVML is not available. In a container NVML may
    report pids of another pid namespace, or none."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        found = {}
        for index in indexes:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pids = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
            pids |= {p.pid for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)}
            if pids:
                found[index] = sorted(pids)
        return found
    except Exception:
        return {}
    finally:
        pynvml.nvmlShutdown()
