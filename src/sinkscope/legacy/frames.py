"""Frame matrices (``full_frame_attention``): a [heads, frames, frames] probability matrix
per cache, turned into rows of the cells a query could see."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sinkscope.legacy.plan import ROW_SUM_TOLERANCE, _as_int, _as_int_list, _fail, _Plan, frame_matrix_layout
from sinkscope.legacy.rows import _rows


def _import_frame_matrix(data: Mapping[str, Any], plan: _Plan, path: Path, not_imported: list[str]):
    entry = plan.entries[0]
    # The fields checked against the matrix, as load_study checks them before any job.
    matrix, blocks, block_of, visible = frame_matrix_layout(data, entry, path)
    frames = matrix.shape[1]
    if blocks.sizes is None:
        plan.notes.append(f"no block_sizes: blocks of {blocks.per_block} frames assumed ({blocks.origin})")
    plan.blocks = blocks
    if "last_block_query_frames" in data:
        stated = _as_int_list(data["last_block_query_frames"], path, "last_block_query_frames")
        last = list(range(*blocks.span(int(block_of[-1]))))
        if stated != last:
            plan.notes.append(
                f"last_block_query_frames {stated} differs from the last block {last} of the block sizes; the block "
                "sizes are used"
            )

    fsl = data.get("frame_seq_length")
    fsl = _as_int(fsl, path, "frame_seq_length", minimum=1) if fsl is not None else None
    plan.frame_seq_length = fsl
    is_logits, reason, scale = _frame_matrix_kind(matrix, visible, entry.is_logits, fsl, path)
    logit_mean = np.where(visible, matrix, np.nan) if is_logits else np.full_like(matrix, np.nan)
    prob_mass = np.full_like(matrix, np.nan) if is_logits else np.where(visible, matrix * scale, np.nan)
    if is_logits:
        not_imported.append(
            f"prob_mass of layer {entry.layer}: NaN — a frame matrix of logit means does not give the softmax "
            "(it needs every token's logit)"
        )
    else:
        not_imported.append(
            f"logit_mean of layer {entry.layer}: NaN — the matrix holds probabilities, and log p differs from the "
            "logit by an unknown per-query log-sum-exp"
        )
    if "last_block_frame_attention" in data:
        plan.notes.append(
            "last_block_frame_attention not imported: it repeats the last block's rows of full_frame_attention"
        )
    part = _rows(
        entry.layer, list(range(frames)), list(range(frames)), block_of.tolist(), logit_mean, prob_mass, visible
    )
    described = [
        {
            "entry": -1,
            "field": "full_frame_attention",
            "layer": entry.layer,
            "shape": list(entry.tensor.shape),
            "dtype": str(entry.tensor.dtype).replace("torch.", ""),
            "values": "logits" if is_logits else "probabilities",
            "decided_by": reason,
            "probability_scale": None if is_logits else scale,
            "blocks": sorted(set(block_of.tolist())),
            "query_frames": list(range(frames)),
            "key_frames": list(range(frames)),
            "visible_cells_per_head": int(visible.sum()),
            "hidden_cells_per_head_dropped": int((~visible).sum()),
        }
    ]
    return [part], described


def _frame_matrix_kind(
    matrix: np.ndarray, visible: np.ndarray, flag: bool | None, fsl: int | None, path: Path
) -> tuple[bool, str, float]:
    """(is_logits, why, scale to prob_mass) of a frame matrix."""
    values = matrix[:, visible]
    negative = bool((values < 0).any())
    if flag is True:
        return True, "is_logits is true", 1.0
    if flag is False and negative:
        raise _fail(
            path, "is_logits", "is false, but full_frame_attention holds negative values, which cannot be probabilities"
        )
    # Row sums over the visible key frames tell which probability aggregate was stored.
    rows = np.where(visible, matrix, 0.0).sum(axis=2)  # [H, Q]
    if flag is None and negative:
        return True, "no is_logits field; negative values cannot be probabilities", 1.0
    if np.abs(rows - 1).max() < ROW_SUM_TOLERANCE:
        why = "is_logits is false" if flag is False else "no is_logits field; non-negative rows summing to 1"
        return False, f"{why}; the rows sum to 1, so the cells are prob_mass", 1.0
    if fsl and np.abs(rows * fsl - 1).max() < ROW_SUM_TOLERANCE:
        why = (
            "is_logits is false"
            if flag is False
            else "no is_logits field; non-negative rows summing to 1/frame_seq_length"
        )
        return False, f"{why}; the cells are means over token pairs, so prob_mass = cell x frame_seq_length", float(fsl)
    if flag is None:
        return (
            True,
            "no is_logits field; non-negative values whose rows sum neither to 1 nor to 1/frame_seq_length: read as "
            "logits",
            1.0,
        )
    scale = float(fsl) if fsl else 1.0
    return (
        False,
        (
            f"is_logits is false, but the rows sum to {rows.min():.4g}..{rows.max():.4g}: taken as the old script's "
            f"mean over token pairs (prob_mass = cell x {scale:g}); the capture may not have covered every key"
        ),
        scale,
    )
