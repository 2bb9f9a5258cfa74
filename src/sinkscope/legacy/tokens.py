"""Token-level entries (logits or probabilities, [B, H, Lq, Lk]): reduced to frame
statistics in query chunks, streaming through a memory-mapped load and handing reduced
pages back to the system."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinkscope.legacy.plan import ROW_SUM_TOLERANCE, _Entry, _fail, _Plan
from sinkscope.legacy.rows import _rows

# float32 values per query chunk (64 MiB): a few such buffers are the whole working set.
CHUNK_ELEMENTS = 1 << 24


# Hand reduced pages of a memory-mapped cache back to the kernel (Linux); the benchmark
# turns it off to show the difference.
_RELEASE_PAGES = True


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
            raise _fail(
                path, field_name, "is false, but the tensor holds negative values, which cannot be probabilities"
            )
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
                raise _fail(
                    path, entry.field, f"holds NaN or infinite values (head {head}, query tokens {start}..{stop - 1})"
                )
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
            not_imported.append(
                f"logit_mean of layer {entry.layer} ({entry.field}): NaN — the cache holds probabilities, and "
                "log p differs from the logit by an unknown per-query log-sum-exp"
            )
            if reduced["worst_row"] > ROW_SUM_TOLERANCE:
                not_imported.append(
                    f"{entry.field}: probability rows sum to 1 ± {reduced['worst_row']:.3g}: the capture may not "
                    "cover every key the call saw, so prob_mass may not sum to 1 over key frames"
                )
        if batch > 1:
            not_imported.append(f"{entry.field}: batch of {batch}; only sample 0 is imported (as the notebooks do)")
        parts.append(
            _rows(entry.layer, entry.query_frames, entry.key_frames, entry.blocks, logit_mean, prob_mass, None)
        )
        described.append(
            {
                "entry": entry.index,
                "field": entry.field,
                "layer": entry.layer,
                "shape": list(entry.tensor.shape),
                "dtype": str(entry.tensor.dtype).replace("torch.", ""),
                "values": "logits" if is_logits else "probabilities",
                "decided_by": reason,
                "frame_seq_length": fsl,
                "query_frames": entry.query_frames,
                "key_frames": entry.key_frames,
                "blocks": sorted(set(entry.blocks)),
                "fields": entry.fields,
                "prob_mass": (
                    "softmax over the entry's keys (taken as every key the call saw)"
                    if is_logits
                    else "sum over the key frame's tokens, mean over the query frame's tokens"
                ),
            }
        )
    return parts, described
