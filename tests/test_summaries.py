"""The derived tables (sinkscope.stats.summaries) against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from synthetic import synthetic_rows

from sinkscope.stats.summaries import (
    HEAD_CLASSES,
    HEAD_LABELS,
    base_class,
    block_stats,
    classify_head,
    curve_stats,
    dominant_period,
    figure4_curves,
    head_class_grid,
    head_diagnostics,
    head_stats,
    is_borderline,
    layer_stats,
    resolve_step,
    uniform_mass,
)


def test_cache_frames_own_frames_and_sink_score_by_hand():
    values, frames = np.array([4.0, 1.0, 2.0, 3.0, 9.0, 8.0]), np.array([0, 1, 2, 3, 4, 5])
    stats = curve_stats(values, frames, query_frames=[4, 5], metric="logit_mean")
    assert (stats["first"], stats["middle"], stats["last"], stats["own"]) == (4.0, 1.5, 3.0, 8.5)
    assert (stats["first_frame"], stats["last_frame"], stats["argmax_frame"]) == (0, 3, 4)
    assert stats["sink_score"] == 2.5
    # Ratios and shares mean nothing on signed logits: null.
    for name in ("first_middle_ratio", "spread_pct", "frame0_mass", "first_k_mass", "cache_share", "own_share"):
        assert math.isnan(stats[name]), name


def test_shares_and_ratios_of_softmax_mass_by_hand():
    mass, frames = np.array([0.4, 0.1, 0.1, 0.1, 0.2, 0.1]), np.arange(6)
    stats = curve_stats(mass, frames, query_frames=[4, 5], metric="prob_mass", first_k=2)
    assert stats["frame0_mass"] == pytest.approx(0.4) and stats["first_k_mass"] == pytest.approx(0.5)
    assert stats["cache_share"] == pytest.approx(0.7) and stats["own_share"] == pytest.approx(0.3)
    assert stats["first_middle_ratio"] == pytest.approx(4.0)
    assert stats["spread_pct"] == pytest.approx((0.4 - 0.1) / 0.175 * 100)


def test_gaps_and_zero_denominators_give_nan_not_errors():
    # A window evicted frames 1-4: first is frame 0, the middle frames 5-6, last frame 7.
    values = np.array([0.5, np.nan, np.nan, np.nan, np.nan, 0.0, 0.0, 0.2, 0.3])
    stats = curve_stats(values, np.arange(9), query_frames=[8], metric="prob_mass")
    assert (stats["first_frame"], stats["last_frame"], stats["num_key_frames"]) == (0, 7, 5)
    assert math.isnan(stats["first_middle_ratio"])  # middle is 0
    evicted = curve_stats(np.array([np.nan, 0.6, 0.4]), np.arange(3), query_frames=[2], metric="prob_mass")
    assert math.isnan(evicted["frame0_mass"]) and evicted["first_frame"] == 1
    assert curve_stats(np.array([]), np.array([]), [], "prob_mass")["num_key_frames"] == 0


def test_head_stats_per_run_and_of_the_run_averaged_curve():
    rows = synthetic_rows(prompts=("a", "b"), seeds=(0, 3))
    heads = head_stats(rows)
    # 4 runs + the average, x 2 heads x 3 calls of the last block x 2 metrics.
    assert len(heads) == 5 * 2 * 3 * 2
    one = heads[
        (heads["prompt_id"] == "b")
        & (heads["seed"] == 3)
        & (heads["head"] == 1)
        & (heads["pass"] == "denoise")
        & (heads["step"] == 1)
        & (heads["metric"] == "logit_mean")
    ]
    last = rows[
        (rows["prompt_id"] == "b")
        & (rows["seed"] == 3)
        & (rows["block"] == 2)
        & (rows["head"] == 1)
        & (rows["pass"] == "denoise")
        & (rows["step"] == 1)
    ]
    curve = last.groupby("key_frame")["logit_mean"].mean()
    assert one["first"].item() == pytest.approx(curve[0])
    assert one["middle"].item() == pytest.approx(curve[1:5].mean())  # cache frames 1..4
    assert one["last"].item() == pytest.approx(curve[5])
    assert one["own"].item() == pytest.approx(curve[6:].mean())
    assert one["query_frames"].item() == "6,7,8" and one["runs"].item() == 1
    averaged = heads[
        (heads["prompt_id"] == "*")
        & (heads["seed"] == -1)
        & (heads["head"] == 1)
        & (heads["pass"] == "denoise")
        & (heads["step"] == 1)
        & (heads["metric"] == "prob_mass")
    ]
    all_runs = rows[(rows["block"] == 2) & (rows["head"] == 1) & (rows["pass"] == "denoise") & (rows["step"] == 1)]
    mean_curve = all_runs.groupby("key_frame")["prob_mass"].mean()
    # The average is taken of the curve, then the statistic: not a mean of per-run ratios.
    assert averaged["runs"].item() == 4
    assert averaged["first_middle_ratio"].item() == pytest.approx(mean_curve[0] / mean_curve[1:5].mean())
    curves, info = figure4_curves(rows, "last", "prob_mass")
    assert info["runs"] == 4 and curves.loc[(3, 1)].to_numpy() == pytest.approx(mean_curve.to_numpy())


def test_layer_stats_match_a_hand_computation():
    rows = synthetic_rows()
    layers = layer_stats(rows)
    row = layers[(layers["pass"] == "cache") & (layers["metric"] == "prob_mass") & (layers["prompt_id"] == "p")]
    cache = rows[rows["pass"] == "cache"]
    averaged = cache.groupby(["query_frame", "key_frame"])["prob_mass"].mean()
    assert row["diagonal_mean"].item() == pytest.approx(np.mean([averaged[(f, f)] for f in range(9)]))
    assert row["first_column_mean"].item() == pytest.approx(np.mean([averaged[(f, 0)] for f in range(9)]))
    head_avg = cache[cache["block"] == 2].groupby("key_frame")["prob_mass"].mean()
    assert row["sink_score"].item() == pytest.approx(head_avg[0] - head_avg[1:5].mean())
    assert row["cache_share"].item() == pytest.approx(head_avg[:6].sum())


def test_resolve_step_options():
    rows = synthetic_rows()
    assert resolve_step(rows, "last") == ("denoise", 1)
    assert resolve_step(rows, "cache") == ("cache", 2)
    assert resolve_step(rows, 0) == ("denoise", 0)
    imported = rows[rows["pass"] == "denoise"].assign(step=-1)
    for option in ("last", "cache", 1):
        assert resolve_step(imported, option) == ("denoise", -1)


def test_block_stats_split_the_mass_into_sink_self_and_other():
    rows = synthetic_rows(blocks=(3, 3, 3, 3, 3), window=7, sink=2)
    stats = block_stats(rows, sink_frames=2)
    assert np.allclose(stats["sink_mass"] + stats["self_mass"] + stats["other_mass"], 1)
    one = stats[
        (stats["block"] == 4) & (stats["head"] == 0) & (stats["pass"] == "denoise") & (stats["step"] == 0)
    ].iloc[0]
    call = rows[(rows["block"] == 4) & (rows["head"] == 0) & (rows["pass"] == "denoise") & (rows["step"] == 0)]
    curve = call.groupby("key_frame")["prob_mass"].mean()
    assert one["sink_mass"] == pytest.approx(curve[[0, 1]].sum())
    assert one["self_mass"] == pytest.approx(curve[[12, 13, 14]].sum())
    assert one["num_key_frames"] == 7 and one["sink_frames"] == "0-1" and one["query_frames"] == "12-14"
    p = curve.to_numpy()
    assert one["entropy"] == pytest.approx(-(p * np.log(p)).sum())
    assert one["argmax_frame"] == curve.idxmax() and one["argmax_age"] == max(0, 12 - curve.idxmax())
    # Without sink frames, frame 0 is the sink; block 0's own frames are not counted twice.
    plain = block_stats(rows, sink_frames=0)
    first = plain[plain["block"] == 0]
    assert (first["sink_mass"] == 0).all() and plain["sink_frames"].eq("0").all()


def test_dominant_period_finds_a_planted_period():
    frames = np.arange(24)
    period, power = dominant_period(np.cos(2 * np.pi * frames / 6) + 0.05 * np.sin(frames))
    assert period == pytest.approx(6) and power > 0.9
    assert all(math.isnan(v) for v in dominant_period([1.0, 2.0]))
    assert all(math.isnan(v) for v in dominant_period(np.ones(10)))


def test_head_classes_follow_the_thresholds_and_the_interval_between_runs():
    thresholds = {"sink_ratio": 5.0, "local_ratio": 2.5, "periodic_power": 0.5}
    base = {"frame0_ratio": 1.0, "recent_ratio": 1.0, "period": 6.0, "period_power": 0.2}
    one_run = {"frame0_ratio_run_std": float("nan"), "recent_ratio_run_std": float("nan")}

    def klass(**row):
        return classify_head({**base, **one_run, **row}, thresholds, 21)

    assert klass(frame0_ratio=6.0, frame0_ratio_run_std=0.5) == "sink"  # 5.5..6.5: every run a sink
    assert klass(frame0_ratio=5.3, frame0_ratio_run_std=0.5) == "sink?"  # 4.8..5.8 holds 5
    assert klass(frame0_ratio=4.8, frame0_ratio_run_std=0.5, recent_ratio=4.0) == "sink?"  # below, but not clearly
    assert klass(frame0_ratio=4.4, frame0_ratio_run_std=0.5, recent_ratio=4.0) == "local"  # 3.9..4.9: not a sink
    assert klass(frame0_ratio=5.0, frame0_ratio_run_std=0.0) == "sink"  # the threshold itself is in
    assert klass(frame0_ratio=5.3) == klass(frame0_ratio=5.0) == "sink"  # one run: the value alone, no '?'
    assert klass(frame0_ratio=4.99, recent_ratio=2.4) == "diffuse"
    assert klass(frame0_ratio=float("nan"), frame0_ratio_run_std=float("nan")) == "diffuse"  # frame 0 evicted
    assert klass(recent_ratio=2.6, recent_ratio_run_std=0.3) == "local?"
    assert klass(recent_ratio=3.0, recent_ratio_run_std=0.3) == "local"
    assert klass(period_power=0.7) == "periodic"
    assert klass(period_power=0.7, period=21.0) == "diffuse"
    assert klass() == "diffuse"
    assert is_borderline("sink?") and not is_borderline("sink") and base_class("local?") == "local"
    assert [label for label in HEAD_LABELS if not is_borderline(label)] == list(HEAD_CLASSES)


def _three_seeds_with_planted_ratios() -> pd.DataFrame:
    """21 frames, last block 18-20; per seed, head 0 puts 7, 8, 9x uniform on frame 0
    (a sink in every run), head 1 4, 5.5, 6.5x (mean 5.33 ± 1.26: straddles 5), head 2
    2.0, 2.6, 3.2x uniform on the block and frame 17 (mean 2.6 ± 0.6: straddles 2.5)."""
    rows = synthetic_rows(blocks=(3,) * 7, heads=3, steps=1, seeds=(0, 1, 2))
    last = rows["block"] == 6
    recent = rows["key_frame"] >= 17
    planted = {0: (7.0, 8.0, 9.0), 1: (4.0, 5.5, 6.5)}
    for head, ratios in planted.items():
        for seed, ratio in enumerate(ratios):
            chosen = last & (rows["head"] == head) & (rows["seed"] == seed)
            rows.loc[chosen, "prob_mass"] = (1 - ratio / 21) / 20
            rows.loc[chosen & (rows["key_frame"] == 0), "prob_mass"] = ratio / 21
    for seed, ratio in enumerate((2.0, 2.6, 3.2)):
        chosen = last & (rows["head"] == 2) & (rows["seed"] == seed)
        rows.loc[chosen, "prob_mass"] = (1 - ratio * 4 / 21) / 17
        rows.loc[chosen & recent, "prob_mass"] = ratio / 21
    return rows


def test_head_classes_are_decided_on_the_ratio_to_uniform_over_the_runs_together():
    rows = _three_seeds_with_planted_ratios()
    diagnostics = head_diagnostics(rows, thresholds={"sink_ratio": 5.0, "local_ratio": 2.5})
    call = diagnostics[diagnostics["pass"] == "denoise"].set_index("head")
    # Brute force: each run's mass on frame 0 (recent frames) over its uniform share, 1/21 (4/21) here.
    last = rows[(rows["block"] == 6) & (rows["pass"] == "denoise")]
    per_run = last.assign(
        frame0=last["prob_mass"].where(last["key_frame"] == 0, 0.0) * 21,
        recent=last["prob_mass"].where(last["key_frame"] >= 17, 0.0) * 21 / 4,
    )
    per_run = (
        per_run.groupby(["head", "seed", "query_frame"])[["frame0", "recent"]].sum().groupby(["head", "seed"]).mean()
    )
    for head in range(3):
        ratios = per_run.loc[head]
        assert call.loc[head, "frame0_ratio"] == pytest.approx(ratios["frame0"].mean())
        assert call.loc[head, "frame0_ratio_run_std"] == pytest.approx(ratios["frame0"].std(ddof=1))
        assert call.loc[head, "recent_ratio"] == pytest.approx(ratios["recent"].mean())
        assert call.loc[head, "recent_ratio_run_std"] == pytest.approx(ratios["recent"].std(ddof=1))
    assert np.allclose(call["recent_uniform"], 4 / 21) and (call["runs"] == 3).all()
    assert call.loc[0, "frame0_ratio"] == pytest.approx(8.0)
    assert list(call["head_class"]) == ["sink", "sink?", "local?"]
    assert list(call["borderline"]) == [False, True, True]
    assert head_class_grid(diagnostics).loc["L4", "H2"] == "sink?"
    # Head 0's runs, 7..9x: a threshold inside them makes it borderline, one above them not a sink.
    head0 = call.loc[0].to_dict()
    for ratio, expected in ((8.5, "sink?"), (9.5, "diffuse")):
        label = classify_head(
            {**head0, "period_power": 0.0}, {"sink_ratio": ratio, "local_ratio": 2.5, "periodic_power": 0.5}, 21
        )
        assert label == expected
    # One run: no interval, so no borderline label; seed 0 of head 1 is 4x uniform: not a sink.
    alone = head_diagnostics(rows[rows["seed"] == 0], thresholds={"sink_ratio": 5.0, "local_ratio": 2.5})
    alone = alone[alone["pass"] == "denoise"].set_index("head")
    assert alone.loc[0, "head_class"] == "sink" and set(alone.loc[[1, 2], "head_class"]) <= {"periodic", "diffuse"}
    assert not alone["borderline"].any() and alone["frame0_ratio_run_std"].isna().all() and (alone["runs"] == 1).all()


def test_head_diagnostics_on_constructed_heads():
    rows = synthetic_rows(blocks=(3,) * 7, heads=3, steps=1)
    last = rows["block"] == 6
    # Head 0 puts 70% of every query's mass on frame 0; head 1 on its own block.
    for head, frames in ((0, [0]), (1, [18, 19, 20])):
        chosen = last & (rows["head"] == head)
        rows.loc[chosen, "prob_mass"] = 0.3 / 18
        rows.loc[chosen & rows["key_frame"].isin(frames), "prob_mass"] = 0.7 / len(frames) + 0.3 / 18
        rows.loc[chosen, "prob_mass"] /= (
            rows[chosen].groupby(["pass", "step", "query_frame"])["prob_mass"].transform("sum")
        )
    diagnostics = head_diagnostics(rows)
    call = diagnostics[(diagnostics["pass"] == "denoise")].set_index("head")
    assert call.loc[0, "head_class"] == "sink" and call.loc[0, "frame0_mass"] > 0.6
    assert call.loc[1, "head_class"] == "local" and call.loc[1, "recent_mass"] > 0.6
    assert 0 <= call.loc[2, "entropy_frames"] <= 1 and call.loc[2, "entropy_frames"] > call.loc[0, "entropy_frames"]
    assert call.loc[0, "sign_rate"] == pytest.approx(
        (
            rows[last & (rows["head"] == 0) & (rows["pass"] == "denoise")].groupby("key_frame")["logit_mean"].mean() > 0
        ).mean()
    )
    grid = head_class_grid(diagnostics)
    assert list(grid.index) == ["L4"] and list(grid.columns) == ["H1", "H2", "H3"] and grid.loc["L4", "H1"] == "sink"
    assert math.isnan(call.loc[0, "entropy_tokens"])  # no query_stats given


def test_entropy_tokens_are_normalized_by_the_number_of_keys():
    rows = synthetic_rows(blocks=(3, 3))
    queries = (
        rows[
            [
                "checkpoint",
                "variant",
                "prompt_id",
                "seed",
                "layer",
                "head",
                "block",
                "pass",
                "step",
                "timestep",
                "query_frame",
            ]
        ]
        .drop_duplicates()
        .assign(entropy_tokens=np.log(24.0), num_keys=24 * 6, num_key_frames=6)
    )
    diagnostics = head_diagnostics(rows, queries)
    assert diagnostics["entropy_tokens"].to_numpy() == pytest.approx(np.log(24) / np.log(144))
    assert isinstance(diagnostics, pd.DataFrame)


def test_uniform_baseline_counts_the_key_tokens_by_hand():
    """Uniform attention over the key tokens a query sees: 1 / visible frames when every
    frame holds its tokens; a frame with half its tokens gets half the share."""
    values, frames = np.array([0.4, 0.1, 0.1, 0.1, 0.2, 0.1]), np.arange(6)
    plain = curve_stats(values, frames, query_frames=[4, 5], metric="prob_mass")
    assert plain["frame0_uniform"] == pytest.approx(1 / 6) and plain["frame0_excess"] == pytest.approx(0.4 - 1 / 6)
    tokens = np.array([12, 24, 24, 24, 24, 24])  # frame 0 lost half its tokens
    uniform = tokens / tokens.sum()
    dropped = curve_stats(values, frames, query_frames=[4, 5], metric="prob_mass", uniform=uniform)
    assert dropped["frame0_uniform"] == pytest.approx(12 / 132) and dropped["frame0_excess"] == pytest.approx(
        0.4 - 12 / 132
    )
    assert math.isnan(curve_stats(values, frames, [4, 5], "logit_mean")["frame0_excess"])  # mass only
    assert math.isnan(curve_stats(np.array([np.nan, 0.6, 0.4]), np.arange(3), [2], "prob_mass")["frame0_uniform"])
    rows = synthetic_rows(blocks=(3, 3))
    rows.loc[(rows["key_frame"] == 1) & (rows["block"] == 1), "key_tokens"] = 6
    shares = rows.assign(uniform=uniform_mass(rows))
    block1 = shares[
        (shares["block"] == 1) & (shares["head"] == 0) & (shares["pass"] == "cache") & (shares["query_frame"] == 4)
    ]
    expected = {0: 24 / 126, 1: 6 / 126, **{k: 24 / 126 for k in range(2, 6)}}
    assert block1.set_index("key_frame")["uniform"].to_dict() == pytest.approx(expected)
    block0 = shares[
        (shares["block"] == 0) & (shares["head"] == 0) & (shares["pass"] == "cache") & (shares["query_frame"] == 1)
    ]
    assert np.allclose(block0["uniform"], 1 / 3)
    assert np.allclose(uniform_mass(rows.drop(columns="key_tokens"))[rows["block"] == 1], 1 / 6)
    assert np.allclose(uniform_mass(rows.assign(key_tokens=0))[rows["block"] == 1], 1 / 6)  # no counts: 1 / frames


def test_head_and_layer_stats_carry_the_uniform_baseline_and_the_spread_between_runs():
    rows = synthetic_rows(prompts=("a", "b"), seeds=(0, 3))
    rows.loc[(rows["key_frame"] == 0) & (rows["block"] == 2), "key_tokens"] = 12
    heads = head_stats(rows)
    mass = heads[
        (heads["metric"] == "prob_mass") & (heads["head"] == 1) & (heads["pass"] == "denoise") & (heads["step"] == 1)
    ]
    averaged = mass[mass["prompt_id"] == "*"].iloc[0]
    per_run = mass[mass["prompt_id"] != "*"]
    assert averaged["frame0_uniform"] == pytest.approx(12 / (12 + 8 * 24))  # 9 frames, frame 0 at half its tokens
    assert averaged["frame0_excess"] == pytest.approx(averaged["frame0_mass"] - 12 / 204)
    for name in ("first", "sink_score", "frame0_mass", "frame0_excess", "cache_share"):
        assert averaged[f"{name}_run_std"] == pytest.approx(per_run[name].std(ddof=1)), name
        assert per_run[f"{name}_run_std"].isna().all()  # per-run rows have no spread
    logits = heads[(heads["metric"] == "logit_mean") & (heads["prompt_id"] == "*")]
    assert logits["frame0_excess"].isna().all() and logits["first_run_std"].notna().all()
    layers = layer_stats(rows)
    one = layers[(layers["metric"] == "prob_mass") & (layers["pass"] == "cache")]
    assert one.loc[one["prompt_id"] == "*", "diagonal_mean_run_std"].item() == pytest.approx(
        one.loc[one["prompt_id"] != "*", "diagonal_mean"].std(ddof=1)
    )
    assert one.loc[one["prompt_id"] == "*", "frame0_uniform"].item() == pytest.approx(12 / 204)
    single = head_stats(synthetic_rows())
    assert single.loc[single["prompt_id"] == "*", "first_run_std"].isna().all()  # one run: no spread


def test_block_stats_uniform_sink_share_and_excess_by_hand():
    rows = synthetic_rows(blocks=(3, 3, 3, 3, 3), window=7, sink=2)
    stats = block_stats(rows, sink_frames=2)
    one = stats[
        (stats["block"] == 4) & (stats["head"] == 0) & (stats["pass"] == "denoise") & (stats["step"] == 0)
    ].iloc[0]
    assert one["sink_uniform"] == pytest.approx(2 / 7)  # 2 sink frames of the 7 it sees
    assert one["sink_excess"] == pytest.approx(one["sink_mass"] - 2 / 7)
    first = stats[stats["block"] == 0]
    assert first["sink_uniform"].isna().all() and first["sink_excess"].isna().all()  # no cache: no baseline
    plain = block_stats(synthetic_rows(blocks=(3, 3, 3)), sink_frames=0)
    second = plain[plain["block"] == 1]
    assert np.allclose(second["sink_uniform"], 1 / 6)
    # A sliding window without sinks evicts frame 0: no sink frame in the cache, no value.
    evicting = block_stats(synthetic_rows(blocks=(3, 3, 3, 3), window=6), sink_frames=0)
    assert evicting.loc[evicting["block"] == 3, "sink_uniform"].isna().all()


def test_head_diagnostics_carry_frame0_uniform_excess_and_run_spread():
    rows = synthetic_rows(blocks=(3,) * 3, prompts=("a", "b"))
    diagnostics = head_diagnostics(rows)
    assert np.allclose(diagnostics["frame0_uniform"], 1 / 9)
    assert np.allclose(diagnostics["frame0_excess"], diagnostics["frame0_mass"] - 1 / 9)
    last = rows[(rows["block"] == 2) & (rows["head"] == 0) & (rows["pass"] == "cache")]
    per_run = last[last["key_frame"] == 0].groupby("prompt_id")["prob_mass"].mean()
    row = diagnostics[(diagnostics["head"] == 0) & (diagnostics["pass"] == "cache")].iloc[0]
    assert row["frame0_mass_run_std"] == pytest.approx(per_run.std(ddof=1)) and row["runs"] == 2
    assert head_diagnostics(synthetic_rows())["frame0_mass_run_std"].isna().all()
