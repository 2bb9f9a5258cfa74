"""Self-attention whose keys are split so that the attention kernel fills the GPU, merged exactly.

An attention kernel gives each program a tile of queries of one head. cuDNN's forward on
Hopper tiles 128 queries, so a block of 3 frames (4680 queries, 12 heads) is 444 programs
for the H100's 132 SMs: 3.4 waves, the fourth a third full, and its time is that of 4 full
waves (``benchmarks/attention_waves.py``, H100: 1.32 ms at 4224 queries, 1.74 ms at 4680).
``plan_key_split`` chooses, by counting waves, between one call and two ways to fill them:

- ``parts``: every query, the keys split into S equal parts run as S batch entries of one
  call: S times the programs, each over 1/S of the keys (S = 2 at 6-21 frames of keys:
  888 programs fill 6.7 of 7 waves of half the length);
- a ``head`` of queries that fills whole waves in one call, then the remaining queries
  with their keys in S parts (at 21 frames: 4224 queries in 3 waves, then 456 queries
  over 8 parts of 4095 keys, 0.375 of a wave).

Every part returns its log-sum-exp, so the parts merge exactly: out = sum_s w_s out_s with
w_s = exp(lse_s - lse), lse = log sum_s exp(lse_s). A merged row differs from one call's
by the rounding of the parts' outputs to the model dtype (one bf16 rounding more).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from sinkscope.attention.flash4 import flash4_attention_with_lse, uses_flash4

# cuDNN's query tile for head sizes up to 128 on Hopper: the staircase of attention_waves.py.
QUERY_TILE = 128
MAX_PARTS = 16
# Parts shorter than this spend too much of their time outside the main loop.
MIN_PART_KEYS = 2048
# A split must save at least this share of the waves to be worth its merge.
MIN_GAIN = 0.05
# The H100's time a wave of 128-query programs spends on one key (head size 128: 1.32 ms
# for 3 waves over 32760 keys, attention_waves.py), the bytes it moves meanwhile (about
# 3 TB/s), and the launches a split adds (copies, merge).
WAVE_SECONDS_PER_KEY = 13.4e-9
WAVE_BYTES_PER_KEY = WAVE_SECONDS_PER_KEY * 3.0e12
SPLIT_LAUNCH_SECONDS = 10e-6


@dataclass(frozen=True)
class KeySplit:
    """How one attention call runs: its first ``head`` queries in one call over every key,
    the rest with the keys in ``parts`` equal parts. ``KeySplit(0, 1)``: one plain call."""

    head: int
    parts: int
    waves: float  # the plan's cost in waves of full programs

    @property
    def plain(self) -> bool:
        return self.parts == 1


def wave_cost(programs: int, processors: int) -> int:
    """Waves of ``programs`` equal programs on ``processors`` SMs, one program each at a time."""
    return -(-programs // processors)


def _part_counts(num_keys: int) -> list[int]:
    return [s for s in range(2, MAX_PARTS + 1) if num_keys % s == 0 and num_keys // s >= MIN_PART_KEYS]


def _copy_waves(rows: int, heads: int, dim: int, num_keys: int) -> float:
    """The extra memory traffic of ``rows`` query rows copied once (bf16), in waves at this key count."""
    return rows * heads * dim * 2 / (num_keys * WAVE_BYTES_PER_KEY)


# A function of a call's sizes alone, asked at every cached call of every layer: planned once a shape.
@lru_cache(maxsize=1024)
def plan_key_split(
    batch: int, heads: int, num_queries: int, num_keys: int, processors: int, dim: int = 128, *, head_first: bool = True
) -> KeySplit:
    """The plan with the fewest waves (``KeySplit``), the merge's traffic counted: each split
    row is written S times as queries and as outputs, and read once more by the merge; a
    head's rows are copied into the output; and its extra launches. A split must save
    ``MIN_GAIN`` of one call's waves. ``head_first`` False: plans without a head of queries
    only (every query over S parts: what an edited call merges other parts into)."""
    per_tile = batch * heads
    tiles = -(-num_queries // QUERY_TILE)
    plain = KeySplit(0, 1, float(wave_cost(per_tile * tiles, processors)))
    options = [
        KeySplit(
            0,
            s,
            wave_cost(s * per_tile * tiles, processors) / s
            + _copy_waves(3 * s * batch * num_queries, heads, dim, num_keys),
        )
        for s in _part_counts(num_keys)
    ]
    head_tiles = (per_tile * tiles // processors) * processors // per_tile
    if head_first and 0 < head_tiles < tiles:
        head = head_tiles * QUERY_TILE
        head_waves = wave_cost(per_tile * head_tiles, processors) + _copy_waves(2 * batch * head, heads, dim, num_keys)
        options += [
            KeySplit(
                head,
                s,
                head_waves
                + wave_cost(s * per_tile * (tiles - head_tiles), processors) / s
                + _copy_waves(3 * s * batch * (num_queries - head), heads, dim, num_keys),
            )
            for s in _part_counts(num_keys)
        ]
    best = min(options, key=lambda plan: (plan.waves, plan.parts), default=plain)
    launches = SPLIT_LAUNCH_SECONDS / (num_keys * WAVE_SECONDS_PER_KEY)
    return best if best.waves + launches < plain.waves * (1 - MIN_GAIN) else plain


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, kernel: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, natural log-sum-exp [N, H, Lq] fp32) of q, k, v [N, H, L, D].

    On CUDA (fp16 / bf16) FlashAttention-4 or cuDNN as ``kernel`` says
    (``sinkscope.attention.flash4``), PyTorch's flash attention where cuDNN is missing; PyTorch's
    CPU flash attention on the CPU."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, scale=scale)[:2]
        return out, lse.float()
    if q.dtype not in (torch.float16, torch.bfloat16):
        # cuDNN's op takes float32 without complaint and returns NaN (H100, torch 2.11).
        raise NotImplementedError(f"cuDNN and flash attention compute in fp16 / bf16, not {q.dtype}")
    if uses_flash4(kernel, q, k, v):
        return flash4_attention_with_lse(q, k, v, scale)
    errors = []
    for attend in (
        lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False, scale=scale),
        lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale),
    ):
        try:
            out, lse = attend()[:2]
        except (RuntimeError, AttributeError) as error:  # not built, or not for this dtype / head_dim
            errors.append(str(error).splitlines()[0][:120])
            continue
        return out, lse.reshape(q.shape[:3]).float()
    raise NotImplementedError(f"no attention backend returns the log-sum-exp here ({'; '.join(errors)})")


def split_key_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    parts: int,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    *,
    part_bias: torch.Tensor | None = None,
    extra: tuple[torch.Tensor, torch.Tensor] | None = None,
    kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [B, Lq, H, D] over k, v [B, Lk, H, D] (the model's layout), the keys in
    ``parts`` equal parts: (output [B, Lq, H, D], log-sum-exp [B, H, Lq] fp32). ``out``: a
    [B, Lq, H, D] view to write the output into; ``kernel``: as ``attention_with_lse``.

    For an edited call (``sinkscope.attention.biased``): ``part_bias`` fp32, [H] or [parts, H],
    is added to every score of each head (and part), so to its log-sum-exp, before the merge;
    ``extra`` (output [B * E, H, Lq, D], log-sum-exp [B * E, H, Lq], batch-major) are E more
    parts, attended elsewhere over other keys, merged with these."""
    batch, num_keys, heads, dim = k.shape
    if parts < 1 or num_keys % parts:
        raise ValueError(f"{num_keys} keys do not split into {parts} equal parts")
    scale = dim**-0.5 if scale is None else scale
    num_q = q.shape[1]
    per_part = num_keys // parts
    queries = q.unsqueeze(1).expand(batch, parts, num_q, heads, dim).reshape(batch * parts, num_q, heads, dim)
    keys = k.reshape(batch * parts, per_part, heads, dim)
    values = v.reshape(batch * parts, per_part, heads, dim)
    result, lse = attention_with_lse(
        queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), scale, kernel
    )
    if part_bias is not None:
        shifted = lse.view(batch, parts, heads, num_q) + part_bias.expand(parts, heads)[None, :, :, None]
        lse = shifted.view(batch * parts, heads, num_q)
    if parts > 1 or extra is not None:
        return merge_parts(result, lse, batch, parts, out, extra)
    if out is None:
        return result.transpose(1, 2), lse
    out.copy_(result.transpose(1, 2))
    return out, lse


def planned_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: KeySplit,
    scale: float | None = None,
    *,
    lse: bool = True,
    kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of q [B, Lq, H, D] over k, v [B, Lk, H, D] run as ``plan`` says:
    (output [B, Lq, H, D], log-sum-exp [B, H, Lq] fp32, or None without ``lse``)."""
    if plan.head == 0:
        out, total = split_key_attention(q, k, v, plan.parts, scale, kernel=kernel)
        return out, total if lse else None
    out = torch.empty_like(q)
    _, head_lse = split_key_attention(q[:, : plan.head], k, v, 1, scale, out=out[:, : plan.head], kernel=kernel)
    tail = out[:, plan.head :]
    _, tail_lse = split_key_attention(q[:, plan.head :], k, v, plan.parts, scale, out=tail, kernel=kernel)
    return out, torch.cat((head_lse, tail_lse), dim=-1) if lse else None


def merge_parts(
    out: torch.Tensor,
    lse: torch.Tensor,
    batch: int,
    parts: int,
    merged: torch.Tensor | None = None,
    extra: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``parts`` partial attentions, out [B * parts, H, Lq, D] and lse [B * parts, H, Lq]
    (batch-major), and the parts of ``extra`` (the same, over other keys), into (output
    [B, Lq, H, D] in out's dtype, log-sum-exp [B, H, Lq] fp32); written into ``merged`` when
    given."""
    _, heads, num_q, dim = out.shape
    if out.is_cuda:
        from sinkscope.attention.merge_kernel import merge_parts_cuda

        return merge_parts_cuda(out, lse, batch, parts, merged, extra)
    out, lse = out.reshape(batch, parts, heads, num_q, dim), lse.reshape(batch, parts, heads, num_q)
    if extra is not None:
        extra_parts = extra[0].shape[0] // batch
        out = torch.cat((out, extra[0].reshape(batch, extra_parts, heads, num_q, dim)), dim=1)
        lse = torch.cat((lse, extra[1].reshape(batch, extra_parts, heads, num_q)), dim=1)
    total = torch.logsumexp(lse, dim=1)
    weights = torch.exp(lse - total.unsqueeze(1))
    result = (out.float() * weights.unsqueeze(-1)).sum(1)
    result = result.to(out.dtype).transpose(1, 2)
    if merged is None:
        return result.contiguous(), total
    merged.copy_(result)
    return merged, total


def key_split(q: torch.Tensor, k: torch.Tensor, enabled: bool = True, *, head_first: bool = True) -> KeySplit:
    """The plan for q, k [B, L, H, D]: a plain call unless ``enabled`` (``KernelSettings.key_split``),
    on CUDA, in fp16 / bf16. ``head_first``: as ``plan_key_split``."""
    batch, num_q, heads, dim = q.shape
    if not (enabled and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)):
        return KeySplit(0, 1, 0.0)
    return plan_key_split(batch, heads, num_q, k.shape[1], multiprocessors(q.device), dim, head_first=head_first)


def gives_lse(q: torch.Tensor) -> bool:
    """Where an attention kernel returns the log-sum-exp with the output (cuDNN, flash)."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def cached_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, split: bool = True, kernel: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's cached self-attention call, q, k, v [B, L, H, D] (softmax scale 1/sqrt(D)):
    (output [B, Lq, H, D], each query's natural-log log-sum-exp [B, H, Lq] fp32, or None
    where the kernel does not return it). The one function both the uncaptured call and the
    ``exact`` capture route run, so capturing leaves the output bit for bit as it is.

    On CUDA in fp16 / bf16, FlashAttention-4's or cuDNN's attention with its log-sum-exp
    (``kernel``: ``KernelSettings.attention_kernel``, ``sinkscope.attention.flash4``), the keys
    split when that fills the GPU's waves better and ``split`` (``key_split``); elsewhere (the
    CPU, float32) SDPA itself, without the log-sum-exp."""
    plan = key_split(q, k, split)
    if gives_lse(q):
        try:
            return planned_attention(q, k, v, plan, kernel=kernel)
        except NotImplementedError:
            if not plan.plain:
                raise
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2), None


def balanced_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, split: bool = True, kernel: str = "auto"
) -> torch.Tensor:
    """The output of ``cached_attention``, [B, Lq, H, D]."""
    return cached_attention(q, k, v, split=split, kernel=kernel)[0]


_MULTIPROCESSORS: dict[int, int] = {}


def multiprocessors(device: torch.device) -> int:
    """The SMs of a CUDA device (cached)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _MULTIPROCESSORS:
        _MULTIPROCESSORS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _MULTIPROCESSORS[index]


__all__ = [
    "KeySplit",
    "attention_with_lse",
    "balanced_attention",
    "cached_attention",
    "gives_lse",
    "key_split",
    "merge_parts",
    "multiprocessors",
    "plan_key_split",
    "planned_attention",
    "split_key_attention",
    "wave_cost",
]
