"""Import of the attention caches that the older extraction scripts wrote (``.pt``).

Three layouts exist (the seed notebooks read them):

- ``token_level`` (``run_extraction_figure4.py``): ``attention_weights`` is a list of
  ``{layer_idx, attn_logits | attn_weights [B, H, Lq, Lk], ...}``, placed in the video by
  top-level ``query_frames`` / ``key_frames`` or a per-entry ``last_block_start_frame``.
- ``inference_capture`` (``run_extraction.py``): entries ``{layer_idx, attn_weights,
  q_shape, k_shape}``, one per attention call, in call order, with no frame indices.
  For a non-rolling KV cache the keys are frames ``0 .. Lk/fsl - 1`` and the queries
  are the last ``Lq/fsl`` of them; calls that cannot be placed that way (a partial
  sliding window, cross-attention to text, a rolled cache) are skipped and listed.
- ``frame_matrix`` (``run_extraction_each.py``): ``full_frame_attention [H, F, F]`` with
  ``layer_index``, ``block_sizes``, ``is_logits``; cells a query frame cannot see under
  the block sizes were left 0 by the script and are not rows.

Each becomes ``frame_attention`` rows (``sinkscope.tables.FRAME_ATTENTION_SCHEMA``) with
``pass = "denoise"``, ``step = -1`` (the call is not recorded) and ``timestep = NaN``.
Logits give ``logit_mean`` (and, token-level, an exact ``prob_mass`` by a streamed
softmax over the entry's keys); probabilities give ``prob_mass`` only, since a logit is
log p plus an unknown per-query log-sum-exp.

Token-level tensors reach [1, 12, 4680, 32760] bf16 (3.7 GB) a layer, so the file is
memory-mapped and reduced one head and one query chunk at a time; on Linux the pages
already reduced are handed back to the kernel, so the resident memory stays near one
chunk rather than growing to the file size.
"""

from __future__ import annotations

import hashlib
import logging
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from sinkscope.legacy.frames import _import_frame_matrix
from sinkscope.legacy.plan import (
    _TOP_LEVEL_FIELDS,
    DEFAULT_PROMPT_ID,
    PICKLE_OPTION,
    LegacyCacheError,
    _describe,
    _load,
    _plan,
)
from sinkscope.legacy.rows import _KEY_COLUMNS, _with_constant_columns
from sinkscope.legacy.tokens import _import_token_entries
from sinkscope.model.torchfile import read_archive
from sinkscope.names import check_name
from sinkscope.tables import FRAME_ATTENTION_SCHEMA, write_table

log = logging.getLogger("sinkscope.legacy")


__all__ = ["import_cache", "import_to_parquet", "peek_layers"]


def peek_layers(path: str | Path, allow_pickle: bool = False) -> list[int]:
    """0-based layer indices present in a cache, reading as little as possible (torch.load with mmap=True).

    Only the pickled structure is read; tensors stay memory-mapped and unread. Layers
    whose every entry would be skipped on import (see the module docstring) are left out.
    A zip archive is first checked without unpickling (``model.torchfile``): every
    record's CRC, and no objects beyond tensors unless ``allow_pickle``.
    """
    path = Path(path)
    if zipfile.is_zipfile(path):
        archive = read_archive(path, verify=True)
        if archive.unsafe_globals and not allow_pickle:
            raise LegacyCacheError(
                f"{path}: holds pickled objects beyond tensors ({', '.join(archive.unsafe_globals[:3])}); "
                f"{PICKLE_OPTION} only for a file you trust"
            )
    path, data = _load(path, allow_pickle)
    return _plan(data, path).layers


def import_cache(
    path: str | Path,
    *,
    checkpoint: str,
    prompt_id: str | None = None,
    seed: int = 0,
    allow_pickle: bool = False,
    provenance: Mapping[str, Any] | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Rows with exactly the columns of ``FRAME_ATTENTION_SCHEMA``, plus a metadata dict
    (``provenance``, the pipeline's record of the code that ran, is copied into it).

    The metadata holds what the table has no column for: the layout, the prompt text,
    num_frames, frame_seq_length, the blocks, what each entry held (logits or
    probabilities, and how that was decided), and what could not be imported and why.
    Raises ``LegacyCacheError`` (a ValueError naming the file and the field) for an
    unknown layout, lengths that are not whole frames, NaN values or a missing layer; a
    ConfigError for a ``checkpoint`` or ``prompt_id`` that cannot be a name
    (``names.name_problem``), before the file is read.
    """
    # Both name the rows' source and prompt, which become file and folder names downstream.
    check_name(checkpoint, "checkpoint")
    prompt_id = check_name(DEFAULT_PROMPT_ID if prompt_id is None else str(prompt_id), "prompt_id")
    path, data = _load(path, allow_pickle)
    plan = _plan(data, path)
    not_imported: list[str] = []
    if plan.layout == "frame_matrix":
        parts, described = _import_frame_matrix(data, plan, path, not_imported)
    else:
        parts, described = _import_token_entries(data, plan, path, not_imported)
    frame = pd.concat(parts, ignore_index=True)

    # Several calls of one block (an inference capture's denoising steps and cache pass)
    # carry no step index, so their rows would collide: they are averaged, and said so.
    averaged = []
    counts = frame.groupby(_KEY_COLUMNS, sort=False).size()
    if (counts > 1).any():
        calls = pd.DataFrame(described)
        for (layer, block), group in calls.explode("blocks").groupby(["layer", "blocks"]):
            if group["entry"].nunique() > 1:
                averaged.append(
                    {
                        "layer": int(layer),
                        "block": int(block),
                        "entries": sorted(int(e) for e in group["entry"].unique()),
                    }
                )
        frame = frame.groupby(_KEY_COLUMNS, sort=False, as_index=False)[["logit_mean", "prob_mass"]].mean()
        message = (
            f"{len(averaged)} blocks had several calls (the file does not say which denoising step or cache pass each "
            "is): their rows are the mean over those calls"
        )
        plan.notes.append(message)
        log.warning("%s: %s", path, message)
    frame = frame.sort_values(_KEY_COLUMNS, ignore_index=True)
    frame = _with_constant_columns(frame, checkpoint, prompt_id, int(seed), plan.frame_seq_length)

    for skipped in plan.skipped:
        log.warning(
            "%s: skipped attention_weights[%d] (layer %d, shape %s): %s",
            path,
            skipped["entry"],
            skipped["layer"],
            skipped["shape"],
            skipped["reason"],
        )
    for line in not_imported:
        log.warning("%s: %s", path, line)
    for note in plan.notes:
        log.info("%s: %s", path, note)

    metadata: dict[str, Any] = {
        "source": "legacy_cache",
        "legacy_layout": plan.layout,
        "legacy_file": str(path.resolve()),
        "legacy_file_bytes": path.stat().st_size,
        "legacy_file_sha256": _sha256(path),
        "checkpoint": checkpoint,
        "prompt_id": prompt_id,
        "seed": int(seed),
        "prompt": data["prompt"] if isinstance(data.get("prompt"), str) else _describe(data.get("prompt")),
        "num_frames": _describe(data.get("num_frames")),
        "frame_seq_length": plan.frame_seq_length,
        "blocks": plan.blocks.describe() if plan.blocks else None,
        "block_sizes": list(plan.blocks.sizes) if plan.blocks and plan.blocks.sizes else None,
        "layers": plan.layers,
        "pass_step": "every row has pass='denoise', step=-1 (call not recorded), timestep=NaN",
        "imported": described,
        "skipped": plan.skipped,
        "not_imported": not_imported,
        "averaged_calls": averaged,
        "notes": plan.notes,
        "extra_fields": {str(k): _describe(v) for k, v in data.items() if k not in _TOP_LEVEL_FIELDS},
        "allow_pickle": bool(allow_pickle),
        **(provenance or {}),
        "torch_version": torch.__version__,
    }
    log.info(
        "%s: %s layout, layers %s: %d rows (%d entries imported, %d skipped)",
        path,
        plan.layout,
        plan.layers,
        len(frame),
        len(described),
        len(plan.skipped),
    )
    return frame, metadata


def import_to_parquet(
    path: str | Path,
    output: str | Path,
    *,
    checkpoint: str,
    prompt_id: str | None = None,
    seed: int = 0,
    allow_pickle: bool = False,
    provenance: Mapping[str, Any] | None = None,
) -> None:
    """``import_cache`` + ``write_table`` (atomic): a failing import leaves no file at ``output``."""
    frame, metadata = import_cache(
        path, checkpoint=checkpoint, prompt_id=prompt_id, seed=seed, allow_pickle=allow_pickle, provenance=provenance
    )
    write_table(frame, output, FRAME_ATTENTION_SCHEMA, metadata)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()
