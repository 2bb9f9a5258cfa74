"""frame_attention rows of an import: the table's columns from reduced frame statistics."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sinkscope.tables import DEFAULT_VARIANT, FRAME_ATTENTION_SCHEMA

_KEY_COLUMNS = ["layer", "head", "block", "query_frame", "key_frame"]


def _rows(
    layer: int,
    query_frames: list[int],
    key_frames: list[int],
    blocks: list[int],
    logit_mean: np.ndarray,
    prob_mass: np.ndarray,
    keep: np.ndarray | None,
) -> pd.DataFrame:
    """Long rows of [H, nq, nk] arrays (cells where ``keep`` [nq, nk] is False dropped)."""
    heads, nq, nk = logit_mean.shape
    h, q, k = np.meshgrid(np.arange(heads), np.arange(nq), np.arange(nk), indexing="ij")
    mask = np.ones((heads, nq, nk), dtype=bool) if keep is None else np.broadcast_to(keep, (heads, nq, nk))
    qf, kf, bl = np.asarray(query_frames), np.asarray(key_frames), np.asarray(blocks)
    return pd.DataFrame(
        {
            "layer": np.full(int(mask.sum()), layer, dtype=np.int16),
            "head": h[mask].astype(np.int16),
            "block": bl[q[mask]].astype(np.int16),
            "query_frame": qf[q[mask]].astype(np.int16),
            "key_frame": kf[k[mask]].astype(np.int16),
            "logit_mean": logit_mean[mask].astype(np.float32),
            "prob_mass": prob_mass[mask].astype(np.float32),
        }
    )


def _with_constant_columns(
    frame: pd.DataFrame, checkpoint: str, prompt_id: str, seed: int, frame_seq_length: int
) -> pd.DataFrame:
    n = len(frame)
    columns = {
        "checkpoint": pd.Series([checkpoint] * n, dtype=object),
        "variant": pd.Series([DEFAULT_VARIANT] * n, dtype=object),
        "prompt_id": pd.Series([prompt_id] * n, dtype=object),
        "seed": np.full(n, seed, dtype=np.int64),
        "layer": frame["layer"].to_numpy(np.int16),
        "head": frame["head"].to_numpy(np.int16),
        "block": frame["block"].to_numpy(np.int16),
        "pass": pd.Series(["denoise"] * n, dtype=object),
        "step": np.full(n, -1, dtype=np.int16),
        "timestep": np.full(n, np.nan, dtype=np.float32),
        "prompt_segment": np.zeros(n, dtype=np.int16),  # the older scripts had one prompt a video
        "query_frame": frame["query_frame"].to_numpy(np.int16),
        "key_frame": frame["key_frame"].to_numpy(np.int16),
        "logit_mean": frame["logit_mean"].to_numpy(np.float32),
        "prob_mass": frame["prob_mass"].to_numpy(np.float32),
        # Not recorded by the older scripts: the argmax needs token-level scores.
        "argmax_share": np.full(n, np.nan, dtype=np.float32),
        "key_tokens": np.full(n, frame_seq_length or 0, dtype=np.int32),
        "key_position_shift": np.zeros(n, dtype=np.int32),
    }
    return pd.DataFrame({name: columns[name] for name in FRAME_ATTENTION_SCHEMA.names})
