"""The plotting API: one-line figures from a pandas table, drawn by the pipeline's code."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.figure import Figure
from test_figures import PNG_MAGIC, layout_problems, study

from sinkscope import figures, plot
from sinkscope.figures.registry import FIGURES

ONE_LINERS = {
    # kind: how a notebook user calls it on the demo's tables
    "figure4": lambda t: plot.plot_figure4(t["frame_attention"], heads=["L1H1", "L5H10"]),
    "figure4_tokens": lambda t: plot.plot_figure4_tokens(t["token_profiles"], t["frame_attention"], heads="L1H1",
                                                         grid=(4, 6)),
    "figure4_steps": lambda t: plot.plot_figure4_steps(t["frame_attention"], heads=["L1H1"]),
    "key_frame_maps": lambda t: plot.plot_key_frame_maps(t["token_profiles"], t["frame_attention"], grid=(4, 6)),
    "layer_comparison": lambda t: plot.plot_layer_comparison(t["frame_attention"], highlight_layers=[0, "L5"]),
    "first_middle_last": lambda t: plot.plot_first_middle_last(t["frame_attention"], metric="prob_mass"),
    "sink_score_overview": lambda t: plot.plot_sink_score_overview(t["frame_attention"]),
    "head_classes": lambda t: plot.plot_head_classes(t["head_diagnostics"]),
    "label_agreement": lambda t: plot.plot_label_agreement(
        t["head_diagnostics"], [[(-1, 1, 2)[(layer + head) % 3] for head in range(12)] for layer in range(8)]),
    "entropy_overview": lambda t: plot.plot_entropy_overview(t["head_diagnostics"], step="cache"),
    "attention_over_time": lambda t: plot.plot_attention_over_time(t["frame_attention"], head="L1H1"),
    "per_head_grid": lambda t: plot.plot_per_head_grid(t["frame_attention"], layer="L5", frame_base=1),
    "heads_heatmap": lambda t: plot.plot_heads_heatmap(t["frame_attention"], layer=4),
    "query_key_maps": lambda t: plot.plot_query_key_maps(t["frame_attention"], layer=0, video_frames=True),
    "sink_mass_over_time": lambda t: plot.plot_sink_mass_over_time(t["block_stats"]),
    "sink_collapse": lambda t: plot.plot_sink_collapse(t["block_stats"], step="cache"),
    "policy_comparison": lambda t: plot.plot_policy_comparison(t["variants"], heads="L1H1"),
    "prompt_switch": lambda t: plot.plot_prompt_switch(t["variants"], step="cache"),
    "attention_across_checkpoints": lambda t: plot.plot_attention_across_checkpoints(
        t["diagnostics_all"], train_steps={"step500": 500, "demo": 1000, "step2000": 2000}),
}


def test_every_kind_has_a_one_liner():
    assert set(ONE_LINERS) == set(figures.KINDS)
    assert {f"plot_{kind}" for kind in figures.KINDS} <= set(plot.__all__)


# Drawn for real here (every kind is drawn by tests/test_figures.py); the others are
# checked for what they hand to sinkscope.figures.draw.
DRAWN = {"figure4", "figure4_tokens", "per_head_grid", "policy_comparison", "attention_across_checkpoints"}


@pytest.mark.parametrize("kind", list(ONE_LINERS))
def test_one_liners_on_pandas_tables(kind, monkeypatch):
    tables = {name: value.copy() if isinstance(value, pd.DataFrame) else value for name, value in study("demo").items()}
    if kind in DRAWN:
        fig = ONE_LINERS[kind](tables)
        assert isinstance(fig, Figure) and fig.texts and fig.axes
        return
    calls = []

    def spy(drawn, given, **kwargs):
        calls.append((drawn, given, kwargs))
        return Figure()

    monkeypatch.setattr(figures, "draw", spy)
    assert isinstance(ONE_LINERS[kind](tables), Figure)
    (drawn, given, kwargs), = calls
    labels = {"reference_labels"} if FIGURES[kind].needs_reference_labels else set()
    assert drawn == kind and set(given) == set(FIGURES[kind].tables) | labels
    assert all(isinstance(t, pd.DataFrame) and len(t) for t in given.values())
    # Exactly the options the workflow passes this kind, filled in from the schema.
    spec = FIGURES[kind]
    assert set(spec.options) | {"dpi", "frame_base"} <= set(kwargs["options"])
    assert set(kwargs["options"]) <= set(spec.options) | set(spec.extra_options) | {"dpi", "frame_base"}
    assert kwargs["source"] == "demo" or kind == "attention_across_checkpoints"
    if FIGURES[kind].scope == "layer":
        assert kwargs["layer"] in (0, 4) and set(given["frame_attention"]["layer"]) == {kwargs["layer"]}


def test_options_a_kind_does_not_draw_with_are_refused():
    with pytest.raises(TypeError, match="no option 'metric'"):
        plot.plot("head_classes", study("demo")["head_diagnostics"], metric="prob_mass")


def test_save_writes_svg_and_png(tmp_path):
    fig = plot.plot_figure4(study("demo")["frame_attention"], heads="L1H1")
    svg, png = plot.save(fig, tmp_path / "figure4", dpi=40)
    assert svg.name == "figure4.svg" and "<text" in svg.read_text()
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_draws_into_a_given_axes():
    import matplotlib.pyplot as plt

    frame = study("demo")["frame_attention"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    try:
        assert plot.plot_figure4(frame, heads="L5H10", ax=axes[0]) is fig
        assert plot.plot_heads_heatmap(frame, layer=0, ax=axes[1]) is fig
        assert plot.plot_head_classes(study("demo")["head_diagnostics"], ax=axes[2]) is fig
        assert "L5H10" in axes[0].get_title() and axes[1].images and axes[2].images
        with pytest.raises(ValueError, match="one head"):
            plot.plot_figure4(frame, heads=["L1H1", "L5H10"], ax=axes[0])
    finally:
        plt.close(fig)


def test_several_checkpoints_or_variants_need_a_choice():
    data = study("demo")
    frame = pd.concat([data["frame_attention"], data["frame_attention"].assign(checkpoint="other")], ignore_index=True)
    with pytest.raises(ValueError, match="checkpoints demo, other; pick one with checkpoint="):
        plot.plot_figure4(frame)
    fig = plot.plot_figure4(frame, checkpoint="other", heads="L1H1")
    assert "other" in fig.texts[1].get_text()
    with pytest.raises(ValueError, match="variants default, sink; pick one with variant="):
        plot.plot_figure4(data["variants"])
    fig = plot.plot_figure4(data["variants"], variant="sink", heads="L1H1")
    assert "demo@sink" in fig.texts[1].get_text()
    with pytest.raises(ValueError, match="no rows of checkpoint 'nope'"):
        plot.plot_sink_score_overview(frame, checkpoint="nope")
    with pytest.raises(ValueError, match="no rows of layer 9"):
        plot.plot_per_head_grid(data["frame_attention"], layer=9)


def test_defaults_come_from_the_config_schema():
    assert plot.defaults()["heads"] == ["L1H1", "L5H10"] and plot.defaults()["metric"] == "logit_mean"
    fig = plot.plot_figure4(study("demo")["frame_attention"])
    assert [ax.get_title().split(" ")[0] for ax in fig.axes] == ["L1H1", "L5H10"]
    assert "logits" in fig.texts[1].get_text()


def test_duckdb_tables(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    frame = study("demo")["frame_attention"]
    path = tmp_path / "frame_attention.parquet"
    frame.to_parquet(path)
    table = duckdb.sql(f"select * from '{path}' where layer in (0, 4)").df()
    fig = plot.plot_layer_comparison(table, metric="prob_mass")
    assert isinstance(fig, Figure) and layout_problems(fig) == []


def test_head_diagnostics_given_to_the_api_name_the_classes():
    """A table the kind uses when given (head_diagnostics: the heads' classes) is picked
    like the others; a head the table calls local is titled so."""
    data = study("demo")
    diagnostics = data["head_diagnostics"].assign(head_class="local")
    fig = plot.plot("figure4", {"frame_attention": data["frame_attention"], "head_diagnostics": diagnostics},
                    heads=["L1H1"])  # fmt: skip
    assert "L1H1 (layer 0, head 0) · local head" in fig.axes[0].get_title()
    assert "sink" not in fig.axes[0].get_title()
