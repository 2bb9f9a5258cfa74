"""The shipped trained demo (sinkscope:demo_trained.pt) has the structure docs/trained-demo.md reports.

Measured once, written in the docs, checked here so that the claim stays true: the last
block's queries look at the block 6 frames back (the period of the circle and pulse
classes), avoid their own still-noisy block, and put no more than uniform on frame 0.
"""

from __future__ import annotations

import pytest

from sinkscope.generation.capture import FrameStatsCapture
from sinkscope.generation.sampler import generate
from sinkscope.model import load_transformer
from sinkscope.model.text import demo_embedding
from sinkscope.options import GenerationOptions
from sinkscope.stats.summaries import figure4_curves, head_diagnostics

UNIFORM = 1 / 21


@pytest.fixture(scope="module")
def frame():
    model = load_transformer("sinkscope:demo_trained.pt", format="self_forcing", model="demo")
    context = demo_embedding("a ball moving in a circle", 64, 32)[None]
    capture = FrameStatsCapture(model, range(6), frame_seq_length=24, token_profiles="none")
    with capture:
        generate(model, context, options=GenerationOptions(), seed=0, observers=[capture])
    return capture.to_frame().assign(checkpoint="demo", variant="default", prompt_id="circle", seed=0)


def test_the_last_block_looks_six_frames_back_not_at_frame_0(frame):
    curves, info = figure4_curves(frame, "last", "prob_mass")
    assert info["query_frames"] == [18, 19, 20]
    layers = curves.groupby(level="layer").mean()
    for layer in (2, 3, 4, 5):
        assert layers.loc[layer, [12, 13, 14]].mean() > 1.5 * UNIFORM, layer  # the block 6 frames back
        assert layers.loc[layer, [18, 19, 20]].mean() < 0.5 * UNIFORM, layer  # its own, still noisy, block
    assert (layers[0] < 2 * UNIFORM).all()  # no first-frame sink


def test_head_diagnostics_find_no_sink_heads_in_the_trained_demo(frame):
    diagnostics = head_diagnostics(frame)
    last = diagnostics[(diagnostics["pass"] == "denoise") & (diagnostics["step"] == 3)]
    assert len(last) == 6 * 12 and (last["head_class"] != "sink").all()
    assert last["entropy_frames"].between(0, 1).all()
