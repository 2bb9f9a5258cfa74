"""Edited attention (``mask_keys``, ``logit_bias``: a bias per head and key frame, -inf masking
it) and the statistics of the edited softmax, against a float64 brute force (the dense
scores plus the bias, softmax, weighted sum): ``attention.biased.edited_attention`` on the
CPU, the torch reference and the Triton kernels (in Triton's CPU interpreter) of the
statistics; on CUDA in bf16 under ``-m gpu``."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from test_stats import FIELDS, assert_matches, brute_force_statistics, run_in_interpreter

from sinkscope.attention.biased import (
    KeySegment,
    bias_plan,
    bias_rows,
    edit_plan,
    edited_attention,
    log_sum_exp,
    remember_rows,
)
from sinkscope.attention.split import cached_attention
from sinkscope.stats.attention import (
    CallStatistics,
    attention_statistics,
    attention_with_statistics,
    triton_available,
)

NEG = -math.inf


def brute_attention(q, k, v, frame_bias, key_lengths):
    """(output [B, Lq, H, D], lse [B, H, Lq]) in float64 from the dense edited scores."""
    bias = frame_bias.double().cpu().repeat_interleave(torch.tensor(key_lengths), dim=1)  # [H, Lk]
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double().cpu(), k.double().cpu()) / math.sqrt(q.shape[-1])
    scores = scores + bias[None, :, None, :]
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v.double().cpu())
    return out, torch.logsumexp(scores, dim=-1)


def brute_statistics(q, k, fsl, num_q, key_lengths, frame_bias):
    """Every statistic of the edited softmax from the dense float64 scores of q, k [H, L, D]
    (logit_mean and token_logit_mean from the raw scores), and each query's edited lse."""
    scale = 1 / math.sqrt(q.shape[-1])
    bias = frame_bias.double().cpu().repeat_interleave(torch.tensor(key_lengths), dim=1)[:, None, :]
    scores = torch.einsum("hqd,hkd->hqk", q.double().cpu(), k.double().cpu()) * scale + bias
    return brute_force_statistics(q, k, fsl, num_q, key_lengths, scale, frame_bias), torch.logsumexp(scores, dim=-1)


def make_call(seed, batch, heads, num_q, key_lengths, dim, dtype=torch.float64, sharp=1.5):
    """q [B, Lq, H, D], k, v [B, Lk, H, D] with per-frame offsets, so frames differ."""
    g = torch.Generator().manual_seed(seed)
    lk = sum(key_lengths)
    q = torch.randn(batch, num_q, heads, dim, generator=g) * sharp
    k = torch.randn(batch, lk, heads, dim, generator=g)
    k += torch.randn(batch, len(key_lengths), heads, dim, generator=g).repeat_interleave(
        torch.tensor(key_lengths), dim=1
    )
    v = torch.randn(batch, lk, heads, dim, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


# Rows of frame_bias: 0 untouched, finite added, -inf masked. Heads 1 and 4 share a row (one
# group of non-adjacent heads), head 3 has three bias values and a mask, head 5 every frame
# biased alike (one part: the output unchanged, the lse shifted).
MIXED_BIAS = [
    [0.0, 0.0, 0.0, 0.0, 0.0],
    [NEG, 0.0, 0.0, 0.0, 0.0],
    [2.5, 0.0, 0.0, 0.0, 0.0],
    [-3.0, NEG, 1.25, 0.0, -3.0],
    [NEG, 0.0, 0.0, 0.0, 0.0],
    [0.75, 0.75, 0.75, 0.75, 0.75],
]
CASES = {
    "masked": ([5, 5, 5], [[NEG, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    "positive bias": ([4, 4, 4, 4], [[3.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.0, 0.0]]),
    "negative bias": ([4, 4, 4, 4], [[0.0, -2.0, 0.0, -2.0], [0.0, 0.0, 0.0, 0.0]]),
    "mixed heads, unequal frames": ([6, 1, 9, 4, 7], MIXED_BIAS),
    "masked middle frames": ([3, 5, 2, 6], [[0.0, NEG, NEG, 0.0], [NEG, 0.0, NEG, 1.0], [0.0, 0.0, 0.0, 0.0]]),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_edited_attention_matches_the_dense_float64_softmax(case, dtype):
    lengths, rows = CASES[case]
    bias = torch.tensor(rows, dtype=torch.float32)
    q, k, v = make_call(len(case), 2, bias.shape[0], 11, lengths, 16, dtype)
    out, lse = edited_attention(q, k, v, bias, lengths)
    ref_out, ref_lse = brute_attention(q, k, v, bias, lengths)
    assert out.dtype == dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (2, bias.shape[0], 11)
    # float64 merges its parts in float32 (attention.split.merge_parts), float32 computes in it.
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=2e-6)


# Unedited heads (rows of 0) first, between edited heads, and apart from them.
PLAIN_LAYOUTS = {
    "first head": MIXED_BIAS,
    "between edited heads": [[0.0] * 5, MIXED_BIAS[1], [0.0] * 5, [0.0] * 5, MIXED_BIAS[3], [0.0] * 5],
    "apart": [[0.0] * 5, *[MIXED_BIAS[2]] * 4, [0.0] * 5],
}


@pytest.mark.parametrize("layout", PLAIN_LAYOUTS)
def test_unedited_heads_get_the_plain_softmax_and_no_edit_is_the_plain_call(layout):
    """Heads with an all-zero row get the unedited softmax (merged from the call's segments:
    within rounding of the plain call); an all-zero (or absent) bias is the plain call itself,
    bit for bit."""
    lengths = [6, 1, 9, 4, 7]
    bias = torch.tensor(PLAIN_LAYOUTS[layout])
    plain_heads = [h for h in range(6) if not bias[h].any()]
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float64, 1e-5)):
        q, k, v = make_call(3, 2, 6, 12, lengths, 16, dtype)
        plain, _ = cached_attention(q, k, v)
        out, lse = edited_attention(q, k, v, bias, lengths)
        torch.testing.assert_close(out[:, :, plain_heads], plain[:, :, plain_heads], rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(lse[:, plain_heads], log_sum_exp(q, k)[:, plain_heads], rtol=1e-5, atol=1e-5)
        if dtype == torch.float64:
            torch.testing.assert_close(out, brute_attention(q, k, v, bias, lengths)[0], rtol=1e-5, atol=2e-6)
        for zero in (torch.zeros(6, 5), None, torch.full((6, 5), -0.0)):
            out, lse = edited_attention(q, k, v, zero, lengths)
            assert torch.equal(out, plain)
            assert torch.equal(lse, log_sum_exp(q, k))


def test_a_bias_written_in_place_or_made_in_inference_mode_is_read_again():
    """The host copy of a bias is kept per tensor while the tensor is unwritten."""
    lengths = [4, 4, 4]
    q, k, v = make_call(5, 1, 2, 6, lengths, 8)
    bias = torch.zeros(2, 3)
    plain, _ = edited_attention(q, k, v, bias, lengths)
    bias[1, 0] = NEG
    out, _ = edited_attention(q, k, v, bias, lengths)
    torch.testing.assert_close(out, brute_attention(q, k, v, bias, lengths)[0], rtol=1e-5, atol=2e-6)
    assert not torch.equal(out, plain)
    with torch.inference_mode():
        frozen = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
        out, _ = edited_attention(q, k, v, frozen, lengths)
    torch.testing.assert_close(out, brute_attention(q, k, v, frozen, lengths)[0], rtol=1e-5, atol=2e-6)


def test_rows_handed_over_by_their_writer_are_not_read_from_the_tensor():
    """remember_rows (the generation's edits hand over the rows they wrote to the GPU): the
    plan comes from them, with no read of the tensor, until the tensor is written again."""
    tensor = torch.zeros(2, 3)
    remember_rows(tensor, [[-2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert bias_rows(tensor) == ((-2.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    assert bias_plan(tensor).segments[0].column == (-2.0, 0.0)
    tensor.add_(0.0)
    assert bias_rows(tensor) == ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="masks every key frame of head 1"):
        remember_rows(torch.zeros(2, 2), [[0.0, 0.0], [NEG, NEG]])
    with pytest.raises(ValueError, match="do not match"):
        remember_rows(torch.zeros(2, 2), [[0.0, 0.0]])


def test_the_plan_cuts_the_key_frames_where_a_heads_bias_changes():
    plan = edit_plan(tuple(tuple(row) for row in MIXED_BIAS))
    assert plan.edited
    # Columns (one value per head) of frames 0, 1, 2, 3, 4: each differs from the next.
    assert [(segment.start, segment.stop) for segment in plan.segments] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert plan.segments[0].column == (0.0, NEG, 2.5, -3.0, NEG, 0.75) and plan.segments[0].biased
    # Frame 0 biased in some heads: two segments, frame 0 and the rest; a frame masked in
    # every head is left out; no edit (or -0.0) is one unbiased segment.
    sink = ((-2.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0))
    assert edit_plan(sink).segments == (KeySegment(0, 1, (-2.0, 0.0)), KeySegment(1, 4, (0.0, 0.0)))
    assert edit_plan(((NEG, 0.0, 0.0), (NEG, 1.0, 1.0))).segments == (KeySegment(1, 3, (0.0, 1.0)),)
    plain = edit_plan(((0.0, -0.0), (0.0, 0.0)))
    assert not plain.edited and not plain.segments[0].biased and len(plain.segments) == 1


@pytest.mark.parametrize(
    "bias, message",
    [
        ([[NEG, NEG], [0.0, 0.0]], "masks every key frame of head 0"),
        ([[0.0, math.nan], [0.0, 0.0]], "NaN or \\+inf"),
        ([[0.0, 0.0], [math.inf, 0.0]], "NaN or \\+inf"),
        ([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], "not \\[2 heads, 2 key frames\\]"),
    ],
)
def test_bad_biases_are_named(bias, message):
    q, k, v = make_call(0, 1, 2, 4, [3, 3], 8)
    with pytest.raises(ValueError, match=message):
        edited_attention(q, k, v, torch.tensor(bias), [3, 3])
    with pytest.raises(ValueError, match=message):
        attention_statistics(
            q[0].transpose(0, 1),
            k[0].transpose(0, 1),
            frame_seq_length=4,
            query_frames=[2],
            key_frames=[0, 1],
            key_lengths=[3, 3],
            frame_bias=torch.tensor(bias),
        )


# -- statistics of the edited softmax ---------------------------------------------------------

# (frame_seq_length, query frames, key lengths, frame_bias rows): whole and partial frames.
STAT_CASES = {
    "mixed": (6, 2, [6, 1, 6, 4, 6], [[NEG, 0.0, 0.0, 0.0, 0.0], [2.0, -1.5, 0.0, 0.0, 0.0], [0.0] * 5]),
    "sink masked everywhere": (5, 1, [5, 5, 5, 5], [[NEG, 0.0, 0.0, 0.0]] * 3),
    "large biases": (4, 2, [4, 4, 3], [[8.0, 0.0, NEG], [-8.0, NEG, 0.0]]),
}


def stat_inputs(case, dtype=torch.float64):
    fsl, num_q, lengths, rows = STAT_CASES[case]
    bias = torch.tensor(rows, dtype=torch.float32)
    q, k, v = make_call(len(case), 1, bias.shape[0], num_q * fsl, lengths, 16, dtype)
    return fsl, num_q, lengths, bias, *(x[0].transpose(0, 1) for x in (q, k, v))  # [H, L, D]


def assert_statistics(stats, ref, *, atol=1e-6, share_atol=1e-6, profiles=True):
    """test_stats.assert_matches, every value finite."""
    for name in FIELDS:
        got = getattr(stats, name)
        assert got is None or torch.isfinite(got).all(), name
    assert_matches(stats, ref, token_profiles=profiles, atol=atol, share_atol=share_atol)


def assert_masked_frames_get_nothing(stats, bias):
    masked = torch.isneginf(bias.cpu())  # [H, nk]
    for name in ("prob_mass", "argmax_share"):
        values = getattr(stats, name).cpu().permute(0, 2, 1)[masked]  # every query frame of masked (h, kf)
        assert torch.equal(values, torch.zeros_like(values)), name
    torch.testing.assert_close(
        stats.prob_mass.double().sum(-1).cpu(),
        torch.ones(stats.prob_mass.shape[:2], dtype=torch.float64),
        rtol=0,
        atol=1e-5,
    )


@pytest.mark.parametrize("case", STAT_CASES)
def test_statistics_of_the_edited_softmax_match_float64_brute_force(case):
    fsl, num_q, lengths, bias, q, k, _ = stat_inputs(case)
    layout = dict(
        frame_seq_length=fsl,
        query_frames=list(range(4, 4 + num_q)),
        key_frames=list(range(len(lengths))),
        key_lengths=lengths,
        token_profiles=True,
    )
    stats = attention_statistics(q, k, backend="torch", frame_bias=bias, **layout)
    ref, _ = brute_statistics(q, k, fsl, num_q, lengths, bias)
    assert_statistics(stats, ref)
    assert_masked_frames_get_nothing(stats, bias)
    # The raw scores' statistics do not see the edit.
    plain = attention_statistics(q, k, backend="torch", **layout)
    assert torch.equal(stats.logit_mean, plain.logit_mean) and torch.equal(
        stats.token_logit_mean, plain.token_logit_mean
    )
    zero = attention_statistics(q, k, backend="torch", frame_bias=torch.zeros_like(bias), **layout)
    assert all(torch.equal(getattr(zero, name), getattr(plain, name)) for name in FIELDS)


def test_the_captured_edited_call_is_edited_attention_then_its_statistics():
    """attention_with_statistics with a frame_bias: the output of edited_attention, the
    statistics of the edited softmax (fused or not: an edited call takes the exact route)."""
    fsl, num_q, lengths, bias, q, k, v = stat_inputs("mixed", torch.float32)
    layout = dict(
        frame_seq_length=fsl, query_frames=[7, 8], key_frames=[0, 1, 2, 6, 7], key_lengths=lengths, token_profiles=True
    )
    expected, _ = edited_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), bias, lengths)
    for fused in (False, True):
        out, stats = attention_with_statistics(q, k, v, fused=fused, frame_bias=bias, **layout)
        assert torch.equal(out, expected[0])
        ref = attention_statistics(q, k, frame_bias=bias, **layout)
        assert all(torch.equal(getattr(stats, name), getattr(ref, name)) for name in FIELDS)
    assert_masked_frames_get_nothing(stats, bias)


# -- the Triton kernels in the CPU interpreter --------------------------------------------------

# TRITON_INTERPRET must be set before triton is imported: one subprocess runs every case.
_INTERPRETER_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from sinkscope.stats.launch import statistics_given_lse, statistics_triton
    cases, results = torch.load(sys.argv[1]), {}
    for name, case in cases.items():
        args = (case["q"], case["k"], case["fsl"], case["num_q"], case["key_lengths"], case["scale"])
        results[name] = {
            "given_lse": vars(statistics_given_lse(case["q"], case["k"], case["lse"], *args[2:], token_profiles=True,
                                                   frame_bias=case["bias"])),
            "partials": vars(statistics_triton(*args, token_profiles=True, frame_bias=case["bias"])),
            "unbiased": vars(statistics_given_lse(case["q"], case["k"], case["plain_lse"], *args[2:],
                                                  token_profiles=True)),
        }
        # The GPU's loop bounds (each segment's own length: masked frames skipped past the
        # first query block), where this interpreter can run them.
        try:
            results[name]["dynamic_bound"] = vars(statistics_given_lse(
                case["q"], case["k"], case["lse"], *args[2:], frame_bias=case["bias"],
                config={"LOOP_END": 0, "BLOCK_M": 4, "BLOCK_N": 16}))
        except Exception as error:
            results[name]["dynamic_bound"] = repr(error)
    torch.save(results, sys.argv[2])
    """
)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """Case -> (inputs, results) of the Triton kernels with a frame_bias, from one subprocess."""
    pytest.importorskip("triton")
    folder = tmp_path_factory.mktemp("edited_interpreter")
    cases = {}
    for case in STAT_CASES:
        fsl, num_q, lengths, bias, q, k, _ = stat_inputs(case, torch.float32)
        _, lse = brute_statistics(q, k, fsl, num_q, lengths, bias)
        plain_lse = torch.logsumexp(q.double() @ k.double().transpose(1, 2) / 4.0, dim=-1).float()
        cases[case] = dict(
            q=q,
            k=k,
            fsl=fsl,
            num_q=num_q,
            key_lengths=lengths,
            scale=0.25,
            bias=bias,
            lse=lse.float(),
            plain_lse=plain_lse,
        )
    results = run_in_interpreter(_INTERPRETER_SCRIPT, cases, folder)
    return {case: (cases[case], results[case]) for case in cases}


@pytest.mark.parametrize("case", STAT_CASES)
def test_triton_statistics_of_the_edited_softmax_in_the_interpreter(interpreted, case):
    """frame_partials_given_lse_kernel and token_profiles_kernel with HAS_BIAS, and the
    combine of frame_softmax_partials_kernel's partials with a bias; without a bias the
    given-lse pass is unchanged."""
    inputs, out = interpreted[case]
    ref, _ = brute_statistics(
        inputs["q"], inputs["k"], inputs["fsl"], inputs["num_q"], inputs["key_lengths"], inputs["bias"]
    )
    for route in ("given_lse", "partials"):
        stats = CallStatistics(**out[route])
        assert_statistics(stats, ref)
        assert_masked_frames_get_nothing(stats, inputs["bias"])
    plain, _ = brute_statistics(
        inputs["q"],
        inputs["k"],
        inputs["fsl"],
        inputs["num_q"],
        inputs["key_lengths"],
        torch.zeros_like(inputs["bias"]),
    )
    assert_statistics(CallStatistics(**out["unbiased"]), plain)
    dynamic = out["dynamic_bound"]
    if isinstance(dynamic, str):
        if "0-dimensional" in dynamic:
            pytest.skip(f"this Triton's interpreter cannot bound a loop by a loaded value: {dynamic}")
        raise AssertionError(dynamic)
    assert_statistics(CallStatistics(**dynamic), ref, profiles=False)
    assert_masked_frames_get_nothing(CallStatistics(**dynamic), inputs["bias"])


# -- CUDA ---------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not triton_available(), reason="needs a CUDA device and triton")


def wan_bias(heads, num_k):
    """A mixed edit at Wan2.1's sizes: head 0 plain, 1 masks the sink, 2 biases it, 3 masks
    the sink and biases the next frame, the rest as head 1 (one group of several heads)."""
    bias = torch.zeros(heads, num_k)
    bias[1:, 0] = NEG
    bias[2, 0] = 2.0
    bias[3, 1] = -1.5
    return bias


def inner_bias(heads, num_k):
    """Heads 1 and 4 mask the sink (a class: selection in one layer)."""
    bias = torch.zeros(heads, num_k)
    bias[[1, 4], 0] = NEG
    return bias


def sink_bias(heads, num_k):
    """Every head's frame 0 biased by -2 (logit_bias on the sink): one segment merged into
    the rest's key-split parts."""
    bias = torch.zeros(heads, num_k)
    bias[:, 0] = -2.0
    return bias


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("make_bias", [wan_bias, inner_bias, sink_bias], ids=["mixed", "inner heads", "sink biased"])
@pytest.mark.parametrize("split", [True, False], ids=["key split", "one call"])
@pytest.mark.parametrize("lengths", [[1560] * 6, [1560, 1560, 611, 1560, 1560, 1560]], ids=["whole", "partial"])
def test_cuda_edited_attention_in_bf16(lengths, split, make_bias):
    heads, num_q = 6, 3 * 1560
    q, k, v = (x.cuda() for x in make_call(1, 1, heads, num_q, lengths, 128, torch.bfloat16))
    bias = make_bias(heads, len(lengths)).cuda()
    plain_heads = [h for h in range(heads) if not bias[h].any()]
    out, lse = edited_attention(q, k, v, bias, lengths, split=split)
    ref_out, ref_lse = brute_attention(q, k, v, bias, lengths)
    plain, plain_lse = cached_attention(q, k, v, split=split)
    # The rounding of a bf16 call: no worse than SDPA's own output against float64.
    sdpa_error = (
        (plain.double().cpu() - brute_attention(q, k, v, torch.zeros_like(bias), lengths)[0]).abs().max().item()
    )
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and lse.is_cuda
    assert (out.double().cpu() - ref_out).abs().max().item() <= 2 * sdpa_error + 2**-9
    torch.testing.assert_close(lse.double().cpu(), ref_lse, rtol=0, atol=2e-3)
    # The plain heads (if any) get the plain call's softmax (within a bf16 rounding), a zero
    # bias the plain call bit for bit.
    if plain_heads:
        assert (out[:, :, plain_heads] - plain[:, :, plain_heads]).abs().max().item() <= 2 * sdpa_error + 2**-9
        torch.testing.assert_close(lse[:, plain_heads], plain_lse[:, plain_heads], rtol=0, atol=2e-3)
    zero_out, zero_lse = edited_attention(q, k, v, torch.zeros_like(bias), lengths, split=split)
    assert torch.equal(zero_out, plain) and torch.equal(zero_lse, plain_lse)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("token_profiles", [False, True])
def test_cuda_statistics_of_the_edited_softmax_match_the_cpu_reference(token_profiles):
    """The capture's route on CUDA: edited_attention's log-sum-exp, then
    frame_partials_given_lse_kernel (and token_profiles_kernel) with the bias; and the
    route without the log-sum-exp (frame_softmax_partials_kernel's combine)."""

    heads, fsl, num_q, lengths = 6, 1560, 2, [1560, 1560, 611, 1560, 1560]
    q, k, v = (x[0].transpose(0, 1).cuda() for x in make_call(2, 1, heads, num_q * fsl, lengths, 128, torch.bfloat16))
    bias = wan_bias(heads, len(lengths)).cuda()
    layout = dict(
        frame_seq_length=fsl,
        query_frames=[5, 6],
        key_frames=[0, 1, 2, 3, 4],
        key_lengths=lengths,
        token_profiles=token_profiles,
    )
    cpu = attention_statistics(q.cpu(), k.cpu(), backend="torch", frame_bias=bias.cpu(), **layout)
    out, given_lse = attention_with_statistics(q, k, v, frame_bias=bias, fused=True, **layout)
    partials = attention_statistics(q, k, frame_bias=bias, **layout)
    expected, _ = edited_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), bias, lengths)
    assert torch.equal(out, expected[0])
    for stats in (given_lse, partials):
        for name in FIELDS:
            got, ref = getattr(stats, name), getattr(cpu, name)
            if ref is None:
                assert got is None
                continue
            assert got.is_cuda and torch.isfinite(got).all(), name
            atol = (
                3 / fsl + 1e-6 if name == "argmax_share" else (5e-5 if "logit" in name or name == "entropy" else 2e-6)
            )
            torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=atol, msg=name)
        assert_masked_frames_get_nothing(stats, bias)
