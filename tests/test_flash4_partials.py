"""The exact route's one pass (``sinkscope.stats.flash4_partials``: FlashAttention-4 with every key
frame's partials). Here: the merge of a key split's parts, in Triton's interpreter, against
torch; when the one pass applies. On a GPU with flash-attn-4 (``-m gpu``): the output is the
model's own call to the bit (plain, under the key split, with parts that start inside and at
a frame), every statistic matches the float64 brute force, and a captured generation is the
uncaptured one to the bit.
"""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
import torch
from test_stats import assert_matches, brute_force_statistics, make_inputs, run_in_interpreter

from sinkscope.attention import flash4, split
from sinkscope.attention.settings import KernelSettings
from sinkscope.stats.flash4_partials import one_pass_applies

_MERGE_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from sinkscope.stats.flash4_partials import merge_part_partials

    case = torch.load(sys.argv[1])
    out = torch.full((4, *case["partials"].shape[2:]), float("nan"))
    merge_part_partials(case["partials"], out, case["frame_ends"], case["part_length"])
    torch.save(out, sys.argv[2])
    """
)


def test_the_key_split_parts_merge_as_torch_merges_them(tmp_path):
    """Parts of 300 keys over frames of 240: a part reaches a frame where their keys meet;
    the entries of the others are never written (NaN here) and must not be read."""
    parts, heads, frames, num_q, part_length = 4, 2, 5, 37, 300
    ends = torch.tensor([240, 480, 720, 960, 1200], dtype=torch.int32)
    g = torch.Generator().manual_seed(0)
    m, g_ref, exp_sum, w = (torch.randn(parts, heads, frames, num_q, generator=g) for _ in range(4))
    exp_sum = exp_sum.abs()
    starts = torch.cat([torch.zeros(1, dtype=torch.int32), ends[:-1]])
    part = torch.arange(parts)[:, None]
    reaches = (starts[None] < (part + 1) * part_length) & (ends[None] > part * part_length)  # [parts, F]
    reach = reaches[:, None, :, None]
    partials = torch.where(reach, torch.stack([m, 3 * g_ref, exp_sum, w]), torch.nan)
    out = run_in_interpreter(_MERGE_SCRIPT, dict(partials=partials, frame_ends=ends, part_length=part_length), tmp_path)
    reference = torch.where(reach, 3 * g_ref, -torch.inf).amax(0)
    weight = torch.where(reach, torch.exp2(3 * g_ref - reference), 0.0)
    expected = [
        torch.where(reach, m, -torch.inf).amax(0),
        reference,
        (torch.where(reach, exp_sum, 0.0) * weight).sum(0),
        (torch.where(reach, w, 0.0) * weight).sum(0),
    ]
    for got, want in zip(out, expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_the_one_pass_is_for_cuda_calls_that_need_the_scores(monkeypatch):
    """Each condition alone keeps the one pass off: a CPU call, logit_mean alone (cheaper by
    factorization), the torch backend, a model call that is not FlashAttention-4's, a call the
    kernel does not fit."""
    from types import SimpleNamespace

    from sinkscope.stats import flash4_partials

    cpu = torch.randn(2, 256, 128, dtype=torch.bfloat16)
    assert not one_pass_applies(cpu, cpu, cpu, [128, 128], ["prob_mass"], "auto")
    cuda = SimpleNamespace(is_cuda=True)  # the rest decided by the two checks below
    runs_flash4, fits = [True], [True]
    monkeypatch.setattr(flash4_partials, "uses_flash4", lambda *args: runs_flash4[0])
    monkeypatch.setattr(flash4_partials, "flash4_partials_fit", lambda *args: fits[0])
    assert one_pass_applies(cuda, cuda, cuda, [128, 128], ["prob_mass"], "auto")
    assert not one_pass_applies(cuda, cuda, cuda, [128, 128], ["logit_mean"], "auto")
    assert not one_pass_applies(cuda, cuda, cuda, [128, 128], ["entropy"], "auto", backend="torch")
    runs_flash4[0] = False
    assert not one_pass_applies(cuda, cuda, cuda, [128, 128], ["entropy"], "cudnn")
    runs_flash4[0], fits[0] = True, False
    assert not one_pass_applies(cuda, cuda, cuda, [96, 128], ["entropy"], "auto")


def needs_flash4_gpu(test):
    for mark in (
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        pytest.mark.skipif(flash4.flash4_forward() is None, reason="needs flash-attn-4"),
    ):
        test = mark(test)
    return test


def _call(key_lengths, *, heads=2, fsl=160, num_q=2, seed=0):
    """bf16 q, k, v [H, L, D] as views of [1, L, H, D] tensors, as the capture passes them."""
    q, k = make_inputs(seed, heads, fsl, 128, num_q, key_lengths, torch.float32, sharp=2.0)
    v = torch.randn(k.shape, generator=torch.Generator().manual_seed(seed + 1))
    return [x.transpose(0, 1).contiguous().cuda().bfloat16().transpose(0, 1) for x in (q, k, v)]


@pytest.mark.parametrize(
    "key_lengths, plan",
    [
        ([160] * 8, split.KeySplit(0, 1, 0.0)),  # one call
        ([160] * 8, split.KeySplit(128, 4, 0.0)),  # parts of 320: each starts at a frame
        ([160] * 8, split.KeySplit(0, 5, 0.0)),  # parts of 256: starting inside frames
        ([200, 128, 160, 290, 182], split.KeySplit(192, 3, 0.0)),  # frames of several lengths
    ],
)
@needs_flash4_gpu
def test_the_output_is_the_model_calls_and_every_statistic_matches_float64(monkeypatch, key_lengths, plan):
    from sinkscope.stats import flash4_partials

    fsl, num_q = 160, 2
    q, k, v = _call(key_lengths, fsl=fsl, num_q=num_q)
    monkeypatch.setattr(flash4_partials, "key_split", lambda *_args: plan)
    assert one_pass_applies(q, k, v, key_lengths, ["prob_mass"], "auto")
    scale = 128**-0.5
    out, partials = flash4_partials.flash4_attention_partials(q, k, v, key_lengths, scale)
    model_out, _ = split.planned_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), plan, kernel="flash4")
    assert torch.equal(out, model_out[0])
    statistics = flash4_partials.statistics_from_partials
    stats = statistics(q, k, partials, fsl, num_q, key_lengths, scale, token_profiles=True)
    # The scores are fp32 sums of bf16 products (the float64 reference sums the same bf16
    # values exactly): a query whose two top keys are that close may change its argmax frame.
    reference = brute_force_statistics(q.float(), k.float(), fsl, num_q, key_lengths, scale)
    assert_matches(stats, reference, atol=2e-6, share_atol=1 / fsl + 1e-6)


@needs_flash4_gpu
def test_without_entropy_the_other_partials_and_the_output_are_the_same():
    from sinkscope.stats import flash4_partials

    key_lengths = [200, 128, 160, 290, 182]
    q, k, v = _call(key_lengths)
    scale = 128**-0.5
    out, partials = flash4_partials.flash4_attention_partials(q, k, v, key_lengths, scale)
    out_less, partials_less = flash4_partials.flash4_attention_partials(q, k, v, key_lengths, scale, entropy=False)
    assert torch.equal(out_less, out)
    for kept, full in zip(partials_less[:3], partials[:3]):  # m, g, l
        assert torch.equal(kept, full)
    assert not partials_less[3].any()  # w


# frames of 128 tokens (16 x 32 latents), head size 128: the one pass takes every call.
@needs_flash4_gpu
def test_a_generation_captured_in_one_pass_is_the_uncaptured_one():
    from test_layer_graphs import SMALL_CUDA

    from sinkscope.generation.capture import FrameStatsCapture
    from sinkscope.generation.sampler import generate
    from sinkscope.model import build_model
    from sinkscope.options import GenerationOptions

    config = dataclasses.replace(SMALL_CUDA, latent_height=16, latent_width=32)
    options = GenerationOptions.from_config({"num_frames": 9})
    context = torch.randn(1, 12, config.text_dim, generator=torch.Generator().manual_seed(2))
    model = build_model(config, seed=7, dtype=torch.bfloat16, device="cuda")
    model.kernels = KernelSettings(attention_kernel="flash4")
    uncaptured = generate(model, context, options=options, seed=3).latents
    model.layer_graphs.clear()
    recorder = FrameStatsCapture(model, range(config.num_layers), frame_seq_length=128)
    with recorder:
        captured = generate(model, context, options=options, seed=3, observers=[recorder]).latents
    assert recorder.one_pass_calls > 0 and recorder.video_exact
    assert torch.equal(captured, uncaptured)


def test_fused_and_exact_take_the_one_pass_where_it_applies(monkeypatch):
    """Where the one pass applies (on a Hopper GPU; here made to, with CPU stand-ins of its
    two functions: the model's own call and the statistics after it), both routes take it:
    the Triton kernel is never asked for and the video stays the uncaptured one."""
    from test_capture import _small_video

    import sinkscope.generation.capture as capture_module
    from sinkscope.attention.split import cached_attention
    from sinkscope.stats.attention import attention_statistics

    asked_entropy = []

    def one_pass(q, k, v, key_lengths, scale, *, split=True, entropy=True):
        asked_entropy.append(entropy)
        out, _ = cached_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), split=split)
        return out[0], tuple(torch.zeros(q.shape[0], q.shape[1], len(key_lengths)) for _ in range(4))

    def statistics(q, k, partials, fsl, num_q, key_lengths, scale, *, token_profiles=False):
        assert all(x.shape[1] == q.shape[1] for x in partials)  # the part's rows of the partials
        frames = list(range(len(key_lengths)))
        return attention_statistics(
            q,
            k,
            frame_seq_length=fsl,
            query_frames=list(range(num_q)),
            key_frames=frames,
            key_lengths=key_lengths,
            token_profiles=token_profiles,
        )

    monkeypatch.setattr(capture_module, "one_pass_applies", lambda *args: True)
    monkeypatch.setattr(capture_module, "flash4_attention_partials", one_pass)
    monkeypatch.setattr(capture_module, "statistics_from_partials", statistics)
    monkeypatch.setattr(capture_module, "fused_route_applies", lambda *args: pytest.fail("the Triton kernel was asked"))
    plain = _small_video(torch.float32, "global")[0]
    for fused in (False, True):
        captured, capture = _small_video(torch.float32, "global", (0, 2), fused=fused)
        assert captured == plain and capture.video_exact and capture.fused_calls == 0
        assert capture.one_pass_calls == len(capture.records) > 0  # one record a call here
    assert set(asked_entropy) == {True}
    # A study without entropy: the kernel keeps no sum of p t.
    asked_entropy.clear()
    _small_video(torch.float32, "global", (0, 2), statistics=("prob_mass", "argmax_share"))
    assert asked_entropy and set(asked_entropy) == {False}
