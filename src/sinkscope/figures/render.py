"""Drawing a figure kind from its tables, and the figure job.

One module per figure kind, named like the kind (``sinkscope.figures.figure4`` draws
``figure4``); each imports only the shared drawing modules (``style``, ``text``, ``views``,
``layout``, ``colours``, ``marks``), ``sinkscope.stats.summaries``, ``sinkscope.tables`` and
``sinkscope.naming``, so the pipeline reruns a figure only when its own code (or the
shared code it uses) changed. This module imports the kind modules by name at run time.

The kinds, and what each reads and draws with, are declared in ``registry.FIGURES``.

Labels follow the paper: L1H1 is layer 0, head 0; tables stay 0-based. Frame numbers
are 0-based unless the option ``frame_base`` is 1 (the paper's "frames 19-21").
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sinkscope.errors import DamagedFileError
from sinkscope.figures.registry import FIGURES, LAYER, STUDY, figure_kind
from sinkscope.figures.style import DEFAULTS, figure_style, option, save_figure
from sinkscope.figures.views import figure4_view
from sinkscope.manifests import DATASET_MANIFEST, check_dataset_folder, read_manifest
from sinkscope.naming import parse_head_label
from sinkscope.tables import read_metadata, read_table, with_default_columns
from sinkscope.tokens import token_rows

log = logging.getLogger("sinkscope")

# The drawing module of each kind.
KINDS = {kind: f"sinkscope.figures.{kind}" for kind in FIGURES}

__all__ = ["DEFAULTS", "KINDS", "draw", "figure_job", "figures_job", "save_figure"]


def module(kind: str):
    """The module that draws ``kind``: ``sinkscope.figures.<kind>`` (a kind registered after
    this module was imported too)."""
    return importlib.import_module(f"sinkscope.figures.{figure_kind(kind).name}")


def draw(
    kind: str,
    tables: Mapping[str, pd.DataFrame] | pd.DataFrame,
    *,
    source: str,
    layer: int | None = None,
    options: Mapping[str, Any],
    grid: Sequence[int] | None = None,
    train_steps: Mapping[str, int | None] | None = None,
    ax: Any = None,
):
    """Draw figure ``kind`` from ``tables`` (table name -> DataFrame; a DataFrame alone is
    frame_attention) and return the matplotlib Figure. ``grid`` is the latent patch grid
    (rows, cols) of token figures; ``ax`` draws single-panel figures into that axes."""
    drawer = module(kind)
    if isinstance(tables, pd.DataFrame):
        tables = {"frame_attention": tables}
    if "token_profiles" in tables:  # the stored form (a list of a frame's values a row) -> a row a token
        tables = {**tables, "token_profiles": token_rows(tables["token_profiles"])}
    if figure_kind(kind).scope == LAYER:
        if layer is None:
            raise ValueError(f"figure {kind} needs a layer")
        frame = tables.get("frame_attention")
        if frame is not None:
            tables = {**tables, "frame_attention": frame[frame["layer"] == layer]}
    with figure_style():
        return drawer.draw(
            dict(tables), source=source, layer=layer, options=dict(options), grid=grid, train_steps=train_steps, ax=ax
        )


# -- the pipeline job ----------------------------------------------------------------------------


def _table_name(path: str | Path) -> str:
    return Path(path).name.removesuffix(".parquet")


def _layer_rows(inputs: Sequence[str], layer: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One layer's frame_attention rows from extraction folders (or an imported file)."""
    from sinkscope.naming import layer_file

    parts, meta = [], {}
    for entry in map(Path, inputs):
        if entry.is_dir():
            file = layer_file(entry, layer)
            rows = read_table(file)
        else:  # an imported legacy cache: one file of every layer
            file = str(entry)
            rows = read_table(file, filters=[("layer", "=", layer)])
        meta = meta or read_metadata(file)
        parts.append(with_default_columns(rows, meta.get("frame_seq_length")))
    return pd.concat(parts, ignore_index=True), meta


TOKEN_FIGURE_COLUMNS = [
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
    "key_frame",
    "token",
    "token_logit_mean",
    "token_prob_mean",
]


def read_token_profiles(folder: str | Path, frame: pd.DataFrame, options: Mapping[str, Any]) -> pd.DataFrame:
    """The token profiles a token figure draws: the chosen heads, the last block, the chosen
    call, a row per key token (float32 values, ``sinkscope.tokens.token_rows``); read with
    a filter from the (possibly GB-sized) dataset folder, never whole."""
    present = set(frame["layer"].unique())
    heads = [head for head in map(parse_head_label, option(options, "heads")) if head[0] in present]
    if not heads:  # none of the chosen heads' layers was extracted: panels say so
        return pd.DataFrame(columns=TOKEN_FIGURE_COLUMNS)
    view = figure4_view(
        frame[frame["layer"].isin({layer for layer, _ in heads})], option(options, "step"), "logit_mean"
    )
    last_blocks = sorted({int(b) for b in frame.groupby(["prompt_id", "seed"], observed=True)["block"].max()})
    filters = [
        ("layer", "in", sorted({layer for layer, _ in heads})),
        ("head", "in", sorted({head for _, head in heads})),
        ("block", "in", last_blocks),
        ("pass", "=", view.pass_),
        ("step", "=", view.step),
    ]
    check_dataset_folder(folder)
    # File by file: each in its own layout (float16 token values, or the float32 lists of
    # older files), decoded to a row per token (a dataset read would force one schema).
    wanted = pd.MultiIndex.from_tuples(heads, names=["layer", "head"])
    parts = []
    for name in sorted(read_manifest(folder, DATASET_MANIFEST)["files"]):
        path = Path(folder) / name
        try:
            part = pq.read_table(path, filters=filters, page_checksum_verification=True).to_pandas()
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
            raise DamagedFileError(
                path, f"is damaged or not a Parquet file ({str(exc).splitlines()[0][:160]})"
            ) from None
        part = part[pd.MultiIndex.from_frame(part[["layer", "head"]].astype(int)).isin(wanted)] if len(part) else part
        if not part.empty:
            parts.append(token_rows(part.reset_index(drop=True)))
    if not parts:
        return pd.DataFrame(columns=TOKEN_FIGURE_COLUMNS)
    rows = pd.concat(parts, ignore_index=True)
    last = rows.groupby(["prompt_id", "seed"], observed=True)["block"].transform("max")
    return rows[rows["block"] == last].reset_index(drop=True)


def _frame_grid(paths: Sequence[str | Path]) -> list[int] | None:
    for path in paths:
        path = Path(path)
        if path.is_file():
            grid = read_metadata(path).get("frame_grid")
            if grid:
                return list(grid)
        elif path.is_dir():
            for file in sorted(path.rglob("*.parquet")):
                grid = read_metadata(file).get("frame_grid")
                if grid:
                    return list(grid)
                break
    return None


class TableReader:
    """Reads a figure job's tables: once a job when ``keep`` (several figures drawn in one
    process read the same tables), each figure getting its own copy, so that no drawing
    sees another's changes."""

    def __init__(self, keep: bool = False) -> None:
        self._kept: dict[tuple, Any] | None = {} if keep else None

    def _once(self, key: tuple, read):
        if self._kept is None:
            return read()
        if key not in self._kept:
            self._kept[key] = read()
        return self._kept[key]

    def table(self, paths: str | Sequence[str]) -> pd.DataFrame:
        key = ("table", paths if isinstance(paths, str) else tuple(paths))
        return self._once(key, lambda: read_table(paths)).copy()

    def layer_rows(self, inputs: Sequence[str], layer: int) -> tuple[pd.DataFrame, dict[str, Any]]:
        frame, meta = self._once(("layer", tuple(inputs), layer), lambda: _layer_rows(inputs, layer))
        return frame.copy(), dict(meta)


def figure_job(
    *,
    kind: str,
    inputs: list[str],
    svg: str,
    png: str,
    options: dict,
    source: str | None,
    layer: int | None = None,
    train_steps: dict[str, int | None] | None = None,
    reader: TableReader | None = None,
) -> None:
    """Draw one figure of a source, a layer, a checkpoint or the study; write SVG and PNG.
    ``reader``: the job's, when one process draws several figures from the same tables."""
    began = time.perf_counter()
    module(kind)  # an unknown kind fails before anything is read
    scope = figure_kind(kind).scope
    source = source or ("study" if scope == STUDY else "sinkscope")
    tables, grid = _figure_tables(kind, inputs, options, layer, reader or TableReader())
    fig = draw(kind, tables, source=source, layer=layer, options=options, grid=grid, train_steps=train_steps)
    save_figure(fig, svg, png, dpi=int(option(options, "dpi")))
    log.info(
        "figure %s of %s%s in %.2f s",
        kind,
        source,
        f" layer {layer}" if layer is not None else "",
        time.perf_counter() - began,
    )


def _figure_tables(
    kind: str, inputs: list[str], options: Mapping[str, Any], layer: int | None, reader: TableReader
) -> tuple[dict[str, pd.DataFrame], Sequence[int] | None]:
    """The tables figure ``kind`` draws from its inputs (table files, extraction folders, a
    token_profiles folder, a label file), and the latent patch grid where it needs one."""
    if figure_kind(kind).scope == LAYER:
        if layer is None:
            raise ValueError(f"figure {kind} needs a layer")
        # The source tables it also reads (head classes) are files named like their table.
        used = [p for p in inputs if Path(p).is_file() and _table_name(p) in figure_kind(kind).uses]
        frame, meta = reader.layer_rows([p for p in inputs if p not in used], layer)
        return {"frame_attention": frame, **{_table_name(p): reader.table(p) for p in used}}, meta.get("frame_grid")
    grid = None
    by_name: dict[str, list[str]] = {}
    labels = [path for path in inputs if str(path).endswith(".csv")]  # diagnostics.reference_labels
    for path in inputs:
        if path not in labels:
            by_name.setdefault(_table_name(path), []).append(path)
    tables = {name: reader.table(paths) for name, paths in by_name.items() if name != "token_profiles"}
    if labels:
        from sinkscope.labels import read_label_file
        from sinkscope.stats.labels import reference_frame

        tables["reference_labels"] = reference_frame(read_label_file(labels[0]))
    if "token_profiles" in by_name:
        frame = tables["frame_attention"]
        parts = [read_token_profiles(folder, frame, options) for folder in by_name["token_profiles"]]
        tables["token_profiles"] = pd.concat(parts, ignore_index=True)
        grid = _frame_grid(by_name.get("frame_attention", []) + by_name["token_profiles"])
    return tables, grid


def figures_job(
    *,
    figures: Mapping[str, Mapping[str, Any]],
    source: str | None,
    train_steps: dict[str, int | None] | None = None,
) -> None:
    """Draw several figures of one source (its layers, a checkpoint, the study) in one
    process: ``figures`` maps a name to the figure's ``kind``, ``layer`` (of a layer
    figure), ``inputs``, ``svg``, ``png`` and ``options``. Each is drawn as ``figure_job``
    draws it alone (the same bytes); the start-up (Python, matplotlib, pandas) is paid once
    and each table read once."""
    began = time.perf_counter()
    reader = TableReader(keep=True)
    for figure in figures.values():
        figure_job(**figure, source=source, train_steps=train_steps, reader=reader)
    log.info("%d figures in %.2f s", len(figures), time.perf_counter() - began)
