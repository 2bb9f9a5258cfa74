"""FlashAttention-4 as the model's attention kernel (``sinkscope.attention.flash4``,
``capture.attention_kernel``): the choice and its errors on the CPU, the layout contract
against a stand-in forward; on a GPU with flash-attn-4 installed (``-m gpu``), its output and
log-sum-exp against float64, under the key split, and the ``exact`` capture route's video."""

from __future__ import annotations

import os

import pytest
import torch
from test_split_attention import brute_force

from sinkscope.attention import flash4, split
from sinkscope.attention.flash4 import (
    flash4_attention_with_lse,
    resolved_attention_kernel,
    uses_flash4,
)
from sinkscope.attention.settings import KernelSettings
from sinkscope.errors import ConfigError, SinkscopeError
from sinkscope.pipeline.config import normalize_config
from sinkscope.pipeline.study import Study


def test_the_config_key_defaults_to_auto_and_only_a_pinned_kernel_is_a_job_param():
    assert normalize_config({})["capture"]["attention_kernel"] == "auto"
    with pytest.raises(ConfigError, match="capture.attention_kernel"):
        normalize_config({"capture": {"attention_kernel": "flash3"}})
    default = Study(normalize_config({}))
    capture = default.extract_params(next(iter(default.runs)), "0")["capture"]
    assert "attention_kernel" not in capture  # default studies keep their params
    assert KernelSettings.from_capture(capture).attention_kernel == "auto"
    pinned = Study(normalize_config({"capture": {"attention_kernel": "cudnn"}}))
    capture = pinned.extract_params(next(iter(pinned.runs)), "0")["capture"]
    assert capture["attention_kernel"] == "cudnn"
    settings = KernelSettings.from_capture(capture)
    assert settings.attention_kernel == "cudnn" and settings.name == "fast"


def test_an_unknown_kernel_is_refused_by_name():
    with pytest.raises(SinkscopeError, match="capture.attention_kernel 'flash3' is not one of auto, cudnn, flash4"):
        KernelSettings(attention_kernel="flash3")


def test_the_config_check_names_a_pinned_flash4_that_can_not_run():
    from sinkscope.pipeline.machinecheck import device_problems

    capture = {"capture": {"backend": "auto", "compile": "auto", "attention_kernel": "flash4"}}
    (problem,) = device_problems(capture, "cpu")
    assert problem.startswith("config key capture.attention_kernel: 'flash4' runs on CUDA only")
    if flash4.flash4_forward() is None:
        (problem,) = device_problems(capture, "cuda")
        assert "needs flash-attn-4, not installed here" in problem
    # A cluster's nodes, not this machine, run the jobs: what is installed here does not count.
    assert device_problems(capture, "cuda", local=False) == []
    assert device_problems({"capture": {**capture["capture"], "attention_kernel": "auto"}}, "cpu") == []


def test_off_cuda_every_kernel_choice_but_flash4_runs_pytorchs_own():
    q = torch.zeros(1, 2, 8, 64)
    assert not uses_flash4("auto", q, q, q) and not uses_flash4("cudnn", q, q, q)
    for kernel in ("auto", "cudnn"):
        assert resolved_attention_kernel(kernel, "cpu", torch.float32, 64) == "sdpa"
        assert resolved_attention_kernel(kernel, "cpu", torch.bfloat16, 128) == "sdpa"
    with pytest.raises(SinkscopeError, match="capture.attention_kernel flash4 can not run here: it runs on CUDA"):
        resolved_attention_kernel("flash4", "cpu", torch.bfloat16, 128)
    with pytest.raises(SinkscopeError, match="flash4 can not run here: it runs on CUDA, not cpu"):
        uses_flash4("flash4", q, q, q)


class FakeCuda:
    """A CUDA tensor's attributes, for the checks that read no data."""

    def __init__(self, dim=128, dtype=torch.bfloat16):
        self.is_cuda, self.dtype = True, dtype
        self.shape = (1, 2, 8, dim)
        self.device = torch.device("cuda", 0)


def test_why_flash4_does_not_apply_names_the_reason(monkeypatch):
    """The checks in their order, each given a call it stops (CUDA tensors faked)."""
    call = FakeCuda()
    monkeypatch.setattr(flash4, "_capability_major", lambda index: 9)
    monkeypatch.setattr(flash4, "_import_flash4", lambda: (None, "flash-attn-4 is not installed (pip ...)"))
    monkeypatch.setattr(flash4, "_first_call_fails", lambda index, dtype, dim: None)
    why = flash4.flash4_unsupported(FakeCuda(dtype=torch.float32), call, call)
    assert "fp16 / bf16 alike, not torch.float32, torch.bfloat16, torch.bfloat16" in why
    assert "head sizes 128, 64, 128 are not equal multiples of 8" in flash4.flash4_unsupported(call, FakeCuda(64), call)
    assert "head sizes 36, 36, 36" in flash4.flash4_unsupported(*(FakeCuda(36),) * 3)
    assert "flash-attn-4 is not installed" in flash4.flash4_unsupported(call, call, call)
    monkeypatch.setattr(flash4, "_import_flash4", lambda: (object(), ""))
    assert flash4.flash4_unsupported(call, call, call) is None
    monkeypatch.setattr(flash4, "_capability_major", lambda index: 8)
    assert "compute capability 9.x and 10.x, not 8.x" in flash4.flash4_unsupported(call, call, call)


def test_a_first_call_that_fails_falls_back_under_auto_and_stops_a_pinned_flash4(monkeypatch, caplog):
    """An installed FlashAttention-4 whose first call fails (a JIT error, an old driver): auto
    runs cuDNN and says so once in the log; flash4 stops with the reason."""
    call = FakeCuda()
    monkeypatch.setattr(flash4, "_capability_major", lambda index: 9)
    monkeypatch.setattr(flash4, "_import_flash4", lambda: (object(), ""))
    monkeypatch.setattr(
        flash4, "_first_call_fails", lambda index, dtype, dim: "its first call failed: RuntimeError: no kernel image"
    )
    flash4._say_once.cache_clear()
    with caplog.at_level("WARNING", logger="sinkscope"):
        assert not uses_flash4("auto", call, call, call)
        assert not uses_flash4("auto", call, call, call)
    (record,) = caplog.records
    assert "FlashAttention-4 is installed but its first call failed: RuntimeError: no kernel image" in record.message
    assert record.message.endswith("cuDNN runs instead")
    with pytest.raises(SinkscopeError, match="flash4 can not run here: its first call failed: RuntimeError"):
        uses_flash4("flash4", call, call, call)


def test_flash4s_compile_cache_is_on_unless_the_user_chose(monkeypatch):
    """FlashAttention-4 reads FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED when first imported: set
    before that import, to 1 where the user has not set it."""
    variable = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
    for chosen, expected in ((None, "1"), ("0", "0")):
        if chosen is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, chosen)
        flash4._import_flash4.cache_clear()
        try:
            flash4.flash4_forward()
            assert os.environ[variable] == expected
        finally:
            flash4._import_flash4.cache_clear()


def test_the_layout_contract_against_a_stand_in_forward(monkeypatch):
    """flash4_attention_with_lse hands FlashAttention-4 the model's [N, L, H, D] tensors and
    returns attention_with_lse's [N, H, L, D] output and [N, H, Lq] log-sum-exp: checked with a
    float64 stand-in of FlashAttention-4's forward (its documented layouts) on the CPU."""
    seen = []

    def stand_in(q, k, v, softmax_scale, return_lse):
        seen.append(tuple(q.shape))
        scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * softmax_scale
        out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.double())
        return out.to(q.dtype), torch.logsumexp(scores, -1).float(), None, None, None

    monkeypatch.setattr(flash4, "flash4_forward", lambda: stand_in)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 16, generator=generator) for n in (5, 7, 7))  # [N, H, L, D]
    out, lse = flash4_attention_with_lse(q, k, v, 0.25)
    assert seen == [(2, 5, 3, 16)]
    expected_out, expected_lse = split.attention_with_lse(q, k, v, 0.25)
    torch.testing.assert_close(out, expected_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, expected_lse, rtol=1e-5, atol=1e-5)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_flash4 = pytest.mark.skipif(flash4.flash4_forward() is None, reason="needs flash-attn-4")


@pytest.mark.gpu
@needs_cuda
@needs_flash4
@pytest.mark.parametrize("plan", [split.KeySplit(0, 1, 0.0), split.KeySplit(0, 4, 0.0), split.KeySplit(256, 2, 0.0)])
def test_flash4_against_float64_plain_and_key_split(plan):
    generator = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (
        torch.randn(1, n, 4, 128, device="cuda", dtype=torch.bfloat16, generator=generator) for n in (600, 4096, 4096)
    )
    assert uses_flash4("flash4", q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    out, lse = split.planned_attention(q, k, v, plan, kernel="flash4")
    expected_out, expected_lse = brute_force(q, k, v)
    # One bf16 rounding of the output (two with the merge), the log-sum-exp in fp32.
    assert (out.double() - expected_out).abs().max().item() < 4e-3
    assert (lse.double() - expected_lse).abs().max().item() < 1e-4
    cudnn_out, _ = split.planned_attention(q, k, v, plan, kernel="cudnn")
    assert (cudnn_out.double() - expected_out).abs().max().item() < 4e-3


@pytest.mark.gpu
@needs_cuda
@needs_flash4
def test_the_exact_route_leaves_a_flash4_video_as_it_is():
    """Captured on every layer by the exact route, the flash4 video is the uncaptured one to the
    bit (the route runs the model's own call, kernel included); cuDNN's is another video."""
    from test_layer_graphs import SMALL_CUDA

    from sinkscope.generation.capture import FrameStatsCapture
    from sinkscope.generation.sampler import generate
    from sinkscope.model import build_model
    from sinkscope.options import GenerationOptions

    options = GenerationOptions.from_config({"num_frames": 9})
    context = torch.randn(1, 12, SMALL_CUDA.text_dim, generator=torch.Generator().manual_seed(2))
    model = build_model(SMALL_CUDA, seed=7, dtype=torch.bfloat16, device="cuda")
    assert resolved_attention_kernel("auto", "cuda", torch.bfloat16, model.config.head_dim) == "flash4"

    def latents(kernel: str, capture: bool) -> torch.Tensor:
        model.kernels = KernelSettings(attention_kernel=kernel)
        model.layer_graphs.clear()
        if not capture:
            return generate(model, context, options=options, seed=3).latents
        recorder = FrameStatsCapture(model, range(SMALL_CUDA.num_layers), frame_seq_length=48)
        with recorder:
            return generate(model, context, options=options, seed=3, observers=[recorder]).latents

    flash = latents("flash4", False)
    assert torch.equal(latents("flash4", True), flash)
    assert torch.equal(latents("auto", False), flash)
    assert torch.equal(latents("cudnn", True), latents("cudnn", False))
