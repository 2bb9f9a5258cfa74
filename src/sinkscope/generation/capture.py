"""Per-call attention statistics of chosen layers while a video is generated.

``FrameStatsCapture`` hooks the self-attention of the chosen layers: every call hands
it the q, k and v that the softmax sees and the call's ``AttentionLayout`` (which
absolute frame each key segment was generated at, how many of its tokens are present,
at which RoPE shift; rows carry the shift relative to the queries',
``relative_position_shift``). By default (``capture.attention: exact``) the layer's
output is the model's own call, the function and arguments the uncaptured call runs
(``sinkscope.attention.split.cached_attention`` under the model's ``kernels``), so a
captured video is the uncaptured one bit for bit on every device and dtype; the
statistics come after it from q and k (``sinkscope.stats.attention_statistics``: frame
statistics, token entropy, argmax shares; key-token profiles for the chosen calls; on
CUDA given the log-sum-exp the attention call returned), and nothing token x token is
kept. ``fused_attention`` (``capture.attention: fused``) computes output and statistics
in one Triton pass where it can (CUDA, fp16 / bf16), the output within bf16 rounding:
``video_exact`` then says whether any call took it. ``capture.attention: frames`` attends
each key frame apart in one call and merges the frames by their log-sum-exps
(``sinkscope.stats.segments``), the output within one bf16 rounding: logit_mean and
prob_mass with no pass over the scores. ``capture.statistics`` names the frame statistics
the rows get; the others are NaN. Results stay on the device until the
generation ends, so capturing costs no host synchronization per call; or, given a
``handoff`` (the extraction job's ``sinkscope.pipeline.writing.ExtractionWriter``), each
call's record goes to it at once and is written while the generation goes on. A Rolling
Forcing window call (``CallInfo.parts``) gives one record per block of the window. A call
that an edit changes (``generation.interventions``: the observer gets a ``frame_bias``)
runs ``sinkscope.attention.biased.edited_attention``, the output the uncaptured edited call
gives, and its rows are the statistics of that edited softmax (masked frames get exactly 0
mass); it never takes the fused route.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd
import torch

from sinkscope.attention.biased import edited_attention
from sinkscope.attention.split import cached_attention
from sinkscope.generation.common import PASS_CACHE, PASS_DENOISE, PASS_RECACHE, PASS_RECOMPUTE, CallInfo
from sinkscope.model import WanModel
from sinkscope.model.layout import AttentionLayout
from sinkscope.stats.attention import (
    FRAME_STATISTICS,
    FRAMES_ROUTE_STATISTICS,
    CallStatistics,
    attention_statistics,
    attention_with_statistics,
    check_statistics,
    fused_route_applies,
)
from sinkscope.stats.flash4_partials import flash4_attention_partials, one_pass_applies, statistics_from_partials
from sinkscope.stats.segments import frame_attention, keep_statistics, statistics_from_frames
from sinkscope.tokens import encode_token_tensors

TOKEN_PROFILE_CHOICES = ("none", "last_block", "all")
# capture.attention: which computation gives a captured layer its output (the module docstring).
ATTENTION_ROUTES = ("exact", "fused", "frames")
# The CallStatistics fields of every call, as the rows take them.
FRAME_STAT_NAMES = FRAME_STATISTICS
# The row tables a capture gives (``KIND_COLUMNS`` has their columns).
ROW_KINDS = ("frames", "queries", "tokens")


@dataclass
class CallRecord:
    """One captured call of one layer: what it was, its key layout, its statistics (on
    the device that computed them)."""

    layer: int
    call: CallInfo
    layout: AttentionLayout
    stats: CallStatistics


def record_tensors(record: CallRecord, frame_seq_length: int, *, tokens: bool = True) -> dict[str, torch.Tensor]:
    """A record's statistics as its rows store them, on the device that computed them:
    the frame statistics as they are and, for a call with token profiles (unless
    ``tokens`` is False), the token values in their stored form, a row per head and key
    frame ([heads x key frames, ``frame_seq_length``], NaN where the call lacked a token;
    ``sinkscope.tokens.encode_token_tensors``). Only device work is queued: no host
    synchronization, so the generation goes on while the host waits for the copy."""
    stats = record.stats
    tensors = {name: getattr(stats, name) for name in FRAME_STAT_NAMES}
    if tokens and stats.token_prob_mean is not None:
        if min(record.layout.key_lengths) < 1:
            raise ValueError(f"layer {record.layer}: a key frame without tokens in {record.layout}")
        dense = (
            _dense_tokens(values, record.layout, frame_seq_length)
            for values in (stats.token_logit_mean, stats.token_prob_mean)
        )
        tensors.update(encode_token_tensors(*dense))
    return tensors


def _dense_tokens(values: torch.Tensor, layout: AttentionLayout, frame_seq_length: int) -> torch.Tensor:
    """[heads, keys] per-key values as [heads x key frames, frame_seq_length], each key at
    its token's place within its frame, NaN where the call lacked a token."""
    heads = values.shape[0]
    num_frames = len(layout.key_lengths)
    if layout.key_token_index is None and all(n == frame_seq_length for n in layout.key_lengths):
        return values.reshape(heads * num_frames, frame_seq_length)
    lengths = np.asarray(layout.key_lengths)
    if layout.key_token_index is not None:
        tokens = np.asarray(layout.key_token_index, np.int64)
    else:
        tokens = np.arange(layout.num_keys) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    places = torch.from_numpy(np.repeat(np.arange(num_frames), lengths) * frame_seq_length + tokens)
    if values.is_cuda:  # a non-blocking copy from pinned memory: no wait for the queued work
        places = places.pin_memory().to(values.device, non_blocking=True)
    dense = values.new_full((heads, num_frames * frame_seq_length), float("nan"))
    dense.index_copy_(1, places, values)
    return dense.view(heads * num_frames, frame_seq_length)


class FrameStatsCapture:
    """Context manager: attach to ``layers`` of ``model``, collect one record per call.

    ``token_profiles``: which calls also get key-token profiles: ``none``, ``last_block``
    (every call of the last block: Deep Forcing's Figure 4 at token resolution) or ``all``.
    ``handoff``: called with each call's :class:`CallRecord` as it is made, instead of
    keeping it (``layer_tables`` then has nothing to give). ``attention``: the route of
    ``capture.attention`` (``ATTENTION_ROUTES``; ``fused_attention=True`` is ``fused``);
    ``statistics``: the frame statistics the rows get (``capture.statistics``), the others NaN.
    """

    def __init__(
        self,
        model: WanModel,
        layers: Sequence[int],
        *,
        frame_seq_length: int,
        backend: str = "auto",
        token_profiles: str = "last_block",
        handoff: Callable[[CallRecord], None] | None = None,
        fused_attention: bool = False,
        attention: str = "exact",
        statistics: Sequence[str] = FRAME_STATISTICS,
    ) -> None:
        num_layers = model.config.num_layers
        bad = [layer for layer in layers if not 0 <= layer < num_layers]
        if bad:
            raise ValueError(f"layers {bad} do not exist; the model has layers 0..{num_layers - 1}")
        if token_profiles not in TOKEN_PROFILE_CHOICES:
            raise ValueError(f"token_profiles {token_profiles!r} is not one of {', '.join(TOKEN_PROFILE_CHOICES)}")
        if attention not in ATTENTION_ROUTES:
            raise ValueError(f"attention {attention!r} is not one of {', '.join(ATTENTION_ROUTES)}")
        if fused_attention:
            attention = "fused"
        check_statistics(statistics)
        if attention == "frames" and not set(statistics) <= set(FRAMES_ROUTE_STATISTICS):
            raise ValueError(
                f"the frames route gives {' and '.join(FRAMES_ROUTE_STATISTICS)} only, not {sorted(statistics)}"
            )
        self.model = model
        self.layers = sorted(set(int(layer) for layer in layers))
        self.frame_seq_length = frame_seq_length
        self.backend = backend
        self.attention = attention
        self.fused_attention = attention == "fused"
        self.statistics = tuple(statistics)
        self.token_profiles = token_profiles
        self.records: list[CallRecord] = []
        self.handoff = handoff
        self._call: CallInfo | None = None
        # Calls whose output came from the fused kernel or the frames route, not the model's own call.
        self.fused_calls = 0
        self.frame_calls = 0
        # Calls (exact or fused) whose statistics came from the attention call's own pass (FlashAttention-4).
        self.one_pass_calls = 0

    @property
    def video_exact(self) -> bool:
        """Whether every captured call's output was the model's own, bit for bit (so the video
        is the uncaptured one): False once a call took the fused or the frames route."""
        return self.fused_calls == 0 and self.frame_calls == 0

    def __enter__(self) -> FrameStatsCapture:
        for layer in self.layers:
            self.model.set_observer(layer, self._observer(layer))
        return self

    def __exit__(self, *exc: object) -> None:
        for layer in self.layers:
            self.model.set_observer(layer, None)

    def begin_call(self, info: CallInfo) -> None:
        self._call = info

    def _wants_tokens(self, call: CallInfo) -> bool:
        return self.token_profiles == "all" or (self.token_profiles == "last_block" and call.is_last_block)

    def _observer(self, layer: int):
        def observe(
            q: torch.Tensor,
            k: torch.Tensor,
            v: torch.Tensor,
            layout: AttentionLayout,
            frame_bias: torch.Tensor | None = None,
        ) -> torch.Tensor:
            call = self._call
            if call is None:
                raise RuntimeError("a captured attention call ran outside a generation")
            if q.shape[0] != 1:
                raise ValueError(f"capture expects batch size 1, got {q.shape[0]}")
            queries, keys, values = (x[0].transpose(0, 1) for x in (q, k, v))
            kernels = self.model.kernels
            frames = self.attention == "frames"
            # Where the attention call's own pass gives every statistic (FlashAttention-4 on
            # Hopper), the exact route and `fused` both take it: it is faster than the Triton
            # kernel and leaves the output the model's call's.
            one_pass = (
                frame_bias is None
                and not frames
                and one_pass_applies(
                    queries, keys, values, layout.key_lengths, self.statistics, kernels.attention_kernel, self.backend
                )
            )
            fused = (
                self.fused_attention
                and not one_pass
                and fused_route_applies(queries, keys, values, layout.key_lengths, self.backend)
            )
            out, lse, frame_lse, partials = None, None, None, None
            edited = {}
            if frame_bias is not None:
                # An edited call (sinkscope.model.generation_edits): the attention the model really uses,
                # and the statistics of that edited softmax; never the fused or frames route.
                fused, frames, edited = False, False, {"frame_bias": frame_bias}
                out, lse = edited_attention(q, k, v, frame_bias, layout.key_lengths, **kernels.attention_call)
            elif fused:
                self.fused_calls += 1
                outs = []
            elif frames:
                # Each key frame attended apart, merged: the frames' log-sum-exps give prob_mass.
                self.frame_calls += 1
                merged, frame_lse, total_lse = frame_attention(
                    queries, keys, values, layout.key_lengths, kernel=kernels.attention_kernel
                )
                out = merged[None]
            elif one_pass:
                # The model's own call (FlashAttention-4's, bit for bit) and every key frame's
                # partials in the same pass.
                self.one_pass_calls += 1
                out, partials = flash4_attention_partials(
                    queries,
                    keys,
                    values,
                    layout.key_lengths,
                    queries.shape[-1] ** -0.5,
                    split=kernels.key_split,
                    entropy="entropy" in self.statistics,
                )
                out = out[None]
            else:
                # The model's own call, as the uncaptured layer runs it: the output does not
                # depend on whether (or how) the statistics are computed.
                out, lse = cached_attention(q, k, v, **kernels.attention_call)
            # A Rolling Forcing window call is one table call per block: each block's
            # queries get their own statistics (each query's softmax is its own, so this
            # is exact) and token profiles averaged over that block's queries only.
            for part in call.table_calls:
                first = part.start_frame - call.start_frame
                rows = slice(first * self.frame_seq_length, (first + part.num_frames) * self.frame_seq_length)
                part_layout = layout
                if part is not call:
                    part_layout = dataclasses.replace(
                        layout, query_frames=tuple(range(part.start_frame, part.start_frame + part.num_frames))
                    )
                statistics_args = dict(
                    frame_seq_length=self.frame_seq_length,
                    query_frames=part_layout.query_frames,
                    key_frames=layout.key_frames,
                    key_lengths=layout.key_lengths,
                    token_profiles=self._wants_tokens(part),
                    backend=self.backend,
                    key_position_shift=layout.key_position_shift,
                    statistics=self.statistics,
                    **edited,
                )
                if frames:
                    stats = statistics_from_frames(
                        queries[:, rows],
                        keys,
                        frame_lse[:, :, rows],
                        total_lse[:, rows],
                        self.frame_seq_length,
                        len(part_layout.query_frames),
                        layout.key_lengths,
                        queries.shape[-1] ** -0.5,
                        statistics=self.statistics,
                        token_profiles=self._wants_tokens(part),
                    )
                elif fused:
                    part_out, stats = attention_with_statistics(
                        queries[:, rows],
                        keys,
                        values,
                        fused=True,
                        key_split=kernels.key_split,
                        attention_kernel=kernels.attention_kernel,
                        **statistics_args,
                    )
                    outs.append(part_out)
                elif partials is not None:
                    stats = statistics_from_partials(
                        queries[:, rows],
                        keys,
                        tuple(x[:, rows] for x in partials),
                        self.frame_seq_length,
                        len(part_layout.query_frames),
                        layout.key_lengths,
                        queries.shape[-1] ** -0.5,
                        token_profiles=self._wants_tokens(part),
                    )
                    stats = keep_statistics(stats, self.statistics)
                else:
                    stats = attention_statistics(
                        queries[:, rows], keys, lse=None if lse is None else lse[0, :, rows], **statistics_args
                    )
                record = CallRecord(layer, part, part_layout, stats)
                if self.handoff is not None:
                    self.handoff(record)
                else:
                    self.records.append(record)
            if fused:
                out = (outs[0] if len(outs) == 1 else torch.cat(outs, dim=0))[None]
            return out

        return observe

    # -- rows ------------------------------------------------------------------------------------

    def _host(self, *, tokens: bool = True) -> list[dict[str, np.ndarray]]:
        """Every record's tensors on the host (token values only if ``tokens``), with one
        device-to-host copy in all."""
        pieces, shapes = [], []
        for record in self.records:
            present = record_tensors(record, self.frame_seq_length, tokens=tokens)
            shapes.append({name: tuple(t.shape) for name, t in present.items()})
            pieces += [t.float().flatten() for t in present.values()]
        flat = torch.cat(pieces).cpu().numpy() if pieces else np.empty(0, np.float32)
        out, offset = [], 0
        for shape in shapes:
            arrays = {}
            for name, dims in shape.items():
                size = int(np.prod(dims))
                arrays[name] = flat[offset : offset + size].reshape(dims)
                offset += size
            out.append(arrays)
        return out

    def layer_tables(self, kinds: Sequence[str] = ROW_KINDS) -> dict[int, dict[str, pd.DataFrame | None]]:
        """Per layer, the tables of ``kinds`` (by default all): ``frames`` (frame_attention
        rows), ``queries`` (query_stats rows) and ``tokens`` (token_profiles rows, or None
        without token capture), without the checkpoint / variant / prompt / seed columns.
        Only what ``kinds`` needs leaves the device."""
        unknown = sorted(set(kinds) - set(ROW_KINDS))
        if unknown:
            raise ValueError(f"row kinds {unknown} are not among {', '.join(ROW_KINDS)}")
        host = self._host(tokens="tokens" in kinds)
        by_layer: dict[int, dict[str, list]] = {layer: {kind: [] for kind in kinds} for layer in self.layers}
        for record, arrays in zip(self.records, host):
            parts = by_layer[record.layer]
            for kind, rows in record_rows(record, arrays, kinds).items():
                if rows is not None:
                    parts[kind].append(rows)
        return {
            layer: {
                kind: _concat(rows, KIND_COLUMNS[kind]) if rows or kind != "tokens" else None
                for kind, rows in parts.items()
            }
            for layer, parts in by_layer.items()
        }

    def to_frame(self) -> pd.DataFrame:
        """frame_attention rows of every captured layer (without the run columns); only the
        frame statistics are copied to the host."""
        tables = self.layer_tables(kinds=("frames",))
        return pd.concat([tables[layer]["frames"] for layer in self.layers], ignore_index=True)


_CALL_COLUMNS = ("layer", "head", "block", "pass", "step", "timestep", "prompt_segment")
FRAME_COLUMNS = (
    *_CALL_COLUMNS,
    "query_frame",
    "key_frame",
    "logit_mean",
    "prob_mass",
    "argmax_share",
    "key_tokens",
    "key_position_shift",
)
QUERY_COLUMNS = (*_CALL_COLUMNS, "query_frame", "entropy_tokens", "num_keys", "num_key_frames")
TOKEN_COLUMNS = (
    *_CALL_COLUMNS,
    "key_frame",
    "key_tokens",
    "key_position_shift",
    "frame_logit_mean",
    "frame_prob_mass",
    "token_logit_centered",
    "token_prob_ratio",
)
KIND_COLUMNS = {"frames": FRAME_COLUMNS, "queries": QUERY_COLUMNS, "tokens": TOKEN_COLUMNS}


# The re-cache pass at a prompt switch is captured like the others: its queries are the
# recomputed frames, its keys everything the cache holds; so is Krea's recompute pass
# (its queries and keys the context frames). New names go last: codes stay stable.
PASSES = (PASS_DENOISE, PASS_CACHE, PASS_RECACHE, PASS_RECOMPUTE)


def _call_columns(record: CallRecord, n: int) -> dict[str, np.ndarray]:
    """The columns one call's ``n`` rows share (all but the layout's index columns)."""
    call = record.call
    return {
        "layer": np.full(n, record.layer, np.int16),
        "block": np.full(n, call.block, np.int16),
        # Category codes, not millions of Python strings (token tables reach 2M rows a layer).
        "pass": np.full(n, PASSES.index(call.pass_), np.int8),
        "step": np.full(n, call.step, np.int16),
        "timestep": np.full(n, call.timestep, np.float32),
        "prompt_segment": np.full(n, call.segment, np.int16),
    }


def record_rows(
    record: CallRecord, arrays: dict[str, np.ndarray], kinds: Sequence[str] = ROW_KINDS
) -> dict[str, dict[str, np.ndarray] | None]:
    """One record's rows by kind (of ``kinds``: ``frames``, ``queries``, ``tokens``: None
    without token profiles), column -> array (``pass`` as codes into ``PASSES``; token
    lists 2-D), from its statistics on the host (``arrays``: ``record_tensors`` by name)."""
    return {
        kind: _ROW_BUILDERS[kind](record, arrays) if kind != "tokens" or "token_prob_ratio" in arrays else None
        for kind in kinds
    }


def concat_rows(parts: list[dict[str, np.ndarray]], columns: Sequence[str]) -> dict[str, np.ndarray]:
    """Several records' rows of one kind as one column -> array mapping (``pass`` still codes)."""
    return {name: np.concatenate([part[name] for part in parts]) for name in columns}


def _frame_rows(record: CallRecord, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    index = _frame_index_columns(record.layout, *arrays["logit_mean"].shape)
    return {
        **_call_columns(record, index["head"].size),
        **index,
        "logit_mean": arrays["logit_mean"].ravel(),
        "prob_mass": arrays["prob_mass"].ravel(),
        "argmax_share": arrays["argmax_share"].ravel(),
    }


def _query_rows(record: CallRecord, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    index = _query_index_columns(record.layout, *arrays["entropy"].shape)
    return {**_call_columns(record, index["head"].size), **index, "entropy_tokens": arrays["entropy"].ravel()}


def _read_only(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for values in columns.values():
        values.flags.writeable = False
    return columns


# The row columns that a call's layout and shape decide alone are built once per layout
# (a block's layout repeats over every layer, step and pass) and shared, read-only.
@lru_cache(maxsize=1024)
def _frame_index_columns(layout: AttentionLayout, heads: int, nq: int, nk: int) -> dict[str, np.ndarray]:
    h, q, k = (g.ravel() for g in np.meshgrid(np.arange(heads), np.arange(nq), np.arange(nk), indexing="ij"))
    return _read_only(
        {
            "head": h.astype(np.int16),
            "query_frame": np.asarray(layout.query_frames, np.int16)[q],
            "key_frame": np.asarray(layout.key_frames, np.int16)[k],
            "key_tokens": np.asarray(layout.key_lengths, np.int32)[k],
            # Relative to the queries' own shift: what RoPE lets attention see.
            "key_position_shift": np.asarray(layout.relative_position_shift, np.int32)[k],
        }
    )


@lru_cache(maxsize=1024)
def _query_index_columns(layout: AttentionLayout, heads: int, nq: int) -> dict[str, np.ndarray]:
    h, q = (g.ravel() for g in np.meshgrid(np.arange(heads), np.arange(nq), indexing="ij"))
    return _read_only(
        {
            "head": h.astype(np.int16),
            "query_frame": np.asarray(layout.query_frames, np.int16)[q],
            "num_keys": np.full(h.size, layout.num_keys, np.int32),
            "num_key_frames": np.full(h.size, len(layout.key_frames), np.int16),
        }
    )


@lru_cache(maxsize=1024)
def _token_index_columns(layout: AttentionLayout, heads: int) -> dict[str, np.ndarray]:
    num_frames = len(layout.key_lengths)
    f = np.tile(np.arange(num_frames), heads)
    return _read_only(
        {
            "head": np.repeat(np.arange(heads), num_frames).astype(np.int16),
            "key_frame": np.asarray(layout.key_frames, np.int16)[f],
            "key_tokens": np.asarray(layout.key_lengths, np.int32)[f],
            "key_position_shift": np.asarray(layout.relative_position_shift, np.int32)[f],
        }
    )


def _token_rows(record: CallRecord, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One row per head and key frame in the stored form (``record_tensors``)."""
    index = _token_index_columns(record.layout, arrays["entropy"].shape[0])
    return {
        **_call_columns(record, index["head"].size),
        **index,
        **{
            name: arrays[name]
            for name in ("frame_logit_mean", "frame_prob_mass", "token_logit_centered", "token_prob_ratio")
        },
    }


_ROW_BUILDERS = {"frames": _frame_rows, "queries": _query_rows, "tokens": _token_rows}


def _concat(parts: list[dict[str, np.ndarray]], columns: Sequence[str]) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame(columns=list(columns))
    data = concat_rows(parts, columns)
    data["pass"] = pd.Categorical.from_codes(data["pass"], categories=list(PASSES))
    # Token lists as one array per row (tables.to_arrow stacks them back into one buffer).
    return pd.DataFrame({name: list(values) if values.ndim == 2 else values for name, values in data.items()})
