"""Tables: the Figure 4 view, head/layer statistics against hand computations, Parquet I/O."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sinkscope.cli import main as cli
from sinkscope.tables import (
    FRAME_ATTENTION_SCHEMA,
    HEAD_STATS_SCHEMA,
    curve_stats,
    head_stats,
    layer_stats,
    read_metadata,
    read_table,
    resolve_step,
    write_table,
)


def synthetic_rows(seed=0, blocks=(3, 3, 3), heads=2, steps=2, checkpoint="ck"):
    """frame_attention rows of a block-causal generation with random values."""
    rng = np.random.default_rng(seed)
    rows = []
    start = 0
    for block, size in enumerate(blocks):
        keys = range(start + size)
        for pass_, step in [("denoise", s) for s in range(steps)] + [("cache", steps)]:
            for head in range(heads):
                for qf in range(start, start + size):
                    mass = rng.random(len(keys))
                    mass /= mass.sum()
                    for kf, m in zip(keys, mass):
                        rows.append(dict(checkpoint=checkpoint, prompt_id="p", seed=0, layer=3, head=head, block=block,
                                         timestep=0.0 if pass_ == "cache" else 900.0 - 100 * step, query_frame=qf,
                                         key_frame=kf, logit_mean=rng.normal(), prob_mass=m, step=step, **{"pass": pass_}))  # fmt: skip
        start += size
    return pd.DataFrame(rows)


def test_curve_stats_by_hand():
    stats = curve_stats(np.array([4.0, 1.0, 2.0, 3.0]), np.array([0, 1, 2, 3]))
    assert stats["first"] == 4.0 and stats["last"] == 3.0 and stats["middle"] == 1.5
    assert stats["sink_score"] == 2.5 and stats["first_middle_ratio"] == pytest.approx(4 / 1.5)
    assert stats["argmax_frame"] == 0
    assert stats["spread_pct"] == pytest.approx((4 - 1) / 2.5 * 100)


def test_zero_denominators_are_nan_not_errors():
    zero_middle = curve_stats(np.array([1.0, 1.0, -1.0, 2.0]), np.array([0, 5, 6, 7]))
    assert math.isnan(zero_middle["first_middle_ratio"])
    assert zero_middle["first_frame"] == 0 and zero_middle["argmax_frame"] == 7
    zero_mean = curve_stats(np.array([1.0, -1.0]), np.array([0, 1]))
    assert math.isnan(zero_mean["spread_pct"]) and math.isnan(zero_mean["middle"])
    assert curve_stats(np.array([]), np.array([]))["num_key_frames"] == 0


def test_head_and_layer_stats_match_a_hand_computation():
    rows = synthetic_rows()
    heads = head_stats(rows)
    # Per head: 3 calls of the last block (2 denoising steps + cache pass) x 2 metrics.
    assert len(heads) == 2 * 3 * 2
    one = heads[(heads["head"] == 1) & (heads["pass"] == "denoise") & (heads["step"] == 1) & (heads["metric"] == "logit_mean")]
    last = rows[(rows["block"] == 2) & (rows["head"] == 1) & (rows["pass"] == "denoise") & (rows["step"] == 1)]
    curve = last.groupby("key_frame")["logit_mean"].mean()
    assert one["first"].item() == pytest.approx(curve[0])
    assert one["middle"].item() == pytest.approx(curve[1:8].mean())
    assert one["last"].item() == pytest.approx(curve[8])
    assert one["query_frames"].item() == "6,7,8"
    assert one["num_key_frames"].item() == 9

    layers = layer_stats(rows)
    row = layers[(layers["pass"] == "cache") & (layers["metric"] == "prob_mass")]
    cache = rows[rows["pass"] == "cache"]
    averaged = cache.groupby(["query_frame", "key_frame"])["prob_mass"].mean()
    diagonal = np.mean([averaged[(f, f)] for f in range(9)])
    column = np.mean([averaged[(f, 0)] for f in range(9)])
    assert row["diagonal_mean"].item() == pytest.approx(diagonal)
    assert row["first_column_mean"].item() == pytest.approx(column)
    head_avg = cache[cache["block"] == 2].groupby("key_frame")["prob_mass"].mean()
    assert row["sink_score"].item() == pytest.approx(head_avg[0] - head_avg[1:8].mean())


def test_resolve_step_options():
    rows = synthetic_rows()
    assert resolve_step(rows, "last") == ("denoise", 1)
    assert resolve_step(rows, "cache") == ("cache", 2)
    assert resolve_step(rows, 0) == ("denoise", 0)
    imported = rows[rows["pass"] == "denoise"].assign(step=-1)
    # Rows from older caches record no call: every option shows them.
    for option in ("last", "cache", 1):
        assert resolve_step(imported, option) == ("denoise", -1)


def test_parquet_round_trip_keeps_schema_and_metadata(tmp_path):
    rows = synthetic_rows()
    path = tmp_path / "frame_attention.parquet"
    write_table(rows, path, FRAME_ATTENTION_SCHEMA, {"package_version": "x", "model_config": {"dim": 8}})
    assert pq.read_schema(path).remove_metadata() == FRAME_ATTENTION_SCHEMA
    assert read_metadata(path) == {"package_version": "x", "model_config": {"dim": 8}}
    back = read_table(path)
    assert len(back) == len(rows) and back["prob_mass"].dtype == np.float32
    write_table(head_stats(rows), tmp_path / "heads.parquet", HEAD_STATS_SCHEMA)
    with pytest.raises(ValueError, match="lacks columns"):
        write_table(rows.drop(columns="head"), tmp_path / "bad.parquet", FRAME_ATTENTION_SCHEMA)
    assert not (tmp_path / "bad.parquet").exists()


def test_cli_figure_refuses_mixed_checkpoints(tmp_path, capsys):
    path = tmp_path / "mixed.parquet"
    write_table(pd.concat([synthetic_rows(checkpoint="a"), synthetic_rows(1, checkpoint="b")]), path, FRAME_ATTENTION_SCHEMA)
    assert cli(["figure", "figure4", "--input", str(path), "--out-prefix", str(tmp_path / "f"), "--heads", "L4H1"]) == 2
    assert "several checkpoints (a, b)" in capsys.readouterr().err
    assert cli(["figure", "figure4", "--input", str(path), "--checkpoint", "b", "--out-prefix", str(tmp_path / "f"),
                "--heads", "L4H1", "--dpi", "60"]) == 0  # fmt: skip
    assert (tmp_path / "f.svg").exists() and (tmp_path / "f.png").exists()
