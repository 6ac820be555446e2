"""GPU discovery: NVML on a real host (here a stand-in pynvml module), fake inventories elsewhere."""

import sys
import types

import pytest

from gpunodes.agent.inventory import discover, fake_inventory, gpu_type_from_model


@pytest.mark.parametrize(
    "model, gpu_type",
    [
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("NVIDIA GeForce RTX 4090", "rtx"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("", "gpu"),
    ],
)
def test_the_gpu_type_comes_from_the_model_name(model, gpu_type):
    assert gpu_type_from_model(model) == gpu_type


class FakeNVMLError(Exception):
    pass


def fake_pynvml(devices, *, init_fails=False):
    mod = types.ModuleType("pynvml")
    mod.NVMLError = FakeNVMLError
    calls = []

    def init():
        if init_fails:
            raise FakeNVMLError("Driver Not Loaded")
        calls.append("init")

    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: calls.append("shutdown")
    mod.nvmlDeviceGetCount = lambda: len(devices)
    mod.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    mod.nvmlDeviceGetName = lambda h: h["name"]
    mod.nvmlDeviceGetUUID = lambda h: h["uuid"]
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=h["mem"])
    mod.calls = calls
    return mod


def test_it_reads_index_uuid_model_and_memory_through_nvml(monkeypatch):
    devices = [
        {"name": b"NVIDIA H200", "uuid": b"GPU-aaaa", "mem": 143771 * 1024 * 1024},
        {"name": "NVIDIA H200", "uuid": "GPU-bbbb", "mem": 143771 * 1024 * 1024},
    ]
    mod = fake_pynvml(devices)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    gpus = discover()
    assert [(g.index, g.uuid, g.model, g.memory_mb) for g in gpus] == [
        (0, "GPU-aaaa", "NVIDIA H200", 143771),
        (1, "GPU-bbbb", "NVIDIA H200", 143771),
    ]
    assert mod.calls == ["init", "shutdown"]


def test_a_host_without_nvml_gets_a_clear_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], init_fails=True))
    with pytest.raises(RuntimeError, match="--fake-gpus"):
        discover()


def test_a_fake_inventory_is_explicit_and_stable():
    first = fake_inventory("gpu-1", 4)
    assert [g.index for g in first] == [0, 1, 2, 3]
    assert first == fake_inventory("gpu-1", 4)
    assert len({g.uuid for g in first + fake_inventory("gpu-2", 4)}) == 8
