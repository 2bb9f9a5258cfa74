"""The analysis code of the GPU benchmarks, on made-up profiler events (no GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def long_rollout():
    spec = importlib.util.spec_from_file_location("long_rollout", ROOT / "benchmarks" / "long_rollout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _event(name: str, start: float, end: float, cuda: bool = False) -> SimpleNamespace:
    device = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end))


def test_idle_gaps_are_put_down_to_the_call_that_waited_or_the_host(long_rollout):
    events = [
        _event("k1", 0, 100, cuda=True),
        _event("k2", 120, 200, cuda=True),  # a 20 us gap: under the threshold
        _event("k3", 500, 600, cuda=True),  # 300 us idle: the host waited in a synchronization ending in it
        _event("k4", 550, 580, cuda=True),  # overlaps k3: the GPU stays busy until 600
        _event("k5", 1000, 1100, cuda=True),  # 400 us idle: the host was busy in an operation
        _event("cudaStreamSynchronize", 150, 210, cuda=False),
        _event("aten::add", 590, 700, cuda=False),
        _event("aten::copy_", 595, 650, cuda=False),
    ]
    gaps = long_rollout.idle_gaps(SimpleNamespace(events=lambda: events), threshold_us=50.0)
    assert gaps["gaps"] == 2 and gaps["idle_ms_in_gaps"] == pytest.approx(0.7)
    assert gaps["kernel_ms"] == pytest.approx(0.41) and gaps["first_to_last_kernel_ms"] == pytest.approx(1.1)
    assert gaps["causes"] == {
        "host busy in aten::add > aten::copy_": {"gaps": 1, "idle_ms": pytest.approx(0.4)},
        "waited in cudaStreamSynchronize": {"gaps": 1, "idle_ms": pytest.approx(0.3)},
    }
    assert gaps["blocking_calls"]["cudaStreamSynchronize"] == 1
