"""Self-attention with edited key frames (``generation.interventions``: ``mask_keys``,
``logit_bias``), exact, from the model's own attention calls.

An edit is a bias per (head, key frame), ``frame_bias`` [H, num key frames] float32: 0
leaves the scores as they are, a finite b is added to every score s_ij = q_i.k_j/sqrt(D)
of that head and frame, -inf masks the frame (its keys get exactly 0 probability). Keys
are laid out frame after frame, ``key_lengths[f]`` tokens each, in the order of
``frame_bias``'s columns.

``edited_attention`` never forms a score matrix. A softmax over keys split into groups
is the groups' softmaxes merged by their log-sum-exps, and a bias b on a group adds b to
that group's log-sum-exp and changes nothing else. So:

- heads whose row is all 0 run the model's plain call (``cached_attention``, with the
  key split of the whole call, so they get the unedited output bit for bit), over the
  heads from the first to the last of them (a view of q, k, v, not a copy: the edited
  heads inside that range are computed and written over; where neither the first nor the
  last head is edited, this is the unedited call itself), unless that range holds more
  than twice their number (then those heads are copied out);
- heads with the same row run together: their masked frames are dropped (the keys
  gathered without them, a view when the kept frames are contiguous), the kept frames
  grouped by their bias, each group attended by ``cached_attention``, its log-sum-exp
  plus its bias, and the groups merged by ``attention.split.merge_parts`` (the merge of
  key-split parts). One group (masking only, or one bias on every kept frame) is one call.

The plan needs the bias values on the host: a CUDA ``frame_bias`` is read once per tensor
(``bias_rows`` keeps its rows until the tensor is freed or written), so a policy that
hands the same tensor to a layer's calls of a block costs one device sync, not one a call.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from sinkscope.attention.split import KeySplit, cached_attention, key_split, merge_parts

# Scores held at once by the log-sum-exp of calls whose kernel does not return it (the
# CPU, float32 on CUDA): 2**24 values (64 MiB in float32).
LSE_SCORE_BUDGET = 2**24

Runs = tuple[tuple[int, int], ...]  # (start, stop) ranges of an axis, ascending, disjoint


@dataclass(frozen=True)
class BiasPart:
    """The kept key frames of one bias value: ``bias`` added to their scores, ``frames``
    their positions in ``frame_bias``'s columns."""

    bias: float
    frames: tuple[int, ...]


@dataclass(frozen=True)
class HeadGroup:
    """Heads with one bias row: attended together, their kept frames in ``parts``."""

    heads: tuple[int, ...]
    parts: tuple[BiasPart, ...]


@dataclass(frozen=True)
class EditPlan:
    """How one edited call runs: the ``plain`` heads (row all 0) in the model's call, each
    of ``groups`` by its parts."""

    plain: tuple[int, ...]
    groups: tuple[HeadGroup, ...]

    @property
    def edited(self) -> bool:
        return bool(self.groups)


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
    rows = tuple(tuple(row) for row in frame_bias.detach().to(torch.float32).cpu().double().tolist())
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
        _HOST_ROWS[key] = (weakref.ref(frame_bias, lambda _, key=key: _HOST_ROWS.pop(key, None)), version, rows,
                           edit_plan(rows))  # fmt: skip
    return rows


@lru_cache(maxsize=256)
def edit_plan(rows: tuple[tuple[float, ...], ...]) -> EditPlan:
    """The plan of a call whose bias rows (``bias_rows``) are ``rows``: heads of one row grouped
    (in head order), each row's kept frames grouped by bias value (in frame order)."""
    plain, by_row = [], {}
    for head, row in enumerate(rows):
        if all(b == 0.0 for b in row):
            plain.append(head)
        else:
            by_row.setdefault(row, []).append(head)
    groups = []
    for row, heads in by_row.items():
        frames_of: dict[float, list[int]] = {}
        for frame, b in enumerate(row):
            if b != -math.inf:
                frames_of.setdefault(b + 0.0, []).append(frame)  # + 0.0: -0.0 and 0.0 are one part
        parts = tuple(BiasPart(b, tuple(frames)) for b, frames in frames_of.items())
        groups.append(HeadGroup(tuple(heads), parts))
    return EditPlan(tuple(plain), tuple(groups))


def plain_runs(plain: Sequence[int]) -> Runs:
    """The heads the plain call runs for the unedited heads ``plain``: the range from the first
    to the last (a view of q, k, v; the edited heads among them computed and written over)
    while it holds at most twice as many heads, else the runs of ``plain`` (copied)."""
    lo, hi = plain[0], plain[-1] + 1
    return ((lo, hi),) if hi - lo <= 2 * len(plain) else runs_of(plain)


def runs_of(indices: Sequence[int]) -> Runs:
    """Ascending indices as (start, stop) runs of consecutive values."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return tuple((a, b) for a, b in runs)


def token_runs(frames: Sequence[int], key_lengths: Sequence[int]) -> Runs:
    """The key tokens of ``frames`` (positions, ascending) as runs of k's token axis."""
    starts = [0]
    for n in key_lengths:
        starts.append(starts[-1] + int(n))
    runs: list[list[int]] = []
    for f in frames:
        a, b = starts[f], starts[f + 1]
        if runs and runs[-1][1] == a:
            runs[-1][1] = b
        else:
            runs.append([a, b])
    return tuple((a, b) for a, b in runs)


def select(x: torch.Tensor, dim: int, runs: Runs) -> torch.Tensor:
    """x's ``runs`` of axis ``dim``: a view for one run, else one copy (``torch.cat``)."""
    if len(runs) == 1:
        a, b = runs[0]
        return x if (a, b) == (0, x.shape[dim]) else x.narrow(dim, a, b - a)
    return torch.cat([x.narrow(dim, a, b - a) for a, b in runs], dim=dim)


def _put(out: torch.Tensor, dim: int, runs: Runs, part: torch.Tensor) -> None:
    """Write ``part`` into ``out``'s ``runs`` of axis ``dim`` (the inverse of ``select``)."""
    offset = 0
    for a, b in runs:
        out.narrow(dim, a, b - a).copy_(part.narrow(dim, offset, b - a))
        offset += b - a


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
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, split: bool = True, plan: KeySplit | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cached_attention`` with its log-sum-exp always given: the kernel's where it returns
    one (CUDA, fp16 / bf16), else ``log_sum_exp``."""
    out, lse = cached_attention(q, k, v, split=split, plan=plan)
    return out, log_sum_exp(q, k) if lse is None else lse


def edited_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    frame_bias: torch.Tensor | None,
    key_lengths: Sequence[int],
    *,
    split: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [B, Lq, H, D] over k, v [B, Lk, H, D] (the model's layout, softmax scale
    1/sqrt(D)) with ``frame_bias`` [H, len(key_lengths)] added to the scores of each head and
    key frame (0: untouched, finite: added, -inf: masked; None: no edit): (output [B, Lq, H, D]
    in q's dtype, the edited softmax's natural log-sum-exp [B, H, Lq] float32). Key frame f is
    the ``key_lengths[f]`` tokens of k after the previous frames'. ``split``: the model's
    ``KernelSettings.key_split``. The module's docstring has the method."""
    batch, num_keys, heads, _ = k.shape
    if q.ndim != 4 or k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:] or v.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} are not [B, L, H, D] of one call")
    if sum(int(n) for n in key_lengths) != num_keys or any(int(n) < 1 for n in key_lengths):
        raise ValueError(f"key_lengths {list(key_lengths)} do not lay out k's {num_keys} keys")
    if frame_bias is None:
        return attention_and_lse(q, k, v, split=split)
    if tuple(frame_bias.shape) != (heads, len(key_lengths)):
        raise ValueError(f"frame_bias {tuple(frame_bias.shape)} is not [{heads} heads, {len(key_lengths)} key frames]")
    plan = bias_plan(frame_bias)
    if not plan.edited:
        return attention_and_lse(q, k, v, split=split)
    runs = plain_runs(plan.plain) if plan.plain else ()
    if runs == ((0, heads),):
        # The unedited call itself (the plain heads' range is every head): the edited heads
        # are written over it.
        out, lse = attention_and_lse(q, k, v, split=split)
    else:
        out = torch.empty_like(q)
        lse = torch.empty(batch, heads, q.shape[1], dtype=torch.float32, device=q.device)
        if runs:
            # The whole call's key split, so that these heads get the unedited call's output.
            plain_out, plain_lse = attention_and_lse(*(select(x, 2, runs) for x in (q, k, v)), split=split,
                                                     plan=key_split(q, k, split))  # fmt: skip
            _put(out, 2, runs, plain_out)
            _put(lse, 1, runs, plain_lse)
    key_lengths = tuple(int(n) for n in key_lengths)
    for group in plan.groups:
        runs = runs_of(group.heads)
        group_q, group_k, group_v = (select(x, 2, runs) for x in (q, k, v))
        outs, lses = [], []
        for part in group.parts:
            tokens = token_runs(part.frames, key_lengths)
            part_out, part_lse = attention_and_lse(group_q, select(group_k, 1, tokens), select(group_v, 1, tokens), split=split)
            outs.append(part_out)
            lses.append(part_lse + part.bias if part.bias != 0.0 else part_lse)
        if len(outs) == 1:
            _put(out, 2, runs, outs[0])
            _put(lse, 1, runs, lses[0])
            continue
        # merge_parts takes the parts batch-major: [B * parts, h, Lq, D] and [B * parts, h, Lq];
        # it writes into out where the group's heads are one run.
        stacked = torch.stack(outs, dim=1).flatten(0, 1).transpose(1, 2)
        into = out.narrow(2, runs[0][0], runs[0][1] - runs[0][0]) if len(runs) == 1 and out.stride(-1) == 1 else None
        group_out, group_lse = merge_parts(stacked, torch.stack(lses, dim=1).flatten(0, 1), batch, len(outs), into)
        if into is None:
            _put(out, 2, runs, group_out)
        _put(lse, 1, runs, group_lse)
    return out, lse


@lru_cache(maxsize=256)
def _lengths_on(key_lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(key_lengths, device=device)


def token_bias(frame_bias: torch.Tensor, key_lengths: Sequence[int]) -> torch.Tensor:
    """[H, Lk] float32 on frame_bias's device: each key token's bias (its frame's)."""
    lengths = tuple(int(n) for n in key_lengths)
    return frame_bias.to(torch.float32).repeat_interleave(_lengths_on(lengths, frame_bias.device), dim=1,
                                                          output_size=sum(lengths))


__all__ = [
    "BiasPart", "EditPlan", "HeadGroup", "attention_and_lse", "bias_plan", "bias_rows", "edit_plan", "edited_attention", "log_sum_exp",
    "token_bias", "token_runs",
]  # fmt: skip
