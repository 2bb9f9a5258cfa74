"""An attention call and every key frame's partials in one pass: FlashAttention-4's Hopper
forward with a softmax that keeps them (``sinkscope.stats.flash4_kernel``, device code).

``flash4_attention_partials(q, k, v, key_lengths, scale)`` returns what
``launch.tma_attention`` returns, the output and per (head, query, key frame) the partials
``reductions.combine_frame_partials`` turns into every frame statistic: m, the frame's max of
the base-2 scores t = q.k * scale * log2(e); g, the running max its sums refer to; l = sum over the frame
of 2^(t - g); w = sum 2^(t - g) t (here the row's whole sum, kept with the part's first frame
in key order, the last one the kernel visits: the combine only adds the frames' w). The call
runs as the model's own call runs (``sinkscope.attention.split.key_split``'s plan: a head
of query tiles over every key, the rest over equal parts of the keys, merged by their
log-sum-exps), with the same kernel configuration as FlashAttention-4's own call, so the
output is the model's call's to the bit (``tests/test_flash4_partials.py``, on the GPU); the
parts' partials are merged here by the same rule (``merge_part_partials``).

What the kernel adds to FlashAttention-4's softmax step, per score: an add (the tile's sum of
p) and a fused multiply-add (the sum of p (t - g)); per row and key tile, the open frame's
max. A frame's sum is the row sum's growth while it was open. A frame that starts inside a
key tile (frames are at least a tile long, so at most one does; about one tile in ten) is
closed by the step's one branch, after the row maxima, which splits that tile's sums and
maxima at the frame's first key and writes the closed frame's partials
(``flash4_kernel``'s docstring says why there). A study without entropy
(``capture.statistics``) compiles the kernel without the sum of p (t - g) (``entropy=False``).
On an H200 the route as a job runs it costs 1.24x (1.3B) / 1.32x (LongLive 2.0) the model's
call, 1.16x / 1.26x without entropy; of what it adds, the kernel is most, and the key frames'
sums, the combine and the merges 0.08 ms (1.3B) / 0.19 ms (LongLive 2.0) a call;
docs/performance.md.

Where it runs (``flash4_partials_fit``): CUDA devices of compute capability 9.x with
``flash-attn-4`` installed, fp16 / bf16, head size 128 (the tile FlashAttention-4 compiles for
it), every key frame at least a key tile (128 keys) long. The kernel is compiled once a
process per kind of call (a key split's head and parts are two kinds): on an H200 a
benchmark's first call, with FlashAttention-4's and the Triton kernels' own first compiles,
took 14-20 s, and a process's first captured generation 24 s against 14 s uncaptured.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.util import find_spec

import torch

from sinkscope.attention.flash4 import flash4_unsupported, uses_flash4
from sinkscope.attention.split import key_split, merge_parts
from sinkscope.stats.reference import CallStatistics

HEAD_DIM = 128
TILE_N = 128


def flash4_partials_fit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_lengths: Sequence[int]) -> bool:
    """Whether ``flash4_attention_partials`` takes q, k, v [H, L, D]."""
    return (
        q.is_cuda
        and q.shape[-1] == HEAD_DIM
        and min(key_lengths) >= TILE_N
        and torch.cuda.get_device_capability(q.device)[0] == 9
        and flash4_unsupported(q, k, v) is None
    )


def one_pass_applies(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_lengths: Sequence[int],
    statistics: Sequence[str],
    attention_kernel: str,
    backend: str = "auto",
) -> bool:
    """Whether the ``exact`` route (and ``fused``) takes this call's statistics from its
    attention call's own pass (``flash4_attention_partials``): the statistics need the scores
    (any besides logit_mean, which costs less by factorization), the statistics backend is
    Triton's (the merge and the combine are Triton kernels; ``auto`` on CUDA where Triton
    runs), the model's call runs FlashAttention-4 (``attention_kernel``, ``uses_flash4``) and
    the kernel fits it. q, k, v are [H, L, D]."""
    return (
        bool(set(statistics) - {"logit_mean"})
        and q.is_cuda
        and backend != "torch"
        and find_spec("triton") is not None
        and uses_flash4(attention_kernel, q, k, v)
        and flash4_partials_fit(q, k, v, key_lengths)
    )


def statistics_from_partials(
    q: torch.Tensor,
    k: torch.Tensor,
    partials: tuple[torch.Tensor, ...],
    frame_seq_length: int,
    num_q: int,
    key_lengths: Sequence[int],
    scale: float,
    *,
    token_profiles: bool = False,
) -> CallStatistics:
    """Every statistic of the call (or of some of its query rows: q [H, rows, D] and the
    partials' same rows) from ``flash4_attention_partials``'s partials, by the combine of the
    one-pass routes (``launch._combine_fused``: logit_mean by factorization from the key
    frames' sums)."""
    from sinkscope.stats.launch import _combine_fused
    from sinkscope.stats.launch_support import _segments_on
    from sinkscope.stats.reductions import segment_part_sums

    key_lengths = tuple(int(n) for n in key_lengths)
    _, _, lengths_float = _segments_on(q.device, key_lengths)
    key_sums = segment_part_sums(k, key_lengths)
    return _combine_fused(q, k, partials, key_sums, lengths_float, frame_seq_length, num_q, scale, token_profiles, None)


# Compiled kernels by (dtype, key parts, what it keeps, exact output, entropy, queries shared by
# the parts): a process's first call of each kind compiles, for its tensors' layout (as
# FlashAttention-4 compiles its own calls).
_KERNELS: dict = {}


def _compile(
    dtype: torch.dtype, parts: int, keeps: str, exact_output: bool, entropy: bool, tensors: tuple, scale: float
):
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute.cute_dsl_utils import to_cute_tensor
    from flash_attn.cute.utils import AuxData

    from sinkscope.stats.flash4_kernel import FrameStatsForwardSm90

    q, k, v, out, lse, partials, frame_ends = tensors
    kernel = FrameStatsForwardSm90(
        cutlass.BFloat16 if dtype == torch.bfloat16 else cutlass.Float16,
        HEAD_DIM,
        HEAD_DIM,
        1,
        is_causal=False,
        is_local=False,
        pack_gqa=False,
        tile_m=128,
        tile_n=TILE_N,
        num_stages=2,
        num_threads=384,
        Q_in_regs=False,
        intra_wg_overlap=True,
        mma_pv_is_rs=True,
        parts=parts,
        keeps=keeps,
        exact_output=exact_output,
        entropy=entropy,
    )
    aux = AuxData(
        [
            to_cute_tensor(partials, assumed_align=4, leading_dim=4),
            to_cute_tensor(frame_ends, assumed_align=4, leading_dim=0),
        ],
        None,
    )
    return cute.compile(
        kernel,
        *(to_cute_tensor(x) for x in (q, k, v)),
        to_cute_tensor(out, assumed_align=16),
        to_cute_tensor(lse, assumed_align=4),
        scale,
        *(None,) * 9,
        aux,
        None,
        None,
        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
        options="--enable-tvm-ffi",
    )


def _run(q, k, v, out, lse, partials, frame_ends, scale: float, parts: int, kind: tuple) -> None:
    """One launch over q [N, Lq, H, D] and k, v [N, Lk, H, D] (N = batch x parts); ``kind``:
    (keeps, exact_output, entropy), as ``flash4_attention_partials`` takes them."""
    from flash_attn.cute.utils import AuxData

    tensors = (q, k, v, out, lse, partials, frame_ends)
    key = (q.dtype, parts, *kind, q.stride(0) == 0 and q.shape[0] > 1)
    # The launch goes to the current device's stream: a call on another GPU switches to it.
    with torch.cuda.device(q.device):
        if key not in _KERNELS:
            _KERNELS[key] = _compile(q.dtype, parts, *kind, tensors, scale)
        _KERNELS[key](q, k, v, out, lse, scale, *(None,) * 9, AuxData([partials, frame_ends], None), None, None)


def merge_part_partials(partials: torch.Tensor, out: torch.Tensor, frame_ends: torch.Tensor, part_length: int) -> None:
    """Merge a key split's parts' partials [4, parts, H, F, Lq] into ``out`` [4, H, F, Lq]
    (``reduction_kernels.part_partials_merge_kernel``; queries at unit stride in both)."""
    import triton

    from sinkscope.stats.reduction_kernels import part_partials_merge_kernel

    _, parts, heads, frames, num_q = partials.shape
    block_q = 128
    part_partials_merge_kernel[(frames, heads, triton.cdiv(num_q, block_q))](
        partials,
        out,
        frame_ends,
        partials.stride(0),
        partials.stride(1),
        partials.stride(2),
        partials.stride(3),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        parts,
        part_length,
        num_q,
        PARTS_PAD=triton.next_power_of_2(parts),
        BLOCK_Q=block_q,
    )


def flash4_attention_partials(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_lengths: Sequence[int],
    scale: float,
    *,
    split: bool = True,
    exact_output: bool = True,
    keeps: str = "frames",
    entropy: bool = True,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """(output [Lq, H, D], (m, g, l, w) each [H, Lq, F] fp32, views of [H, F, Lq] storage)
    of q, k, v [H, L, D] (views of the model's [1, L, H, D] tensors), the keys in frames of
    ``key_lengths``; ``split``: the model's ``KernelSettings.key_split`` (its call's plan);
    ``exact_output`` False: the output from the kernel's own sums of p (faster; within one
    rounding of the model's call, not bit for bit);
    ``keeps`` (measurements): ``"sums"`` or ``"nothing"`` compile the kernel keeping less
    (``flash4_kernel.FrameSoftmax.keeps``), and the partials are then not the frames';
    ``entropy`` False: w is not kept (written 0: the combine's entropy is then meaningless), one
    fused multiply-add a score less."""
    from sinkscope.stats.launch_support import _frame_ends_on

    key_lengths = tuple(int(n) for n in key_lengths)
    heads, num_q, dim = q.shape
    frames = len(key_lengths)
    q4, k4, v4 = (x.transpose(0, 1)[None] for x in (q, k, v))
    frame_ends = _frame_ends_on(q.device, key_lengths)
    out = torch.empty(num_q, heads, dim, dtype=q.dtype, device=q.device)
    # [4, H, F, Lq]: a warp's rows of one frame are written to consecutive addresses.
    partials = torch.empty(4, heads, frames, num_q, dtype=torch.float32, device=q.device)
    kind = (keeps, exact_output, entropy)
    plan = key_split(q4, k4, split)
    head = plan.head if plan.parts > 1 else num_q
    if head:
        lse = torch.empty(1, heads, head, dtype=torch.float32, device=q.device)
        head_partials = partials[:, None, ..., :head]
        _run(q4[:, :head], k4, v4, out[None, :head], lse, head_partials, frame_ends, scale, 1, kind)
    if head < num_q:
        parts, tail = plan.parts, num_q - head
        per_part = k.shape[1] // parts
        queries = q4[:, head:].expand(parts, tail, heads, dim)
        keys, values = (x.reshape(parts, per_part, heads, dim) for x in (k4, v4))
        part_out = torch.empty(parts, tail, heads, dim, dtype=q.dtype, device=q.device)
        part_lse = torch.empty(parts, heads, tail, dtype=torch.float32, device=q.device)
        part_partials = torch.empty(4, parts, heads, frames, tail, dtype=torch.float32, device=q.device)
        _run(queries, keys, values, part_out, part_lse, part_partials, frame_ends, scale, parts, kind)
        merge_parts(part_out.transpose(1, 2), part_lse, 1, parts, out[None, head:])
        merge_part_partials(part_partials, partials[..., head:], frame_ends, per_part)
    return out, tuple(partials.transpose(2, 3).unbind(0))
