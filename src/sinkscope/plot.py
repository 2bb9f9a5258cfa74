"""Every figure of the pipeline in one line, from a table you already hold.

Each ``plot_*`` function takes a pandas DataFrame (read with pandas, DuckDB, or anything
else), draws with the same code as the pipeline (``sinkscope.figures``), in the package
style, with the config's figure defaults (``figures:`` of the config schema) for what you
leave out, and returns the matplotlib Figure. Single-panel figures draw into ``ax`` when
you give one. A table that holds several checkpoints (or variants) needs
``checkpoint=`` (``variant=``) to pick one. ``save(fig, prefix)`` writes PREFIX.svg (text
kept as text) and PREFIX.png.

Example::

    import pandas as pd
    from sinkscope import plot

    table = pd.read_parquet("results/tables/frame_attention.parquet")
    fig = plot.plot_figure4(table, checkpoint="demo", heads=["L1H1", "L5H10"])
    plot.save(fig, "figure4")                       # figure4.svg, figure4.png

    # The same table through DuckDB, two layers only:
    import duckdb
    table = duckdb.sql("select * from 'results/tables/frame_attention.parquet' where layer in (0, 4)").df()
    plot.plot_layer_comparison(table, checkpoint="demo", metric="prob_mass")
    plot.plot_per_head_grid(table, layer=4, checkpoint="demo", frame_base=1)

    diagnostics = pd.read_parquet("results/tables/head_diagnostics.parquet")
    plot.plot_head_classes(diagnostics, checkpoint="demo")

    # Token profiles are a dataset folder: read only what the figure needs.
    tokens = pd.read_parquet("results/tables/token_profiles.parquet",
                             filters=[("layer", "in", [0, 4]), ("head", "in", [0, 9])])
    plot.plot_figure4_tokens(tokens, table, checkpoint="demo", heads=["L1H1", "L5H10"], grid=(30, 52))

Layers and heads are 0-based in tables; ``heads`` use the paper's 1-based labels
('L1H1' = layer 0, head 0); ``layer`` takes 0-based 4 or 'L5'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from sinkscope import figures
from sinkscope.figures.common import save_figure
from sinkscope.figures.registry import (
    CHECKPOINT,
    COMMON_OPTIONS,
    LAYER,
    STUDY,
    FigureKind,
    figure_kind,
)
from sinkscope.tables import DEFAULT_VARIANT, with_default_columns

__all__ = [
    "plot",
    "plot_attention_across_checkpoints",
    "plot_attention_over_time",
    "plot_entropy_overview",
    "plot_figure4",
    "plot_figure4_steps",
    "plot_figure4_tokens",
    "plot_first_middle_last",
    "plot_head_classes",
    "plot_label_agreement",
    "plot_heads_heatmap",
    "plot_key_frame_maps",
    "plot_layer_comparison",
    "plot_per_head_grid",
    "plot_policy_comparison",
    "plot_prompt_switch",
    "plot_query_key_maps",
    "plot_sink_collapse",
    "plot_sink_mass_over_time",
    "plot_sink_score_overview",
    "save",
]


@lru_cache(maxsize=1)
def defaults() -> dict[str, Any]:
    """The figures defaults of the config schema."""
    from sinkscope.schema import load_schema

    properties = load_schema()["properties"]["figures"]["properties"]
    return {name: spec.get("default") for name, spec in properties.items()}


def _options(kind: FigureKind, **given: Any) -> dict[str, Any]:
    """The options ``kind`` draws with, the config's defaults for those left out (the
    pipeline passes the same); options only the API takes stay out unless given."""
    options = {name: defaults()[name] for name in (*COMMON_OPTIONS, *kind.options)}
    options.update({name: value for name, value in given.items() if value is not None})
    if isinstance(options.get("heads"), str):
        options["heads"] = [options["heads"]]
    return options


def _layer(layer: int | str) -> int:
    if isinstance(layer, str):
        text = layer.strip().upper()
        if not text.startswith("L") or not text[1:].isdigit() or int(text[1:]) < 1:
            raise ValueError(f"layer {layer!r} is not a 0-based index or a label like 'L5'")
        return int(text[1:]) - 1
    return int(layer)


def _pick(
    table: pd.DataFrame, *, checkpoint: str | None, variant: str | None, what: str, variants: bool = False,
    checkpoints: bool = False,
) -> pd.DataFrame:  # fmt: skip
    """The rows of one checkpoint (and variant), or a clear error naming what is there."""
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"{what}: expected a pandas DataFrame, got {type(table).__name__}")
    if table.empty:
        raise ValueError(f"{what}: the table has no rows")
    if "variant" not in table.columns:
        table = with_default_columns(table) if "logit_mean" in table.columns else table.assign(variant=DEFAULT_VARIANT)
    if checkpoint is not None:
        table = table[table["checkpoint"] == checkpoint]
        if table.empty:
            raise ValueError(f"{what}: no rows of checkpoint {checkpoint!r}")
    names = [str(x) for x in pd.unique(table["checkpoint"])]
    if len(names) > 1 and not checkpoints:
        raise ValueError(f"{what}: the table holds checkpoints {', '.join(sorted(names))}; pick one with checkpoint=...")
    if variant is not None:
        table = table[table["variant"] == variant]
        if table.empty:
            raise ValueError(f"{what}: no rows of variant {variant!r}")
    found = [str(x) for x in pd.unique(table["variant"])]
    if len(found) > 1 and not variants:
        raise ValueError(f"{what}: the table holds variants {', '.join(sorted(found))}; pick one with variant=...")
    return table


def _source(table: pd.DataFrame, source: str | None) -> str:
    if source:
        return source
    checkpoint = str(table["checkpoint"].iloc[0])
    variant = str(table["variant"].iloc[0]) if "variant" in table.columns else DEFAULT_VARIANT
    return checkpoint if variant == DEFAULT_VARIANT else f"{checkpoint}@{variant}"


def plot(
    kind: str,
    tables: Mapping[str, pd.DataFrame] | pd.DataFrame,
    *,
    layer: int | str | None = None,
    checkpoint: str | None = None,
    variant: str | None = None,
    variants: Sequence[str] | None = None,
    checkpoints: Sequence[str] | None = None,
    grid: Sequence[int] | None = None,
    train_steps: Mapping[str, int | None] | None = None,
    source: str | None = None,
    ax: Any = None,
    **options: Any,
):
    """Any figure kind from its tables (table name -> DataFrame; a DataFrame alone is the
    kind's first table). ``sinkscope.figures.registry.FIGURES`` says which tables a kind
    reads (``tables``; ``uses``: read when given, e.g. head_diagnostics for the heads'
    classes, else derived from the rows at the default thresholds) and which ``options``
    (``figures:`` keys) it draws with; the ``plot_<kind>`` functions are this call with
    the kind's arguments spelled out."""
    spec = figure_kind(kind)
    takes = (*spec.options, *spec.extra_options, *COMMON_OPTIONS)
    unknown = sorted(set(options) - set(takes))
    if unknown:
        takes = ", ".join(takes)
        raise TypeError(f"plot {kind!r}: no option {unknown[0]!r} (it draws with {takes})")
    if isinstance(tables, pd.DataFrame):
        tables = {spec.tables[0]: tables}
    missing = [name for name in spec.tables if name not in tables]
    if missing:
        raise ValueError(f"plot {kind!r} draws {', '.join(spec.tables)}; {missing[0]} is missing")
    what = f"plot_{kind}"
    picked = {}
    # The tables it reads when given (head_diagnostics: the heads' classes) are picked alike.
    for name in [*spec.tables, *(name for name in spec.uses if name in tables)]:
        rows = _pick(tables[name], checkpoint=checkpoint, variant=variant, what=what if name == spec.tables[-1] else
                     f"{what} ({name})", variants=spec.scope == CHECKPOINT, checkpoints=spec.scope == STUDY)  # fmt: skip
        if variants and spec.scope == CHECKPOINT:
            rows = rows[rows["variant"].isin(list(variants))]
        if checkpoints and spec.scope == STUDY:
            rows = rows[rows["checkpoint"].isin(list(checkpoints))]
        picked[name] = rows
    if spec.needs_reference_labels and "reference_labels" in tables:
        picked["reference_labels"] = tables["reference_labels"]
    main = picked[spec.tables[-1]]
    if spec.scope == STUDY:
        source = source or "study"
        if checkpoints:
            train_steps = train_steps or {name: None for name in checkpoints}
    elif spec.scope == CHECKPOINT:
        source = source or str(main["checkpoint"].iloc[0])
    else:
        source = _source(main, source)
    index = None
    if spec.scope == LAYER:
        if layer is None:
            raise TypeError(f"plot {kind!r} needs a layer")
        index = _layer(layer)
        rows = main[main["layer"] == index]
        if rows.empty:
            layers = ", ".join(str(int(x)) for x in sorted(pd.unique(main["layer"])))
            raise ValueError(f"{what}: no rows of layer {index} (0-based); the table holds layers {layers}")
        picked[spec.tables[-1]] = rows
    if options.get("highlight_layers"):
        options["highlight_layers"] = [_layer(x) for x in options["highlight_layers"]]
    return figures.draw(kind, picked, source=source, layer=index, options=_options(spec, **options), grid=grid,
                        train_steps=train_steps, ax=ax)  # fmt: skip


# -- the figures of a source ---------------------------------------------------------------------


def plot_figure4(table: pd.DataFrame, heads: Sequence[str] | str | None = None, *, checkpoint: str | None = None,
                 variant: str | None = None, step: str | int | None = None, metric: str | None = None,
                 frame_base: int | None = None, source: str | None = None, ax=None):  # fmt: skip
    """Deep Forcing Figure 4 (frame bars) of the last block, one panel per head; ``ax``
    for one head."""
    return plot("figure4", table, checkpoint=checkpoint, variant=variant, source=source, ax=ax, heads=heads, step=step,
                metric=metric, frame_base=frame_base)  # fmt: skip


def plot_figure4_tokens(tokens: pd.DataFrame, table: pd.DataFrame, heads: Sequence[str] | str | None = None, *,
                        grid: Sequence[int] | None = None, checkpoint: str | None = None, variant: str | None = None,
                        step: str | int | None = None, metric: str | None = None, frame_base: int | None = None,
                        source: str | None = None, ax=None):  # fmt: skip
    """Figure 4 at token resolution from token_profiles rows (``tokens``) and the
    frame_attention ``table`` (query block, gaps, frame means); ``grid`` = (rows, cols) of
    the latent patch grid (30, 52 for Wan2.1 at 480x832)."""
    return plot("figure4_tokens", {"token_profiles": tokens, "frame_attention": table}, grid=grid, checkpoint=checkpoint,
                variant=variant, source=source, ax=ax, heads=heads, step=step, metric=metric,
                frame_base=frame_base)  # fmt: skip


def plot_figure4_steps(table: pd.DataFrame, heads: Sequence[str] | str | None = None, *, checkpoint: str | None = None,
                       variant: str | None = None, metric: str | None = None, frame_base: int | None = None,
                       source: str | None = None):  # fmt: skip
    """Figure 4 at every denoising step and the cache pass (Deep Forcing Fig. 11)."""
    return plot("figure4_steps", table, checkpoint=checkpoint, variant=variant, source=source, heads=heads,
                metric=metric, frame_base=frame_base)  # fmt: skip


def plot_key_frame_maps(tokens: pd.DataFrame, table: pd.DataFrame, heads: Sequence[str] | str | None = None, *,
                        grid: Sequence[int] | None = None, checkpoint: str | None = None, variant: str | None = None,
                        step: str | int | None = None, metric: str = "prob_mass", frame_base: int | None = None,
                        source: str | None = None):  # fmt: skip
    """Token profiles of each head's most attended key frames on the patch grid."""
    return plot("key_frame_maps", {"token_profiles": tokens, "frame_attention": table}, grid=grid, checkpoint=checkpoint,
                variant=variant, source=source, heads=heads, step=step, metric=metric, frame_base=frame_base)  # fmt: skip


def plot_layer_comparison(table: pd.DataFrame, *, highlight_layers: Sequence[int | str] | None = None,
                          checkpoint: str | None = None, variant: str | None = None, step: str | int | None = None,
                          metric: str | None = None, frame_base: int | None = None, source: str | None = None):  # fmt: skip
    """Layers x key frames heat map plus chosen layers as small multiples, ±1 std between runs."""
    return plot("layer_comparison", table, checkpoint=checkpoint, variant=variant, source=source,
                highlight_layers=highlight_layers, step=step, metric=metric, frame_base=frame_base)  # fmt: skip


def plot_first_middle_last(table: pd.DataFrame, *, checkpoint: str | None = None, variant: str | None = None,
                           step: str | int | None = None, metric: str | None = None, frame_base: int | None = None,
                           source: str | None = None, ax=None):  # fmt: skip
    """First, middle, last and own frames of each layer's head-averaged curve."""
    return plot("first_middle_last", table, checkpoint=checkpoint, variant=variant, source=source, ax=ax, step=step,
                metric=metric, frame_base=frame_base)  # fmt: skip


def plot_sink_score_overview(table: pd.DataFrame, *, checkpoint: str | None = None, variant: str | None = None,
                             step: str | int | None = None, metric: str | None = None, source: str | None = None,
                             ax=None):  # fmt: skip
    """First − middle of every layer x head (sink-class heads outlined: give head_diagnostics
    through ``plot.plot('sink_score_overview', {'frame_attention': ..., 'head_diagnostics': ...})``
    for the config's thresholds; without it, the rows' classes at the default ones)."""
    return plot("sink_score_overview", table, checkpoint=checkpoint, variant=variant, source=source, ax=ax, step=step,
                metric=metric)  # fmt: skip


def plot_head_classes(diagnostics: pd.DataFrame, *, checkpoint: str | None = None, variant: str | None = None,
                      step: str | int | None = None, source: str | None = None, ax=None):  # fmt: skip
    """Layers x heads coloured by head_class (head_diagnostics)."""
    return plot("head_classes", diagnostics, checkpoint=checkpoint, variant=variant, source=source, ax=ax, step=step)


def plot_label_agreement(diagnostics: pd.DataFrame, labels: Any, *, checkpoint: str | None = None,
                         variant: str | None = None, source: str | None = None, ax: Any = None,
                         step: str | int | None = None):
    """A published label file (a path, a layers x heads grid of -1/1/2, or rows of layer,
    head, reference) against head_class and pyramid_label (head_diagnostics)."""
    from sinkscope.labels import read_label_file
    from sinkscope.stats.labels import reference_frame

    if isinstance(labels, (str, Path)):
        labels = read_label_file(labels)
    frame = labels if isinstance(labels, pd.DataFrame) else reference_frame(labels)
    return plot("label_agreement", {"head_diagnostics": diagnostics, "reference_labels": frame}, checkpoint=checkpoint,
                variant=variant, source=source, ax=ax, step=step)  # fmt: skip


def plot_entropy_overview(diagnostics: pd.DataFrame, *, checkpoint: str | None = None, variant: str | None = None,
                          step: str | int | None = None, source: str | None = None):  # fmt: skip
    """entropy_frames and entropy_tokens of every layer x head, and their layer means."""
    return plot("entropy_overview", diagnostics, checkpoint=checkpoint, variant=variant, source=source, step=step)


def plot_attention_over_time(table: pd.DataFrame, head: str | None = None, *, heads: Sequence[str] | None = None,
                             checkpoint: str | None = None, variant: str | None = None, step: str | int | None = None,
                             frame_base: int | None = None, source: str | None = None, ax=None):  # fmt: skip
    """Blocks x absolute key frames of the softmax mass, for ``head`` (or ``heads``)."""
    chosen = [head] if head else (list(heads) if heads else None)
    return plot("attention_over_time", table, checkpoint=checkpoint, variant=variant, source=source, ax=ax,
                heads=chosen, step=step, frame_base=frame_base)  # fmt: skip


# -- the figures of one layer --------------------------------------------------------------------


def plot_per_head_grid(table: pd.DataFrame, layer: int | str, *, checkpoint: str | None = None,
                       variant: str | None = None, step: str | int | None = None, metric: str | None = None,
                       frame_base: int | None = None, source: str | None = None):  # fmt: skip
    """One layer: every head's Figure 4 bars on one y scale."""
    return plot("per_head_grid", table, layer=layer, checkpoint=checkpoint, variant=variant, source=source, step=step,
                metric=metric, frame_base=frame_base)  # fmt: skip


def plot_heads_heatmap(table: pd.DataFrame, layer: int | str, *, checkpoint: str | None = None,
                       variant: str | None = None, step: str | int | None = None, metric: str | None = None,
                       frame_base: int | None = None, source: str | None = None, ax=None):  # fmt: skip
    """One layer: heads x key frames heat map of the last block."""
    return plot("heads_heatmap", table, layer=layer, checkpoint=checkpoint, variant=variant, source=source, ax=ax,
                step=step, metric=metric, frame_base=frame_base)  # fmt: skip


def plot_query_key_maps(table: pd.DataFrame, layer: int | str, *, video_frames: bool | None = None,
                        checkpoint: str | None = None, variant: str | None = None, step: str | int | None = None,
                        metric: str | None = None, frame_base: int | None = None, source: str | None = None):  # fmt: skip
    """One layer: query x key frame maps of every head over the whole generation."""
    return plot("query_key_maps", table, layer=layer, checkpoint=checkpoint, variant=variant, source=source,
                video_frames=video_frames, step=step, metric=metric, frame_base=frame_base)  # fmt: skip


# -- the figures of a checkpoint and of the study ------------------------------------------------


def plot_sink_mass_over_time(block_stats: pd.DataFrame, *, checkpoint: str | None = None,
                             variants: Sequence[str] | None = None, source: str | None = None):  # fmt: skip
    """Mass on frame 0 (or the sink frames) block by block beside its uniform share, and the
    excess over it; one panel pair per layer, one line per variant (block_stats)."""
    return plot("sink_mass_over_time", block_stats, checkpoint=checkpoint, variants=variants, source=source)


def plot_sink_collapse(block_stats: pd.DataFrame, *, checkpoint: str | None = None,
                       variants: Sequence[str] | None = None, step: str | int | None = None,
                       source: str | None = None):  # fmt: skip
    """Sink mass, the latents' similarity to the sink frames and to the previous block,
    and where temporal RoPE channels complete a turn, block by block (block_stats)."""
    return plot("sink_collapse", block_stats, checkpoint=checkpoint, variants=variants, source=source, step=step)


def plot_policy_comparison(table: pd.DataFrame, heads: Sequence[str] | str | None = None, *,
                           checkpoint: str | None = None, variants: Sequence[str] | None = None,
                           step: str | int | None = None, metric: str | None = None, frame_base: int | None = None,
                           source: str | None = None):  # fmt: skip
    """Figure 4 of the last block, one row per variant (KV-cache policy) of one checkpoint."""
    return plot("policy_comparison", table, checkpoint=checkpoint, variants=variants, source=source, heads=heads,
                step=step, metric=metric, frame_base=frame_base)  # fmt: skip


def plot_prompt_switch(table: pd.DataFrame, *, checkpoint: str | None = None, variants: Sequence[str] | None = None,
                       step: str | int | None = None, source: str | None = None):  # fmt: skip
    """Around each prompt switch: sink mass and mass on pre-switch frames block by block,
    one line per variant (frame_attention rows of prompt schedules)."""
    return plot("prompt_switch", table, checkpoint=checkpoint, variants=variants, source=source, step=step)


def plot_attention_across_checkpoints(diagnostics: pd.DataFrame, *, train_steps: Mapping[str, int | None] | None = None,
                                      checkpoints: Sequence[str] | None = None, variant: str | None = None,
                                      source: str | None = None):  # fmt: skip
    """frame0_mass and entropy_frames per layer against training step (``train_steps``:
    checkpoint -> step) or checkpoint order (``checkpoints``, else the table's order)."""
    return plot("attention_across_checkpoints", diagnostics, train_steps=train_steps, checkpoints=checkpoints,
                variant=variant, source=source)  # fmt: skip


def save(fig, prefix: str | Path, dpi: int | None = None) -> tuple[Path, Path]:
    """Write ``prefix``.svg (editable text) and ``prefix``.png, atomically; returns both paths."""
    prefix = Path(prefix)
    svg, png = prefix.with_name(prefix.name + ".svg"), prefix.with_name(prefix.name + ".png")
    save_figure(fig, svg, png, dpi=int(dpi or defaults()["dpi"]))
    return svg, png
