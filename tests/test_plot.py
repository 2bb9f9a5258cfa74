"""The plotting API: one-line figures from a pandas table, drawn by the pipeline's code."""

from __future__ import annotations

import inspect

import pandas as pd
import pytest
from matplotlib.figure import Figure
from test_figures import PNG_MAGIC, layout_problems, study

from sinkscope import figures, plot
from sinkscope.figures.registry import FIGURES

# Demo tables for what each scope compares: a checkpoint's variants, the study's checkpoints.
SCOPE_TABLES = {"checkpoint": {"frame_attention": "variants"}, "study": {"head_diagnostics": "diagnostics_all"}}
LABEL_GRID = [[(-1, 1, 2)[(layer + head) % 3] for head in range(12)] for layer in range(8)]


def one_liner(kind: str, tables: dict):
    """``plot.plot_<kind>`` called as a notebook user would on the demo's tables, its
    arguments read from the kind's registry entry."""
    spec = FIGURES[kind]
    args = [tables[SCOPE_TABLES.get(spec.scope, {}).get(name, name)] for name in spec.tables]
    args += [LABEL_GRID] if spec.needs_reference_labels else []
    args += ["L5"] if spec.scope == "layer" else []
    named = {"heads": "L1H1"} if spec.draws_heads else {}
    named |= {"grid": (4, 6)} if spec.needs_token_profiles else {}
    return getattr(plot, f"plot_{kind}")(*args, **named)


def test_every_kind_has_a_plot_function():
    """One ``plot_<kind>`` a registry entry, its arguments and docstring derived from it."""
    assert {name for name in plot.__all__ if name.startswith("plot_")} == {f"plot_{kind}" for kind in FIGURES}
    for kind, spec in FIGURES.items():
        function = getattr(plot, f"plot_{kind}")
        parameters = inspect.signature(function).parameters
        assert function.__name__ == f"plot_{kind}" and function.__doc__[1:].startswith(spec.shows[1:20])
        assert set(spec.options) | set(spec.extra_options) | {"dpi", "frame_base", "source", "ax"} <= set(parameters)
        assert ("layer" in parameters) == (spec.scope == "layer") and (
            "grid" in parameters
        ) == spec.needs_token_profiles
        assert all(f"``{name}``" in function.__doc__ for name in parameters)
    with pytest.raises(TypeError, match="metric"):
        plot.plot_head_classes(study("demo")["head_diagnostics"], metric="prob_mass")


def test_a_new_entry_gets_its_function_from_the_entry_alone(monkeypatch):
    """A kind's function is made from its entry: a new table, layer, heads and a new
    option become its arguments, with nothing written for it in sinkscope.plot."""
    from sinkscope.figures.registry import LAYER, FigureKind

    kind = FigureKind(
        "new_kind", LAYER, ("frame_attention", "new_table"), ("step", "heads", "new_option"), "a new kind"
    )
    calls = []
    monkeypatch.setattr(plot, "plot", lambda name, tables, **given: calls.append((name, tables, given)))
    function = plot._plot_function(kind)
    assert list(inspect.signature(function).parameters)[:4] == ["table", "new_table", "layer", "heads"]
    assert "``new_option``" in function.__doc__ and function.__doc__.startswith("A new kind.")
    function("rows", "more rows", "L2", new_option=3)
    assert calls == [
        ("new_kind", {"frame_attention": "rows", "new_table": "more rows"}, {"layer": "L2", "new_option": 3})
    ]


# Drawn for real here (every kind is drawn by tests/test_figures.py); the others are
# checked for what they hand to sinkscope.figures.draw.
DRAWN = {"figure4", "figure4_tokens", "per_head_grid", "policy_comparison", "attention_across_checkpoints"}


@pytest.mark.parametrize("kind", list(FIGURES))
def test_one_liners_on_pandas_tables(kind, monkeypatch):
    tables = {name: value.copy() if isinstance(value, pd.DataFrame) else value for name, value in study("demo").items()}
    if kind in DRAWN:
        fig = one_liner(kind, tables)
        assert isinstance(fig, Figure) and fig.texts and fig.axes
        return
    calls = []

    def spy(drawn, given, **kwargs):
        calls.append((drawn, given, kwargs))
        return Figure()

    monkeypatch.setattr(figures, "draw", spy)
    assert isinstance(one_liner(kind, tables), Figure)
    ((drawn, given, kwargs),) = calls
    labels = {"reference_labels"} if FIGURES[kind].needs_reference_labels else set()
    assert drawn == kind and set(given) == set(FIGURES[kind].tables) | labels
    assert all(isinstance(t, pd.DataFrame) and len(t) for t in given.values())
    # Exactly the options the workflow passes this kind, filled in from the schema.
    spec = FIGURES[kind]
    assert set(spec.options) | {"dpi", "frame_base"} <= set(kwargs["options"])
    assert set(kwargs["options"]) <= set(spec.options) | set(spec.extra_options) | {"dpi", "frame_base"}
    assert kwargs["source"] == "demo" or kind == "attention_across_checkpoints"
    if FIGURES[kind].scope == "layer":
        assert kwargs["layer"] == 4 and set(given["frame_attention"]["layer"]) == {kwargs["layer"]}


def test_notebook_spellings_keep_working(monkeypatch):
    """Arguments as the plotting API took them before its functions were derived: one
    ``head``, a 0-based ``layer`` by name, highlighted layers as labels, a label grid."""
    data = study("demo")
    calls = []
    monkeypatch.setattr(figures, "draw", lambda kind, given, **kwargs: calls.append((kind, given, kwargs)) or Figure())
    plot.plot_attention_over_time(data["frame_attention"], head="L1H1", step="cache")
    plot.plot_per_head_grid(data["frame_attention"], layer=0, frame_base=1)
    plot.plot_layer_comparison(data["frame_attention"], highlight_layers=[0, "L5"])
    plot.plot_label_agreement(data["head_diagnostics"], LABEL_GRID)
    plot.plot_attention_across_checkpoints(data["diagnostics_all"], train_steps={"step500": 500, "demo": 1000})
    (_, _, over_time), (_, _, grid), (_, _, layers), (_, labels, _), (_, _, across) = calls
    assert over_time["options"]["heads"] == ["L1H1"] and over_time["options"]["step"] == "cache"
    assert grid["layer"] == 0 and grid["options"]["frame_base"] == 1
    assert layers["options"]["highlight_layers"] == [0, 4]
    assert set(labels["reference_labels"].columns) >= {"layer", "head", "reference"}
    assert across["train_steps"] == {"step500": 500, "demo": 1000}


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
    assert "mean logit (pre-softmax q·k/√d, logit_mean)" in fig.texts[1].get_text()


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
    fig = plot.plot(
        "figure4", {"frame_attention": data["frame_attention"], "head_diagnostics": diagnostics}, heads=["L1H1"]
    )
    assert "L1H1 (layer 0, head 0) · local head" in fig.axes[0].get_title()
    assert "sink" not in fig.axes[0].get_title()
