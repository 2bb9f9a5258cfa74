"""Every figure of the pipeline in one line, from a table you already hold.

There is one ``plot_<kind>`` function a figure kind, made at import from the kind's entry
in ``sinkscope.figures.registry.FIGURES`` (its tables, layer, heads and options become
its arguments; ``help(plot.plot_figure4)`` lists them). Each takes a pandas DataFrame (read
with pandas, DuckDB, or anything else), draws with the same code as the pipeline
(``sinkscope.figures``), in the package style, with the config's figure defaults
(``figures:`` of the config schema) for what you leave out, and returns the matplotlib
Figure. Single-panel figures draw into ``ax`` when you give one. A table that holds several
checkpoints (or variants) needs ``checkpoint=`` (``variant=``) to pick one.
``save(fig, prefix)`` writes PREFIX.svg (text kept as text) and PREFIX.png.

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

import inspect
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from sinkscope import figures
from sinkscope.figures.registry import (
    CHECKPOINT,
    COMMON_OPTIONS,
    FIGURES,
    LAYER,
    RUN,
    STUDY,
    SWEEP,
    FigureKind,
    figure_kind,
)
from sinkscope.figures.style import save_figure
from sinkscope.tables import DEFAULT_VARIANT, with_default_columns


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
    table: pd.DataFrame,
    *,
    checkpoint: str | None,
    variant: str | None,
    what: str,
    variants: bool = False,
    checkpoints: bool = False,
) -> pd.DataFrame:
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
        raise ValueError(
            f"{what}: the table holds checkpoints {', '.join(sorted(names))}; pick one with checkpoint=..."
        )
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


def _reference_labels(labels: Any) -> pd.DataFrame:
    """A published label file as rows of layer, head, reference: from its path, a layers x
    heads grid of -1/1/2, or the rows themselves."""
    if isinstance(labels, pd.DataFrame):
        return labels
    from sinkscope.labels import read_label_file
    from sinkscope.stats.labels import reference_frame

    return reference_frame(read_label_file(labels) if isinstance(labels, (str, Path)) else labels)


def plot(
    kind: str,
    tables: Mapping[str, pd.DataFrame] | pd.DataFrame,
    *,
    layer: int | str | None = None,
    checkpoint: str | None = None,
    variant: str | None = None,
    variants: Sequence[str] | None = None,
    checkpoints: Sequence[str] | None = None,
    sweeps: Sequence[str] | None = None,
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
        rows = _pick(
            tables[name],
            checkpoint=checkpoint,
            variant=variant,
            what=what if name == spec.tables[-1] else f"{what} ({name})",
            variants=spec.scope in (CHECKPOINT, RUN, SWEEP),
            checkpoints=spec.scope == STUDY,
        )
        if variants and spec.scope in (CHECKPOINT, RUN):
            rows = rows[rows["variant"].isin(list(variants))]
        if sweeps and spec.scope == SWEEP:
            rows = rows[rows["sweep"].isin(list(sweeps))]
            if rows.empty:
                raise ValueError(f"{what}: no rows of sweeps {', '.join(sweeps)}")
        if checkpoints and spec.scope == STUDY:
            rows = rows[rows["checkpoint"].isin(list(checkpoints))]
        picked[name] = rows
    if spec.needs_reference_labels and "reference_labels" in tables:
        picked["reference_labels"] = _reference_labels(tables["reference_labels"])
    main = picked[spec.tables[-1]]
    if spec.scope == STUDY:
        source = source or "study"
        if checkpoints:
            train_steps = train_steps or {name: None for name in checkpoints}
    elif spec.scope in (CHECKPOINT, RUN, SWEEP):
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
    return figures.draw(
        kind,
        picked,
        source=source,
        layer=index,
        options=_options(spec, **options),
        grid=grid,
        train_steps=train_steps,
        ax=ax,
    )


# -- one plot_<kind> function a kind, derived from its registry entry ----------------------------

# The argument that takes each table, where it is not the table's own name.
_TABLE_ARGUMENTS = {
    "frame_attention": "table",
    "token_profiles": "tokens",
    "head_diagnostics": "diagnostics",
    "reference_labels": "labels",
}
_ARGUMENTS: dict[str, tuple[Any, str]] = {  # argument: (annotation, what it is)
    "table": ("pd.DataFrame", "frame_attention rows"),
    "tokens": (
        "pd.DataFrame",
        "token_profiles rows (the dataset folder read with a filter: only what the figure needs)",
    ),
    "diagnostics": ("pd.DataFrame", "head_diagnostics rows"),
    "block_stats": ("pd.DataFrame", "block_stats rows"),
    "variant_effects": ("pd.DataFrame", "variant_effects rows (per run, and the run-averaged rows it draws)"),
    "variant_head_effects": ("pd.DataFrame", "variant_head_effects rows (per run, and the run-averaged rows it draws)"),
    "head_atlas": ("pd.DataFrame", "head_atlas rows (per run, and the run-averaged rows it draws)"),
    "frame_atlas": ("pd.DataFrame", "frame_atlas rows (per run, and the run-averaged rows it draws)"),
    "pruning_curve": ("pd.DataFrame", "pruning_curve rows (per run, and the run-averaged rows it draws)"),
    "frames": (
        "pd.DataFrame",
        "one image a row: checkpoint, variant, prompt_id, seed, frame, image (uint8 [H, W, 3]), "
        "unit ('video' or 'latent'), for latents preview (the latent-to-RGB projection's name, "
        "sinkscope.model.latent_preview); sinkscope.pipeline.contact_sheets.frames_table reads them",
    ),
    "labels": (
        "Any",
        "a published label file: its path, a layers x heads grid of -1/1/2, or rows of layer, head, reference",
    ),
    "layer": ("int | str", "the layer, 0-based (4) or labelled like the paper ('L5')"),
    "heads": ("Sequence[str] | str | None", "the heads, labelled like the paper ('L1H1' = layer 0, head 0), or one"),
    "head": ("str | None", "one head; the same as heads=[head]"),
    "grid": ("Sequence[int] | None", "(rows, cols) of the latent patch grid (30, 52 for Wan2.1 at 480x832)"),
    "step": ("str | int | None", "the call of the last block: 'last' (denoising step), 'cache' (pass) or a step index"),
    "metric": ("str | None", "'logit_mean' or 'prob_mass'"),
    "highlight_layers": ("Sequence[int | str] | None", "layers drawn as curves beside the heat map"),
    "video_frames": ("bool | None", "label the axes in video frames"),
    "frame_base": ("int | None", "0 or 1: the number of the first frame in labels"),
    "dpi": ("int | None", "the figure's resolution"),
    "checkpoint": ("str | None", "the checkpoint to draw, when the table holds several"),
    "variant": ("str | None", "the variant to draw, when the table holds several"),
    "variants": ("Sequence[str] | None", "the variants to compare (default: every one in the table)"),
    "checkpoints": ("Sequence[str] | None", "the checkpoints in order (default: the table's order)"),
    "sweeps": ("Sequence[str] | None", "the sweeps to draw, a row of panels each (default: every one in the table)"),
    "train_steps": ("Mapping[str, int | None] | None", "checkpoint -> training step, the x axis"),
    "source": ("str | None", "the name in the subtitle (default: the checkpoint, @variant)"),
    "generation": (
        "Mapping[str, Any] | None",
        "the run's generation options (an extraction file's metadata "
        "'generation'): its sink frames and interventions are marked",
    ),
    "ax": ("Any", "a matplotlib Axes to draw a one-panel figure into"),
}


def _argument(name: str) -> tuple[str, str]:
    """(annotation, what it is) of a ``plot_<kind>`` argument; an option named nowhere
    above is a ``figures:`` key of the config schema."""
    return _ARGUMENTS.get(name, ("Any", f"the figures option {name!r} (see the config schema)"))


def _table_inputs(kind: FigureKind) -> tuple[str, ...]:
    """The tables a ``plot_<kind>`` function takes as its first arguments, in order."""
    return (*kind.tables, *(("reference_labels",) if kind.needs_reference_labels else ()))


def _signature(kind: FigureKind) -> inspect.Signature:
    """``plot_<kind>``'s signature: its tables, then its layer (layer figures) and heads
    (figures of chosen heads), positional; the options it draws with and its scope's
    choices (checkpoint and variant, or the variants or checkpoints it compares) by name."""
    positional = [_TABLE_ARGUMENTS.get(name, name) for name in _table_inputs(kind)]
    positional += ["layer"] if kind.scope == LAYER else []
    positional += ["heads"] if kind.draws_heads else []
    named = ["head"] if kind.draws_heads else []
    named += ["grid"] if kind.needs_token_profiles else []
    named += [name for name in (*kind.options, *kind.extra_options, *COMMON_OPTIONS) if name not in positional]
    named += {
        CHECKPOINT: ["checkpoint", "variants"],
        RUN: ["checkpoint", "variants"],
        STUDY: ["train_steps", "checkpoints", "variant"],
        SWEEP: ["checkpoint", "sweeps"],
    }.get(kind.scope, ["checkpoint", "variant"])
    named += ["source", "ax"]
    required = set(positional) - {"heads"}

    def parameter(name: str, how: Any) -> inspect.Parameter:
        default = inspect.Parameter.empty if name in required else None
        return inspect.Parameter(name, how, default=default, annotation=_argument(name)[0])

    return inspect.Signature(
        [parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in positional]
        + [parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in dict.fromkeys(named)],
        return_annotation="matplotlib.figure.Figure",
    )


def _plot_function(kind: FigureKind):
    """``plot_<kind>``: ``plot(kind, ...)`` with the kind's arguments spelled out."""
    signature = _signature(kind)
    tables = {name: _TABLE_ARGUMENTS.get(name, name) for name in _table_inputs(kind)}

    def plot_kind(*args: Any, **kwargs: Any):
        given = signature.bind(*args, **kwargs).arguments
        head = given.pop("head", None)
        if head is not None:
            given["heads"] = [head]
        return plot(kind.name, {name: given.pop(argument) for name, argument in tables.items()}, **given)

    lines = [f"{kind.shows[0].upper()}{kind.shows[1:]}.", ""]
    lines += [f"- ``{name}``: {_argument(name)[1]}" for name in signature.parameters]
    lines += ["", f"Returns the matplotlib Figure; the same as ``plot({kind.name!r}, ...)``."]
    plot_kind.__name__ = plot_kind.__qualname__ = f"plot_{kind.name}"
    plot_kind.__doc__ = "\n".join(lines)
    plot_kind.__signature__ = signature  # type: ignore[attr-defined]
    plot_kind.__module__ = __name__
    return plot_kind


for _kind in FIGURES.values():
    globals()[f"plot_{_kind.name}"] = _plot_function(_kind)
del _kind

__all__ = ["defaults", "plot", "save", *(f"plot_{name}" for name in FIGURES)]


def save(fig, prefix: str | Path, dpi: int | None = None) -> tuple[Path, Path]:
    """Write ``prefix``.svg (editable text) and ``prefix``.png, atomically; returns both paths."""
    prefix = Path(prefix)
    svg, png = prefix.with_name(prefix.name + ".svg"), prefix.with_name(prefix.name + ".png")
    save_figure(fig, svg, png, dpi=int(dpi or defaults()["dpi"]))
    return svg, png
