"""Parquet statistics tables: schemas, provenance, the Figure 4 view, head/layer stats.

- ``frame_attention``: one row per call x head x query frame x key frame (DESIGN.md).
- ``head_stats``: per head, the last block's query-averaged curve over key frames, for
  every call of that block (the 4 denoising steps and the cache pass) and both metrics:
  first / middle / last key frame, sink_score = first - middle, first_middle_ratio,
  argmax_frame, spread_pct = (max - min) / |mean| * 100.
- ``layer_stats``: the same on the head-averaged curve, plus the diagonal mean and the
  frame-0 column mean of the full frame x frame matrix of that call.

Provenance travels in the Parquet key-value metadata under ``sinkscope.*`` keys.
Ratios whose denominator is 0 (or an empty middle) are NaN, never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .io import atomic_path

METRICS = ("logit_mean", "prob_mass")
META_PREFIX = "sinkscope."

FRAME_ATTENTION_SCHEMA = pa.schema(
    [
        ("checkpoint", pa.string()),
        ("prompt_id", pa.string()),
        ("seed", pa.int64()),
        ("layer", pa.int16()),
        ("head", pa.int16()),
        ("block", pa.int16()),
        ("pass", pa.string()),
        ("step", pa.int16()),
        ("timestep", pa.float32()),
        ("query_frame", pa.int16()),
        ("key_frame", pa.int16()),
        ("logit_mean", pa.float32()),
        ("prob_mass", pa.float32()),
    ]
)

_CURVE_STATS = [
    ("num_key_frames", pa.int16()),
    ("query_frames", pa.string()),
    ("first_frame", pa.int16()),
    ("last_frame", pa.int16()),
    ("first", pa.float64()),
    ("middle", pa.float64()),
    ("last", pa.float64()),
    ("sink_score", pa.float64()),
    ("first_middle_ratio", pa.float64()),
    ("argmax_frame", pa.int16()),
    ("spread_pct", pa.float64()),
]
_CALL_KEYS = [
    ("checkpoint", pa.string()),
    ("prompt_id", pa.string()),
    ("seed", pa.int64()),
    ("layer", pa.int16()),
]
_CALL_FIELDS = [("pass", pa.string()), ("step", pa.int16()), ("timestep", pa.float32()), ("metric", pa.string())]

HEAD_STATS_SCHEMA = pa.schema(_CALL_KEYS + [("head", pa.int16())] + _CALL_FIELDS + _CURVE_STATS)
LAYER_STATS_SCHEMA = pa.schema(
    _CALL_KEYS + _CALL_FIELDS + _CURVE_STATS + [("diagonal_mean", pa.float64()), ("first_column_mean", pa.float64())]
)

RUN_KEYS = ["checkpoint", "prompt_id", "seed"]


# -- writing and reading -----------------------------------------------------------------


def _encode_metadata(metadata: Mapping[str, Any] | None) -> dict[bytes, bytes]:
    encoded = {}
    for key, value in (metadata or {}).items():
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        encoded[(META_PREFIX + key).encode()] = text.encode()
    return encoded


def write_table(frame: pd.DataFrame, path: str | Path, schema: pa.Schema, metadata: Mapping[str, Any] | None = None) -> None:
    """Write ``frame`` with exactly ``schema``'s columns and types, atomically."""
    missing = [name for name in schema.names if name not in frame.columns]
    if missing:
        raise ValueError(f"table for {path} lacks columns {missing}")
    table = pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **_encode_metadata(metadata)})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``sinkscope.*`` provenance of a Parquet file (JSON values decoded)."""
    raw = pq.read_schema(path).metadata or {}
    result = {}
    for key, value in raw.items():
        key = key.decode()
        if not key.startswith(META_PREFIX):
            continue
        text = value.decode()
        try:
            result[key[len(META_PREFIX) :]] = json.loads(text)
        except json.JSONDecodeError:
            result[key[len(META_PREFIX) :]] = text
    return result


def read_table(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """One DataFrame from one or more Parquet files of the same schema."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    tables = [pq.read_table(p) for p in paths]
    if not tables:
        raise ValueError("no tables to read")
    return pa.concat_tables(tables, promote_options="default").to_pandas()


# -- the Figure 4 view ---------------------------------------------------------------------


def resolve_step(frame: pd.DataFrame, step: str | int) -> tuple[str, int]:
    """Map the figures' ``step`` option to (pass, step) of the rows present.

    'last' is the last denoising step present, 'cache' the cache pass, an integer a
    denoising step index. Rows imported from older caches record no call (step -1):
    they are shown whatever the option asks for.
    """
    denoise = frame[frame["pass"] == "denoise"]
    if not denoise.empty and (denoise["step"] == -1).all() and not (frame["pass"] == "cache").any():
        return "denoise", -1
    if step == "cache":
        return "cache", int(frame.loc[frame["pass"] == "cache", "step"].max()) if (frame["pass"] == "cache").any() else -1
    if step == "last":
        if denoise.empty:
            raise ValueError("no denoising-step rows to show")
        return "denoise", int(denoise["step"].max())
    return "denoise", int(step)


def last_block(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of the last generated block of each run and layer."""
    keys = [k for k in RUN_KEYS + ["layer"] if k in frame.columns]
    last = frame.groupby(keys, observed=True)["block"].transform("max")
    return frame[frame["block"] == last]


def key_curves(frame: pd.DataFrame, metric: str, by: Sequence[str]) -> pd.DataFrame:
    """Mean of ``metric`` over query frames: one curve over key_frame per ``by`` group.

    Returns a wide frame: index = ``by``, columns = key frames (absolute indices).
    """
    grouped = frame.groupby(list(by) + ["key_frame"], observed=True)[metric].mean()
    return grouped.unstack("key_frame").sort_index(axis=1)


def curve_stats(values: np.ndarray, frames: np.ndarray) -> dict[str, Any]:
    """first / middle / last statistics of one curve over its visible key frames."""
    values = np.asarray(values, dtype=np.float64)
    frames = np.asarray(frames)
    keep = ~np.isnan(values)
    values, frames = values[keep], frames[keep]
    if values.size == 0:
        nan = float("nan")
        return dict(num_key_frames=0, first_frame=-1, last_frame=-1, first=nan, middle=nan, last=nan,
                    sink_score=nan, first_middle_ratio=nan, argmax_frame=-1, spread_pct=nan)  # fmt: skip
    first, last = values[0], values[-1]
    middle = values[1:-1].mean() if values.size > 2 else float("nan")
    mean = values.mean()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = first / middle if middle != 0 else float("nan")
        spread = (values.max() - values.min()) / abs(mean) * 100 if mean != 0 else float("nan")
    return dict(
        num_key_frames=int(values.size),
        first_frame=int(frames[0]),
        last_frame=int(frames[-1]),
        first=float(first),
        middle=float(middle),
        last=float(last),
        sink_score=float(first - middle),
        first_middle_ratio=float(ratio),
        argmax_frame=int(frames[int(np.argmax(values))]),
        spread_pct=float(spread),
    )


def _frames_label(frames: Iterable[int]) -> str:
    return ",".join(str(int(f)) for f in sorted(set(frames)))


def _call_groups(frame: pd.DataFrame):
    keys = [k for k in RUN_KEYS + ["layer", "pass", "step"] if k in frame.columns]
    return frame.groupby(keys, observed=True, sort=True)


def head_stats(frame: pd.DataFrame) -> pd.DataFrame:
    """Per head, call of the last block and metric: the curve statistics."""
    rows = []
    for key, call in _call_groups(last_block(frame)):
        base = dict(zip(RUN_KEYS + ["layer", "pass", "step"], key))
        base["timestep"] = float(call["timestep"].iloc[0])
        base["query_frames"] = _frames_label(call["query_frame"])
        for metric in METRICS:
            curves = key_curves(call, metric, ["head"])
            for head, values in curves.iterrows():
                rows.append({**base, "head": head, "metric": metric, **curve_stats(values.to_numpy(), curves.columns.to_numpy())})
    return pd.DataFrame(rows, columns=HEAD_STATS_SCHEMA.names)


def layer_stats(frame: pd.DataFrame) -> pd.DataFrame:
    """Per call of the last block and metric: statistics of the head-averaged curve,
    plus the diagonal and frame-0 column means of the head-averaged frame x frame
    matrix assembled from every block at the same (pass, step)."""
    keys = [k for k in RUN_KEYS + ["layer", "pass", "step"] if k in frame.columns]
    # Head-averaged query x key matrices, one per run, layer and call kind.
    matrices = frame.groupby(keys + ["query_frame", "key_frame"], observed=True)[list(METRICS)].mean()
    rows = []
    for key, call in _call_groups(last_block(frame)):
        base = dict(zip(keys, key))
        base["timestep"] = float(call["timestep"].iloc[0])
        base["query_frames"] = _frames_label(call["query_frame"])
        matrix = matrices.loc[key].reset_index()
        diagonal = matrix[matrix["query_frame"] == matrix["key_frame"]]
        column = matrix[matrix["key_frame"] == 0]
        for metric in METRICS:
            curve = call.groupby("key_frame")[metric].mean().sort_index()
            rows.append(
                {
                    **base,
                    "metric": metric,
                    **curve_stats(curve.to_numpy(), curve.index.to_numpy()),
                    "diagonal_mean": float(diagonal[metric].mean()) if len(diagonal) else float("nan"),
                    "first_column_mean": float(column[metric].mean()) if len(column) else float("nan"),
                }
            )
    return pd.DataFrame(rows, columns=LAYER_STATS_SCHEMA.names)
