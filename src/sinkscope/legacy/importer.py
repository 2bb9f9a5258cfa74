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

import ctypes
import ctypes.util
import hashlib
import logging
import math
import os
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.tables import DEFAULT_VARIANT, FRAME_ATTENTION_SCHEMA, write_table

log = logging.getLogger("sinkscope.legacy")

__all__ = ["LAYOUTS", "LegacyCacheError", "import_cache", "import_to_parquet", "peek_layers"]

LAYOUTS = ("token_level", "inference_capture", "frame_matrix")
PICKLE_OPTION = "--allow-pickle (or allow_pickle: true in legacy_caches)"
DEFAULT_PROMPT_ID = "legacy"
# The old scripts' own defaults (Wan2.1 at 480x832; Self-Forcing's 3-frame blocks).
DEFAULT_FRAME_SEQ_LENGTH = 1560
DEFAULT_FRAMES_PER_BLOCK = 3
# float32 values per query chunk (64 MiB): a few such buffers are the whole working set.
CHUNK_ELEMENTS = 1 << 24
# |row sum - 1| below this counts as a softmax row (bf16 storage rounds each value).
ROW_SUM_TOLERANCE = 0.02
# Hand reduced pages of a memory-mapped cache back to the kernel (Linux); the benchmark
# turns it off to show the difference.
_RELEASE_PAGES = True

_KEY_COLUMNS = ["layer", "head", "block", "query_frame", "key_frame"]
_TOP_LEVEL_FIELDS = {
    "attention_weights", "full_frame_attention", "prompt", "num_frames", "frame_seq_length", "query_frames",
    "key_frames", "num_frame_per_block", "block_sizes", "independent_first_frame", "is_logits", "layer_index",
    "layer_idx", "num_heads", "last_block_query_frames", "last_block_frame_attention", "layer_indices",
}  # fmt: skip


class LegacyCacheError(SinkscopeError):
    """A cache this module cannot import; the message names the file and the field."""


# A tensor may claim more elements than its bytes hold only through stride-0 (broadcast)
# dimensions; real attention caches never do. Beyond this bound it is refused: a
# 370 KB file must not become 12 x 4680 x 156e6 values to stream through.
MAX_UNBACKED_BYTES = 1 << 20


def _check_backed(tensor: torch.Tensor, path: Path, where: str) -> None:
    """Fail unless the file holds the bytes the tensor claims (up to MAX_UNBACKED_BYTES)."""
    claimed = tensor.numel() * tensor.element_size()
    stored = tensor.untyped_storage().nbytes() - tensor.storage_offset() * tensor.element_size()
    if claimed > max(stored, MAX_UNBACKED_BYTES):
        raise _fail(
            path, where,
            f"claims {tensor.numel():,} values of shape {list(tensor.shape)} (strides {list(tensor.stride())}) "
            f"but the file holds {max(stored, 0):,} bytes for them: a broadcast (stride-0) view, not an attention cache",
        )  # fmt: skip


# -- small readers of the file's fields -----------------------------------------------------


def _fail(path: Path, where: str, message: str) -> LegacyCacheError:
    return LegacyCacheError(f"{path}: field {where}: {message}")


def _as_int(value: Any, path: Path, where: str, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    integral = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    whole = isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer()
    if not (integral or whole):
        raise _fail(path, where, f"expected an integer, got {_describe(value)!r}")
    number = int(value)
    if number < minimum:
        raise _fail(path, where, f"expected an integer >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise _fail(path, where, f"expected an integer <= {maximum}, got {number}")
    return number


def _as_int_list(value: Any, path: Path, where: str) -> list[int]:
    if isinstance(value, torch.Tensor):
        value = value.flatten().tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, range, np.ndarray)):
        raise _fail(path, where, f"expected a list of integers, got {type(value).__name__}")
    return [_as_int(v, path, f"{where}[{i}]") for i, v in enumerate(value)]


def _as_flag(value: Any, path: Path, where: str) -> bool | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and int(value) in (0, 1)):
        return bool(value)
    raise _fail(path, where, f"expected true or false, got {_describe(value)!r}")


def _lookup(entry: Mapping[str, Any], data: Mapping[str, Any], key: str) -> tuple[Any, str | None]:
    """An entry's own field first, then the file's top-level one: (value, where found)."""
    if key in entry:
        return entry[key], "entry"
    if key in data:
        return data[key], "top"
    return None, None


def _describe(value: Any) -> Any:
    """A short JSON-able description of a field the table has no column for."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) <= 500 else value[:500] + "…"
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        return value.item()
    if isinstance(value, torch.Tensor):
        return f"tensor{list(value.shape)} {str(value.dtype).replace('torch.', '')}"
    if (
        isinstance(value, (list, tuple, torch.Size))
        and len(value) <= 64
        and all(isinstance(v, (bool, int, float, str)) for v in value)
    ):
        return list(value)
    text = repr(value)
    return f"{type(value).__name__}: {text[:300]}{'…' if len(text) > 300 else ''}"


# -- blocks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Blocks:
    """Generation blocks: explicit sizes, or a fixed count per block (first frame alone or not)."""

    sizes: tuple[int, ...] | None
    per_block: int
    first_alone: bool
    origin: str

    def of(self, frame: int) -> int | None:
        if self.sizes is not None:
            end = 0
            for block, size in enumerate(self.sizes):
                end += size
                if frame < end:
                    return block
            return None
        if self.first_alone:
            return 0 if frame == 0 else (frame - 1) // self.per_block + 1
        return frame // self.per_block

    def span(self, block: int) -> tuple[int, int]:
        """[start, stop) of a block's frames."""
        if self.sizes is not None:
            start = sum(self.sizes[:block])
            return start, start + self.sizes[block]
        if self.first_alone:
            return (0, 1) if block == 0 else (1 + (block - 1) * self.per_block, 1 + block * self.per_block)
        return block * self.per_block, (block + 1) * self.per_block

    def describe(self) -> dict[str, Any]:
        if self.sizes is not None:
            return {"block_sizes": list(self.sizes), "from": self.origin}
        return {"num_frame_per_block": self.per_block, "independent_first_frame": self.first_alone, "from": self.origin}


def _blocks(entry: Mapping[str, Any], data: Mapping[str, Any], path: Path, prefix: str) -> _Blocks:
    sizes, where = _lookup(entry, data, "block_sizes")
    if sizes is not None:
        name = f"{prefix}block_sizes" if where == "entry" else "block_sizes"
        values = _as_int_list(sizes, path, name)
        if not values or any(v < 1 for v in values):
            raise _fail(path, name, f"expected positive block sizes, got {values}")
        return _Blocks(tuple(values), 0, False, "block_sizes")
    per_block, where = _lookup(entry, data, "num_frame_per_block")
    alone, _ = _lookup(entry, data, "independent_first_frame")
    first_alone = bool(_as_flag(alone, path, "independent_first_frame"))
    if per_block is None:
        return _Blocks(None, DEFAULT_FRAMES_PER_BLOCK, first_alone, f"default ({DEFAULT_FRAMES_PER_BLOCK} frames a block)")
    name = f"{prefix}num_frame_per_block" if where == "entry" else "num_frame_per_block"
    return _Blocks(None, _as_int(per_block, path, name, minimum=1), first_alone, "num_frame_per_block")


# -- planning: where each tensor sits in the video (shapes only, no tensor data read) --------


@dataclass
class _Entry:
    """One token-level tensor placed in the video."""

    index: int
    field: str
    layer: int
    tensor: torch.Tensor
    fsl: int
    query_frames: list[int]
    key_frames: list[int]
    blocks: list[int]
    is_logits: bool | None
    key_name: str
    fields: list[str]


@dataclass
class _Plan:
    layout: str
    entries: list[_Entry] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    blocks: _Blocks | None = None
    frame_seq_length: int | None = None

    @property
    def layers(self) -> list[int]:
        return sorted({entry.layer for entry in self.entries})


def _detect_layout(data: Any, path: Path) -> str:
    if not isinstance(data, Mapping):
        raise LegacyCacheError(
            f"{path}: unknown layout: the file holds a {type(data).__name__}, not a dict with the field "
            "'attention_weights' (token-level or inference-mode captures) or 'full_frame_attention' (frame matrices)"
        )
    if "full_frame_attention" in data:
        return "frame_matrix"
    if "attention_weights" not in data:
        found = ", ".join(sorted(map(str, data))[:20]) or "none"
        raise LegacyCacheError(
            f"{path}: unknown layout: neither the field 'attention_weights' (token-level or inference-mode captures) "
            f"nor 'full_frame_attention' (frame matrices) is present (fields: {found})"
        )
    entries = data["attention_weights"]
    if isinstance(entries, (str, bytes, Mapping)) or not isinstance(entries, Sequence) or not entries:
        raise _fail(path, "attention_weights", f"expected a non-empty list of dicts, got {_describe(entries)!r}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise _fail(path, f"attention_weights[{i}]", f"expected a dict, got {type(entry).__name__}")
        if "attn_logits" not in entry and "attn_weights" not in entry:
            raise _fail(
                path,
                f"attention_weights[{i}]",
                f"has neither 'attn_logits' nor 'attn_weights' (fields: {sorted(map(str, entry))})",
            )
    # Frame indices say where the tensors sit: the Figure 4 script's full captures.
    if "query_frames" in data or "key_frames" in data or any("last_block_start_frame" in e for e in entries):
        return "token_level"
    # Call captures of the inference pipeline carry q/k shapes and no frame indices.
    if any("q_shape" in e or "k_shape" in e for e in entries):
        return "inference_capture"
    return "token_level" if any("attn_logits" in e for e in entries) else "inference_capture"


def _token_tensor(entry: Mapping[str, Any], path: Path, prefix: str) -> tuple[torch.Tensor, str]:
    key = "attn_logits" if "attn_logits" in entry else "attn_weights"
    tensor = entry[key]
    where = f"{prefix}{key}"
    if not isinstance(tensor, torch.Tensor):
        raise _fail(path, where, f"expected a tensor, got {type(tensor).__name__}")
    if tensor.ndim == 3:
        tensor = tensor.unsqueeze(0)
    if tensor.ndim != 4:
        raise _fail(path, where, f"expected [B, heads, queries, keys], got shape {list(tensor.shape)}")
    if not tensor.is_floating_point():
        raise _fail(path, where, f"expected floating-point values, got {tensor.dtype}")
    if min(tensor.shape) < 1:
        raise _fail(path, where, f"is empty (shape {list(tensor.shape)})")
    _check_backed(tensor, path, where)
    return tensor, key


def _frame_seq_length(entry: Mapping[str, Any], data: Mapping[str, Any], path: Path, prefix: str, plan: _Plan) -> int:
    value, where = _lookup(entry, data, "frame_seq_length")
    if value is None:
        note = f"frame_seq_length is not in the file: assumed {DEFAULT_FRAME_SEQ_LENGTH} (Wan2.1 at 480x832), as the notebooks do"
        if note not in plan.notes:
            plan.notes.append(note)
        return DEFAULT_FRAME_SEQ_LENGTH
    return _as_int(value, path, f"{prefix}frame_seq_length" if where == "entry" else "frame_seq_length", minimum=1)


def _layer_of(entry: Mapping[str, Any], path: Path, prefix: str) -> int:
    for key in ("layer_idx", "layer_index"):
        if key in entry:
            # Layers are int16 in the tables.
            return _as_int(entry[key], path, f"{prefix}{key}", maximum=2**15 - 1)
    raise _fail(path, f"{prefix}layer_idx", "the layer index is missing (expected an integer 'layer_idx')")


def _plan_token_level(data: Mapping[str, Any], path: Path) -> _Plan:
    plan = _Plan("token_level")
    for i, entry in enumerate(data["attention_weights"]):
        prefix = f"attention_weights[{i}]."
        tensor, key = _token_tensor(entry, path, prefix)
        layer = _layer_of(entry, path, prefix)
        fsl = _frame_seq_length(entry, data, path, prefix, plan)
        lq, lk = tensor.shape[2], tensor.shape[3]
        for name, length in (("key", lk), ("query", lq)):
            if length % fsl:
                raise _fail(path, f"{prefix}{key}", f"{name} length {length} is not a multiple of frame_seq_length {fsl}")
        nq, nk = lq // fsl, lk // fsl
        for name, count in (("num_key_frames", nk), ("num_query_frames", nq)):
            if name in entry and _as_int(entry[name], path, prefix + name) != count:
                raise _fail(path, prefix + name, f"says {entry[name]}, but {key} holds {count} frames of {fsl} tokens")
        frames, where = _lookup(entry, data, "key_frames")
        if frames is not None:
            name = f"{prefix}key_frames" if where == "entry" else "key_frames"
            key_frames = _as_int_list(frames, path, name)
            if len(key_frames) != nk:
                raise _fail(path, name, f"names {len(key_frames)} frames, but {prefix}{key} has {nk} key frames of {fsl} tokens")
        else:
            key_frames = list(range(nk))
        frames, where = _lookup(entry, data, "query_frames")
        if frames is not None:
            name = f"{prefix}query_frames" if where == "entry" else "query_frames"
            query_frames = _as_int_list(frames, path, name)
            if len(query_frames) != nq:
                raise _fail(
                    path, name, f"names {len(query_frames)} frames, but {prefix}{key} has {nq} query frames of {fsl} tokens"
                )
        elif "last_block_start_frame" in entry:
            start = _as_int(entry["last_block_start_frame"], path, f"{prefix}last_block_start_frame")
            query_frames = list(range(start, start + nq))
        else:
            query_frames = key_frames[-nq:] if nq <= nk else []
            if not query_frames:
                raise _fail(path, f"{prefix}{key}", f"{nq} query frames but only {nk} key frames, and no query_frames field")
            plan.notes.append(
                f"{prefix[:-1]}: no query_frames or last_block_start_frame: the queries are taken as the last {nq} key frames "
                f"{query_frames} (the block's own frames end the key sequence in a block-causal call)"
            )
        if len(set(key_frames)) != len(key_frames):
            raise _fail(path, "key_frames", f"repeats a frame: {key_frames}")
        blocks = _blocks(entry, data, path, prefix)
        plan.blocks = plan.blocks or blocks
        block_of = [blocks.of(f) for f in query_frames]
        if None in block_of:
            raise _fail(path, "block_sizes", f"query frames {query_frames} lie past the blocks {list(blocks.sizes or [])}")
        flag, where = _lookup(entry, data, "is_logits")
        is_logits = _as_flag(flag, path, f"{prefix}is_logits" if where == "entry" else "is_logits")
        plan.entries.append(_Entry(i, f"{prefix}{key}", layer, tensor, fsl, query_frames, key_frames, block_of, is_logits, key,
                                   sorted(map(str, entry))))  # fmt: skip
        plan.frame_seq_length = plan.frame_seq_length or fsl
    return plan


def _plan_inference(data: Mapping[str, Any], path: Path) -> _Plan:
    plan = _Plan("inference_capture")
    num_frames = data.get("num_frames")
    num_frames = _as_int(num_frames, path, "num_frames", minimum=1) if num_frames is not None else None
    placed: list[_Entry] = []
    for i, entry in enumerate(data["attention_weights"]):
        prefix = f"attention_weights[{i}]."
        tensor, key = _token_tensor(entry, path, prefix)
        layer = _layer_of(entry, path, prefix)
        fsl = _frame_seq_length(entry, data, path, prefix, plan)
        blocks = _blocks(entry, data, path, prefix)
        plan.blocks = plan.blocks or blocks
        lq, lk = tensor.shape[2], tensor.shape[3]
        reason = None
        if lk % fsl:
            reason = (f"key length {lk} is not a whole number of frames of {fsl} tokens (a partial sliding window, "
                      "or cross-attention to the text): its key frames are unknown")  # fmt: skip
        elif lq % fsl:
            reason = f"query length {lq} is not a whole number of frames of {fsl} tokens"
        elif lq > lk:
            reason = f"{lq // fsl} query frames but only {lk // fsl} key frames: not a block-causal self-attention call"
        elif num_frames is not None and lk // fsl > num_frames:
            reason = f"{lk // fsl} key frames, more than the video's num_frames {num_frames}"
        else:
            nq, nk = lq // fsl, lk // fsl
            first = nk - nq
            block = blocks.of(first)
            if block is None or blocks.span(block) != (first, nk):
                reason = (f"its queries, if they were the last {nq} of key frames 0-{nk - 1}, would not be one generation "
                          f"block ({blocks.describe()}): the KV cache may have rolled or been trimmed")  # fmt: skip
        if reason is not None:
            plan.skipped.append({"entry": i, "layer": layer, "shape": list(tensor.shape), "reason": reason})
            continue
        query_frames = list(range(nk - nq, nk))
        flag, where = _lookup(entry, data, "is_logits")
        is_logits = _as_flag(flag, path, f"{prefix}is_logits" if where == "entry" else "is_logits")
        placed.append(_Entry(i, f"{prefix}{key}", layer, tensor, fsl, query_frames, list(range(nk)), [block] * nq, is_logits,
                             key, sorted(map(str, entry))))  # fmt: skip
        plan.frame_seq_length = plan.frame_seq_length or fsl
    # A rolling (sliding-window) cache stops growing: the calls of several blocks then share
    # the largest key length, and only the first block that filled the window sits at frames
    # 0..nk-1. Calls of one block come in a run, as many per block as in the earlier blocks.
    for layer in sorted({e.layer for e in placed}):
        calls = [e for e in placed if e.layer == layer]
        counts: dict[int, int] = {}
        for e in calls:
            counts[len(e.key_frames)] = counts.get(len(e.key_frames), 0) + 1
        if len(counts) < 2:
            continue
        per_block = min(counts.values())
        widest = max(counts)
        if counts[widest] > per_block:
            late = [e for e in calls if len(e.key_frames) == widest][per_block:]
            for e in late:
                plan.skipped.append({
                    "entry": e.index, "layer": layer, "shape": list(e.tensor.shape),
                    "reason": (f"the key length stops growing at {widest} frames ({counts[widest]} calls where the earlier blocks "
                               f"had {per_block}): the KV cache rolled, so the key frames of the later blocks' calls are unknown"),
                })  # fmt: skip
            placed = [e for e in placed if not any(e is x for x in late)]
    plan.entries = placed
    plan.skipped.sort(key=lambda s: s["entry"])
    return plan


def _plan(data: Any, path: Path) -> _Plan:
    layout = _detect_layout(data, path)
    if layout == "frame_matrix":
        plan = _Plan("frame_matrix")
        if "layer_index" in data or "layer_idx" in data:
            layer = _layer_of(data, path, "")
        else:
            raise _fail(path, "layer_index", "the layer index is missing (expected an integer 'layer_index')")
        tensor = data["full_frame_attention"]
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise _fail(path, "full_frame_attention", f"expected a floating-point tensor, got {_describe(tensor)!r}")
        shape = list(tensor.shape)
        _check_backed(tensor, path, "full_frame_attention")
        if tensor.ndim == 4 and shape[0] == 1:
            tensor = tensor[0]
        if tensor.ndim != 3 or tensor.shape[1] != tensor.shape[2] or min(tensor.shape) < 1:
            raise _fail(path, "full_frame_attention", f"expected [heads, frames, frames], got shape {shape}")
        flag = _as_flag(data.get("is_logits"), path, "is_logits")
        plan.entries.append(_Entry(-1, "full_frame_attention", layer, tensor, 0, [], [], [], flag, "full_frame_attention", []))
        return plan
    plan = _plan_token_level(data, path) if layout == "token_level" else _plan_inference(data, path)
    if not plan.entries:
        reasons = "; ".join(f"attention_weights[{s['entry']}]: {s['reason']}" for s in plan.skipped[:5])
        raise _fail(path, "attention_weights", f"no entry can be placed in the video ({reasons})")
    return plan


def _load(path: str | Path, allow_pickle: bool) -> tuple[Path, Any]:
    from sinkscope.model.loading import torch_load

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"attention cache {str(path)!r} does not exist")
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as handle:
            magic = handle.read(2)
        # The pre-1.6 torch.save format is a bare pickle (protocol 2+ starts with 0x80).
        if not magic.startswith(b"\x80"):
            raise LegacyCacheError(f"{path}: unknown layout: not a file written by torch.save")
    return path, torch_load(path, allow_pickle=allow_pickle, option=PICKLE_OPTION)


# -- public API -----------------------------------------------------------------------------


def peek_layers(path: str | Path, allow_pickle: bool = False) -> list[int]:
    """0-based layer indices present in a cache, reading as little as possible (torch.load with mmap=True).

    Only the pickled structure is read; tensors stay memory-mapped and unread. Layers
    whose every entry would be skipped on import (see the module docstring) are left out.
    """
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
    unknown layout, lengths that are not whole frames, NaN values or a missing layer.
    """
    path, data = _load(path, allow_pickle)
    plan = _plan(data, path)
    prompt_id = DEFAULT_PROMPT_ID if prompt_id is None else str(prompt_id)
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
                    {"layer": int(layer), "block": int(block), "entries": sorted(int(e) for e in group["entry"].unique())}
                )
        frame = frame.groupby(_KEY_COLUMNS, sort=False, as_index=False)[["logit_mean", "prob_mass"]].mean()
        message = (f"{len(averaged)} blocks had several calls (the file does not say which denoising step or cache pass each is): "
                   "their rows are the mean over those calls")  # fmt: skip
        plan.notes.append(message)
        log.warning("%s: %s", path, message)
    frame = frame.sort_values(_KEY_COLUMNS, ignore_index=True)
    frame = _with_constant_columns(frame, checkpoint, prompt_id, int(seed), plan.frame_seq_length)

    for skipped in plan.skipped:
        log.warning("%s: skipped attention_weights[%d] (layer %d, shape %s): %s", path, skipped["entry"], skipped["layer"],
                    skipped["shape"], skipped["reason"])  # fmt: skip
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
    log.info("%s: %s layout, layers %s: %d rows (%d entries imported, %d skipped)", path, plan.layout, plan.layers, len(frame),
             len(described), len(plan.skipped))  # fmt: skip
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
    frame, metadata = import_cache(path, checkpoint=checkpoint, prompt_id=prompt_id, seed=seed, allow_pickle=allow_pickle,
                                   provenance=provenance)  # fmt: skip
    write_table(frame, output, FRAME_ATTENTION_SCHEMA, metadata)


# -- frame matrices ---------------------------------------------------------------------------


def _import_frame_matrix(data: Mapping[str, Any], plan: _Plan, path: Path, not_imported: list[str]):
    entry = plan.entries[0]
    matrix = entry.tensor.to(torch.float64).numpy()
    heads, frames = matrix.shape[0], matrix.shape[1]
    if "num_heads" in data and _as_int(data["num_heads"], path, "num_heads") != heads:
        raise _fail(path, "num_heads", f"says {data['num_heads']}, but full_frame_attention has {heads} heads")
    blocks = _blocks({}, data, path, "")
    if blocks.sizes is not None and sum(blocks.sizes) != frames:
        raise _fail(
            path, "block_sizes", f"{list(blocks.sizes)} sum to {sum(blocks.sizes)} frames, but full_frame_attention has {frames}"
        )
    if blocks.sizes is None:
        plan.notes.append(f"no block_sizes: blocks of {blocks.per_block} frames assumed ({blocks.origin})")
    plan.blocks = blocks
    block_of = np.array([blocks.of(f) for f in range(frames)])
    # Block-causal: a query frame sees every frame up to the end of its block.
    visible_until = np.array([blocks.span(b)[1] for b in block_of])
    visible = np.arange(frames)[None, :] < visible_until[:, None]  # [Q, K]
    if "last_block_query_frames" in data:
        stated = _as_int_list(data["last_block_query_frames"], path, "last_block_query_frames")
        last = list(range(*blocks.span(int(block_of[-1]))))
        if stated != last:
            plan.notes.append(
                f"last_block_query_frames {stated} differs from the last block {last} of the block sizes; the block sizes are used"
            )
    values = matrix[:, visible]  # [H, cells]
    if not np.isfinite(values).all():
        bad = int((~np.isfinite(values)).sum())
        raise _fail(path, "full_frame_attention", f"holds {bad} NaN or infinite values in the cells the queries can see")

    fsl = data.get("frame_seq_length")
    fsl = _as_int(fsl, path, "frame_seq_length", minimum=1) if fsl is not None else None
    plan.frame_seq_length = fsl
    is_logits, reason, scale = _frame_matrix_kind(matrix, visible, entry.is_logits, fsl, path)
    logit_mean = np.where(visible, matrix, np.nan) if is_logits else np.full_like(matrix, np.nan)
    prob_mass = np.full_like(matrix, np.nan) if is_logits else np.where(visible, matrix * scale, np.nan)
    if is_logits:
        not_imported.append(f"prob_mass of layer {entry.layer}: NaN — a frame matrix of logit means does not give the softmax "
                            "(it needs every token's logit)")  # fmt: skip
    else:
        not_imported.append(f"logit_mean of layer {entry.layer}: NaN — the matrix holds probabilities, and log p differs from the "
                            "logit by an unknown per-query log-sum-exp")  # fmt: skip
    if "last_block_frame_attention" in data:
        plan.notes.append("last_block_frame_attention not imported: it repeats the last block's rows of full_frame_attention")
    part = _rows(entry.layer, list(range(frames)), list(range(frames)), block_of.tolist(), logit_mean, prob_mass, visible)
    described = [{
        "entry": -1, "field": "full_frame_attention", "layer": entry.layer, "shape": list(entry.tensor.shape),
        "dtype": str(entry.tensor.dtype).replace("torch.", ""), "values": "logits" if is_logits else "probabilities",
        "decided_by": reason, "probability_scale": None if is_logits else scale, "blocks": sorted(set(block_of.tolist())),
        "query_frames": list(range(frames)), "key_frames": list(range(frames)),
        "visible_cells_per_head": int(visible.sum()), "hidden_cells_per_head_dropped": int((~visible).sum()),
    }]  # fmt: skip
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
        raise _fail(path, "is_logits", "is false, but full_frame_attention holds negative values, which cannot be probabilities")
    # Row sums over the visible key frames tell which probability aggregate was stored.
    rows = np.where(visible, matrix, 0.0).sum(axis=2)  # [H, Q]
    if flag is None and negative:
        return True, "no is_logits field; negative values cannot be probabilities", 1.0
    if np.abs(rows - 1).max() < ROW_SUM_TOLERANCE:
        why = "is_logits is false" if flag is False else "no is_logits field; non-negative rows summing to 1"
        return False, f"{why}; the rows sum to 1, so the cells are prob_mass", 1.0
    if fsl and np.abs(rows * fsl - 1).max() < ROW_SUM_TOLERANCE:
        why = "is_logits is false" if flag is False else "no is_logits field; non-negative rows summing to 1/frame_seq_length"
        return False, f"{why}; the cells are means over token pairs, so prob_mass = cell x frame_seq_length", float(fsl)
    if flag is None:
        return (
            True,
            "no is_logits field; non-negative values whose rows sum neither to 1 nor to 1/frame_seq_length: read as logits",
            1.0,
        )
    scale = float(fsl) if fsl else 1.0
    return False, (f"is_logits is false, but the rows sum to {rows.min():.4g}..{rows.max():.4g}: taken as the old script's mean over "
                   f"token pairs (prob_mass = cell x {scale:g}); the capture may not have covered every key"), scale  # fmt: skip


# -- token-level tensors ---------------------------------------------------------------------


class _PageReleaser:
    """Hands the pages of a memory-mapped tensor back to the kernel once they are reduced.

    A private, unmodified file mapping re-reads from the file on the next touch, so
    MADV_DONTNEED never changes what the tensor holds; it is only used after checking in
    /proc/self/maps that the tensor's memory is a mapping of the cache file itself.
    """

    MADV_SEQUENTIAL = 2
    MADV_DONTNEED = 4

    def __init__(self, tensor: torch.Tensor, path: Path) -> None:
        self.enabled = False
        if not (_RELEASE_PAGES and sys.platform.startswith("linux") and tensor.is_contiguous()):
            return
        start = tensor.data_ptr()
        stop = start + tensor.numel() * tensor.element_size()
        try:
            target = os.path.realpath(path)
            with open("/proc/self/maps") as maps:
                for line in maps:
                    parts = line.split(maxsplit=5)
                    low, high = (int(x, 16) for x in parts[0].split("-"))
                    if low <= start and stop <= high and len(parts) == 6 and parts[5].strip() == target:
                        self.enabled = True
                        break
            if self.enabled:
                self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
                self.libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                self.page = os.sysconf("SC_PAGE_SIZE")
                self._advise(start, stop, self.MADV_SEQUENTIAL)
        except (OSError, ValueError, AttributeError):
            self.enabled = False

    def _advise(self, start: int, stop: int, advice: int) -> None:
        low = start - start % self.page
        self.libc.madvise(low, stop - low, advice)  # best effort: a failure only costs memory

    def release(self, view: torch.Tensor) -> None:
        if self.enabled and view.is_contiguous():
            start = view.data_ptr()
            self._advise(start, start + view.numel() * view.element_size(), self.MADV_DONTNEED)


def _decide_token_kind(entry: _Entry, path: Path) -> tuple[bool, str]:
    """Logits or probabilities, from the key name, is_logits and a look at the first rows."""
    field_name = entry.field.rsplit(".", 1)[0] + ".is_logits"
    if entry.key_name == "attn_logits":
        if entry.is_logits is False:
            raise _fail(path, field_name, "is false, but the tensor is stored as 'attn_logits'")
        return True, "stored as attn_logits" + ("; is_logits is true" if entry.is_logits else "")
    if entry.is_logits is True:
        return True, "is_logits is true"
    probe = entry.tensor[0, 0, : min(entry.tensor.shape[2], 64)].to(torch.float32)
    if entry.is_logits is False:
        if bool((probe < 0).any()):
            raise _fail(path, field_name, "is false, but the tensor holds negative values, which cannot be probabilities")
        return False, "is_logits is false"
    if bool((probe < 0).any()):
        return True, "no is_logits field; negative values cannot be probabilities"
    if float((probe.sum(dim=1) - 1).abs().max()) < ROW_SUM_TOLERANCE:
        return False, "no is_logits field; non-negative rows summing to 1 (softmax output)"
    return True, "no is_logits field; non-negative values whose rows do not sum to 1: read as logits"


def _reduce_tokens(entry: _Entry, is_logits: bool, path: Path) -> dict[str, Any]:
    """Frame sums of one [B, H, Lq, Lk] tensor, streamed one head and query chunk at a time.

    Returns float64 [H, nq, nk] arrays: ``sums`` (sum over the token pairs of each frame
    pair) and, for logits, ``mass`` (sum over the query tokens of the softmax mass on the
    key frame, the softmax taken over all the entry's keys).
    """
    tensor, fsl = entry.tensor, entry.fsl
    _, heads, lq, lk = tensor.shape
    nq, nk = lq // fsl, lk // fsl
    rows = max(1, min(lq, CHUNK_ELEMENTS // lk))
    buffer = torch.empty(rows, lk, dtype=torch.float32)
    sums = torch.zeros(heads, nq, nk, dtype=torch.float64)
    mass = torch.zeros(heads, nq, nk, dtype=torch.float64) if is_logits else None
    frame_of_row = torch.arange(lq) // fsl
    releaser = _PageReleaser(tensor[0], path)
    minimum, worst_row = math.inf, 0.0
    for head in range(heads):
        values = tensor[0, head]
        for start in range(0, lq, rows):
            stop = min(lq, start + rows)
            chunk = values[start:stop]
            x = buffer[: stop - start]
            x.copy_(chunk)  # a float32 copy: the mapped file is never written
            frame_sums = x.view(stop - start, nk, fsl).sum(dim=2)
            # Any NaN or infinity in the chunk makes its frame sums non-finite.
            if not bool(torch.isfinite(frame_sums).all()):
                raise _fail(path, entry.field, f"holds NaN or infinite values (head {head}, query tokens {start}..{stop - 1})")
            index = frame_of_row[start:stop]
            sums[head].index_add_(0, index, frame_sums.to(torch.float64))
            if mass is not None:
                # Softmax over every key of the row, the max subtracted first for range.
                x.sub_(x.amax(dim=1, keepdim=True)).exp_()
                frame_mass = x.view(stop - start, nk, fsl).sum(dim=2)
                frame_mass.div_(frame_mass.sum(dim=1, keepdim=True))
                mass[head].index_add_(0, index, frame_mass.to(torch.float64))
            else:
                minimum = min(minimum, float(x.amin()))
                worst_row = max(worst_row, float((frame_sums.sum(dim=1) - 1).abs().max()))
            releaser.release(chunk)
    if not is_logits and minimum < 0:
        raise _fail(path, entry.field, f"was read as probabilities, but holds negative values (min {minimum:g})")
    return {"sums": sums.numpy(), "mass": None if mass is None else mass.numpy(), "worst_row": worst_row}


def _import_token_entries(data: Mapping[str, Any], plan: _Plan, path: Path, not_imported: list[str]):
    parts, described = [], []
    for entry in plan.entries:
        batch = entry.tensor.shape[0]
        is_logits, reason = _decide_token_kind(entry, path)
        reduced = _reduce_tokens(entry, is_logits, path)
        fsl = entry.fsl
        if is_logits:
            logit_mean = reduced["sums"] / (fsl * fsl)
            prob_mass = reduced["mass"] / fsl
        else:
            logit_mean = np.full_like(reduced["sums"], np.nan)
            prob_mass = reduced["sums"] / fsl
            not_imported.append(f"logit_mean of layer {entry.layer} ({entry.field}): NaN — the cache holds probabilities, and "
                                "log p differs from the logit by an unknown per-query log-sum-exp")  # fmt: skip
            if reduced["worst_row"] > ROW_SUM_TOLERANCE:
                not_imported.append(f"{entry.field}: probability rows sum to 1 ± {reduced['worst_row']:.3g}: the capture may not "
                                    "cover every key the call saw, so prob_mass may not sum to 1 over key frames")  # fmt: skip
        if batch > 1:
            not_imported.append(f"{entry.field}: batch of {batch}; only sample 0 is imported (as the notebooks do)")
        parts.append(_rows(entry.layer, entry.query_frames, entry.key_frames, entry.blocks, logit_mean, prob_mass, None))
        described.append({
            "entry": entry.index, "field": entry.field, "layer": entry.layer, "shape": list(entry.tensor.shape),
            "dtype": str(entry.tensor.dtype).replace("torch.", ""), "values": "logits" if is_logits else "probabilities",
            "decided_by": reason, "frame_seq_length": fsl, "query_frames": entry.query_frames, "key_frames": entry.key_frames,
            "blocks": sorted(set(entry.blocks)), "fields": entry.fields,
            "prob_mass": ("softmax over the entry's keys (taken as every key the call saw)" if is_logits
                          else "sum over the key frame's tokens, mean over the query frame's tokens"),
        })  # fmt: skip
    return parts, described


# -- rows -----------------------------------------------------------------------------------


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
    return pd.DataFrame({
        "layer": np.full(int(mask.sum()), layer, dtype=np.int16),
        "head": h[mask].astype(np.int16),
        "block": bl[q[mask]].astype(np.int16),
        "query_frame": qf[q[mask]].astype(np.int16),
        "key_frame": kf[k[mask]].astype(np.int16),
        "logit_mean": logit_mean[mask].astype(np.float32),
        "prob_mass": prob_mass[mask].astype(np.float32),
    })  # fmt: skip


def _with_constant_columns(frame: pd.DataFrame, checkpoint: str, prompt_id: str, seed: int, frame_seq_length: int) -> pd.DataFrame:
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()
