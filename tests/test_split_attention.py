"""Key-split attention (sinkscope.attention.split): the wave plan, the exact merge, the model's use."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from sinkscope.attention import split as split_attention
from sinkscope.attention.split import (
    KeySplit,
    balanced_attention,
    cached_attention,
    key_split,
    merge_parts,
    plan_key_split,
    planned_attention,
    split_key_attention,
)


def brute_force(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 softmax attention of [B, L, H, D] tensors: (output [B, Lq, H, D], lse [B, H, Lq])."""
    scores = torch.einsum("blhd,bkhd->bhlk", q.double(), k.double()) * q.shape[-1] ** -0.5
    out = torch.einsum("bhlk,bkhd->blhd", torch.softmax(scores, -1), v.double())
    return out, torch.logsumexp(scores, -1)


def inputs(batch=2, num_q=37, num_k=60, heads=3, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, n, heads, dim, generator=g) * s for n, s in ((num_q, 2.0), (num_k, 2.0), (num_k, 1.0))]


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 6])
def test_split_key_attention_matches_the_brute_force(parts):
    q, k, v = inputs()
    out, lse = split_key_attention(q, k, v, parts)
    ref_out, ref_lse = brute_force(q, k, v)
    assert out.shape == q.shape and lse.shape == (2, 3, 37)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-6, rtol=1e-6)


@pytest.mark.parametrize("parts", [1, 3])
def test_split_parts_with_a_bias_per_head_and_parts_of_other_keys_merge_as_one_softmax(parts):
    """An edited call's pieces (attention.biased): the key-split parts with a bias added to
    each head's scores (-inf: none of its keys), and ``extra`` parts over other keys (here
    with their own bias already in their log-sum-exp), merged as one softmax over all."""
    q, k, v = inputs(num_k=60)
    extra_k, extra_v = inputs(num_k=12, seed=1)[1:]
    head_bias = torch.tensor([-1.5, 0.0, -math.inf])
    extra_bias = torch.tensor([0.0, 2.0, 0.5])
    extra_out, extra_lse = split_key_attention(q, extra_k, extra_v, 1)
    extra = (extra_out.transpose(1, 2), extra_lse + extra_bias[None, :, None])
    out, lse = split_key_attention(q, k, v, parts, part_bias=head_bias, extra=extra)
    # The brute force: one softmax over both key sets, each head's scores shifted.
    scores = torch.einsum("blhd,bkhd->bhlk", q.double(), torch.cat((k, extra_k), 1).double()) * 0.25
    scores[..., :60] += head_bias.double()[None, :, None, None]
    scores[..., 60:] += extra_bias.double()[None, :, None, None]
    ref_out = torch.einsum("bhlk,bkhd->blhd", torch.softmax(scores, -1), torch.cat((v, extra_v), 1).double())
    torch.testing.assert_close(out.double(), ref_out, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), atol=2e-6, rtol=1e-6)


def test_a_split_that_does_not_divide_the_keys_is_refused():
    q, k, v = inputs(num_k=61)
    with pytest.raises(ValueError, match="61 keys do not split into 2 equal parts"):
        split_key_attention(q, k, v, 2)


@pytest.mark.parametrize(
    "plan", [KeySplit(16, 2, 0.0), KeySplit(32, 3, 0.0), KeySplit(36, 6, 0.0), KeySplit(0, 4, 0.0)]
)
def test_a_head_in_one_call_and_a_split_tail_match_the_brute_force(plan):
    q, k, v = inputs()
    out, lse = planned_attention(q, k, v, plan)
    ref_out, ref_lse = brute_force(q, k, v)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-6, rtol=1e-6)


def test_the_plan_fills_the_waves_of_the_last_block():
    # 12 heads x ceil(4680 / 128) = 444 programs on 132 SMs: 4 waves, 3.4 of them used.
    assert split_attention.wave_cost(444, 132) == 4
    # 33 query tiles (4224 queries) fill 3 waves; the other 456 queries run over 8 key parts.
    last_block = plan_key_split(1, 12, 4680, 32760, 132)
    assert (last_block.head, last_block.parts) == (4224, 8)
    assert 3.375 < last_block.waves < 3.5
    assert plan_key_split(1, 12, 4224, 32760, 132).plain  # 396 programs: 3 full waves already
    assert plan_key_split(1, 12, 4680, 4680, 132).plain  # short keys: the launches cost more than the wave saves
    assert plan_key_split(1, 12, 4680, 32749, 132).plain  # a prime key count has no equal parts
    # Every plan is within MIN_GAIN of the best of the options it weighs, and no worse than one call.
    for num_q in range(128, 9000, 97):
        plan = plan_key_split(1, 12, num_q, 32760, 132)
        assert plan.waves <= split_attention.wave_cost(12 * -(-num_q // 128), 132)
        if not plan.plain:
            assert plan.head % 128 == 0 and 0 <= plan.head < num_q and 32760 % plan.parts == 0


def test_the_cpu_and_float32_never_split():
    q, k, v = inputs(batch=1, num_q=4680, num_k=32760, heads=1, dim=8)
    assert key_split(q, k).plain
    torch.testing.assert_close(
        balanced_attention(q, k, v),
        F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2),
    )


def test_capture_kernels_name_the_split_and_the_gelu_epilogue():
    from sinkscope.attention.settings import KernelSettings

    assert KernelSettings.named("fast") == KernelSettings(key_split=True, fused_gelu=True, fused_norms=True)
    assert KernelSettings.named("reference") == KernelSettings(key_split=False, fused_gelu=False, fused_norms=False)
    assert [KernelSettings.named(name).name for name in ("fast", "reference")] == ["fast", "reference"]
    assert KernelSettings(key_split=True, fused_gelu=False).name == "custom"
    with pytest.raises(ValueError, match="capture.kernels 'quick' is not one of fast, reference"):
        KernelSettings.named("quick")


def test_the_split_is_an_argument_and_the_cpu_call_is_sdpa_without_lse():
    q, k, v = inputs(batch=1)
    sdpa = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    for split in (True, False):
        out, lse = cached_attention(q, k, v, split=split)
        assert lse is None and torch.equal(out, sdpa) and torch.equal(balanced_attention(q, k, v, split=split), sdpa)
    assert not hasattr(split_attention, "_ENABLED") and not hasattr(split_attention, "enable_key_split")


def test_merge_parts_by_torch_equals_one_call():
    q, k, v = inputs(num_k=48)
    parts = 4
    queries = q.unsqueeze(1).expand(2, parts, *q.shape[1:]).reshape(2 * parts, *q.shape[1:]).transpose(1, 2)
    keys, values = (x.reshape(2 * parts, 12, 3, 16).transpose(1, 2) for x in (k, v))
    out, lse = split_attention.attention_with_lse(queries, keys, values, 0.25)
    merged, total = merge_parts(out, lse, 2, parts)
    ref_out, ref_lse = brute_force(q, k, v)
    torch.testing.assert_close(merged.double(), ref_out, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(total.double(), ref_lse, atol=2e-6, rtol=1e-6)


_MERGE_SCRIPT = textwrap.dedent(
    """
    import json, torch
    from sinkscope.attention.merge_kernel import merge_parts_cuda
    from sinkscope.attention.split import attention_with_lse, merge_parts
    results = []
    for batch, parts, heads, num_q, dim in ((2, 3, 3, 37, 16), (1, 2, 2, 70, 24)):
        g = torch.Generator().manual_seed(parts)
        out = torch.randn(batch * parts, num_q, heads, dim, generator=g).transpose(1, 2)  # cuDNN's strides
        lse = torch.randn(batch * parts, heads, num_q, generator=g) * 3
        merged, total = merge_parts_cuda(out, lse, batch, parts)
        ref, ref_total = merge_parts(out, lse, batch, parts)
        results.append([(merged - ref).abs().max().item(), (total - ref_total).abs().max().item(), list(merged.shape)])
        # Parts of a second tensor (an edited call's biased frames): as if stacked with the first's.
        extra = (
            torch.randn(batch * 2, num_q, heads, dim, generator=g).transpose(1, 2),
            torch.randn(batch * 2, heads, num_q, generator=g),
        )
        merged, total = merge_parts_cuda(out, lse, batch, parts, extra=extra)
        stacked = [torch.cat((a.reshape(batch, -1, *a.shape[1:]), b.reshape(batch, -1, *b.shape[1:])), 1).flatten(0, 1)
                   for a, b in ((out, extra[0]), (lse, extra[1]))]
        ref, ref_total = merge_parts(stacked[0], stacked[1], batch, parts + 2)
        results.append([(merged - ref).abs().max().item(), (total - ref_total).abs().max().item(), list(merged.shape)])
    print(json.dumps(results))
    """
)


def test_the_merge_kernel_in_tritons_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _MERGE_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    for out_diff, lse_diff, _shape in results:
        assert out_diff < 1e-5 and lse_diff < 1e-5
    assert results[-1][2] == [1, 70, 2, 24]  # the last case's merged shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_split_attention_on_cuda_is_sdpa_within_bf16_rounding():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, n, 12, 128, device="cuda", generator=g).bfloat16() for n in (4680, 32760, 32760))
    out, lse = planned_attention(q, k, v, key_split(q, k))
    ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    ref_out, ref_lse = brute_force(q[:, :256], k, v)
    torch.testing.assert_close(out[:, :256].double(), ref_out, atol=4e-3, rtol=1e-2)
    torch.testing.assert_close(lse[..., :256].double(), ref_lse, atol=1e-4, rtol=1e-5)
    assert (out.float() - ref.float()).abs().max().item() < 4e-3
    # The uncaptured call's plan, and cuDNN's attention with its log-sum-exp as SDPA runs it
    # (FlashAttention-4's, the default where installed, is tests/test_flash4.py's).
    assert torch.equal(out, balanced_attention(q, k, v))
    for queries in (q, q[:, :4224]):  # split, and one plain call
        plain_out, plain_lse = cached_attention(queries, k, v, split=False, kernel="cudnn")
        sdpa = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (queries, k, v))).transpose(1, 2)
        assert plain_lse is not None and torch.equal(plain_out, sdpa)


def test_a_plan_without_the_log_sum_exp_gives_the_same_output():
    q, k, v = inputs()
    for plan in (KeySplit(16, 2, 0.0), KeySplit(0, 3, 0.0)):
        out, lse = planned_attention(q, k, v, plan, lse=False)
        assert lse is None
        torch.testing.assert_close(out, planned_attention(q, k, v, plan)[0], rtol=0, atol=0)
