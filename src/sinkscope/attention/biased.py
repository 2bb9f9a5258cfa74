"""Self-attention with edited key frames (``generation.interventions``: ``mask_keys``,
``logit_bias``), exact, from the model's own attention kernel.

An edit is a bias per (head, key frame), ``frame_bias`` [H, num key frames] float32: 0
leaves the scores as they are, a finite b is added to every score s_ij = q_i.k_j/sqrt(D)
of that head and frame, -inf masks the frame (its keys get exactly 0 probability). Keys
are laid out frame after frame, ``key_lengths[f]`` tokens each, in the order of
``frame_bias``'s columns.

``edited_attention`` never forms a score matrix. A softmax over keys split into segments
is the segments' softmaxes merged by their log-sum-exps, and a bias b on a segment adds b
to that segment's log-sum-exp and changes nothing else. So the key frames are cut into
segments of consecutive frames over which every head's bias stays the same (``edit_plan``:
frame 0 biased or masked in some heads gives two segments, frame 0 and the rest); a segment
masked in every head is left out; each segment is attended by every head at once, over a
view of k and v (no copy), and its log-sum-exp gets each head's bias; the longest segment
runs key-split as the model's call would (``split.key_split``), and the others merge into
its parts in the same merge (``split.split_key_attention``'s ``extra``). Every head runs in
every call, so a layer with a few edited heads costs what one with every head edited costs:
the plain call plus a call over the edited frames and a merge; the unedited heads of such
a call get the unedited softmax within one bf16 rounding of the model's own call (their
output is merged from parts). A call with no edit is the model's call itself, bit for bit.

The plan needs the bias values on the host: a CUDA ``frame_bias`` is read once per tensor
(``bias_rows`` keeps its rows until the tensor is freed or written), and not at all when
whoever wrote it hands its rows over (``remember_rows``: the generation's edits do), so
an edited generation waits for the GPU nowhere.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from sinkscope.attention.split import cached_attention, gives_lse, key_split, merge_parts, split_key_attention

# Scores held at once by the log-sum-exp of calls whose kernel does not return it (the
# CPU, float32 on CUDA): 2**24 values (64 MiB in float32).
LSE_SCORE_BUDGET = 2**24


@dataclass(frozen=True)
class KeySegment:
    """Key frames ``start`` to ``stop`` (positions in ``frame_bias``'s columns, stop excluded)
    over which each head's bias is the same: ``column``, one value per head."""

    start: int
    stop: int
    column: tuple[float, ...]

    @property
    def biased(self) -> bool:
        """Whether some head's scores over this segment change (its log-sum-exp gets the bias)."""
        return any(b != 0.0 for b in self.column)


@dataclass(frozen=True)
class EditPlan:
    """How one call runs: the segments attended, in frame order (a segment masked in every
    head left out); ``edited`` False when no score changes (the model's call itself)."""

    segments: tuple[KeySegment, ...]
    edited: bool


# id(tensor) -> (a weak reference to it, its version counter when read, its rows, its plan).
_HOST_ROWS: dict[int, tuple[weakref.ref, int, tuple[tuple[float, ...], ...], EditPlan]] = {}
_HOST_ROWS_LIMIT = 1024


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter (in-place writes bump it); None for an inference tensor,
    which has none (its rows are then read at every call)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _cached(frame_bias: torch.Tensor) -> tuple | None:
    hit = _HOST_ROWS.get(id(frame_bias))
    if hit is not None and hit[0]() is frame_bias and hit[1] == _version(frame_bias):
        return hit
    return None


def bias_plan(frame_bias: torch.Tensor) -> EditPlan:
    """``edit_plan`` of ``frame_bias``'s rows, kept with them (``bias_rows``)."""
    hit = _cached(frame_bias)
    return hit[3] if hit is not None else edit_plan(bias_rows(frame_bias))


def bias_rows(frame_bias: torch.Tensor) -> tuple[tuple[float, ...], ...]:
    """``frame_bias`` [H, F] as host floats (its float32 values), read once per tensor and
    kept while the tensor lives unwritten (an in-place write bumps its version)."""
    hit = _cached(frame_bias)
    if hit is not None:
        return hit[2]
    if frame_bias.ndim != 2:
        raise ValueError(f"frame_bias must be [heads, key frames]; got {tuple(frame_bias.shape)}")
    return remember_rows(frame_bias, frame_bias.detach().to(torch.float32).cpu().double().tolist())


def remember_rows(frame_bias: torch.Tensor, rows: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    """Keep ``rows`` (frame_bias's values, [H, F], from the host that wrote them) as
    ``bias_rows`` of ``frame_bias``, so that reading them costs no device sync; checked as
    ``bias_rows`` checks them."""
    rows = tuple(tuple(float(b) for b in row) for row in rows)
    if tuple(frame_bias.shape) != (len(rows), len(rows[0]) if rows else 0):
        raise ValueError(f"rows of {len(rows)} heads do not match frame_bias {tuple(frame_bias.shape)}")
    for head, row in enumerate(rows):
        if any(math.isnan(b) or b == math.inf for b in row):
            raise ValueError(f"frame_bias of head {head} holds NaN or +inf: {list(row)}")
        if all(b == -math.inf for b in row):
            raise ValueError(f"frame_bias masks every key frame of head {head}: its softmax would be empty")
    version = _version(frame_bias)
    if version is not None:
        if len(_HOST_ROWS) >= _HOST_ROWS_LIMIT:
            _HOST_ROWS.clear()
        key = id(frame_bias)
        _HOST_ROWS[key] = (
            weakref.ref(frame_bias, lambda _, key=key: _HOST_ROWS.pop(key, None)),
            version,
            rows,
            edit_plan(rows),
        )
    return rows


@lru_cache(maxsize=256)
def edit_plan(rows: tuple[tuple[float, ...], ...]) -> EditPlan:
    """The plan of a call whose bias rows (``bias_rows``, [H][F]) are ``rows``: its key frames cut
    where some head's bias changes, the segments masked in every head left out."""
    columns = [tuple(row[frame] + 0.0 for row in rows) for frame in range(len(rows[0]))]  # + 0.0: -0.0 is 0.0
    edited = any(b != 0.0 for column in columns for b in column)
    segments, start = [], 0
    for frame in range(1, len(columns) + 1):
        if frame == len(columns) or columns[frame] != columns[start]:
            if not all(b == -math.inf for b in columns[start]):
                segments.append(KeySegment(start, frame, columns[start]))
            start = frame
    return EditPlan(tuple(segments), edited)


def log_sum_exp(q: torch.Tensor, k: torch.Tensor, budget: int = LSE_SCORE_BUDGET) -> torch.Tensor:
    """[B, H, Lq] float32: each query's natural log-sum-exp of q.k/sqrt(D), q [B, Lq, H, D]
    and k [B, Lk, H, D], over query chunks of at most ``budget`` scores (float64 for float64
    inputs, else float32). For calls whose kernel does not return it."""
    batch, num_q, heads, dim = q.shape
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    keys = k.to(compute).permute(0, 2, 3, 1)  # [B, H, D, Lk]
    out = torch.empty(batch, heads, num_q, dtype=torch.float32, device=q.device)
    rows = max(1, budget // max(1, batch * heads * k.shape[1]))
    for start in range(0, num_q, rows):
        chunk = q[:, start : start + rows].to(compute).transpose(1, 2)  # [B, H, rows, D]
        scores = torch.matmul(chunk, keys).mul_(dim**-0.5)
        out[:, :, start : start + rows] = torch.logsumexp(scores, dim=-1).float()
    return out


def attention_and_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, split: bool = True, kernel: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cached_attention`` with its log-sum-exp always given: the kernel's where it returns
    one (CUDA, fp16 / bf16), else ``log_sum_exp``."""
    out, lse = cached_attention(q, k, v, split=split, kernel=kernel)
    return out, log_sum_exp(q, k) if lse is None else lse


def edited_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    frame_bias: torch.Tensor | None,
    key_lengths: Sequence[int],
    *,
    split: bool = True,
    kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [B, Lq, H, D] over k, v [B, Lk, H, D] (the model's layout, softmax scale
    1/sqrt(D)) with ``frame_bias`` [H, len(key_lengths)] added to the scores of each head and
    key frame (0: untouched, finite: added, -inf: masked; None: no edit): (output [B, Lq, H, D]
    in q's dtype, the edited softmax's natural log-sum-exp [B, H, Lq] float32). Key frame f is
    the ``key_lengths[f]`` tokens of k after the previous frames'. ``split`` and ``kernel``: the
    model's ``KernelSettings.key_split`` and ``attention_kernel``. The module's docstring has the method."""
    batch, num_keys, heads, _ = k.shape
    if q.ndim != 4 or k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:] or v.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} are not [B, L, H, D] of one call")
    if sum(int(n) for n in key_lengths) != num_keys or any(int(n) < 1 for n in key_lengths):
        raise ValueError(f"key_lengths {list(key_lengths)} do not lay out k's {num_keys} keys")
    if frame_bias is None:
        return attention_and_lse(q, k, v, split=split, kernel=kernel)
    check_bias_shape(frame_bias, heads, len(key_lengths))
    plan = bias_plan(frame_bias)
    if not plan.edited:
        return attention_and_lse(q, k, v, split=split, kernel=kernel)
    starts = [0]
    for n in key_lengths:
        starts.append(starts[-1] + int(n))

    def keys_of(segment: KeySegment) -> tuple[torch.Tensor, torch.Tensor]:
        first, count = starts[segment.start], starts[segment.stop] - starts[segment.start]
        return k.narrow(1, first, count), v.narrow(1, first, count)

    def column_of(segment: KeySegment) -> torch.Tensor:
        """Its bias per head, [H] float32 on frame_bias's device (a view: no host copy)."""
        return frame_bias[:, segment.start].to(torch.float32)

    main = max(plan.segments, key=lambda segment: starts[segment.stop] - starts[segment.start])
    extras = []
    for segment in plan.segments:
        if segment is not main:
            part_out, part_lse = attention_and_lse(q, *keys_of(segment), split=split, kernel=kernel)
            if segment.biased:
                part_lse = part_lse + column_of(segment)[None, :, None]
            extras.append((part_out.transpose(1, 2), part_lse))
    main_bias = column_of(main) if main.biased else None
    main_k, main_v = keys_of(main)
    # merge_parts takes the other segments batch-major: [B * E, H, Lq, D] and [B * E, H, Lq].
    extra = None
    if len(extras) == 1:
        extra = extras[0]
    elif extras:
        extra = tuple(torch.stack(x, 1).flatten(0, 1) for x in zip(*extras))
    if extra is not None and gives_lse(q):
        # The longest segment key-split as the model's call would be, the others merged in.
        parts = key_split(q, main_k, split, head_first=False).parts
        return split_key_attention(q, main_k, main_v, parts, part_bias=main_bias, extra=extra, kernel=kernel)
    out, lse = attention_and_lse(q, main_k, main_v, split=split, kernel=kernel)
    if main_bias is not None:
        lse = lse + main_bias[None, :, None]
    return (out, lse) if extra is None else merge_parts(out.transpose(1, 2), lse, batch, 1, None, extra)


@lru_cache(maxsize=256)
def _lengths_on(key_lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(key_lengths, device=device)


def check_bias_shape(frame_bias: torch.Tensor, heads: int, num_k: int) -> None:
    """Raise ValueError unless ``frame_bias`` is [heads, num_k] (one bias a head and key frame)."""
    if tuple(frame_bias.shape) != (heads, num_k):
        raise ValueError(f"frame_bias {tuple(frame_bias.shape)} is not [{heads} heads, {num_k} key frames]")


def token_bias(frame_bias: torch.Tensor, key_lengths: Sequence[int]) -> torch.Tensor:
    """[H, Lk] float32 on frame_bias's device: each key token's bias (its frame's)."""
    lengths = tuple(int(n) for n in key_lengths)
    return frame_bias.to(torch.float32).repeat_interleave(
        _lengths_on(lengths, frame_bias.device), dim=1, output_size=sum(lengths)
    )


__all__ = [
    "EditPlan",
    "KeySegment",
    "attention_and_lse",
    "bias_plan",
    "bias_rows",
    "edit_plan",
    "edited_attention",
    "log_sum_exp",
    "remember_rows",
    "token_bias",
]
