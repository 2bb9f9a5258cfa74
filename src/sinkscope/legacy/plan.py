"""Reading an older cache: which layout it is, what each entry holds, where it sits.

The plan of an import (``_plan``): the layout (token-level, inference captures or frame
matrices), the blocks, and per entry its layer, query and key frames; every field is
checked and a bad one named (``LegacyCacheError``). Nothing here reduces a tensor.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinkscope.errors import SinkscopeError

LAYOUTS = ("token_level", "inference_capture", "frame_matrix")


PICKLE_OPTION = "--allow-pickle (or allow_pickle: true in legacy_caches)"


DEFAULT_PROMPT_ID = "legacy"


# The old scripts' own defaults (Wan2.1 at 480x832; Self-Forcing's 3-frame blocks).
DEFAULT_FRAME_SEQ_LENGTH = 1560


DEFAULT_FRAMES_PER_BLOCK = 3


_TOP_LEVEL_FIELDS = {
    "attention_weights",
    "full_frame_attention",
    "prompt",
    "num_frames",
    "frame_seq_length",
    "query_frames",
    "key_frames",
    "num_frame_per_block",
    "block_sizes",
    "independent_first_frame",
    "is_logits",
    "layer_index",
    "layer_idx",
    "num_heads",
    "last_block_query_frames",
    "last_block_frame_attention",
    "layer_indices",
}


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
            path,
            where,
            f"claims {tensor.numel():,} values of shape {list(tensor.shape)} (strides {list(tensor.stride())}) but "
            f"the file holds {max(stored, 0):,} bytes for them: a broadcast (stride-0) view, not an attention cache",
        )


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
        return _Blocks(
            None, DEFAULT_FRAMES_PER_BLOCK, first_alone, f"default ({DEFAULT_FRAMES_PER_BLOCK} frames a block)"
        )
    name = f"{prefix}num_frame_per_block" if where == "entry" else "num_frame_per_block"
    return _Blocks(None, _as_int(per_block, path, name, minimum=1), first_alone, "num_frame_per_block")


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
        note = (
            f"frame_seq_length is not in the file: assumed {DEFAULT_FRAME_SEQ_LENGTH} (Wan2.1 at 480x832), as the "
            "notebooks do"
        )
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
                raise _fail(
                    path, f"{prefix}{key}", f"{name} length {length} is not a multiple of frame_seq_length {fsl}"
                )
        nq, nk = lq // fsl, lk // fsl
        for name, count in (("num_key_frames", nk), ("num_query_frames", nq)):
            if name in entry and _as_int(entry[name], path, prefix + name) != count:
                raise _fail(path, prefix + name, f"says {entry[name]}, but {key} holds {count} frames of {fsl} tokens")
        frames, where = _lookup(entry, data, "key_frames")
        if frames is not None:
            name = f"{prefix}key_frames" if where == "entry" else "key_frames"
            key_frames = _as_int_list(frames, path, name)
            if len(key_frames) != nk:
                raise _fail(
                    path, name, f"names {len(key_frames)} frames, but {prefix}{key} has {nk} key frames of {fsl} tokens"
                )
        else:
            key_frames = list(range(nk))
        frames, where = _lookup(entry, data, "query_frames")
        if frames is not None:
            name = f"{prefix}query_frames" if where == "entry" else "query_frames"
            query_frames = _as_int_list(frames, path, name)
            if len(query_frames) != nq:
                raise _fail(
                    path,
                    name,
                    f"names {len(query_frames)} frames, but {prefix}{key} has {nq} query frames of {fsl} tokens",
                )
        elif "last_block_start_frame" in entry:
            start = _as_int(entry["last_block_start_frame"], path, f"{prefix}last_block_start_frame")
            query_frames = list(range(start, start + nq))
        else:
            query_frames = key_frames[-nq:] if nq <= nk else []
            if not query_frames:
                raise _fail(
                    path, f"{prefix}{key}", f"{nq} query frames but only {nk} key frames, and no query_frames field"
                )
            plan.notes.append(
                f"{prefix[:-1]}: no query_frames or last_block_start_frame: the queries are taken as the last {nq} "
                f"key frames {query_frames} (the block's own frames end the key sequence in a block-causal call)"
            )
        if len(set(key_frames)) != len(key_frames):
            raise _fail(path, "key_frames", f"repeats a frame: {key_frames}")
        blocks = _blocks(entry, data, path, prefix)
        plan.blocks = plan.blocks or blocks
        block_of = [blocks.of(f) for f in query_frames]
        if None in block_of:
            raise _fail(
                path, "block_sizes", f"query frames {query_frames} lie past the blocks {list(blocks.sizes or [])}"
            )
        flag, where = _lookup(entry, data, "is_logits")
        is_logits = _as_flag(flag, path, f"{prefix}is_logits" if where == "entry" else "is_logits")
        plan.entries.append(
            _Entry(
                i,
                f"{prefix}{key}",
                layer,
                tensor,
                fsl,
                query_frames,
                key_frames,
                block_of,
                is_logits,
                key,
                sorted(map(str, entry)),
            )
        )
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
            reason = (
                f"key length {lk} is not a whole number of frames of {fsl} tokens (a partial sliding window, "
                "or cross-attention to the text): its key frames are unknown"
            )
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
                reason = (
                    f"its queries, if they were the last {nq} of key frames 0-{nk - 1}, would not be one generation "
                    f"block ({blocks.describe()}): the KV cache may have rolled or been trimmed"
                )
        if reason is not None:
            plan.skipped.append({"entry": i, "layer": layer, "shape": list(tensor.shape), "reason": reason})
            continue
        query_frames = list(range(nk - nq, nk))
        flag, where = _lookup(entry, data, "is_logits")
        is_logits = _as_flag(flag, path, f"{prefix}is_logits" if where == "entry" else "is_logits")
        placed.append(
            _Entry(
                i,
                f"{prefix}{key}",
                layer,
                tensor,
                fsl,
                query_frames,
                list(range(nk)),
                [block] * nq,
                is_logits,
                key,
                sorted(map(str, entry)),
            )
        )
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
                plan.skipped.append(
                    {
                        "entry": e.index,
                        "layer": layer,
                        "shape": list(e.tensor.shape),
                        "reason": (
                            f"the key length stops growing at {widest} frames ({counts[widest]} calls where the "
                            f"earlier blocks had {per_block}): the KV cache rolled, so the key frames of the later "
                            "blocks' calls are unknown"
                        ),
                    }
                )
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
        plan.entries.append(
            _Entry(-1, "full_frame_attention", layer, tensor, 0, [], [], [], flag, "full_frame_attention", [])
        )
        return plan
    plan = _plan_token_level(data, path) if layout == "token_level" else _plan_inference(data, path)
    if not plan.entries:
        reasons = "; ".join(f"attention_weights[{s['entry']}]: {s['reason']}" for s in plan.skipped[:5])
        raise _fail(path, "attention_weights", f"no entry can be placed in the video ({reasons})")
    return plan


def check_values(data: Mapping[str, Any], plan: _Plan, path: Path) -> None:
    """What an import would refuse in the values, found without importing: a frame
    matrix's fields that disagree with it (num_heads, block_sizes) and NaN or infinity in
    the cells its queries see; NaN or infinity in a token-level tensor that is imported.
    ``load_study`` runs it, so a bad cache stops the workflow before any job."""
    if plan.layout == "frame_matrix":
        frame_matrix_layout(data, plan.entries[0], path)
        return
    for entry in plan.entries:
        values = entry.tensor[0]
        rows = max(1, min(values.shape[1], (1 << 24) // values.shape[2]))
        for head in range(values.shape[0]):
            for start in range(0, values.shape[1], rows):
                if not bool(torch.isfinite(values[head, start : start + rows]).all()):
                    stop = min(values.shape[1], start + rows)
                    raise _fail(
                        path,
                        entry.field,
                        f"holds NaN or infinite values (head {head}, query tokens {start}..{stop - 1})",
                    )


def check_cache(path: str | Path, allow_pickle: bool = False) -> None:
    """``check_values`` of a cache file (after ``importer.peek_layers`` has checked its archive)."""
    path, data = _load(path, allow_pickle)
    check_values(data, _plan(data, path), path)


def frame_matrix_layout(data: Mapping[str, Any], entry: _Entry, path: Path):
    """A frame matrix checked against its fields: (matrix as float64 [H, F, F], blocks,
    the block of each frame, the [Q, K] cells a query frame can see under the blocks)."""
    matrix = entry.tensor.to(torch.float64).numpy()
    heads, frames = matrix.shape[0], matrix.shape[1]
    if "num_heads" in data and _as_int(data["num_heads"], path, "num_heads") != heads:
        raise _fail(path, "num_heads", f"says {data['num_heads']}, but full_frame_attention has {heads} heads")
    blocks = _blocks({}, data, path, "")
    if blocks.sizes is not None and sum(blocks.sizes) != frames:
        raise _fail(
            path,
            "block_sizes",
            f"{list(blocks.sizes)} sum to {sum(blocks.sizes)} frames, but full_frame_attention has {frames}",
        )
    block_of = np.array([blocks.of(f) for f in range(frames)])
    # Block-causal: a query frame sees every frame up to the end of its block.
    visible_until = np.array([blocks.span(b)[1] for b in block_of])
    visible = np.arange(frames)[None, :] < visible_until[:, None]  # [Q, K]
    values = matrix[:, visible]  # [H, cells]
    if not np.isfinite(values).all():
        bad = int((~np.isfinite(values)).sum())
        raise _fail(
            path, "full_frame_attention", f"holds {bad} NaN or infinite values in the cells the queries can see"
        )
    return matrix, blocks, block_of, visible


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


# |row sum - 1| below this counts as a softmax row (bf16 storage rounds each value).
ROW_SUM_TOLERANCE = 0.02
