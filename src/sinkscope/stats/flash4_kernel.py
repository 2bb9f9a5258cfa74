"""Device code: FlashAttention-4's Hopper forward that keeps every key frame's partials.

Imported only by ``sinkscope.stats.flash4_partials`` when it first builds a kernel (it needs
``flash-attn-4`` and the CuTe DSL: ``pip install 'sinkscope[flash4]'``); the maths and the
partials' meaning are in that module's docstring.

``FrameStatsForwardSm90`` is FlashAttention-4's own SM90 forward
(``flash_attn.cute.flash_fwd_sm90.FlashAttentionForwardSm90``), subclassed, not copied. Two
of its hooks are used:

- ``apply_score_mod``, which the kernel calls on every key tile's scores just before the
  online softmax (when a score_mod is set): here it changes no score; it records which tile
  this is (``_TRACE``: the CuTe DSL traces the kernel's Python once, in order, so the hook's
  record is the next softmax step's tile) and, at a work tile's first key tile, the work
  tile (``FrameSoftmax.where``) and the frame it opens with (``FrameSoftmax.open_at_top``);
  it has no branch of its own;
- the module name ``Softmax`` that the kernel's consumer code builds its softmax from,
  pointed at ``FrameSoftmax`` while that code is traced (``FrameStatsForwardSm90.mma``).

``FrameSoftmax.online_softmax`` is FlashAttention's online-softmax step with the plain
kernel's operations in its order (so the output and the log-sum-exp are the plain kernel's
bit for bit; ``tests/test_flash4_partials.py`` checks it on the GPU), the open frame's max on
top, and one branch, after the row maxima, taken where a frame's first key lies in the tile:
it closes that frame and writes its partials. A frame's sum is the row sum's growth while it
was open, so no step keeps a sum of its own.

Where that branch sits is most of what the partials cost. Placed before the row maxima (in
the hook, as until 2026-11-29), it made ptxas wait for the PV product ahead of them, so that
they no longer overlapped it (about 5% of the call); after them, the wait stays where the
plain kernel has it. The compiler still puts the V tile's release at the end of the tile
whenever the tile has a branch (2-3%, measured with a branch never taken); an extra
multiply-add on every score costs more than the branch's exponentials taken twice, once a
frame (docs/performance-history.md, the fourth session of 2026-11-29).
"""

from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from flash_attn.cute import flash_fwd_sm90
from flash_attn.cute import utils as fa_utils
from flash_attn.cute.softmax import Softmax
from quack import layout_utils

LOG2E = math.log2(math.e)
TILE_N = 128
# Set while a kernel is traced: the outputs (the kernel's aux tensors), the softmax ("softmax"),
# the thread's columns as thread 0's ("cols0", compile-time numbers) and the key tile the next
# softmax step takes ("n_block", valid in that step's part of the trace).
_TRACE: dict = {}
# What the hook records of a work tile in FrameSoftmax.where, then each of the thread's rows.
WORK_FIELDS = ("batch", "head", "seqlen_q", "seqlen_k", "part_start", "thread_col")


def _unused_score_mod(*_args):  # the kernel calls its hook only when a score_mod is set
    raise AssertionError("never traced: FrameStatsForwardSm90.apply_score_mod replaces it")


def _quad_sum(x):
    return fa_utils.warp_reduce(x, lambda a, b: a + b, width=4)


def _quad_max(x):
    return cute.arch.warp_reduction_max(x, threads_in_group=4)


def _work(softmax) -> SimpleNamespace:
    """The work tile's record (``FrameSoftmax.where``) and the outputs."""
    where = softmax.where
    work = SimpleNamespace(**{name: where[i] for i, name in enumerate(WORK_FIELDS)})
    work.rows = [where[len(WORK_FIELDS) + r] for r in range(cute.size(softmax.row_max))]
    work.partials, work.frame_ends = _TRACE["outputs"]
    work.cols0 = _TRACE["cols0"]
    return work


# The helpers below have no control flow of their own: the kernel's functions (cute.jit)
# branch around them, so that every value they see comes from where they are called.
def _writes(work, r: int):
    """Whether this thread writes row r's partials: one thread of the row's four, a row of the
    queries (the last query tile runs past them)."""
    return (cute.arch.lane_idx() % 4 == 0) & (work.rows[r] < work.seqlen_q)


def _write_partials(work, r: int, frame, m_raw, g, scale_log2, l_quad, w_quad) -> None:
    """Row r's partials of one frame: m, g, l (summed over the row's four threads already) and
    w, the sum of p t (the same; 0 but for the part's first frame in key order, the last one
    visited, which holds the row's)."""
    out, row = work.partials, work.rows[r]
    out[0, work.batch, work.head, frame, row] = m_raw * scale_log2
    out[1, work.batch, work.head, frame, row] = g
    out[2, work.batch, work.head, frame, row] = l_quad
    out[3, work.batch, work.head, frame, row] = w_quad


def _frame_start(frame_ends, frame):
    """The first key of ``frame`` (0 for the first frame): the end of the frame before."""
    return frame_ends[cutlass.max(frame - 1, 0)] * cutlass.min(frame, 1)


@dataclass
class FrameSoftmax(Softmax):
    """FlashAttention's online softmax plus, per row, the open key frame's max and base (its
    sum is the row sum's growth since it opened) and the row's sum of p (t - g) (entropy needs
    it for the row, not per frame: it is written with the part's first frame in key order, the
    last one visited, whose reference is the final running max)."""

    # This thread's running sum of p as it stood before the open frame (the row sum of the keys
    # visited before it), and the reference g of that sum: the open frame's sum is the row sum
    # now less this, rescaled, so that no step keeps a sum of its own for the frame.
    open_base: cute.Tensor = None
    open_base_g: cute.Tensor = None
    open_m: cute.Tensor = None  # the open frame's max of the raw scores (the row's four threads')
    row_w: cute.Tensor = None  # this thread's sum of 2^(t - g) (t - g) over the row's keys so far
    # [the open frame, its first key, 1 where the step's branch opened it in this tile (the step
    # then leaves its max, which the branch took from the keys below the boundary) or 0]: the
    # same in every thread
    open_frame: cute.Tensor = None
    # The work tile, recorded by the hook at its first key tile (memory, not values: a value
    # made in one of the kernel's functions may not be used in another): WORK_FIELDS.
    where: cute.Tensor = None
    # What it keeps (measurements): "frames" (every frame's partials), "sums" (the sums of p
    # and p (t - g), no frames), "nothing" (the plain kernel's softmax step).
    keeps: cutlass.Constexpr[str] = "frames"
    # True: the running sum as the plain kernel adds it (its output to the bit); False: from
    # the tile's own sum of p (one add a score less; the output then differs in its roundings).
    exact_output: cutlass.Constexpr[bool] = True
    # False: no sum of p (t - g) (entropy's; one fused multiply-add a score less), w written 0.
    entropy: cutlass.Constexpr[bool] = True

    @staticmethod
    def create_for(
        scale_log2, num_rows: int, keeps: str = "frames", exact_output: bool = True, entropy: bool = True
    ) -> FrameSoftmax:
        def rows():
            return cute.make_rmem_tensor(num_rows, Float32)

        frame = cute.make_rmem_tensor(3, Int32)
        where = cute.make_rmem_tensor(len(WORK_FIELDS) + num_rows, Int32)
        state = (rows(), rows(), rows(), rows(), frame, where)
        return FrameSoftmax(scale_log2, num_rows, rows(), rows(), 80, None, *state, keeps, exact_output, entropy)

    @cute.jit
    def open_at_top(self):
        """Open the frame that holds this part's last key (a work tile's first key tile), with
        nothing visited before it."""
        work = _work(self)
        top = work.part_start + work.seqlen_k - 1
        frame = Int32(0)
        for i in cutlass.range(cute.size(work.frame_ends.shape[0]), unroll=1):
            if work.frame_ends[i] <= top:
                frame = i + 1
        self.open_frame[0] = frame
        self.open_frame[1] = _frame_start(work.frame_ends, frame)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            self.open_base[r] = 0.0
            self.open_base_g[r] = -Float32.inf  # 2^(-inf - g) = 0: nothing to take off
            self.open_m[r] = -Float32.inf

    @cute.jit
    def online_softmax(
        self, acc_S: cute.Tensor, is_first: cutlass.Constexpr[bool] = False, check_inf: cutlass.Constexpr[bool] = True
    ) -> cute.Tensor:
        """FlashAttention's online-softmax step on a key tile, as the plain kernel computes it
        (p = 2^(t - g) in place, the running max and sum, the rescale), with the tile's sums of
        p and p (t - g) taken score by score (no vector of t - g kept alive: the consumer warps
        have no registers to spare) and the open frame's max carried on (its sum is the row
        sum's growth). Where the open frame's first key lies in the tile, one branch after the
        row maxima closes it."""
        if const_expr(self.keeps == "nothing"):  # measurements: the plain kernel's step
            return Softmax.online_softmax(self, acc_S, is_first, check_inf)
        frames = const_expr(self.keeps == "frames")
        work = _work(self)
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S)
        row_scale = cute.make_fragment_like(self.row_max, Float32)
        row_max, row_sum, scale_log2 = self.row_max, self.row_sum, self.scale_log2
        num_rows = cute.size(row_max)
        tile_maxima = cute.make_rmem_tensor(num_rows, Float32)
        # Per row: the new running max, the same with -inf as 0 (the reference), its g.
        refs = cute.make_rmem_tensor(3 * num_rows, Float32)
        for r in cutlass.range_constexpr(num_rows):
            tile_maxima[r] = _quad_max(fa_utils.fmax_reduce(acc_S_mn[r, None].load(), None, arch=self.arch))
            row_max_new = tile_maxima[r]
            if const_expr(not is_first):
                row_max_new = fa_utils.fmax(tile_maxima[r], row_max[r])
            row_max_cur = row_max_new
            if const_expr(check_inf):
                row_max_cur = 0.0 if row_max_new == -Float32.inf else row_max_new
            refs[3 * r] = row_max_new
            refs[3 * r + 1] = row_max_cur
            refs[3 * r + 2] = row_max_cur * scale_log2
        if const_expr(frames):
            # Where the open frame's first key lies inside this key tile, or the open frame ended
            # with the last tile (about one tile in ten): close the open frame and write its
            # partials, from the keys above its first key in this tile (p as the step computes
            # it) and the row sum before the tile; open the frame before, with the keys below
            # as its start. The key tile's only branch, after the row maxima: there it leaves
            # them overlapping the PV product (docs/performance-history.md).
            tile_start = work.part_start + _TRACE["n_block"] * TILE_N
            frame_start = self.open_frame[1]
            self.open_frame[2] = 0
            # (The branch touches no attribute of self: the tracer would carry self out of it.)
            open_base, open_base_g, open_m, open_frame = self.open_base, self.open_base_g, self.open_m, self.open_frame
            if frame_start > tile_start:
                frame = open_frame[0]
                num_cols = cute.size(acc_S_mn.shape[1])
                # Below: the frame before's keys (all of the tile where the open frame ended with
                # the last tile, frame_start = tile_start + TILE_N).
                split_col = frame_start - tile_start - work.thread_col
                for r in cutlass.range_constexpr(cute.size(row_max)):
                    row_max_cur, g = refs[3 * r + 1], refs[3 * r + 2]
                    visited = Float32(0.0)  # the row sum before the tile, in this tile's reference
                    if const_expr(not is_first):
                        rescale = cute.math.exp2((row_max[r] - row_max_cur) * scale_log2, fastmath=True)
                        visited = row_sum[r] * rescale
                    low_m, high_m = -Float32.inf, -Float32.inf
                    high_l = Float32(0.0)
                    for c in cutlass.range_constexpr(num_cols):
                        below = work.cols0[c] < split_col
                        score = acc_S_mn[r, c]
                        p = cute.math.exp2(score * scale_log2 - g, fastmath=True)
                        high_l += 0.0 if below else p
                        low_m = fa_utils.fmax(low_m, score if below else -Float32.inf)
                        high_m = fa_utils.fmax(high_m, -Float32.inf if below else score)
                    # Every key visited up to the frame's first key, less the base: the frame's sum.
                    # (A difference of fp32 sums of the row: off by their rounding, a few 1e-8 of
                    # the row's sum, far inside the exact route's tolerance.)
                    visited = visited + high_l
                    part = visited - open_base[r] * cute.math.exp2(open_base_g[r] - g, fastmath=True)
                    exp_sum = _quad_sum(part)
                    closed_m = fa_utils.fmax(open_m[r], _quad_max(high_m))
                    if _writes(work, r):
                        _write_partials(work, r, frame, closed_m, g, scale_log2, exp_sum, 0.0)
                    open_base[r] = visited
                    open_base_g[r] = g
                    open_m[r] = _quad_max(low_m)
                open_frame[0] = frame - 1
                open_frame[1] = _frame_start(work.frame_ends, frame - 1)
                open_frame[2] = 1

        opened = self.open_frame[2] != 0
        for r in cutlass.range_constexpr(num_rows):
            row_max_prev = row_max[r]
            row_max_new, row_max_cur, g = refs[3 * r], refs[3 * r + 1], refs[3 * r + 2]
            sums = [Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)]  # p, p, p x, p x
            for c in cutlass.range_constexpr(cute.size(acc_S_mn.shape[1])):
                x = acc_S_mn[r, c] * scale_log2 - g
                p = cute.math.exp2(x, fastmath=True)
                acc_S_mn[r, c] = p
                sums[c % 2] += p
                if const_expr(self.entropy):
                    if const_expr(is_first):  # columns past the keys: x = -inf, p = 0
                        x = 0.0 if x == -Float32.inf else x
                    sums[2 + c % 2] += p * x
            tile_l = sums[0] + sums[1]
            tile_w = sums[2] + sums[3]
            probabilities = acc_S_mn[r, None].load()
            if const_expr(is_first):
                row_sum[r] = tile_l
                if const_expr(self.exact_output):
                    row_sum[r] = fa_utils.fadd_reduce(probabilities, init_val=None, arch=self.arch)
                row_scale[r] = 1.0
                self.row_w[r] = tile_w
            else:
                row_scale[r] = cute.math.exp2((row_max_prev - row_max_cur) * scale_log2, fastmath=True)
                if const_expr(self.entropy):
                    # The row's sum of p (t - g) moves to the new reference: t - g shifts by the
                    # change (nothing to move where every earlier key was masked).
                    shift = 0.0 if row_max_prev == -Float32.inf else (row_max_prev - row_max_cur) * scale_log2
                    self.row_w[r] = (self.row_w[r] + shift * row_sum[r]) * row_scale[r] + tile_w
                if const_expr(self.exact_output):
                    row_sum[r] = fa_utils.fadd_reduce(probabilities, init_val=row_sum[r] * row_scale[r], arch=self.arch)
                else:
                    row_sum[r] = row_sum[r] * row_scale[r] + tile_l
            row_max[r] = row_max_new
            if const_expr(frames):
                # The open frame's max goes on; where the branch opened it in this tile, it took
                # the max of the keys below the boundary already.
                self.open_m[r] = self.open_m[r] if opened else fa_utils.fmax(self.open_m[r], tile_maxima[r])
        return row_scale

    @cute.jit
    def finalize(self, final_scale: Float32 = 1.0, sink_val=None) -> cute.Tensor:
        # The open frame, the part's first in key order (a frame closes only at a tile that
        # holds keys below it), closes here with the final running max as its reference, and
        # takes the row's sum of p t (every other frame's w is 0).
        if const_expr(self.keeps == "nothing"):
            return Softmax.finalize(self, final_scale, sink_val)
        work = _work(self)
        frame = self.open_frame[0] if const_expr(self.keeps == "frames") else Int32(0)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            row_max_cur = self.row_max[r]
            row_max_cur = 0.0 if row_max_cur == -Float32.inf else row_max_cur
            g = row_max_cur * self.scale_log2
            # sum p t = sum p (t - g) + g sum p, over the row (row_sum: this thread's part)
            w = Float32(0.0)
            if const_expr(self.entropy):
                w = _quad_sum(self.row_w[r]) + g * _quad_sum(self.row_sum[r])
            open_l = self.row_sum[r]
            if const_expr(self.keeps == "frames"):
                open_l -= self.open_base[r] * cute.math.exp2(self.open_base_g[r] - g, fastmath=True)
            open_l = _quad_sum(open_l)
            if _writes(work, r):
                m = self.open_m[r] if const_expr(self.keeps == "frames") else -Float32.inf
                _write_partials(work, r, frame, m, g, self.scale_log2, open_l, w)
        return Softmax.finalize(self, final_scale, sink_val)


@contextlib.contextmanager
def _swapped(module, name: str, value):
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


class FrameStatsForwardSm90(flash_fwd_sm90.FlashAttentionForwardSm90):
    """The SM90 forward whose softmax keeps every key frame's partials (aux tensors: the
    partials [4, B, H, F, Lq] fp32 and the frames' ends [F] int32). ``parts``: the key split's
    parts in the batch (batch index = b * parts + part; each part ``seqlen_k`` keys); ``keeps``
    (measurements), ``exact_output`` and ``entropy``: as ``FrameSoftmax``'s."""

    def __init__(
        self, *args, parts: int = 1, keeps: str = "frames", exact_output: bool = True, entropy: bool = True, **kwargs
    ):
        super().__init__(*args, score_mod=_unused_score_mod, has_aux_tensors=True, **kwargs)
        self.parts = parts
        self.keeps = keeps
        self.exact_output = exact_output
        self.entropy = entropy

    def mma(self, *args, **kwargs):
        kernel = self

        class Factory:  # what flash_fwd_sm90.Softmax.create builds while mma is traced
            @staticmethod
            def create(scale_log2, num_rows, arch=80, softmax_scale=None):
                # With a score_mod set the kernel passes log2(e) and the scale apart; the plain
                # kernel's product, computed as it computes it (softmax_scale * LOG2_E):
                _TRACE["softmax"] = FrameSoftmax.create_for(
                    softmax_scale * LOG2E, num_rows, kernel.keeps, kernel.exact_output, kernel.entropy
                )
                return _TRACE["softmax"]

        _TRACE.clear()
        arguments = inspect.signature(super().mma).bind(*args, **kwargs).arguments
        _TRACE["outputs"] = tuple(arguments["aux_data"].tensors)
        try:
            with _swapped(flash_fwd_sm90, "Softmax", Factory):
                return super().mma(*args, **kwargs)
        finally:
            _TRACE.clear()

    def first_half_block_overlap(self, *args, **kwargs):
        # A work tile's first key tile: the hook that follows records the work tile's rows. (The
        # tracer may trace a loop's body more than once; each pass records its own.)
        _TRACE["first"] = True
        return super().first_half_block_overlap(*args, **kwargs)

    @cute.jit
    def apply_score_mod(
        self,
        thr_mma_qk,
        batch_idx,
        head_idx,
        m_block,
        acc_S,
        n_block,
        softmax_scale,
        seqlen,
        aux_data=None,
        fastdiv_mods=None,
    ):
        # No score changes: record the tile and, at a work tile's first key tile, the work tile
        # (and open its top frame). No branch here: see the module's docstring.
        if const_expr(_TRACE.pop("first", False)):
            identity = cute.make_identity_tensor((self.tile_m, self.tile_n))
            coords = layout_utils.reshape_acc_to_mn(thr_mma_qk.partition_C(identity))
            coords0 = layout_utils.reshape_acc_to_mn(thr_mma_qk.get_slice(0).partition_C(identity))
            _TRACE["cols0"] = [coords0[0, c][1] for c in range(cute.size(coords.shape[1]))]
            record = (
                batch_idx,
                head_idx,
                seqlen.seqlen_q,
                seqlen.seqlen_k,
                (batch_idx % self.parts) * seqlen.seqlen_k,
                coords[0, 0][1],
                *(m_block * self.tile_m + coords[r, 0][0] for r in range(cute.size(coords.shape[0]))),
            )
            softmax = _TRACE["softmax"]
            for i, value in enumerate(record):
                softmax.where[i] = value
            if const_expr(softmax.keeps == "frames"):
                softmax.open_at_top()
        _TRACE["n_block"] = n_block
