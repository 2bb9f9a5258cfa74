"""Frame-wise generation (Causal Forcing: blocks of one latent frame, 21 blocks) and
few-step schedules with a first block of its own (Causal Forcing++): the capture, the
summaries, every figure and the memory estimate."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from synthetic import synthetic_atlas, synthetic_effects
from test_figures import (
    layout_problems,
    synthetic_contact_frames,
    synthetic_frames,
    synthetic_queries,
    synthetic_tokens,
)

from sinkscope import figures
from sinkscope.figures.registry import FIGURES
from sinkscope.generation.capture import FrameStatsCapture
from sinkscope.generation.sampler import generate
from sinkscope.model import build_model
from sinkscope.options import GenerationOptions
from sinkscope.pipeline.integrity import check_layer_rows
from sinkscope.stats import summaries

FEW_STEP = {
    "num_frames": 21,
    "frames_per_block": 1,
    "denoising_steps": [1000, 500],
    "first_block_denoising_steps": [1000, 750, 500, 250],
}


def test_frame_blocks_with_few_steps_are_captured_and_summarized():
    options = GenerationOptions.from_config(FEW_STEP)
    model = build_model("demo", seed=0)
    capture = FrameStatsCapture(model, [0], frame_seq_length=24)
    with capture:
        result = generate(
            model,
            torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1)),
            options=options,
            seed=0,
            observers=[capture],
        )
    tables = capture.layer_tables()[0]
    frames = tables["frames"].assign(checkpoint="cf", variant="default", prompt_id="p", seed=0)
    assert len(result.calls) == options.num_calls == 5 + 20 * 3
    check_layer_rows(frames, layer=0, calls=options.num_calls, heads=12, where="test")
    assert set(frames.loc[frames["block"] == 0, "step"]) == {0, 1, 2, 3, 4}
    assert set(frames.loc[frames["block"] == 20, "step"]) == {0, 1, 2}
    # The last block: one query frame against all 21 frames; the Figure 4 view of its last step.
    curves, info = summaries.figure4_curves(frames, "last", "prob_mass")
    assert info["query_frames"] == [20] and (info["pass"], info["step"]) == ("denoise", 1) and curves.shape == (12, 21)
    assert summaries.figure4_curves(frames, "cache", "prob_mass")[1]["step"] == 2
    # Each block's own last step, and its own cache pass, over time.
    last = summaries.block_calls(frames, "last")
    assert last.groupby("block")["step"].agg(set).to_dict() == {0: {3}, **{b: {1} for b in range(1, 21)}}
    assert set(summaries.block_calls(frames, "cache")["block"]) == set(range(21))
    blocks = summaries.block_stats(frames)
    assert len(blocks) == 12 * options.num_calls and np.allclose(
        blocks[["sink_mass", "self_mass", "other_mass"]].sum(axis=1), 1
    )
    assert len(summaries.head_stats(frames)) and len(summaries.layer_stats(frames))
    assert len(
        summaries.head_diagnostics(
            frames, tables["queries"].assign(checkpoint="cf", variant="default", prompt_id="p", seed=0)
        )
    )


def few_step_frames(**kw) -> pd.DataFrame:
    """Synthetic rows of 21 one-frame blocks: 4 steps in block 0, 2 in the others."""
    rows = synthetic_frames(6, 12, frames=21, per_block=1, **kw)
    later = rows["block"] > 0
    keep = ~later | rows["step"].isin([0, 3, 4])
    rows = rows[keep].copy()
    rows.loc[later & (rows["step"] == 3), "step"] = 1
    rows.loc[later & (rows["step"] == 4), "step"] = 2
    return rows.reset_index(drop=True)


@pytest.fixture(scope="module")
def data() -> dict:
    frame = few_step_frames()
    variants = pd.concat(
        [few_step_frames(switch_block=12), few_step_frames(window=8, sinks=1, variant="sink", switch_block=12)],
        ignore_index=True,
    )
    queries = synthetic_queries(frame, 24)
    last = frame["block"] == frame["block"].max()
    diagnostics = summaries.head_diagnostics(frame[last], queries[queries["block"] == frame["block"].max()])
    return {
        "frame_attention": frame,
        "token_profiles": synthetic_tokens(frame, [(0, 0), (4, 9)], (4, 6)),
        "head_diagnostics": diagnostics,
        "block_stats": summaries.block_stats(variants, {"default": 0, "sink": 1}),
        "variants": variants,
        "grid": (4, 6),
        "diagnostics_all": diagnostics,
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(figures.KINDS))
def test_every_figure_draws_one_frame_blocks_with_few_steps(kind, data):
    scope = FIGURES[kind].scope
    if scope == "checkpoint":  # the variants' tables, and their effects against the untouched run
        tables = {
            "frame_attention": data["variants"],
            "block_stats": data["block_stats"],
            **synthetic_effects(6, 12, frames=21, per_block=1),
        }
    elif scope == "study":
        tables = {"head_diagnostics": data["diagnostics_all"]}
    elif scope == "run":  # the contact sheet: images, not tables
        tables = {"frames": synthetic_contact_frames()}
    elif scope == "sweep":  # the atlas tables of sweeps over one-frame blocks
        tables = synthetic_atlas(6, 12, frames=21, per_block=1)
    else:
        tables = {name: data[name] for name in ("frame_attention", "token_profiles", "head_diagnostics")}
    if FIGURES[kind].needs_reference_labels:  # the config's label file: codes cycling over the heads
        heads = tables["head_diagnostics"][["layer", "head"]].drop_duplicates()
        tables["reference_labels"] = heads.assign(reference=[(-1, 1, 2)[(a + b) % 3] for a, b in heads.to_numpy()])
    fig = figures.draw(
        kind,
        tables,
        source="cf",
        layer=0 if scope == "layer" else None,
        options={"dpi": 40},
        grid=data["grid"],
        train_steps={"demo": 1},
    )
    assert layout_problems(fig) == []


def test_memory_estimate_of_frame_blocks():
    from sinkscope.model.config import get_model_config
    from sinkscope.pipeline.resources import estimate_job_memory

    config = get_model_config("wan2.1-t2v-1.3b")
    chunk = GenerationOptions.from_config({"num_frames": 21})
    frame = GenerationOptions.from_config(FEW_STEP)
    a = estimate_job_memory(config, chunk, "bfloat16", captured_layers=30)
    b = estimate_job_memory(config, frame, "bfloat16", captured_layers=30)
    assert b.kv_cache == a.kv_cache  # the same 21 frames cached
    assert b.activations * 3 == a.activations  # one frame a call instead of three
    assert frame.num_calls == 65 and chunk.num_calls == 35
