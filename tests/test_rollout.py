"""Long-rollout diagnostics: latent similarity to the sink frames and to the previous
block, and where the temporal RoPE channels end a turn, against direct computations."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from synthetic import synthetic_rows

from sinkscope.stats.rollout import block_similarity, rope_period_ends, rope_periods
from sinkscope.stats.summaries import block_stats


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize(("sizes", "sinks"), [((3, 3, 3, 3), 3), ((3, 3, 3), 0), ((1, 3, 3), 2)])
def test_block_similarity_matches_pairwise_cosines(sizes, sinks):
    rng = np.random.default_rng(0)
    latents = rng.normal(size=(4, sum(sizes), 2, 3))
    got = block_similarity(latents, sizes, sinks, head_dim=128)
    starts = np.cumsum((0, *sizes[:-1]))
    sink_frames = range(max(sinks, 1))
    for block, (start, size) in enumerate(zip(starts, sizes)):
        frames = range(start, start + size)
        outside = [s for s in sink_frames if s < start]
        expected = np.mean([cosine(latents[:, f], latents[:, s]) for f in frames for s in outside]) if outside else None
        assert got["latent_sink_cosine"][block] == (pytest.approx(expected) if expected is not None else None)
        if block == 0:
            assert got["latent_previous_cosine"][block] is None
        else:
            previous = range(starts[block - 1], start)
            pairs = [cosine(latents[:, f], latents[:, g]) for f in frames for g in previous]
            assert got["latent_previous_cosine"][block] == pytest.approx(np.mean(pairs))


def test_a_video_that_returns_to_its_sink_frame_scores_one():
    rng = np.random.default_rng(1)
    sink = rng.normal(size=(4, 1, 2, 3))
    latents = np.concatenate([sink] * 3 + [rng.normal(size=(4, 6, 2, 3))] + [sink * 2.0] * 3, axis=1)
    got = block_similarity(latents, (3, 3, 3, 3), 1)
    assert got["latent_sink_cosine"][3] == pytest.approx(1.0)  # frames 9-11 are frame 0, scaled
    assert abs(got["latent_sink_cosine"][1]) < 0.9


def test_rope_periods_are_wans_temporal_channel_turns():
    periods = rope_periods(128)  # Wan2.1-1.3B: 44 temporal channels, 22 pairs
    assert len(periods) == 22
    assert periods[0] == pytest.approx(2 * math.pi)
    assert periods[7] == pytest.approx(2 * math.pi * 10000 ** (14 / 44))
    ends = rope_period_ends(128, 117, 120).split()
    assert ends == [f"c7@{periods[7]:.1f}"]  # 117.7: channel pair 7 completes its first turn in frames 117-119
    assert rope_period_ends(128, 0, 3) == ""


def test_block_stats_carry_the_videos_similarities():
    frame = synthetic_rows(blocks=(3, 3, 3))
    runs = frame[["checkpoint", "variant", "prompt_id", "seed"]].drop_duplicates()
    rollout = pd.concat(
        [
            pd.DataFrame(
                {
                    "block": [0, 1, 2],
                    "latent_sink_cosine": [None, 0.5, 0.25],
                    "latent_previous_cosine": [None, 0.9, 0.8],
                    "rope_periods": ["", "", "c3@18.7"],
                }
            ).assign(**run)
            for run in runs.to_dict("records")
        ]
    )
    stats = block_stats(frame, 0, rollout)
    assert set(stats.loc[stats["block"] == 2, "latent_sink_cosine"]) == {0.25}
    assert stats.loc[stats["block"] == 0, "latent_previous_cosine"].isna().all()
    assert set(stats.loc[stats["block"] == 2, "rope_periods"]) == {"c3@18.7"}
    plain = block_stats(frame, 0)
    assert plain["latent_sink_cosine"].isna().all()
    pd.testing.assert_frame_equal(
        plain.drop(columns=["latent_sink_cosine", "latent_previous_cosine", "rope_periods"]),
        stats.drop(columns=["latent_sink_cosine", "latent_previous_cosine", "rope_periods"]),
    )
