"""The ``frames`` capture route (each key frame attended apart, merged by log-sum-exps) and
``capture.statistics``: against the float64 brute force on the CPU, in a generation, in the
config; the CUDA tests (``-m gpu``) at real sizes against the CPU reference."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from test_stats import CUDA_LAYOUTS, LAYOUTS, brute_force_statistics, layout_inputs, make_inputs

from sinkscope.errors import ConfigError
from sinkscope.generation.capture import FrameStatsCapture
from sinkscope.generation.sampler import generate
from sinkscope.model import build_model
from sinkscope.options import GenerationOptions
from sinkscope.pipeline.config import normalize_config
from sinkscope.pipeline.integrity import check_layer_rows
from sinkscope.pipeline.study import Study
from sinkscope.stats.attention import attention_statistics, attention_with_statistics, triton_available
from sinkscope.stats.segments import FRAME_STATISTICS, frame_attention, frame_runs

FRAMES = ["logit_mean", "prob_mass"]


def _layout(lay):
    return dict(
        frame_seq_length=lay["fsl"],
        query_frames=list(range(50, 50 + lay["num_q"])),
        key_frames=lay["key_frames"],
        key_lengths=lay["key_lengths"],
    )


def _values(k, seed):
    return torch.randn(k.shape, generator=torch.Generator().manual_seed(seed)).to(k.dtype)


def test_frame_runs_group_consecutive_frames_of_one_length():
    assert frame_runs([12, 12, 5, 1, 12, 12, 12]) == [(0, 0, 2, 12), (24, 2, 1, 5), (29, 3, 1, 1), (30, 4, 3, 12)]
    assert frame_runs([7]) == [(0, 0, 1, 7)]


@pytest.mark.parametrize("index", range(len(LAYOUTS)))
def test_frame_attention_matches_float64_attention_and_each_frames_log_sum_exp(index):
    lay, q, k = layout_inputs(index)
    v = _values(k, index)
    out, frame_lse, lse = frame_attention(q, k, v, lay["key_lengths"])
    scores = torch.einsum("hqd,hkd->hqk", q.double(), k.double()) * lay["dim"] ** -0.5
    expected = (torch.softmax(scores, dim=-1) @ v.double()).transpose(0, 1)
    assert out.shape == expected.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, dim=-1), rtol=1e-6, atol=1e-5)
    starts = np.cumsum([0, *lay["key_lengths"]])
    for f, (a, b) in enumerate(zip(starts[:-1], starts[1:])):
        torch.testing.assert_close(
            frame_lse[f].double(), torch.logsumexp(scores[..., a:b], dim=-1), rtol=1e-6, atol=1e-5
        )


@pytest.mark.parametrize("index", range(len(LAYOUTS)))
def test_the_frames_route_gives_logit_mean_and_prob_mass_of_the_float64_brute_force(index):
    """prob_mass from the frames' log-sum-exps and logit_mean from their mean q and k equal the
    brute force to float32 rounding; argmax_share and entropy are NaN; token profiles too."""
    lay, q, k = layout_inputs(index)
    v = _values(k, index)
    out, stats = attention_with_statistics(q, k, v, frames=True, statistics=FRAMES, token_profiles=True, **_layout(lay))
    ref = brute_force_statistics(q, k, lay["fsl"], lay["num_q"], lay["key_lengths"], lay["dim"] ** -0.5)
    torch.testing.assert_close(stats.prob_mass.double(), ref["prob_mass"], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(stats.logit_mean.double(), ref["logit_mean"], rtol=1e-5, atol=1e-5)
    for name in ("token_logit_mean", "token_prob_mean"):
        torch.testing.assert_close(getattr(stats, name).double(), ref[name], rtol=1e-4, atol=1e-5, msg=name)
    assert stats.argmax_share.isnan().all() and stats.entropy.isnan().all()
    assert stats.entropy.shape == ref["entropy"].shape and stats.argmax_share.shape == ref["argmax_share"].shape
    torch.testing.assert_close(stats.prob_mass.double().sum(-1), torch.ones_like(ref["entropy"]), rtol=0, atol=1e-5)
    scores = torch.einsum("hqd,hkd->hqk", q.double(), k.double()) * lay["dim"] ** -0.5
    expected = (torch.softmax(scores, dim=-1) @ v.double()).transpose(0, 1)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chosen", [["logit_mean"], ["prob_mass", "entropy"], ["argmax_share"]])
def test_statistics_not_chosen_are_nan_and_the_chosen_ones_unchanged(chosen):
    lay, q, k = layout_inputs(0)
    full = attention_statistics(q, k, **_layout(lay))
    some = attention_statistics(q, k, statistics=chosen, **_layout(lay))
    for name in FRAME_STATISTICS:
        got = getattr(some, name)
        if name in chosen:
            assert torch.equal(got, getattr(full, name)), name
        else:
            assert got.shape == getattr(full, name).shape and got.isnan().all(), name


def test_bad_statistics_and_routes_are_named():
    lay, q, k = layout_inputs(0)
    v = _values(k, 0)
    for bad in ([], ["logit_mean", "logit_mean"], ["top_k"], "prob_mass"):
        with pytest.raises(ValueError, match="statistics"):
            attention_statistics(q, k, statistics=bad, **_layout(lay))
    with pytest.raises(ValueError, match="the frames route gives logit_mean and prob_mass only"):
        attention_with_statistics(q, k, v, frames=True, **_layout(lay))
    model = build_model("demo", seed=0)
    with pytest.raises(ValueError, match="the frames route gives logit_mean and prob_mass only"):
        FrameStatsCapture(model, [0], frame_seq_length=24, attention="frames")
    with pytest.raises(ValueError, match="attention 'fast' is not one of exact, fused, frames"):
        FrameStatsCapture(model, [0], frame_seq_length=24, attention="fast")


def _demo_video(setup: dict, **capture):
    model = build_model("demo", seed=0)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    options = GenerationOptions.from_config(setup)
    if not capture:
        return generate(model, context, options=options, seed=0).latents, None, options
    recorder = FrameStatsCapture(model, (0, 2), frame_seq_length=24, token_profiles="last_block", **capture)
    with recorder:
        result = generate(model, context, options=options, seed=0, observers=[recorder])
    return result.latents, recorder, options


@pytest.mark.parametrize(
    "setup",
    [
        {"num_frames": 9},
        {
            "num_frames": 9,
            "cache_policy": "participative_compression",
            "local_attn_frames": 6,
            "sink_frames": 1,
            "budget_frames": 5,
            "recent_frames": 3,
        },
    ],
    ids=["global", "participative_compression"],
)
def test_a_generation_captured_by_frames_gives_the_exact_routes_rows(setup):
    """The frames route's rows equal the exact route's (prob_mass to float32 rounding,
    logit_mean bit for bit), its video the uncaptured one's within rounding (not bit for bit:
    video_exact is False), argmax_share and entropy NaN; also where a policy drops tokens."""
    plain, _, options = _demo_video(setup)
    exact_latents, exact, _ = _demo_video(setup, attention="exact")
    latents, frames, _ = _demo_video(setup, attention="frames", statistics=FRAMES)
    assert exact.video_exact and not frames.video_exact
    assert frames.frame_calls == options.num_calls * 2 and frames.fused_calls == 0
    assert torch.equal(exact_latents, plain)
    assert (latents - plain).norm() <= 1e-4 * plain.norm()
    ours, theirs = frames.layer_tables(), exact.layer_tables()
    for layer in (0, 2):
        got, ref = ours[layer]["frames"], theirs[layer]["frames"]
        assert len(got) == len(ref)
        np.testing.assert_allclose(got["prob_mass"], ref["prob_mass"], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got["logit_mean"], ref["logit_mean"], rtol=1e-5, atol=1e-5)
        assert got["argmax_share"].isna().all() and ours[layer]["queries"]["entropy_tokens"].isna().all()
        check_layer_rows(got, layer=layer, calls=options.num_calls, heads=12, where="test")
        tokens, ref_tokens = ours[layer]["tokens"], theirs[layer]["tokens"]
        np.testing.assert_allclose(tokens["frame_prob_mass"], ref_tokens["frame_prob_mass"], rtol=1e-3, atol=1e-5)


def test_the_exact_route_with_logit_mean_alone_keeps_the_video_and_the_values():
    setup = {"num_frames": 9}
    plain, _, options = _demo_video(setup)
    latents, some, _ = _demo_video(setup, statistics=["logit_mean"])
    _, every, _ = _demo_video(setup, attention="exact")
    assert torch.equal(latents, plain) and some.video_exact
    got, ref = some.layer_tables()[0]["frames"], every.layer_tables()[0]["frames"]
    np.testing.assert_array_equal(got["logit_mean"], ref["logit_mean"])
    assert got[["prob_mass", "argmax_share"]].isna().all().all()
    check_layer_rows(got, layer=0, calls=options.num_calls, heads=12, where="test")


def test_rows_with_a_statistic_half_missing_are_damaged():
    setup = {"num_frames": 6}
    _, recorder, options = _demo_video(setup, attention="frames", statistics=FRAMES)
    frames = recorder.layer_tables()[0]["frames"]
    damaged = frames.copy()
    damaged.loc[damaged.index[:3], "prob_mass"] = np.nan
    with pytest.raises(Exception, match="non-finite"):
        check_layer_rows(damaged, layer=0, calls=options.num_calls, heads=12, where="test")
    skewed = frames.copy()
    skewed["prob_mass"] = skewed["prob_mass"] * 1.01
    with pytest.raises(Exception, match="sums to 1"):
        check_layer_rows(skewed, layer=0, calls=options.num_calls, heads=12, where="test")


def test_capture_statistics_default_to_all_and_the_frames_route_takes_two():
    assert normalize_config({})["capture"]["statistics"] == list(FRAME_STATISTICS)
    with pytest.raises(ConfigError, match="capture.statistics"):
        normalize_config({"capture": {"statistics": ["top_k"]}})
    with pytest.raises(ConfigError, match="capture.statistics"):
        normalize_config({"capture": {"statistics": []}})
    with pytest.raises(ConfigError, match=r"capture.statistics: .* asks for argmax_share, entropy, which capture"):
        normalize_config({"capture": {"attention": "frames"}})
    config = normalize_config({"capture": {"attention": "frames", "statistics": FRAMES}})
    study = Study(config)
    capture = study.extract_params(next(iter(study.runs)), "0")["capture"]
    assert capture["attention"] == "frames" and capture["statistics"] == FRAMES
    # A study of every statistic keeps the job parameters it had (no rerun of its extractions).
    default = Study(normalize_config({}))
    assert "statistics" not in default.extract_params(next(iter(default.runs)), "0")["capture"]


def test_cuda_graphs_default_on_and_only_turning_them_off_is_a_job_param():
    from sinkscope.attention.settings import KernelSettings

    assert normalize_config({})["capture"]["cuda_graphs"] is True
    with pytest.raises(ConfigError, match="capture.cuda_graphs"):
        normalize_config({"capture": {"cuda_graphs": "sometimes"}})
    default = Study(normalize_config({}))
    capture = default.extract_params(next(iter(default.runs)), "0")["capture"]
    assert "cuda_graphs" not in capture  # the same video either way: default jobs keep their params
    assert KernelSettings.from_capture(capture) == KernelSettings()
    off = Study(normalize_config({"capture": {"cuda_graphs": False, "kernels": "reference"}}))
    capture = off.extract_params(next(iter(off.runs)), "0")["capture"]
    assert capture["cuda_graphs"] is False
    settings = KernelSettings.from_capture(capture)
    assert not settings.cuda_graphs and settings.name == "reference"


def test_the_config_names_the_statistics_the_package_computes():
    """pipeline.config keeps its own copy of the names (it imports no torch): the same names."""
    from sinkscope.pipeline import config
    from sinkscope.stats import segments

    assert config.CAPTURE_STATISTICS == segments.FRAME_STATISTICS
    assert config.FRAMES_ROUTE_STATISTICS == segments.FRAMES_ROUTE_STATISTICS


def test_merged_rows_of_a_frames_capture_pass_the_table_frame():
    """The rows' frames hold NaN for what was left out, and pandas keeps them as floats."""
    _, recorder, _ = _demo_video({"num_frames": 6}, attention="frames", statistics=["prob_mass"])
    frames = recorder.to_frame()
    assert frames["logit_mean"].isna().all() and frames["prob_mass"].notna().all()
    assert isinstance(frames, pd.DataFrame) and frames["argmax_share"].dtype == np.float32


@pytest.mark.gpu
@pytest.mark.skipif(not triton_available(), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("index", range(len(CUDA_LAYOUTS)))
def test_cuda_frames_route_matches_the_reference_and_sdpa(index):
    """On CUDA (cuDNN over the frames, the Triton merge): prob_mass and logit_mean are the CPU
    reference's to float32 rounding, the output SDPA's within its own rounding."""
    lay = CUDA_LAYOUTS[index]
    q, k = make_inputs(index, lay["heads"], lay["fsl"], lay["dim"], lay["num_q"], lay["key_lengths"], torch.bfloat16)
    v = _values(k, index)
    q, k, v = q.cuda(), k.cuda(), v.cuda()
    kwargs = dict(_layout(lay), token_profiles=True)
    out, stats = attention_with_statistics(q, k, v, frames=True, statistics=FRAMES, **kwargs)
    cpu = attention_statistics(q.cpu(), k.cpu(), backend="torch", **kwargs)
    torch.testing.assert_close(stats.prob_mass.cpu(), cpu.prob_mass, rtol=1e-4, atol=2e-6)
    torch.testing.assert_close(stats.logit_mean.cpu(), cpu.logit_mean, rtol=1e-4, atol=5e-5)
    torch.testing.assert_close(stats.token_prob_mean.cpu(), cpu.token_prob_mean, rtol=1e-4, atol=2e-6)
    assert stats.argmax_share.isnan().all() and stats.entropy.isnan().all()
    scale = lay["dim"] ** -0.5
    exact = (torch.softmax(q.double() @ k.double().transpose(1, 2) * scale, dim=-1) @ v.double()).transpose(0, 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(0, 1)
    ours_error = (out.double() - exact).abs().max().item()
    sdpa_error = (sdpa.double() - exact).abs().max().item()
    assert out.dtype == torch.bfloat16 and ours_error <= 2 * sdpa_error + 2**-9, (ours_error, sdpa_error)
    logit_only = attention_statistics(q, k, statistics=["logit_mean"], **kwargs)
    torch.testing.assert_close(logit_only.logit_mean.cpu(), cpu.logit_mean, rtol=1e-4, atol=5e-5)
    assert math.isnan(logit_only.prob_mass[0, 0, 0].item())


@pytest.mark.slow
def test_an_extraction_job_by_the_frames_route_writes_nan_for_what_it_leaves_out(tmp_path, monkeypatch):
    """``sinkscope extract`` with capture.attention frames: the rows pass the job's checks with
    argmax_share and entropy NaN, and the manifest names the route, its statistics and that
    the video is not the uncaptured one bit for bit."""
    import json
    from pathlib import Path

    from sinkscope.cli import main
    from sinkscope.naming import layer_file
    from sinkscope.tables import read_table

    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "config.yaml").write_text((repo / "config.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    settings = (
        "generation.num_frames=3",
        "generation.denoising_steps=[1000]",
        "capture.attention=frames",
        "capture.statistics=[logit_mean, prob_mass]",
    )
    assert main(["extract", "--out", "ext", "--layers", "0", *(x for s in settings for x in ("--set", s))]) == 0
    contents = json.loads((tmp_path / "ext" / "manifest.json").read_text())["contents"]
    assert contents["capture_route"] == {
        "attention": "frames",
        "statistics": FRAMES,
        "kernels": "fast",
        "attention_kernel": "sdpa",  # the CPU's
        "cuda_graphs": True,
        "video_exact": False,
        "one_pass": False,
    }
    frames = read_table(layer_file(tmp_path / "ext", 0))
    queries = read_table(layer_file(tmp_path / "ext", 0, "queries"))
    assert frames["argmax_share"].isna().all() and frames["prob_mass"].notna().all()
    assert queries["entropy_tokens"].isna().all()
    sums = frames.groupby(["block", "pass", "step", "head", "query_frame"], observed=True)["prob_mass"].sum()
    assert (sums - 1).abs().max() < 1e-5


@pytest.mark.slow
@pytest.mark.workflow
def test_a_study_by_the_frames_route_runs_to_its_tables_and_figures(workflow):
    """The whole DAG with capture.attention frames: the tables hold NaN where the route gives
    nothing, the figures and summaries are drawn from the rest."""
    workflow.write_config(
        {
            "layers": [0],
            "generation": {"num_frames": 6},
            "capture": {"attention": "frames", "statistics": FRAMES},
        }
    )
    workflow.run()
    frame = pd.read_parquet(workflow.path("results/tables/frame_attention.parquet"))
    assert frame["argmax_share"].isna().all() and frame["prob_mass"].notna().all()
    sums = frame.groupby(["layer", "block", "pass", "step", "head", "query_frame"], observed=True)["prob_mass"].sum()
    assert ((sums - 1).abs() < 1e-5).all()
