"""The fused norm / modulation / RoPE kernels of a Wan block (``sinkscope.model.block_kernels``)
against the float64 composition of the model's own modules: their logic in Triton's CPU
interpreter (float32 and fp16, here and in CI), at bf16 on a GPU (``-m gpu``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from sinkscope.attention.settings import KernelSettings
from sinkscope.model.wan import apply_rope


def reference_modulated_norm(x, shift, scale, eps):
    frames = shift.shape[1]
    normed = F.layer_norm(x.double(), (x.shape[-1],), eps=eps).unflatten(1, (frames, -1))
    return (normed * (1 + scale.double()[:, :, None]) + shift.double()[:, :, None]).flatten(1, 2)


def reference_residual(x, y, gate):
    if gate is None:
        return x.double() + y.double()
    frames = gate.shape[1]
    return x.double() + (y.double().unflatten(1, (frames, -1)) * gate.double()[:, :, None]).flatten(1, 2)


def reference_qk_norm_rope(x, weight, rope, heads):
    normed = F.rms_norm(x.double(), (x.shape[-1],), eps=1e-6) * weight.double()
    if rope is None:
        return normed
    return apply_rope(normed.unflatten(-1, (heads, -1)), rope.double()).flatten(-2)


def kernel_cases(device: str, dtype: torch.dtype) -> list[dict]:
    """Each function on a few shapes (a width that is no power of two, several frames, a batch
    of two, the gate's strides as the model's modulation views have them): the max |difference|
    against the float64 reference and the largest reference value."""
    from sinkscope.model.block_kernels import gated_residual, modulated_norm, qk_norm_rope, residual_norm
    from sinkscope.model.wan import RotaryTables

    results = []
    g = torch.Generator(device=device).manual_seed(0)
    for batch, frames, tokens_per_frame, dim, heads in ((1, 3, 8, 48, 4), (2, 2, 6, 96, 2), (1, 1, 5, 256, 2)):
        tokens = frames * tokens_per_frame

        def draw(*shape, spread=1.0):
            return (torch.randn(*shape, device=device, generator=g) * spread).to(dtype)

        x, y = draw(batch, tokens, dim, spread=3.0), draw(batch, tokens, dim)
        modulation = draw(batch, frames, 6, dim, spread=0.3)  # the model's [B, F, 6, dim]
        shift, scale, gate = modulation[:, :, 0], modulation[:, :, 1], modulation[:, :, 2]
        weight, bias = 1 + draw(dim, spread=0.1), draw(dim, spread=0.1)
        rope = RotaryTables(dim // heads).phases(2, frames, 1, tokens_per_frame, device, torch.float32)

        def gap(name, got, want, dim=dim):
            results.append(
                {
                    "case": name,
                    "dim": dim,
                    "max_diff": (got.double() - want).abs().max().item(),
                    "scale": want.abs().max().item(),
                }
            )

        gap("modulated_norm", modulated_norm(x, shift, scale, 1e-6), reference_modulated_norm(x, shift, scale, 1e-6))
        summed, normed = residual_norm(x, y, gate, affine=(weight, bias), eps=1e-6)
        stored = summed
        gap("residual_gated", summed, reference_residual(x, y, gate))
        want = F.layer_norm(stored.double(), (dim,), weight.double(), bias.double(), eps=1e-6)
        gap("residual_norm_affine", normed, want)
        summed, normed = residual_norm(x, y, modulation=(shift, scale), eps=1e-6)
        gap("residual_plain", summed, reference_residual(x, y, None))
        gap("residual_norm_modulated", normed, reference_modulated_norm(summed, shift, scale, 1e-6))
        gap("gated_residual", gated_residual(x, y, gate), reference_residual(x, y, gate))
        gap("qk_norm_rope", qk_norm_rope(x, weight, rope, heads, 1e-6), reference_qk_norm_rope(x, weight, rope, heads))
        gap("qk_norm", qk_norm_rope(x, weight, None, heads, 1e-6), reference_qk_norm_rope(x, weight, None, heads))
    return results


_INTERPRETER_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    sys.path.insert(0, {tests!r})
    import sinkscope.model.wan as wan
    from test_block_kernels import SMALL_BLOCK, block_accuracy, block_outputs, kernel_cases
    kernels, block = kernel_cases("cpu", torch.float32), block_outputs()
    wan.fused_norms_apply = lambda tensor, fused: fused  # the CUDA-only kernels, here in the interpreter
    # fp16, not bf16: the interpreter truncates to bf16 where the GPU rounds to nearest.
    half = dict(batch=2, dtype=torch.float16)
    accuracy = [block_accuracy("cpu", SMALL_BLOCK, 3, 12, rope_k=rope_k, **half) for rope_k in (True, False)]
    print(json.dumps({{"kernels": kernels, "block": block, "accuracy": accuracy}}))
    """
)


# A block small enough for Triton's interpreter: two heads of 48, a width that is no power of two.
SMALL_BLOCK = dict(dim=96, ffn_dim=128, num_heads=2, num_layers=1, text_dim=16, text_len=8, freq_dim=16)


def block_accuracy(
    device,
    config: dict | str,
    frames: int,
    tokens_per_frame: int,
    *,
    batch: int = 1,
    rope_k: bool = True,
    dtype: torch.dtype = torch.bfloat16,
) -> dict:
    """A block's q, k, v and output from ``dtype`` weights and inputs, unfused and with the kernels,
    each against float64 (the same values through the unfused composition): per tensor the
    max and mean |error| of both, and the largest reference value. The kernels round once where
    the unfused code rounds after each step, so theirs should be no larger."""
    import copy

    from sinkscope.model import build_model, get_model_config
    from sinkscope.model.wan import init_random_weights

    config = get_model_config(config)
    model = build_model(config, seed=None, device=device, dtype=torch.float32)
    init_random_weights(model, seed=0, device=device)
    model = model.to(dtype)
    exact = copy.deepcopy(model).double()  # the same weights, exactly
    g = torch.Generator(device=device).manual_seed(1)

    def draw(*shape, spread=1.0):
        return (torch.randn(*shape, device=device, generator=g) * spread).to(dtype)

    tokens, heads = frames * tokens_per_frame, config.num_heads
    x, attn = draw(batch, tokens, config.dim, spread=2.0), draw(batch, tokens, config.dim)
    e0 = draw(batch, frames, 6, config.dim, spread=0.2)
    context = (draw(batch, heads, 16, config.head_dim), draw(batch, heads, 16, config.head_dim))
    rope = {
        dtype: model.rope.phases(2, frames, 1, tokens_per_frame, device, dtype)
        for dtype in (torch.float32, torch.float64)
    }
    block, reference_block = model.blocks[0], exact.blocks[0]
    with torch.no_grad():
        wide = (x.double(), e0.double())
        reference = (
            *reference_block.attention_inputs(reference_block, *wide, rope[torch.float64], rope_k, False),
            reference_block.attention_outputs(
                reference_block, x.double(), attn.double(), e0.double(), *(c.double() for c in context), False, False
            ),
        )
        runs = {
            fused: (
                *block.attention_inputs(block, x, e0, rope[torch.float32], rope_k, fused),
                block.attention_outputs(block, x, attn, e0, *context, False, fused),
            )
            for fused in (False, True)
        }
    results = {}
    for index, name in enumerate(("q", "k", "v", "out")):
        want = reference[index]
        errors = {fused: (runs[fused][index].double() - want).abs() for fused in (False, True)}
        results[name] = {
            "plain_max": errors[False].max().item(),
            "fused_max": errors[True].max().item(),
            "plain_mean": errors[False].mean().item(),
            "fused_mean": errors[True].mean().item(),
            "scale": want.abs().max().item(),
        }
    return results


def check_accuracy(results: dict) -> None:
    for name, r in results.items():
        assert r["fused_mean"] <= 1.1 * r["plain_mean"], (name, r)
        assert r["fused_max"] <= 1.5 * r["plain_max"], (name, r)


def block_outputs() -> dict:
    """A tiny model's KV-cache steps with the fused kernels (forced on, float32 on the CPU) and
    without: the max |difference| of the outputs, and of the keys each layer cached."""
    import sinkscope.model.wan as wan
    from sinkscope.model import WanConfig, build_model
    from sinkscope.model.policies import new_policy

    config = WanConfig(
        dim=48,
        ffn_dim=64,
        num_heads=4,
        num_layers=2,
        text_dim=16,
        text_len=8,
        freq_dim=16,
        latent_height=4,
        latent_width=6,
    )
    model = build_model(config, seed=3, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, config.in_dim, 4, 4, 6, generator=g)
    context = torch.randn(1, 5, config.text_dim, generator=g)
    runs = {}
    wan.fused_norms_apply = lambda tensor, fused: fused  # the CUDA-only kernels, here in the interpreter
    for fused in (False, True):
        model.kernels = KernelSettings(key_split=False, fused_gelu=False, fused_norms=fused)
        policy = new_policy(model, "global", frame_seq_length=6, num_frames=4, local_attn_frames=-1, sink_frames=0)
        with torch.no_grad():
            outs = [model(x[:, :, s : s + 2], 500.0, context, cache_policy=policy, start_frame=s) for s in (0, 2)]
        runs[fused] = (torch.cat(outs, 2), policy.cache.k[0][:, :24].clone())
    return {
        "output_diff": (runs[True][0] - runs[False][0]).abs().max().item(),
        "output_scale": runs[False][0].abs().max().item(),
        "keys_diff": (runs[True][1] - runs[False][1]).abs().max().item(),
    }


def test_the_block_kernels_in_tritons_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = _INTERPRETER_SCRIPT.format(tests=os.path.dirname(__file__))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    cases = {(r["case"], r["dim"]) for r in results["kernels"]}
    assert len(cases) == 24
    for result in results["kernels"]:  # float32 arithmetic against float64
        assert result["max_diff"] <= 2e-5 * max(1.0, result["scale"]), result
    block = results["block"]
    assert block["output_diff"] < 1e-4 * max(1.0, block["output_scale"]), block
    assert block["keys_diff"] < 1e-4, block
    for accuracy in results["accuracy"]:  # fp16, a batch of two, k with and without RoPE
        check_accuracy(accuracy)


def test_the_block_kernels_run_on_cuda_in_half_precision_eager_inference_only(monkeypatch):
    from types import SimpleNamespace

    from sinkscope.model.wan import fused_norms_apply

    assert not fused_norms_apply(torch.zeros(2, 3, dtype=torch.bfloat16), True)  # the CPU
    cuda = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)  # what the function reads of a tensor
    assert not fused_norms_apply(cuda, False)
    assert not fused_norms_apply(SimpleNamespace(is_cuda=True, dtype=torch.float32), True)
    assert not fused_norms_apply(cuda, True)  # gradients on: the kernels have no backward
    with torch.no_grad():
        assert fused_norms_apply(cuda, True) and fused_norms_apply(
            SimpleNamespace(is_cuda=True, dtype=torch.float16), True
        )
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        assert not fused_norms_apply(cuda, True)  # a compiled block keeps Inductor's fusion
    assert KernelSettings.named("reference").fused_norms is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_block_kernels_on_cuda_are_the_composition_within_bf16_rounding():
    for result in kernel_cases("cuda", torch.bfloat16):
        # One bf16 rounding of the output (2^-8 relative), where eager rounds after each step.
        assert result["max_diff"] <= 2**-7 * max(1.0, result["scale"]), result


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_size_block_with_the_kernels_is_closer_to_float64_than_without():
    from sinkscope.model import get_model_config

    one_layer = {**get_model_config("wan2.1-t2v-1.3b").to_dict(), "num_layers": 1}
    for rope_k in (True, False):
        check_accuracy(block_accuracy("cuda", one_layer, 3, 1560, rope_k=rope_k))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_blocks_keep_inductors_fusion():
    """A compiled block launches none of the kernels (``fused_norms_apply`` is False while
    compiling) and gives the unfused block's q, k, v and output within bf16 rounding."""
    from sinkscope.model import WanConfig, build_model
    from sinkscope.model.wan import WanAttentionBlock

    config = WanConfig(dim=256, ffn_dim=512, num_heads=2, num_layers=1, text_dim=64, text_len=16, freq_dim=64)
    model = build_model(config, seed=0, device="cuda", dtype=torch.bfloat16)
    block = model.blocks[0]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, 3 * 40, config.dim, device="cuda", generator=g).bfloat16()
    e0 = (torch.randn(1, 3, 6, config.dim, device="cuda", generator=g) * 0.1).bfloat16()
    attn = torch.randn(1, 3 * 40, config.dim, device="cuda", generator=g).bfloat16()
    rope = model.rope.phases(0, 3, 5, 8, "cuda", torch.float32)
    context = model.context_kv(torch.randn(1, 8, config.text_dim, device="cuda", generator=g))[0]
    before = torch.compile(WanAttentionBlock.attention_inputs, dynamic=False)
    after = torch.compile(WanAttentionBlock.attention_outputs, dynamic=False)
    with torch.no_grad():
        plain = (
            *block.attention_inputs(block, x, e0, rope, True, False),
            block.attention_outputs(block, x, attn, e0, *context),
        )
        before(block, x, e0, rope, True, True), after(block, x, attn, e0, *context, True, True)  # compiled here
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            compiled = (*before(block, x, e0, rope, True, True), after(block, x, attn, e0, *context, True, True))
            torch.cuda.synchronize()
    assert not {"residual_norm_kernel", "qk_norm_rope_kernel"} & {event.name for event in profile.events()}
    for want, got in zip(plain, compiled):
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=2**-6 * want.float().abs().max().item())
