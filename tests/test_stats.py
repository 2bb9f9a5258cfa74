"""The per-call statistics: attention_statistics (every statistic, variable-length key frames) against a float64
brute force, for the torch reference and for the Triton kernels in Triton's CPU
interpreter; CUDA tests compare the kernels with the CPU reference at real sizes."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from sinkscope.stats.attention import (
    CallStatistics,
    attention_statistics,
    check_frame_layout,
    triton_available,
)
from sinkscope.stats.reference import statistics_chunked

FIELDS = ("logit_mean", "prob_mass", "argmax_share", "entropy", "token_logit_mean", "token_prob_mean")


def brute_force_statistics(q, k, fsl, num_q, key_lengths, scale, frame_bias=None):
    """Every statistic from the full float64 score matrix, frame slice by frame slice; with
    ``frame_bias`` [H, frames] (an edit: added to the scores, -inf masks), of the edited
    softmax, logit_mean and token_logit_mean staying the raw scores'."""
    q, k = q.double().cpu(), k.double().cpu()
    raw = torch.einsum("hqd,hkd->hqk", q, k) * scale
    scores = raw
    if frame_bias is not None:
        scores = raw + frame_bias.double().cpu().repeat_interleave(torch.tensor(key_lengths), dim=1)[:, None, :]
    probs = torch.softmax(scores, dim=-1)
    # p log p with p = 0 on masked keys: 0.
    plogp = torch.where(probs > 0, probs * torch.log_softmax(scores, dim=-1), torch.zeros_like(probs))
    heads, num_k = q.shape[0], len(key_lengths)
    bounds = [(sum(key_lengths[:f]), sum(key_lengths[: f + 1])) for f in range(num_k)]
    token_frame = torch.repeat_interleave(torch.arange(num_k), torch.tensor(key_lengths))
    top_frame = token_frame[scores.argmax(dim=-1)]  # [H, Lq]
    out = {name: torch.empty(heads, num_q, num_k, dtype=torch.float64) for name in FIELDS[:3]}
    out["entropy"] = torch.empty(heads, num_q, dtype=torch.float64)
    for a in range(num_q):
        rows = slice(a * fsl, (a + 1) * fsl)
        for b, (lo, hi) in enumerate(bounds):
            out["logit_mean"][:, a, b] = raw[:, rows, lo:hi].mean(dim=(1, 2))
            out["prob_mass"][:, a, b] = probs[:, rows, lo:hi].sum(dim=2).mean(dim=1)
            out["argmax_share"][:, a, b] = (top_frame[:, rows] == b).double().mean(dim=1)
        out["entropy"][:, a] = -plogp[:, rows].sum(dim=-1).mean(dim=1)
    out["token_logit_mean"] = raw.mean(dim=1)
    out["token_prob_mean"] = probs.mean(dim=1)
    return out


def make_inputs(seed, heads, fsl, dim, num_q, key_lengths, dtype=torch.float32, sharp=1.5):
    """q and k with per-frame offsets (clearly non-zero frame means) and a few large keys
    (peaked rows, low entropy), so every statistic varies across frames."""
    g = torch.Generator().manual_seed(seed)
    num_k = len(key_lengths)
    q = torch.randn(heads, num_q * fsl, dim, generator=g)
    q += torch.randn(heads, num_q, 1, dim, generator=g).repeat_interleave(fsl, 1).flatten(1, 2)
    k = torch.randn(heads, sum(key_lengths), dim, generator=g)
    k += torch.randn(heads, num_k, 1, dim, generator=g).repeat_interleave(torch.tensor(key_lengths), 1).squeeze(2)
    return (q * sharp).to(dtype), k.to(dtype)


def random_layout(seed):
    """A call's layout: 2-3 heads, 1-4 query frames, 1-8 key frames in a non-ascending
    order, partial frames (1 token included), head_dim 8, 16 or 128."""
    rng = random.Random(seed)
    fsl = rng.randint(5, 24)
    num_k = rng.randint(1, 8)
    lengths = [rng.choice([fsl, fsl, 1, rng.randint(1, fsl)]) for _ in range(num_k)]
    key_frames = rng.sample(range(40), num_k)
    return dict(
        heads=rng.randint(2, 3),
        fsl=fsl,
        dim=rng.choice([8, 16, 128]),
        num_q=rng.randint(1, 4),
        key_lengths=lengths,
        key_frames=key_frames,
    )


HAND_LAYOUTS = [
    # Sinks kept whole, a window with dropped tokens, key frames out of order.
    dict(heads=2, fsl=12, dim=16, num_q=2, key_lengths=[12, 12, 5, 1, 12, 12, 12], key_frames=[0, 1, 9, 8, 10, 11, 12]),
    # Every key frame a single token; one key frame; a segment longer than a frame.
    dict(heads=3, fsl=7, dim=8, num_q=2, key_lengths=[1, 1, 1, 1], key_frames=[3, 2, 1, 0]),
    dict(heads=2, fsl=9, dim=128, num_q=1, key_lengths=[4], key_frames=[5]),
    dict(heads=2, fsl=6, dim=16, num_q=2, key_lengths=[6, 20, 3], key_frames=[2, 0, 1]),
    # Whole frames (the default layout).
    dict(heads=2, fsl=20, dim=16, num_q=1, key_lengths=[20] * 3, key_frames=[0, 1, 2]),
]
LAYOUTS = HAND_LAYOUTS + [random_layout(seed) for seed in range(10)]


def layout_inputs(index, dtype=torch.float32):
    lay = LAYOUTS[index]
    q, k = make_inputs(100 + index, lay["heads"], lay["fsl"], lay["dim"], lay["num_q"], lay["key_lengths"], dtype)
    return lay, q, k


def assert_matches(stats, ref, *, token_profiles=True, atol=1e-6, share_atol=1e-6):
    """stats (a CallStatistics, any device) against the float64 brute force."""
    for name in FIELDS:
        got = getattr(stats, name)
        if name.startswith("token") and not token_profiles:
            assert got is None
            continue
        assert got.dtype == torch.float32, name
        assert got.shape == ref[name].shape, name
        got = got.double().cpu()
        if name == "argmax_share":
            torch.testing.assert_close(got, ref[name], rtol=0, atol=share_atol, msg=name)
        elif name in ("logit_mean", "token_logit_mean", "entropy"):
            torch.testing.assert_close(got, ref[name], rtol=1e-5, atol=10 * atol, msg=name)
        else:
            torch.testing.assert_close(got, ref[name], rtol=1e-4, atol=atol, msg=name)


def assert_identities(stats, key_lengths, *, atol=1e-6):
    """The relations between the frame statistics and the token profiles."""
    heads, num_q, num_k = stats.prob_mass.shape
    ones = torch.ones(heads, num_q, dtype=torch.float64)
    torch.testing.assert_close(stats.prob_mass.double().sum(-1).cpu(), ones, rtol=0, atol=1e-5)
    torch.testing.assert_close(stats.argmax_share.double().sum(-1).cpu(), ones, rtol=0, atol=1e-6)
    num_keys = sum(key_lengths)
    assert stats.entropy.min().item() >= -1e-5
    assert stats.entropy.max().item() <= math.log(num_keys) + 1e-5
    if stats.token_prob_mean is None:
        return
    starts = [sum(key_lengths[:f]) for f in range(num_k)]
    for f, (start, length) in enumerate(zip(starts, key_lengths)):
        tokens = slice(start, start + length)
        torch.testing.assert_close(
            stats.token_prob_mean[:, tokens].double().sum(-1).cpu(),
            stats.prob_mass[:, :, f].double().mean(-1).cpu(),
            rtol=1e-5,
            atol=atol,
        )
        torch.testing.assert_close(
            stats.token_logit_mean[:, tokens].double().mean(-1).cpu(),
            stats.logit_mean[:, :, f].double().mean(-1).cpu(),
            rtol=1e-5,
            atol=1e-5,
        )


# -- the torch reference ---------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(LAYOUTS)))
def test_reference_statistics_match_float64_brute_force(index):
    lay, q, k = layout_inputs(index)
    stats = attention_statistics(
        q,
        k,
        frame_seq_length=lay["fsl"],
        query_frames=list(range(lay["num_q"])),
        key_frames=lay["key_frames"],
        key_lengths=lay["key_lengths"],
        token_profiles=True,
        backend="torch",
    )
    assert isinstance(stats, CallStatistics)
    ref = brute_force_statistics(q, k, lay["fsl"], lay["num_q"], lay["key_lengths"], lay["dim"] ** -0.5)
    assert_matches(stats, ref)
    assert_identities(stats, lay["key_lengths"])


def test_token_profiles_only_when_asked_and_default_lengths_are_whole_frames():
    q, k = make_inputs(7, 2, 8, 16, 2, [8, 8, 8])
    kwargs = dict(frame_seq_length=8, query_frames=[1, 2], key_frames=[0, 1, 2], backend="torch")
    plain = attention_statistics(q, k, **kwargs)
    assert plain.token_logit_mean is None and plain.token_prob_mean is None
    explicit = attention_statistics(q, k, key_lengths=[8, 8, 8], token_profiles=True, **kwargs)
    for name in FIELDS[:4]:
        torch.testing.assert_close(getattr(plain, name), getattr(explicit, name), rtol=0, atol=0)
    assert explicit.token_prob_mean.shape == explicit.token_logit_mean.shape == (2, 24)


def test_custom_scale_and_bf16_inputs_with_partial_frames():
    lengths = [3, 10, 1]
    q, k = make_inputs(11, 2, 10, 16, 1, lengths, dtype=torch.bfloat16)
    stats = attention_statistics(
        q,
        k,
        frame_seq_length=10,
        query_frames=[2],
        key_frames=[2, 0, 1],
        key_lengths=lengths,
        token_profiles=True,
        scale=0.3,
    )
    assert_matches(stats, brute_force_statistics(q, k, 10, 1, lengths, 0.3))


def test_small_budget_streams_exactly():
    lay, q, k = layout_inputs(0)
    args = (q, k, lay["fsl"], lay["num_q"], lay["key_lengths"], 0.25)
    full = statistics_chunked(*args, token_profiles=True)
    tiny = statistics_chunked(*args, token_profiles=True, score_budget=1)  # one query row at a time
    for name in FIELDS:
        torch.testing.assert_close(getattr(tiny, name), getattr(full, name), rtol=1e-6, atol=1e-7)


def test_token_mean_streams_in_small_conversions():
    from sinkscope.stats.reference import token_mean

    x = torch.randn(3, 37, 8).to(torch.bfloat16)
    expected = x.double().mean(dim=1)
    for budget in (1, 24, 10**6):
        torch.testing.assert_close(token_mean(x, torch.float64, budget), expected, rtol=1e-12, atol=1e-12)


def test_peaked_rows_reach_zero_entropy_and_full_argmax():
    # One key far above the rest: every query puts (almost) all mass on it.
    q = torch.ones(1, 4, 8)
    k = torch.zeros(1, 6, 8)
    k[0, 4] = 100.0
    stats = attention_statistics(
        q, k, frame_seq_length=4, query_frames=[1], key_frames=[0, 1], key_lengths=[3, 3], backend="torch"
    )
    assert stats.entropy.abs().max().item() < 1e-6
    torch.testing.assert_close(stats.argmax_share, torch.tensor([[[0.0, 1.0]]]))
    torch.testing.assert_close(stats.prob_mass, torch.tensor([[[0.0, 1.0]]]))
    # Uniform rows: entropy ln Lk, and ties go to the first key token's frame.
    uniform = attention_statistics(
        torch.zeros(1, 4, 8),
        torch.zeros(1, 6, 8),
        frame_seq_length=4,
        query_frames=[1],
        key_frames=[0, 1],
        key_lengths=[2, 4],
        backend="torch",
    )
    torch.testing.assert_close(uniform.entropy, torch.full((1, 1), math.log(6)))
    torch.testing.assert_close(uniform.prob_mass, torch.tensor([[[2 / 6, 4 / 6]]]))
    torch.testing.assert_close(uniform.argmax_share, torch.tensor([[[1.0, 0.0]]]))


@pytest.mark.parametrize(
    "key_frames, key_lengths, message",
    [
        ([0, 1], [5, 4], "not sum\\(key_lengths\\) = 9"),
        ([0, 1, 2], [5, 5, 0], "positive integers"),
        ([0, 1, 2], [5, -1, 6], "positive integers"),
        ([0, 1, 2], [5, 2.5, 2.5], "positive integers"),
        ([0, 1], [10], "1 entries for 2 key frames"),
    ],
)
def test_bad_key_lengths_are_named(key_frames, key_lengths, message):
    with pytest.raises(ValueError, match=message):
        check_frame_layout(torch.zeros(2, 5, 4), torch.zeros(2, 10, 4), 5, [0], key_frames, key_lengths)


def test_a_call_needs_frames():
    with pytest.raises(ValueError, match="needs query and key frames"):
        check_frame_layout(torch.zeros(2, 0, 4), torch.zeros(2, 5, 4), 5, [], [0])


def test_strided_views_like_the_kv_cache():
    # The capture passes q[0].transpose(0, 1) of a [B, L, H, D] tensor: no copy needed.
    q4, k4 = torch.randn(1, 5, 3, 8), torch.randn(1, 10, 3, 8)
    q, k = q4[0].transpose(0, 1), k4[0].transpose(0, 1)
    stats = attention_statistics(q, k, frame_seq_length=5, query_frames=[1], key_frames=[0, 1], token_profiles=True)
    assert_matches(stats, brute_force_statistics(q, k, 5, 1, [5, 5], 8**-0.5))


@pytest.mark.parametrize(
    "q_shape, k_shape, qf, kf, message",
    [
        ((2, 10, 4), (2, 15, 4), [0], [0, 1, 2], "q has 10 tokens"),
        ((2, 5, 4), (2, 14, 4), [0], [0, 1, 2], "k has 14 tokens"),
        ((2, 5, 4), (3, 15, 4), [0], [0, 1, 2], "differ in heads"),
        ((2, 5), (2, 15, 4), [0], [0, 1, 2], "must be \\[H, L, D\\]"),
        ((2, 5, 4), (2, 10, 4), [0], [1, 1], "repeat a frame"),
    ],
)
def test_bad_layouts_are_named(q_shape, k_shape, qf, kf, message):
    with pytest.raises(ValueError, match=message):
        check_frame_layout(torch.zeros(q_shape), torch.zeros(k_shape), 5, qf, kf)


@pytest.mark.parametrize(
    "backend, other, message",
    [
        ("cuda-magic", None, "unknown statistics backend"),
        ("auto", torch.float64, "differ in dtype or device"),
        ("triton", None, "triton backend needs CUDA tensors"),
    ],
)
def test_bad_backends_and_inputs_are_named(backend, other, message):
    q = torch.randn(1, 4, 8)
    k = q if other is None else q.to(other)
    with pytest.raises(ValueError, match=message):
        attention_statistics(q, k, frame_seq_length=4, query_frames=[0], key_frames=[0], backend=backend)


# -- the Triton kernels in the CPU interpreter ------------------------------------------------

# The kernels' logic on the CPU, run by Triton's interpreter. TRITON_INTERPRET must be
# set before triton is imported, so one subprocess runs every case (the inputs and the
# results travel through torch.save) and the comparisons happen here. The interpreter's
# default tiles are small (32 x 16) so that every masking path is taken: partial tiles,
# padded head_dim, segments shorter than a tile or not aligned to one, several key tiles
# in a segment (online rescaling), several query blocks in token_profiles_kernel.
INTERPRETER_CASES = list(range(len(HAND_LAYOUTS))) + [len(HAND_LAYOUTS) + i for i in (1, 2, 3)]
# (frame_softmax_partials_kernel config, token_profiles_kernel config) per case; None =
# the interpreter default.
INTERPRETER_CONFIGS = {1: ({"BLOCK_M": 16, "BLOCK_N": 16}, {"BLOCK_M": 16, "BLOCK_N": 32})}
# This case also runs frame_softmax_partials_kernel alone.
FRAME_ONLY_CASE = 3

_INTERPRETER_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from sinkscope.stats.launch import (_combine_fused, attention_statistics_tma, attention_statistics_triton,
                                       statistics_given_lse, statistics_triton, tma_attention, tma_kernel_fits)
    from sinkscope.stats.launch_support import _segments_on
    from sinkscope.stats.reductions import segment_part_sums, segment_sums
    cases, results = torch.load(sys.argv[1]), {}
    segments = cases.pop("segment_sums")
    results["segment_sums"] = {
        chunk: segment_sums(segments["x"], segments["lengths"], chunk=chunk) for chunk in (None, 1, 40, 1000)
    }
    for index, case in cases.items():
        q, k, fsl, num_q, lengths, scale = (case[key] for key in ("q", "k", "fsl", "num_q", "key_lengths", "scale"))
        args = (q, k, fsl, num_q, lengths, scale)
        if case.get("tma"):
            assert tma_kernel_fits(q, k, case["v"], lengths), index
            out, stats = attention_statistics_tma(q, k, case["v"], fsl, num_q, lengths, scale, token_profiles=True)
            results[index] = {"output": out, "stats": vars(stats)}
            # The combine's finish adding its parts one tile each (a long cache's many frames).
            _, partials = tma_attention(q, k, case["v"], lengths, scale)
            key_sums, lengths_float = segment_part_sums(k, lengths), _segments_on(q.device, tuple(lengths))[2]
            results[index]["finish_part_by_part"] = vars(_combine_fused(
                q, k, partials, key_sums, lengths_float, fsl, num_q, scale, False, None, {"FINISH_TILE": 1}))
            continue
        stats = statistics_triton(*args, token_profiles=True, config=case["config"],
                                  profile_config=case["profile_config"])
        results[index] = {"stats": vars(stats)}
        out, fused = attention_statistics_triton(q, k, case["v"], fsl, num_q, lengths, scale, token_profiles=True,
                                                 config=case["config"], profile_config=case["profile_config"])
        results[index]["fused"] = vars(fused)
        results[index]["output"] = out
        lse = torch.logsumexp(q.double() @ k.double().transpose(1, 2) * scale, dim=-1).float()
        results[index]["given_lse"] = vars(statistics_given_lse(q, k, lse, fsl, num_q, lengths, scale,
                                                                token_profiles=True, config=case["config"],
                                                                profile_config=case["profile_config"]))
        if index == case["frame_only_case"]:
            results[index]["frame_only"] = vars(statistics_triton(*args))
        if index == case["frame_only_case"]:
            # The GPU's loop bound (each segment's own length), where this interpreter can run it.
            try:
                results["dynamic_bound"] = vars(statistics_triton(*args, config={"LOOP_END": 0},
                                                                  profile_config={"LOOP_END": 0}, token_profiles=True))
            except Exception as error:
                results["dynamic_bound"] = repr(error)
    torch.save(results, sys.argv[2])
    print("ok")
    """
)


def run_in_interpreter(script: str, cases: dict, folder) -> dict:
    """``script`` run in a subprocess under Triton's CPU interpreter (TRITON_INTERPRET=1) on
    ``cases`` (saved to ``folder``): the results it saves. One subprocess for every case,
    since the interpreter's setup takes seconds."""
    torch.save(cases, folder / "cases.pt")
    env = dict(os.environ, TRITON_INTERPRET="1")
    src = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, "src"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    command = [sys.executable, "-c", script, str(folder / "cases.pt"), str(folder / "results.pt")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(folder / "results.pt")


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """Index -> (inputs, results) of every interpreter case, from one subprocess."""
    pytest.importorskip("triton")
    folder = tmp_path_factory.mktemp("interpreter")
    cases = {}
    for index in INTERPRETER_CASES:
        lay, q, k = layout_inputs(index)
        config, profile_config = INTERPRETER_CONFIGS.get(index, (None, None))
        v = torch.randn(k.shape, generator=torch.Generator().manual_seed(index))
        cases[index] = dict(
            q=q,
            k=k,
            v=v,
            fsl=lay["fsl"],
            num_q=lay["num_q"],
            key_lengths=lay["key_lengths"],
            scale=lay["dim"] ** -0.5,
            config=config,
            profile_config=profile_config,
            frame_only_case=FRAME_ONLY_CASE,
        )
    for index, lay in TMA_INTERPRETER_LAYOUTS.items():
        q, k = make_inputs(index, lay["heads"], lay["fsl"], lay["dim"], lay["num_q"], lay["key_lengths"], torch.float16)
        v = torch.randn(k.shape, generator=torch.Generator().manual_seed(index)).half()
        # [Lq, H, D] storage read as [H, L, D] views, as the capture passes them (TMA takes the strides).
        q, k, v = (x.transpose(0, 1).contiguous().transpose(0, 1) for x in (q, k, v))
        cases[index] = dict(
            q=q,
            k=k,
            v=v,
            fsl=lay["fsl"],
            num_q=lay["num_q"],
            key_lengths=lay["key_lengths"],
            scale=lay["dim"] ** -0.5,
            tma=True,
        )
    # segment_sums_kernel alone: segments of 1 to 150 tokens, a strided fp16 view, in parts of several sizes.
    x = torch.randn(70, 3, 24, generator=torch.Generator().manual_seed(7)).half()
    x = torch.cat([x, x.flip(0), x[:60]]).transpose(0, 1)  # [3, 200, 24], strides (24, 72, 1)
    cases["segment_sums"] = dict(x=x, lengths=[1, 37, 150, 12])
    results = run_in_interpreter(_INTERPRETER_SCRIPT, cases, folder)
    out = {index: (cases[index], results[index]) for index in [*INTERPRETER_CASES, *TMA_INTERPRETER_LAYOUTS]}
    out["dynamic_bound"] = results["dynamic_bound"]
    out["segment_sums"] = (cases["segment_sums"], results["segment_sums"])
    return out


def test_segment_sums_in_the_interpreter(interpreted):
    """segment_sums_kernel: each segment's fp32 sum, whatever the parts it is split into."""
    case, sums = interpreted["segment_sums"]
    x, bounds = case["x"].double(), [0, 1, 38, 188, 200]
    expected = torch.stack([x[:, a:b].sum(1) for a, b in zip(bounds, bounds[1:])], dim=1)  # [H, S, D]
    assert set(sums) == {None, 1, 40, 1000}
    for chunk, got in sums.items():
        assert got.shape == (3, 4, 24) and got.dtype == torch.float32, chunk
        torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-5, msg=f"chunk {chunk}")


# attention_frame_partials_tma_kernel in fp16 (the interpreter's bf16 is not NumPy's), tiles 32 x 16: frames that end
# inside a tile and on a tile's edge, out of order, a partial frame, query blocks past the
# end, one key frame of two tiles.
TMA_INTERPRETER_LAYOUTS = {
    1000: dict(heads=2, fsl=40, dim=32, num_q=2, key_lengths=[40, 40, 40, 40]),
    1001: dict(heads=3, fsl=24, dim=16, num_q=1, key_lengths=[24, 20, 37, 24]),
    1002: dict(heads=1, fsl=16, dim=64, num_q=3, key_lengths=[16, 32]),
}


def _case_args(case):
    return case["q"], case["k"], case["fsl"], case["num_q"], case["key_lengths"], case["scale"]


@pytest.mark.parametrize("index", INTERPRETER_CASES)
def test_triton_kernels_in_the_interpreter(interpreted, index):
    case, out = interpreted[index]
    stats = CallStatistics(**out["stats"])
    ref = brute_force_statistics(*_case_args(case))
    assert_matches(stats, ref)
    assert_identities(stats, case["key_lengths"])


@pytest.mark.parametrize("index", INTERPRETER_CASES)
def test_fused_attention_kernel_in_the_interpreter(interpreted, index):
    """attention_frame_partials_kernel: the attention output and every statistic from one
    pass over the keys."""
    case, out = interpreted[index]
    q, k, v, scale = case["q"].double(), case["k"].double(), case["v"].double(), case["scale"]
    expected = (torch.softmax(q @ k.transpose(1, 2) * scale, dim=-1) @ v).transpose(0, 1)  # [Lq, H, D]
    assert out["output"].shape == expected.shape and out["output"].dtype == torch.float32
    torch.testing.assert_close(out["output"].double(), expected, rtol=1e-5, atol=1e-5)
    stats = CallStatistics(**out["fused"])
    assert_matches(stats, brute_force_statistics(*_case_args(case)))
    assert_identities(stats, case["key_lengths"])


@pytest.mark.parametrize("index", TMA_INTERPRETER_LAYOUTS)
def test_tma_attention_kernel_in_the_interpreter(interpreted, index):
    """attention_frame_partials_tma_kernel (then the combine): the attention output within fp16 rounding (P is rounded
    for P @ V, as in flash attention), every statistic as the float64 brute force."""
    case, out = interpreted[index]
    q, k, v, scale = case["q"].double(), case["k"].double(), case["v"].double(), case["scale"]
    expected = (torch.softmax(q @ k.transpose(1, 2) * scale, dim=-1) @ v).transpose(0, 1)
    assert out["output"].shape == expected.shape and out["output"].dtype == torch.float16
    torch.testing.assert_close(out["output"].double(), expected, rtol=0, atol=2e-3)
    stats = CallStatistics(**out["stats"])
    assert_matches(stats, brute_force_statistics(*_case_args(case)))
    assert_identities(stats, case["key_lengths"])
    # The combine's finish adding its parts one at a time: the same statistics, to fp32 rounding.
    part_by_part = out["finish_part_by_part"]
    for name in ("logit_mean", "prob_mass", "argmax_share", "entropy"):
        torch.testing.assert_close(part_by_part[name], getattr(stats, name), rtol=1e-5, atol=1e-6, msg=name)


def test_tma_kernel_takes_only_what_it_can_address():
    """The TMA pass needs fp16 / bf16, frames of at least a key tile, TMA-aligned strides."""
    from sinkscope.stats.launch import tma_kernel_fits

    q, k = (torch.zeros(2, n, 64, dtype=torch.bfloat16) for n in (128, 256))
    assert tma_kernel_fits(q, k, k, [128, 128])
    assert not tma_kernel_fits(q.float(), k.float(), k.float(), [128, 128])
    assert not tma_kernel_fits(q, k, k, [200, 56])  # a frame shorter than a key tile (64)
    odd = torch.zeros(2, 256, 72, dtype=torch.bfloat16)[..., :60]  # head size 60, not a power of two
    assert not tma_kernel_fits(odd[:, :128], odd, odd, [128, 128])
    unaligned = torch.zeros(2 * 257 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 257, 64)[:, 1:]
    assert not tma_kernel_fits(q, unaligned, unaligned, [128, 128])


@pytest.mark.parametrize("index", INTERPRETER_CASES)
def test_statistics_given_the_log_sum_exp_in_the_interpreter(interpreted, index):
    """frame_partials_given_lse_kernel: the statistics when the attention call gave each
    query's log-sum-exp."""
    case, out = interpreted[index]
    stats = CallStatistics(**out["given_lse"])
    assert_matches(stats, brute_force_statistics(*_case_args(case)))
    assert_identities(stats, case["key_lengths"])


def test_triton_frame_statistics_alone_in_the_interpreter(interpreted):
    """frame_softmax_partials_kernel without token_profiles_kernel: the same frame
    statistics, no profiles."""
    case, out = interpreted[FRAME_ONLY_CASE]
    stats, frame_only = CallStatistics(**out["stats"]), CallStatistics(**out["frame_only"])
    assert_matches(frame_only, brute_force_statistics(*_case_args(case)), token_profiles=False)
    for name in FIELDS[:4]:
        torch.testing.assert_close(getattr(frame_only, name), getattr(stats, name), rtol=0, atol=0)


def test_triton_runtime_loop_bounds_in_the_interpreter(interpreted):
    """In the interpreter the kernels' loops run to compile-time bounds
    (frame_softmax_partials_kernel: the longest segment, see LOOP_END); this runs the GPU's runtime bounds, where the
    interpreter supports them."""
    dynamic = interpreted["dynamic_bound"]
    if isinstance(dynamic, str):
        if "0-dimensional" in dynamic:
            pytest.skip(f"this Triton's interpreter cannot bound a loop by a loaded value: {dynamic}")
        raise AssertionError(dynamic)
    case, out = interpreted[FRAME_ONLY_CASE]
    for name in FIELDS:
        torch.testing.assert_close(dynamic[name], out["stats"][name], rtol=1e-6, atol=1e-7)


# -- CUDA: the kernels against the CPU reference -----------------------------------------------

CUDA_LAYOUTS = [
    # Wan2.1's frame size: 2 query frames, 5 key frames (one partial, out of order).
    dict(heads=4, fsl=1560, dim=128, num_q=2, key_lengths=[1560, 1560, 611, 1560, 1560], key_frames=[0, 1, 4, 3, 5]),
    # The capture's whole-frame layout at Wan2.1's size, the last block of 6 frames.
    dict(heads=2, fsl=1560, dim=128, num_q=3, key_lengths=[1560] * 6, key_frames=list(range(6))),
    # Odd sizes: segments of 1 token, lengths not multiples of any tile, head_dim 64 and 16.
    dict(heads=3, fsl=37, dim=64, num_q=3, key_lengths=[1, 37, 200, 5, 37, 1], key_frames=[7, 0, 1, 5, 6, 3]),
    dict(heads=2, fsl=130, dim=16, num_q=1, key_lengths=[129, 1, 130], key_frames=[2, 1, 0]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_the_captured_call_outputs_the_models_own_attention_then_the_statistics(dtype):
    """attention_with_statistics off CUDA: the output is the model's cached call bit for bit
    (the statistics never feed it), the statistics those of attention_statistics."""
    from sinkscope.attention.split import cached_attention
    from sinkscope.stats.attention import attention_with_statistics

    lengths = [8, 5, 8]
    q, k = make_inputs(3, 2, 8, 16, 2, lengths, dtype)
    v = torch.randn(k.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    layout = dict(
        frame_seq_length=8, query_frames=[4, 5], key_frames=[0, 4, 5], key_lengths=lengths, token_profiles=True
    )
    for fused in (False, True):  # fused is a Triton kernel's: the CPU takes the model's call
        out, stats = attention_with_statistics(q, k, v, fused=fused, **layout)
        model_out, lse = cached_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)))
        assert lse is None and out.dtype == dtype and torch.equal(out, model_out[0])
        ref = attention_statistics(q, k, **layout)
        assert all(torch.equal(getattr(stats, name), getattr(ref, name)) for name in FIELDS)
    with pytest.raises(ValueError, match="scales by 1/sqrt"):
        attention_with_statistics(q, k, v, scale=0.5, **layout)


@pytest.mark.gpu
@pytest.mark.skipif(not triton_available(), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index", range(len(CUDA_LAYOUTS)))
def test_cuda_statistics_match_cpu_reference(index, dtype):
    lay = CUDA_LAYOUTS[index]
    q, k = make_inputs(index, lay["heads"], lay["fsl"], lay["dim"], lay["num_q"], lay["key_lengths"], dtype)
    kwargs = dict(
        frame_seq_length=lay["fsl"],
        query_frames=list(range(10, 10 + lay["num_q"])),
        key_frames=lay["key_frames"],
        key_lengths=lay["key_lengths"],
        token_profiles=True,
    )
    cpu = attention_statistics(q, k, backend="torch", **kwargs)
    got = attention_statistics(q.cuda(), k.cuda(), **kwargs)
    for name in FIELDS:
        value = getattr(got, name)
        assert value.is_cuda and value.dtype == torch.float32, name
        ref = getattr(cpu, name)
        if name == "argmax_share":
            # A near-tie between two frames' top keys may resolve differently in another
            # summation order: allow a few query tokens.
            torch.testing.assert_close(value.cpu(), ref, rtol=0, atol=3 / lay["fsl"] + 1e-6, msg=name)
        elif name in ("logit_mean", "token_logit_mean", "entropy"):
            torch.testing.assert_close(value.cpu(), ref, rtol=1e-5, atol=5e-5, msg=name)
        else:
            torch.testing.assert_close(value.cpu(), ref, rtol=1e-4, atol=2e-6, msg=name)
    assert_identities(got, lay["key_lengths"], atol=2e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not triton_available(), reason="needs a CUDA device and triton")
def test_cuda_token_profiles_allocate_no_score_matrix():
    heads, fsl, dim, num_q = 12, 1560, 128, 3
    lengths = [1560] * 6 + [700]
    q, k = make_inputs(0, heads, fsl, dim, num_q, lengths, torch.bfloat16)
    q, k = q.cuda(), k.cuda()
    kwargs = dict(
        frame_seq_length=fsl,
        query_frames=[6, 7, 8],
        key_frames=list(range(7)),
        key_lengths=lengths,
        token_profiles=True,
    )
    attention_statistics(q, k, **kwargs)  # compile both kernels first
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    stats = attention_statistics(q, k, **kwargs)
    torch.cuda.synchronize()
    growth = torch.cuda.max_memory_allocated() - base
    num_queries, num_keys = q.shape[1], k.shape[1]
    # One head's score matrix would be Lq x Lk values: stay below a quarter of its fp32
    # bytes, and within a small multiple of the per-(query, frame) partials (the
    # kernels' outputs and the combine's temporaries) plus the [H, Lk] profiles.
    assert growth < num_queries * num_keys, growth
    assert growth < 16 * heads * num_queries * len(lengths) * 4 + 4 * heads * num_keys * 4 + 2**20, growth
    assert stats.token_prob_mean.shape == (heads, num_keys)


@pytest.mark.gpu
@pytest.mark.skipif(not triton_available(), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("route", ["default", "one pass", "given lse", "tma"])
@pytest.mark.parametrize("index", range(len(CUDA_LAYOUTS)))
def test_cuda_attention_with_statistics_matches_sdpa_and_the_reference(index, route):
    """The captured call's output is SDPA's (bit for bit by cuDNN with its log-sum-exp and
    the pass given it; within bf16 rounding by the one pass and its TMA form, the default
    where frames are at least a key tile long); its statistics are the reference's."""
    from sinkscope.stats.attention import attention_with_statistics
    from sinkscope.stats.launch import (
        attention_statistics_lse,
        attention_statistics_tma,
        attention_statistics_triton,
        tma_kernel_fits,
    )

    lay = CUDA_LAYOUTS[index]
    q, k = make_inputs(index, lay["heads"], lay["fsl"], lay["dim"], lay["num_q"], lay["key_lengths"], torch.bfloat16)
    v = torch.randn(k.shape, generator=torch.Generator().manual_seed(index)).to(torch.bfloat16)
    q, k, v = q.cuda(), k.cuda(), v.cuda()
    kwargs = dict(
        frame_seq_length=lay["fsl"],
        query_frames=list(range(lay["num_q"])),
        key_frames=lay["key_frames"],
        key_lengths=lay["key_lengths"],
        token_profiles=True,
    )
    scale = lay["dim"] ** -0.5
    args = (q, k, v, lay["fsl"], lay["num_q"], lay["key_lengths"], scale)
    if route == "default":
        out, stats = attention_with_statistics(q, k, v, **kwargs)
    elif route == "one pass":
        out, stats = attention_statistics_triton(*args, token_profiles=True)
    elif route == "given lse":
        out, stats = attention_statistics_lse(*args, token_profiles=True)
    else:
        if not tma_kernel_fits(q, k, v, lay["key_lengths"]):
            pytest.skip("frames shorter than the TMA pass's key tile")
        out, stats = attention_statistics_tma(*args, token_profiles=True)
    exact = (torch.softmax(q.double() @ k.double().transpose(1, 2) * scale, dim=-1) @ v.double()).transpose(0, 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(0, 1)
    ours_error = (out.double() - exact).abs().max().item()
    sdpa_error = (sdpa.double() - exact).abs().max().item()
    # The same rounding as SDPA's: bf16 output, probabilities rounded to bf16 for P @ V.
    assert out.dtype == torch.bfloat16 and out.shape == sdpa.shape
    assert ours_error <= 2 * sdpa_error + 2**-9, (ours_error, sdpa_error)
    cpu = attention_statistics(q.cpu(), k.cpu(), backend="torch", **kwargs)
    for name in FIELDS:
        got, ref = getattr(stats, name).cpu(), getattr(cpu, name)
        atol = (
            3 / lay["fsl"] + 1e-6
            if name == "argmax_share"
            else (5e-5 if "logit" in name or name == "entropy" else 2e-6)
        )
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=atol, msg=name)
    assert_identities(stats, lay["key_lengths"], atol=2e-6)
