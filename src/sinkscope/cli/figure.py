"""``sinkscope figure``: one figure of the registry drawn from tables or extraction
folders, with the rows of one checkpoint and variant (or the several a kind compares)
and its options checked against what the input holds."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from sinkscope.arguments import OUTPUT_RULE, call_step, dpi, natural, output_path, paper_head
from sinkscope.errors import ConfigError
from sinkscope.pipeline.layout import ATLAS_TABLES
from sinkscope.schema import schema_defaults

if TYPE_CHECKING:
    import pandas as pd

    from sinkscope.figures.registry import FigureKind


def add_figure_parser(sub: argparse._SubParsersAction) -> None:
    """``sinkscope figure``: one figure of the registry, its options the config's ``figures:``."""
    from sinkscope.figures.registry import FIGURES

    fig = sub.add_parser("figure", help="draw one figure from sinkscope tables")
    fig.add_argument(
        "kind",
        choices=list(FIGURES),
        metavar="KIND",
        help="; ".join(f"{name}: {kind.shows}" for name, kind in FIGURES.items()),
    )
    fig.add_argument(
        "--input", nargs="+", required=True, help="tables (.parquet) or extraction folders the figure reads"
    )
    fig.add_argument(
        "--out-prefix", required=True, type=output_path, help=f"writes PREFIX.svg and PREFIX.png; {OUTPUT_RULE}"
    )
    fig.add_argument("--checkpoint", help="the checkpoint to draw, when the input holds several")
    fig.add_argument("--variant", help="the variant to draw, when the input holds several")
    defaults = schema_defaults("figures")
    fig.add_argument(
        "--highlight-layers", type=natural, nargs="+", help="0-based layers drawn as curves in layer_comparison"
    )
    fig.add_argument("--source", help="name shown in titles (default: the input's checkpoint[@variant])")
    fig.add_argument("--layer", type=natural, help="0-based layer (the layer figures)")
    fig.add_argument(
        "--step",
        type=call_step,
        default=defaults["step"],
        help="the call drawn: last (the last denoising step), cache (the cache pass) or a step index",
    )
    fig.add_argument(
        "--metric",
        choices=["logit_mean", "prob_mass"],
        help=f"logit_mean (pre-softmax, the paper's y axis) or prob_mass (softmax mass per frame); "
        f"default {defaults['metric']} "
        f"({', '.join(n for n, k in FIGURES.items() if 'metric' in k.extra_options)}: prob_mass)",
    )
    fig.add_argument(
        "--heads",
        type=paper_head,
        nargs="+",
        default=defaults["heads"],
        help="heads in the paper's notation (L1H1 = layer 0, head 0)",
    )
    fig.add_argument(
        "--video-frames", action="store_true", help="label video frames (stride 4) in the query x key maps"
    )
    fig.add_argument(
        "--frame-base",
        type=int,
        choices=[0, 1],
        default=defaults["frame_base"],
        help="first frame number in labels (1 matches the paper)",
    )
    fig.add_argument("--dpi", type=dpi, default=defaults["dpi"], help="PNG resolution (50 to 1200)")
    fig.set_defaults(func=cmd_figure)


def cmd_figure(args: argparse.Namespace) -> int:
    from sinkscope import plot
    from sinkscope.figures.registry import COMMON_OPTIONS, LAYER, RUN, figure_kind
    from sinkscope.pipeline.jobs import log_to
    from sinkscope.stats.summaries import block_stats, head_diagnostics

    log_to(None)
    kind = figure_kind(args.kind)
    if kind.scope == LAYER and args.layer is None:
        raise ConfigError(f"figure {args.kind!r} needs --layer")
    if kind.scope == RUN:  # the contact sheet: drawn from videos or latents, not tables
        raise ConfigError(
            f"figure {args.kind!r} is drawn from videos or latents, not tables: set outputs.contact_sheet "
            "(docs/video.md) or call sinkscope.plot.plot_contact_sheet"
        )
    tables = _figure_tables(args.input)
    frame = tables.get("frame_attention")
    if frame is not None:  # the tables aggregation derives from frame rows
        if "block_stats" in kind.tables:
            tables.setdefault("block_stats", block_stats(frame))
        if "head_diagnostics" in kind.inputs:  # read, or used for the heads' classes
            tables.setdefault("head_diagnostics", head_diagnostics(frame, tables.get("query_stats")))
    for name in kind.tables:
        if name not in tables:
            hint = {
                "token_profiles": "the token_profiles.parquet folder, or extraction folders captured with "
                "capture.token_profiles",
                **{table: f"results/tables/{table}.parquet" for table in ATLAS_TABLES},
            }.get(name, "results/tables/frame_attention.parquet or extraction folders")
            raise ConfigError(f"figure {args.kind!r} draws {name} rows; --input holds none (give {hint})")
    tables = {name: _chosen_rows(table, kind, args) for name, table in tables.items()}
    frame = tables.get("frame_attention")
    if frame is not None and "frame_attention" in kind.tables:
        _check_frame_arguments(frame, kind, args)
    if args.highlight_layers and "highlight_layers" not in kind.options:
        raise ConfigError(f"figure {args.kind!r} does not draw --highlight-layers (layer_comparison does)")
    # Only the options this kind draws with; the plotting API fills the rest as the pipeline does.
    given = {name: getattr(args, name, None) for name in (*kind.options, *kind.extra_options, *COMMON_OPTIONS)}
    if "generation" in kind.extra_options:  # the run's generation options, as its extraction files record them
        given["generation"] = _input_generation(args.input)
    figure = plot.plot(
        args.kind,
        {name: tables[name] for name in kind.inputs if name in tables},
        layer=args.layer,
        source=args.source or args.checkpoint,  # else the table's checkpoint[@variant]
        **{name: value for name, value in given.items() if value is not None},
    )
    plot.save(figure, args.out_prefix, dpi=args.dpi)
    print(f"wrote {args.out_prefix}.svg and .png")
    return 0


def _chosen_rows(table: pd.DataFrame, kind: FigureKind, args: argparse.Namespace) -> pd.DataFrame:
    """The rows of --checkpoint and --variant; several of either are refused where the kind
    draws one (a checkpoint's variants, its sweeps' runs, the study's checkpoints are drawn
    together)."""
    from sinkscope.figures.registry import CHECKPOINT, STUDY, SWEEP

    several = {"variant": kind.scope in (CHECKPOINT, SWEEP), "checkpoint": kind.scope == STUDY}
    for column, wanted in (("checkpoint", args.checkpoint), ("variant", args.variant)):
        if column not in table:
            continue
        present = sorted(set(table[column].astype(str)))
        if wanted is not None:
            if wanted not in present:
                raise ConfigError(f"--{column} {wanted!r} is not in the input (it has {', '.join(present)})")
            table = table[table[column].astype(str) == wanted]
        elif len(present) > 1 and not several[column]:
            raise ConfigError(f"the input holds several {column}s ({', '.join(present)}); choose one with --{column}")
    return table


def _check_frame_arguments(frame: pd.DataFrame, kind: FigureKind, args: argparse.Namespace) -> None:
    """--step, --layer, --heads and --highlight-layers against the frame rows the input holds."""
    from sinkscope.naming import head_label, parse_head_label

    layers = sorted({int(x) for x in frame["layer"].unique()})
    heads = sorted({int(x) for x in frame["head"].unique()})
    steps = sorted({int(x) for x in frame.loc[frame["pass"] == "denoise", "step"].unique() if x >= 0})
    if isinstance(args.step, int) and steps and args.step > steps[-1]:
        raise ConfigError(f"--step {args.step} is past the last denoising step {steps[-1]} of the input")
    if args.layer is not None and args.layer not in layers:
        raise ConfigError(f"--layer {args.layer} is not in the input (it has layers {layers})")
    chosen = [(label, *parse_head_label(label)) for label in args.heads]
    for label, _, head in chosen:
        if head not in heads and kind.draws_heads:  # the default --heads do not bind the other kinds
            raise ConfigError(
                f"--heads {label}: the input has heads 1..{len(heads)} ({head_label(layers[0], 0)} first)"
            )
    if kind.draws_heads and not any(layer in layers for _, layer, _ in chosen):
        shown = ", ".join(head_label(layer, 0) for layer in layers[:4])
        raise ConfigError(
            f"none of --heads {' '.join(args.heads)} is in the input: it has layers {layers} ({shown}...)"
        )
    absent = [layer for layer in args.highlight_layers or [] if layer not in layers]
    if absent:
        raise ConfigError(f"--highlight-layers {absent[0]} is not in the input (it has layers {layers})")


def _input_generation(inputs: list[str]) -> dict | None:
    """The generation options the first extraction folder among ``inputs`` records."""
    from sinkscope.manifests import MANIFEST, read_manifest
    from sinkscope.tables import read_metadata

    for entry in map(Path, inputs):
        if entry.is_dir() and (entry / MANIFEST).is_file():
            files = sorted(name for name in read_manifest(entry)["files"] if name.endswith(".parquet"))
            generation = read_metadata(entry / files[0]).get("generation") if files else None
            if generation:
                return generation
    return None


def _figure_tables(inputs: list[str]) -> dict:
    """The tables a figure reads, by name, from table files, the token_profiles dataset
    folder, or extraction folders (their per-layer files)."""
    import pandas as pd

    from sinkscope.manifests import DATASET_MANIFEST, MANIFEST, read_manifest
    from sinkscope.tables import read_table

    known = (
        "frame_attention",
        "head_diagnostics",
        "block_stats",
        "token_profiles",
        "query_stats",
        "variant_effects",
        "variant_head_effects",
        *ATLAS_TABLES,
    )
    parts: dict[str, list] = {}
    for entry in map(Path, inputs):
        if not entry.exists():
            raise ConfigError(f"--input {str(entry)!r} does not exist")
        if entry.is_dir() and (entry / MANIFEST).is_file():  # an extraction folder
            files = read_manifest(entry)["files"]
            kinds = {"": "frame_attention", ".queries": "query_stats", ".tokens": "token_profiles"}
            for name in sorted(files):
                stem = name.removesuffix(".parquet")
                kind = kinds.get(stem[stem.find(".") :] if "." in stem else "")
                if kind:
                    parts.setdefault(kind, []).append(read_table(entry / name))
        elif entry.is_dir() and (entry / DATASET_MANIFEST).is_file():  # the token_profiles dataset folder
            files = sorted(read_manifest(entry, DATASET_MANIFEST)["files"])
            parts.setdefault("token_profiles", []).append(read_table([entry / name for name in files]))
        elif entry.is_file():
            name = entry.name.removesuffix(".parquet")
            parts.setdefault(name if name in known else "frame_attention", []).append(read_table(entry))
        else:
            raise ConfigError(f"--input {str(entry)!r} is neither a table nor a folder sinkscope wrote")
    return {
        name: pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0] for name, frames in parts.items()
    }
