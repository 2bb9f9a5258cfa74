"""The analysis code of the GPU benchmarks, on made-up profiler events, and the sums the token-profile
variants compute, on small inputs against float64 (no GPU)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def long_rollout():
    return _load_benchmark("long_rollout")


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


# -- benchmarks/token_profile_variants.py: the sums its variants compute ---------------------


def _token_sums_reference(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(each query's natural log-sum-exp [H, Lq], each key's sum over the queries of p [H, Lk]),
    in float64."""
    scores = q.double() @ k.double().transpose(1, 2) * q.shape[-1] ** -0.5
    lse = torch.logsumexp(scores, -1)
    return lse, torch.exp(scores - lse[..., None]).sum(1)


def test_the_swapped_call_s_inputs_give_each_key_s_sum_as_a_log_sum_exp():
    pytest.importorskip("triton")
    variants = _load_benchmark("token_profile_variants")
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, n, 128, generator=generator).bfloat16() for n in (50, 70))
    lse, reference = _token_sums_reference(q, k)
    scale = 128**-0.5
    rows, cols = variants.augmented_inputs(q, k, lse.float(), scale, 144)
    assert rows.shape == (1, 70, 2, 144) and cols.shape == (1, 50, 2, 144)
    # The attention call's own log-sum-exp of each row (a key), from its bf16 inputs in float64.
    scores = torch.einsum("khd,qhd->hkq", rows[0].double(), cols[0].double()) * scale
    sums = torch.logsumexp(scores, -1).exp()
    assert ((sums - reference).abs().max() / reference.abs().max()).item() < 2e-6
    # Without the offsets' low parts the sums would be off by bf16's rounding of the offset.
    cols[0, :, :, 129:131] = 0
    rough = torch.logsumexp(torch.einsum("khd,qhd->hkq", rows[0].double(), cols[0].double()) * scale, -1).exp()
    assert ((rough - reference).abs().max() / reference.abs().max()).item() > 1e-4


_KEYS_MAJOR_SCRIPT = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import token_profile_variants as variants
q, k, lse2 = torch.load(sys.argv[2])
results = {}
for pipeline in (False, True):
    for rowsum in (False, True):
        results[(pipeline, rowsum)] = variants.keys_major_sums(q, k, lse2, 128**-0.5, 32, 16, 4, 1, pipeline, rowsum)[0]
torch.save(results, sys.argv[3])
"""


def test_the_keys_major_kernel_sums_every_query_s_probabilities(tmp_path):
    """``_keys_major_kernel`` in Triton's CPU interpreter, with partial key and query tiles."""
    pytest.importorskip("triton")
    generator = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, n, 128, generator=generator) for n in (37, 75))
    lse, reference = _token_sums_reference(q, k)
    torch.save((q, k, (lse / torch.log(torch.tensor(2.0, dtype=torch.float64))).float()), tmp_path / "in.pt")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    command = [sys.executable, "-c", _KEYS_MAJOR_SCRIPT, str(ROOT / "benchmarks"), str(tmp_path / "in.pt")]
    result = subprocess.run([*command, str(tmp_path / "out.pt")], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for flags, sums in torch.load(tmp_path / "out.pt").items():
        assert ((sums.double() - reference).abs().max() / reference.abs().max()).item() < 1e-5, flags
