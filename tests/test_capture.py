"""Capture during generation: every call, absolute frames, values equal to a float64 brute force
of the q and k each call saw, under every KV-cache policy."""

from __future__ import annotations

import dataclasses
import hashlib
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_stats import brute_force_statistics

from sinkscope.generation.capture import FRAME_STAT_NAMES, FrameStatsCapture
from sinkscope.generation.common import FlowMatchSchedule
from sinkscope.generation.sampler import generate
from sinkscope.model import build_model
from sinkscope.model.config import WanConfig
from sinkscope.options import GenerationOptions, block_cache_policies
from sinkscope.tokens import round_significant, token_rows, token_values

FSL = 24  # the demo's tokens a frame


class Recorder:
    """Keeps the raw q, k and layout of one layer, to recompute the statistics independently."""

    def __init__(self):
        self.calls = []
        self.info = None

    def begin_call(self, info):
        self.info = info

    def __call__(self, q, k, v, layout):
        self.calls.append((self.info, q[0].transpose(0, 1).clone(), k[0].transpose(0, 1).clone(), layout))


def run(options, layers=(0, 4), device="cpu", seed=0, token_profiles="last_block"):
    model = build_model("demo", seed=0, device=device)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    capture = FrameStatsCapture(model, layers, frame_seq_length=FSL, token_profiles=token_profiles)
    recorder = Recorder()
    with capture:
        model.blocks[layers[0]].self_attn.observer = _tee(model.blocks[layers[0]].self_attn.observer, recorder)
        result = generate(model, context, options=options, seed=seed, observers=[capture, recorder])
    return capture.layer_tables(), recorder, result


def _tee(first, second):
    def both(*args):
        second(*args)
        return first(*args)

    return both


def test_every_call_is_captured_with_absolute_frames():
    tables, recorder, result = run(GenerationOptions(num_frames=9))
    rows = tables[4]["frames"]
    assert [(c.block, c.pass_, c.step) for c in result.calls] == [
        (b, p, s)
        for b in range(3)
        for p, s in [("denoise", 0), ("denoise", 1), ("denoise", 2), ("denoise", 3), ("cache", 4)]
    ]
    assert rows.groupby(["block", "pass", "step"]).ngroups == 15
    last = rows[rows["block"] == 2]
    assert sorted(set(last["query_frame"])) == [6, 7, 8] and sorted(set(last["key_frame"])) == list(range(9))
    timesteps = sorted(set(rows.loc[rows["pass"] == "denoise", "timestep"].astype(float).round(1)))
    assert timesteps == [625.0, 833.3, 937.5, 1000.0]
    assert set(rows.loc[rows["pass"] == "cache", "timestep"]) == {0.0}
    assert (rows["key_tokens"] == FSL).all() and (rows["key_position_shift"] == 0).all()
    # Token profiles for the last block only (the default): a row per head and key frame,
    # the frame's tokens as lists of float16-precision values; token_rows gives a row per key token.
    tokens = tables[4]["tokens"]
    assert set(tokens["block"]) == {2} and len(tokens) == 5 * 12 * 9
    assert {len(values) for values in tokens["token_prob_ratio"]} == {FSL}
    ratios = np.stack(tokens["token_prob_ratio"].to_numpy())
    assert np.array_equal(ratios, round_significant(ratios, 11))
    assert len(token_rows(tokens)) == 5 * 12 * 9 * FSL
    queries = tables[4]["queries"]
    assert len(queries) == 15 * 12 * 3 and (queries["entropy_tokens"] > 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("policy", block_cache_policies())  # rolling_forcing: tests/test_rolling_forcing.py
def test_values_equal_a_float64_brute_force_under_every_policy(policy):
    extra = {
        "participative_compression": dict(local_attn_frames=8, sink_frames=2, budget_frames=6, recent_frames=3),
        "deep_sink": dict(local_attn_frames=7, sink_frames=2),
        "rerope_sink": dict(local_attn_frames=7, sink_frames=3),
        "sink": dict(local_attn_frames=6, sink_frames=2),
        "window": dict(local_attn_frames=6),
        "rolling_sink": dict(local_attn_frames=12, sink_frames=3),
    }.get(policy, {})
    frames = {"global": 9, "rolling_sink": 18}.get(policy, 15)  # rolling_sink: frames 6..8 attended twice at cs 15
    options = GenerationOptions.from_config({"num_frames": frames, "cache_policy": policy, **extra})
    tables, recorder, _ = run(options, token_profiles="all")
    frame_rows, token_table, query_rows = tables[0]["frames"], tables[0]["tokens"], tables[0]["queries"]
    partial = False
    for info, q, k, layout in recorder.calls:
        ref = brute_force_statistics(q, k, FSL, len(layout.query_frames), list(layout.key_lengths), q.shape[-1] ** -0.5)

        def call(t, info=info):
            return t[(t["block"] == info.block) & (t["pass"] == info.pass_) & (t["step"] == info.step)]

        got = call(frame_rows).sort_values(["head", "query_frame", "key_frame"], kind="stable")
        order = np.argsort(layout.key_frames, kind="stable")  # rows are sorted by absolute key frame (ties: k's order)
        for name, atol in (("logit_mean", 1e-6), ("prob_mass", 1e-7), ("argmax_share", 1e-9)):
            expected = ref[name][:, :, order].flatten().numpy()
            assert np.allclose(got[name].to_numpy(), expected, atol=atol, rtol=1e-5), (policy, info, name)
        assert (
            got["key_tokens"].to_numpy() == np.tile(np.asarray(layout.key_lengths)[order], got.shape[0] // len(order))
        ).all()
        partial |= min(layout.key_lengths) < FSL
        queries = call(query_rows).sort_values(["head", "query_frame"])
        assert np.allclose(queries["entropy_tokens"].to_numpy(), ref["entropy"].flatten().numpy(), atol=1e-6)
        # Token lists, a row per (head, key segment in k's order); back to k's columns by the
        # layout: segment of each key column and its token index within the frame.
        tokens = call(token_table)
        lengths = np.asarray(layout.key_lengths)
        segment = np.repeat(np.arange(len(lengths)), lengths)
        index = (
            np.asarray(layout.key_token_index)
            if layout.key_token_index is not None
            else np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        )
        # Stored at float16 precision relative to each frame: within float16 rounding (2**-11
        # of a token's ratio to the frame's mean token; of the frame's logit spread).
        decoded = dict(zip(("token_logit_mean", "token_prob_mean"), token_values(tokens), strict=True))
        spread = np.nanmax(np.abs(np.stack(tokens["token_logit_centered"].to_numpy()).astype(np.float64)))
        for name, rtol, atol in (("token_prob_mean", 2**-10, 1e-9), ("token_logit_mean", 0, 2**-10 * spread + 1e-6)):
            lists = decoded[name].reshape(q.shape[0], len(lengths), FSL)
            assert np.allclose(lists[:, segment, index], ref[name].numpy(), rtol=rtol, atol=atol), (policy, info, name)
            assert np.isnan(lists).sum() == q.shape[0] * (len(lengths) * FSL - lengths.sum())
    # Dropped tokens show as partial key frames under participative compression only.
    assert partial == (policy == "participative_compression")
    shifted = (frame_rows["key_position_shift"] != 0).any()
    assert shifted == (
        policy in ("deep_sink", "participative_compression", "rerope_sink", "rolling_sink", "relative_rope", "ema_sink")
    )


def test_token_profiles_sum_and_average_to_the_frame_statistics():
    tables, _, _ = run(GenerationOptions(num_frames=9))
    frames, tokens = tables[4]["frames"], token_rows(tables[4]["tokens"])
    keys = ["block", "pass", "step", "head", "key_frame"]
    per_frame = frames[frames["block"] == 2].groupby(keys, observed=True)[["logit_mean", "prob_mass"]].mean()
    from_tokens = tokens.groupby(keys, observed=True).agg(
        logit=("token_logit_mean", "mean"), mass=("token_prob_mean", "sum")
    )
    assert np.allclose(from_tokens["logit"], per_frame["logit_mean"], atol=1e-5)
    assert np.allclose(from_tokens["mass"], per_frame["prob_mass"], atol=1e-6)
    # The decoded float16 values average / sum to the stored float32 frame values exactly
    # (up to the float32 rounding of each decoded value).
    stored = tables[4]["tokens"].set_index(keys)[["frame_logit_mean", "frame_prob_mass"]]
    exact = tokens.groupby(keys, observed=True).agg(
        logit=("token_logit_mean", lambda v: v.astype(np.float64).mean()),
        mass=("token_prob_mean", lambda v: v.astype(np.float64).sum()),
    )
    stored = stored.reindex(exact.index)
    assert np.allclose(exact["logit"], stored["frame_logit_mean"], rtol=1e-6, atol=1e-7)
    assert np.allclose(exact["mass"], stored["frame_prob_mass"], rtol=1e-6, atol=0)


def test_seed_determines_the_video():
    options = GenerationOptions(num_frames=6)
    _, _, a = run(options, layers=(0,), seed=3)
    _, _, b = run(options, layers=(0,), seed=3)
    _, _, c = run(options, layers=(0,), seed=4)
    assert torch.equal(a.latents, b.latents)
    assert not torch.equal(a.latents, c.latents)


# A model small enough for a dozen generations in a few seconds, with the demo's 24 tokens a frame.
SMALL = WanConfig(
    dim=48,
    ffn_dim=64,
    num_heads=4,
    num_layers=3,
    text_dim=16,
    text_len=8,
    freq_dim=16,
    latent_height=8,
    latent_width=12,
)
SMALL_OPTIONS = {
    "global": {"num_frames": 6, "denoising_steps": [1000, 500]},
    "deep_sink": {
        "num_frames": 9,
        "denoising_steps": [1000, 500],
        "cache_policy": "deep_sink",
        "local_attn_frames": 4,
        "sink_frames": 1,
    },
    "participative_compression": {
        "num_frames": 9,
        "denoising_steps": [1000, 500],
        "cache_policy": "participative_compression",
        "local_attn_frames": 6,
        "sink_frames": 1,
        "budget_frames": 5,
        "recent_frames": 3,
    },
    "rolling_forcing": {
        "procedure": "rolling_forcing",
        "num_frames": 12,
        "denoising_steps": [1000, 500],
        "local_attn_frames": 9,
    },
}


def latents_sha256(latents: torch.Tensor) -> str:
    """The latents' own bytes (no conversion that could hide a difference)."""
    return hashlib.sha256(latents.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@cache
def _small_model(dtype: torch.dtype):
    return build_model(SMALL, seed=0, dtype=dtype)


def _small_video(
    dtype: torch.dtype,
    setup: str,
    layers: tuple[int, ...] = (),
    fused: bool = False,
    statistics: tuple[str, ...] = FRAME_STAT_NAMES,
):
    model = _small_model(dtype)
    context = torch.randn(1, 7, SMALL.text_dim, generator=torch.Generator().manual_seed(1))
    options = GenerationOptions.from_config(SMALL_OPTIONS[setup])
    if not layers:
        return latents_sha256(generate(model, context, options=options, seed=0).latents), None
    capture = FrameStatsCapture(
        model, layers, frame_seq_length=24, token_profiles="all", fused_attention=fused, statistics=statistics
    )
    with capture:
        result = generate(model, context, options=options, seed=0, observers=[capture])
    assert len(capture.records) == len(layers) * options.num_calls
    return latents_sha256(result.latents), capture


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_capture_leaves_the_video_bit_for_bit(dtype):
    """The captured layers' output is the model's own call, so the latents are the uncaptured
    ones byte for byte, with one layer captured or all."""
    plain, _ = _small_video(dtype, "global")
    for layers in ((1,), (0, 1, 2)):
        captured, capture = _small_video(dtype, "global", layers)
        assert captured == plain and capture.video_exact, layers


@pytest.mark.parametrize(
    "setup, dtype",
    [("deep_sink", torch.float32), ("participative_compression", torch.bfloat16), ("rolling_forcing", torch.float32)],
)
def test_capture_leaves_the_video_bit_for_bit_under_sinks_and_rolling_forcing(setup, dtype):
    """Also where a policy moves keys, drops tokens, or a Rolling Forcing window call gives one
    record per block (the output is still the whole call's)."""
    assert _small_video(dtype, setup, (0, 1, 2))[0] == _small_video(dtype, setup)[0]


def test_the_fused_route_leaves_the_cpu_video_exact(monkeypatch):
    """capture.attention: fused is a CUDA kernel's; on the CPU every call is the model's own."""
    import sinkscope.generation.capture as capture_module

    asked = []
    real = capture_module.fused_route_applies

    def spy(*args, **kwargs):
        asked.append(real(*args, **kwargs))
        return asked[-1]

    monkeypatch.setattr(capture_module, "fused_route_applies", spy)
    captured, capture = _small_video(torch.float32, "global", (0, 2), fused=True)
    assert asked and not any(asked) and capture.video_exact and capture.fused_calls == 0
    assert captured == _small_video(torch.float32, "global")[0]


def test_schedule_matches_self_forcing():
    schedule = FlowMatchSchedule(shift=5.0)
    steps = schedule.denoising_timesteps([1000, 750, 500, 250], warp=True)
    assert steps == pytest.approx([1000.0, 937.5, 833.333, 625.0], abs=1e-3)
    assert schedule.sigma(937.5) == pytest.approx(0.9375, abs=1e-6)
    x, v = torch.ones(2), torch.full((2,), 0.5)
    assert torch.allclose(schedule.to_x0(v, x, 625.0), torch.full((2,), 1 - 0.625 * 0.5))


def test_tables_of_some_kinds_equal_those_of_all():
    """``layer_tables(kinds)`` and ``to_frame`` (frames only, no token values copied) give
    the rows the full tables give."""
    model = build_model("demo", seed=0)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    capture = FrameStatsCapture(model, (1, 3), frame_seq_length=FSL)
    with capture:
        generate(model, context, options=GenerationOptions(num_frames=6), seed=0, observers=[capture])
    full = capture.layer_tables()
    assert all(full[layer]["tokens"] is not None for layer in (1, 3))
    queries = capture.layer_tables(kinds=("queries",))
    assert all(set(queries[layer]) == {"queries"} for layer in (1, 3))
    pd.testing.assert_frame_equal(queries[3]["queries"], full[3]["queries"])
    pd.testing.assert_frame_equal(
        capture.to_frame(), pd.concat([full[1]["frames"], full[3]["frames"]], ignore_index=True)
    )
    with pytest.raises(ValueError, match=r"row kinds \['rows'\] are not among frames, queries, tokens"):
        capture.layer_tables(kinds=("frames", "rows"))


def test_capture_rejects_missing_layers_and_unknown_token_choices():
    model = build_model("demo", seed=0)
    with pytest.raises(ValueError, match=r"layers \[6\] do not exist"):
        FrameStatsCapture(model, [6], frame_seq_length=FSL)
    with pytest.raises(ValueError, match="token_profiles 'some'"):
        FrameStatsCapture(model, [0], frame_seq_length=FSL, token_profiles="some")


@pytest.mark.parametrize("fused", [False, True])
def test_capture_asks_for_the_attention_route_it_was_given(monkeypatch, fused):
    """capture.attention reaches every captured call: fused asks whether its kernel applies
    (on CUDA it takes the one-pass Triton kernel; here it does not), exact takes the model's own call."""
    import sinkscope.generation.capture as capture_module

    asked, own_calls = [], []
    real_applies, real_attention = capture_module.fused_route_applies, capture_module.cached_attention

    def applies(*args, **kwargs):
        asked.append(True)
        return real_applies(*args, **kwargs)

    def own(*args, **kwargs):
        own_calls.append(kwargs["split"])
        return real_attention(*args, **kwargs)

    monkeypatch.setattr(capture_module, "fused_route_applies", applies)
    monkeypatch.setattr(capture_module, "cached_attention", own)
    model = _small_model(torch.float32)
    context = torch.randn(1, 7, SMALL.text_dim, generator=torch.Generator().manual_seed(1))
    capture = FrameStatsCapture(model, [1], frame_seq_length=FSL, token_profiles="none", fused_attention=fused)
    with capture:
        result = generate(
            model, context, options=GenerationOptions.from_config(SMALL_OPTIONS["global"]), seed=0, observers=[capture]
        )
    assert bool(asked) == fused and len(asked) == (len(result.calls) if fused else 0)
    assert len(own_calls) == len(result.calls) and set(own_calls) == {model.kernels.key_split}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("policy", ["global", "participative_compression"])
def test_cuda_capture_matches_cpu_in_float32(monkeypatch, policy):
    # cuDNN convolutions default to TF32 on the GPU (the patch embedding); ask for fp32.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    extra = dict(local_attn_frames=8, sink_frames=2, budget_frames=6, recent_frames=3) if policy != "global" else {}
    options = GenerationOptions.from_config({"num_frames": 12, "cache_policy": policy, **extra})
    cpu, _, cpu_result = run(options, device="cpu")
    gpu, _, gpu_result = run(options, device="cuda")
    torch.testing.assert_close(gpu_result.latents.cpu(), cpu_result.latents, rtol=1e-3, atol=1e-3)
    # The captured layers' output is the model's own call: the video is the uncaptured one, bit for bit.
    model = build_model("demo", seed=0, device="cuda")
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1)).cuda()
    plain = generate(model, context, options=options, seed=0)
    assert torch.equal(gpu_result.latents, plain.latents)
    for kind, names in (
        ("frames", ("logit_mean", "prob_mass")),
        ("tokens", ("token_logit_mean", "token_prob_mean")),
        ("queries", ("entropy_tokens",)),
    ):
        for name in names:
            a, b = (
                token_values(t[4][kind])[int(name == "token_prob_mean")]
                if kind == "tokens"
                else t[4][kind][name].to_numpy()
                for t in (gpu, cpu)
            )
            # Token values are stored at float16 precision relative to their frame: a value
            # near a rounding boundary may land one step (2**-10 of the row's spread) apart.
            atol = 1e-4 + (2**-9 * float(np.nanmax(np.abs(b))) if kind == "tokens" else 0.0)
            assert a.shape == b.shape and np.allclose(a, b, rtol=1e-3, atol=atol, equal_nan=True), (kind, name)


def _module_settings(*modules) -> dict[str, object]:
    """Every plain value a module holds at its top level (where a process-wide switch would live)."""
    return {
        f"{m.__name__}.{name}": value
        for m in modules
        for name, value in vars(m).items()
        if isinstance(value, (bool, int, float, str)) and not name.startswith("__")
    }


def test_two_generations_with_different_kernels_each_run_their_own(monkeypatch):
    """capture.kernels is a field of the model, handed to every call: two models in one
    process, one fast and one reference, each compute what they were given."""
    from sinkscope.attention import split
    from sinkscope.attention.settings import KernelSettings
    from sinkscope.model import wan

    seen = []
    real_attention, real_ffn = wan.balanced_attention, wan.feed_forward

    def attention(*args, split, kernel):
        seen.extend((("split", split), ("kernel", kernel)))
        return real_attention(*args, split=split, kernel=kernel)

    def ffn(block_ffn, h, fused_gelu):
        seen.append(("gelu", fused_gelu))
        return real_ffn(block_ffn, h, fused_gelu)

    monkeypatch.setattr(wan, "balanced_attention", attention)
    monkeypatch.setattr(wan, "feed_forward", ffn)
    before = _module_settings(wan, split)
    context = torch.randn(1, 7, SMALL.text_dim, generator=torch.Generator().manual_seed(1))
    options = GenerationOptions.from_config({"num_frames": 3, "denoising_steps": [1000]})
    for name, kernel in (("reference", "cudnn"), ("fast", "auto"), ("reference", "auto")):
        model = build_model(SMALL, seed=0)
        model.kernels = dataclasses.replace(KernelSettings.named(name), attention_kernel=kernel)
        seen.clear()
        generate(model, context, options=options, seed=0)
        expected = {("split", name == "fast"), ("gelu", name == "fast"), ("kernel", kernel)}
        assert seen and set(seen) == expected, name
    assert _module_settings(wan, split) == before
    assert not any(hasattr(wan, old) for old in ("_FUSED_GELU", "use_fast_kernels", "enable_fused_gelu"))


@pytest.mark.slow
def test_two_extraction_jobs_with_different_kernels_in_one_process(tmp_path, monkeypatch):
    """extract_job hands capture.kernels to the model it loads; the next job in the same process
    gets its own setting, and each manifest names its route and whether its video is exact."""
    import json

    from sinkscope.cli import main
    from sinkscope.generation import sampler

    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "config.yaml").write_text((repo / "config.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    seen = []
    real = sampler.generate

    def spy(model, *args, **kwargs):
        seen.append(model.kernels)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(sampler, "generate", spy)
    for name in ("reference", "fast"):
        settings = ("generation.num_frames=3", "generation.denoising_steps=[1000]", f"capture.kernels={name}")
        assert (
            main(["extract", "--out", f"ext-{name}", "--layers", "0", *(x for s in settings for x in ("--set", s))])
            == 0
        )
        contents = json.loads((tmp_path / f"ext-{name}" / "manifest.json").read_text())["contents"]
        assert contents["capture_route"] == {
            "attention": "exact",
            "statistics": ["logit_mean", "prob_mass", "argmax_share", "entropy"],
            "kernels": name,
            "attention_kernel": "sdpa",  # the CPU's
            "cuda_graphs": True,
            "video_exact": True,
            "one_pass": False,  # FlashAttention-4's one pass is for CUDA
        }
    assert [settings.name for settings in seen] == ["reference", "fast"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kernels", ["fast", "reference"])
def test_cuda_capture_leaves_the_bf16_video_bit_for_bit(kernels):
    """On CUDA in bf16 the exact route's output is the model's own cuDNN call (with its
    log-sum-exp, under either kernel setting): the latents equal the uncaptured ones."""
    from sinkscope.attention.settings import KernelSettings

    model = build_model("demo", seed=0, device="cuda", dtype=torch.bfloat16)
    model.kernels = KernelSettings.named(kernels)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1)).cuda()
    options = GenerationOptions.from_config(
        {"num_frames": 9, "cache_policy": "deep_sink", "local_attn_frames": 4, "sink_frames": 1}
    )
    plain = generate(model, context, options=options, seed=0).latents
    for layers in ((2,), tuple(range(model.config.num_layers))):
        capture = FrameStatsCapture(model, layers, frame_seq_length=FSL, token_profiles="all")
        with capture:
            captured = generate(model, context, options=options, seed=0, observers=[capture]).latents
        assert torch.equal(captured, plain) and capture.video_exact, layers
        assert len(capture.layer_tables()[layers[0]]["frames"]) > 0
