"""Parquet tables: schemas, column definitions, provenance, integrity-checked I/O.

Every file is written atomically, with page checksums, a sha256 of every column's
content, the definitions of its columns and the provenance under ``sinkscope.*``
metadata keys. Every read verifies the checksums; a full read also verifies the
content digests, so a damaged file fails naming itself instead of flowing on.

The tables (DESIGN.md; the derived ones are computed in ``sinkscope.stats.summaries``):

- ``frame_attention``: one row per call x head x query frame x key frame.
- ``query_stats``: one row per call x head x query frame (token-level entropy).
- ``token_profiles``: one row per chosen call x head x key frame: the frame's exact mean
  logit and softmax mass (float32) and its token values relative to them, at float16's
  precision, as two lists of ``frame_seq_length`` values (NaN where a token is absent);
  ``sinkscope.tokens.token_rows`` decodes them into one row per key token
  (``tokens.decode_token_values``: the float32 values, whose frame mean and sum equal the
  stored frame values).
- ``head_stats`` / ``layer_stats``: the last block's Figure 4 view, summarized.
- ``block_stats``: per block and call, where the mass goes (over-time view).
- ``head_diagnostics``: per head, entropies, sink mass, sign rate, periodicity, class.
- ``variant_effects`` / ``variant_head_effects``: each variant against the untouched
  ``default`` run of the same checkpoint, prompt and seed, per latent frame and per head
  (computed in ``sinkscope.pipeline.effects``).
- ``head_atlas`` / ``frame_atlas`` / ``pruning_curve``: the sweeps' runs against the
  untouched run, per swept head, cached frame and head count (``sinkscope.pipeline.atlas``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sinkscope.digests import ContentDigests, column_digests, column_digests_v1
from sinkscope.errors import DamagedFileError
from sinkscope.io import _UMASK, atomic_path

METRICS = ("logit_mean", "prob_mass")
META_PREFIX = "sinkscope."
DEFAULT_VARIANT = "default"
# Rows of head_stats / layer_stats that summarize the run-averaged curve.
ALL_PROMPTS, ALL_SEEDS = "*", -1

RUN_KEYS = ["checkpoint", "variant", "prompt_id", "seed"]
_RUN_FIELDS = [("checkpoint", pa.string()), ("variant", pa.string()), ("prompt_id", pa.string()), ("seed", pa.int64())]
_CALL_FIELDS = [
    ("block", pa.int16()),
    ("pass", pa.string()),
    ("step", pa.int16()),
    ("timestep", pa.float32()),
    ("prompt_segment", pa.int16()),
]

FRAME_ATTENTION_SCHEMA = pa.schema(
    _RUN_FIELDS
    + [("layer", pa.int16()), ("head", pa.int16())]
    + _CALL_FIELDS
    + [
        ("query_frame", pa.int16()),
        ("key_frame", pa.int16()),
        ("logit_mean", pa.float32()),
        ("prob_mass", pa.float32()),
        ("argmax_share", pa.float32()),
        ("key_tokens", pa.int32()),
        ("key_position_shift", pa.int32()),
    ]
)
QUERY_STATS_SCHEMA = pa.schema(
    _RUN_FIELDS
    + [("layer", pa.int16()), ("head", pa.int16())]
    + _CALL_FIELDS
    + [
        ("query_frame", pa.int16()),
        ("entropy_tokens", pa.float32()),
        ("num_keys", pa.int32()),
        ("num_key_frames", pa.int16()),
    ]
)
TOKEN_PROFILES_SCHEMA = pa.schema(
    _RUN_FIELDS
    + [("layer", pa.int16()), ("head", pa.int16())]
    + _CALL_FIELDS
    + [
        ("key_frame", pa.int16()),
        ("key_tokens", pa.int32()),
        ("key_position_shift", pa.int32()),
        ("frame_logit_mean", pa.float32()),
        ("frame_prob_mass", pa.float32()),
        # float16 precision (11 significant bits) held in float32: byte-stream-split
        # compresses the zero low bytes away, and every Parquet reader (DuckDB too, which
        # cannot read split float16) reads them.
        ("token_logit_centered", pa.list_(pa.float32())),
        ("token_prob_ratio", pa.list_(pa.float32())),
    ]
)
# token_profiles as sinkscope wrote it before the compact layout (full float32 token values):
# still read (``token_values`` tells the two apart by their columns).
TOKEN_PROFILES_SCHEMA_V1 = pa.schema(
    _RUN_FIELDS
    + [("layer", pa.int16()), ("head", pa.int16())]
    + _CALL_FIELDS
    + [
        ("key_frame", pa.int16()),
        ("key_tokens", pa.int32()),
        ("key_position_shift", pa.int32()),
        ("token_logit_mean", pa.list_(pa.float32())),
        ("token_prob_mean", pa.list_(pa.float32())),
    ]
)
# The stored token columns of each layout: (logit, prob) lists.
_SUMMARY_CALL = [
    ("pass", pa.string()),
    ("step", pa.int16()),
    ("timestep", pa.float32()),
    ("metric", pa.string()),
    ("runs", pa.int16()),
]
_CURVE_FIELDS = [
    ("query_frames", pa.string()),
    ("num_key_frames", pa.int16()),
    ("first_frame", pa.int16()),
    ("last_frame", pa.int16()),
    ("first", pa.float64()),
    ("middle", pa.float64()),
    ("last", pa.float64()),
    ("own", pa.float64()),
    ("sink_score", pa.float64()),
    ("argmax_frame", pa.int16()),
    ("first_middle_ratio", pa.float64()),
    ("spread_pct", pa.float64()),
    ("frame0_mass", pa.float64()),
    ("frame0_uniform", pa.float64()),
    ("frame0_excess", pa.float64()),
    ("first_k_mass", pa.float64()),
    ("cache_share", pa.float64()),
    ("own_share", pa.float64()),
]
# The statistics whose between-run standard deviation the run-averaged rows carry, as
# <stat>_run_std (null in per-run rows and with one run).
HEAD_RUN_STD = (
    "first",
    "middle",
    "last",
    "own",
    "sink_score",
    "first_middle_ratio",
    "spread_pct",
    "frame0_mass",
    "frame0_excess",
    "first_k_mass",
    "cache_share",
    "own_share",
)
LAYER_RUN_STD = (*HEAD_RUN_STD, "diagonal_mean", "first_column_mean")
DIAGNOSTICS_RUN_STD = (
    "entropy_frames",
    "entropy_tokens",
    "frame0_mass",
    "frame0_excess",
    "frame0_argmax_share",
    "recent_mass",
    "frame0_ratio",
    "recent_ratio",
)
RUN_STD_SUFFIX = "_run_std"


def run_std_fields(names: Sequence[str]) -> list[tuple[str, pa.DataType]]:
    return [(name + RUN_STD_SUFFIX, pa.float64()) for name in names]


HEAD_STATS_SCHEMA = pa.schema(
    _RUN_FIELDS
    + [("layer", pa.int16()), ("head", pa.int16())]
    + _SUMMARY_CALL
    + _CURVE_FIELDS
    + run_std_fields(HEAD_RUN_STD)
)
LAYER_STATS_SCHEMA = pa.schema(
    _RUN_FIELDS
    + [("layer", pa.int16())]
    + _SUMMARY_CALL
    + _CURVE_FIELDS
    + [("diagonal_mean", pa.float64()), ("first_column_mean", pa.float64())]
    + run_std_fields(LAYER_RUN_STD)
)
BLOCK_STATS_SCHEMA = pa.schema(
    _RUN_FIELDS
    + [("layer", pa.int16()), ("head", pa.int16())]
    + _CALL_FIELDS
    + [
        ("query_frames", pa.string()),
        ("sink_frames", pa.string()),
        ("sink_mass", pa.float64()),
        ("sink_uniform", pa.float64()),
        ("sink_excess", pa.float64()),
        ("self_mass", pa.float64()),
        ("other_mass", pa.float64()),
        ("argmax_frame", pa.int16()),
        ("argmax_age", pa.int16()),
        ("entropy", pa.float64()),
        ("num_key_frames", pa.int16()),
        ("latent_sink_cosine", pa.float64()),
        ("latent_previous_cosine", pa.float64()),
        ("rope_periods", pa.string()),
    ]
)
HEAD_DIAGNOSTICS_SCHEMA = pa.schema(
    [
        ("checkpoint", pa.string()),
        ("variant", pa.string()),
        ("layer", pa.int16()),
        ("head", pa.int16()),
        ("pass", pa.string()),
        ("step", pa.int16()),
        ("timestep", pa.float32()),
        ("runs", pa.int16()),
    ]
    + [
        ("entropy_frames", pa.float64()),
        ("entropy_tokens", pa.float64()),
        ("frame0_mass", pa.float64()),
        ("frame0_uniform", pa.float64()),
        ("frame0_excess", pa.float64()),
        ("frame0_ratio", pa.float64()),
        ("frame0_argmax_share", pa.float64()),
        ("recent_mass", pa.float64()),
        ("recent_uniform", pa.float64()),
        ("recent_ratio", pa.float64()),
        ("sign_rate", pa.float64()),
        ("period", pa.float64()),
        ("period_power", pa.float64()),
        ("head_class", pa.string()),
        ("borderline", pa.bool_()),
        ("pyramid_label", pa.int8()),
    ]
    + run_std_fields(DIAGNOSTICS_RUN_STD)
)

# The paired effects of a variant against the untouched (default) run of the same
# checkpoint, prompt and seed (sinkscope.pipeline.effects).
EFFECTS_RUN_STD = (
    "latent_rel_distance",
    "latent_cosine",
    "flicker",
    "first_frame_similarity",
    "first_frame_similarity_default",
)
HEAD_EFFECTS_RUN_STD = (
    "frame0_mass",
    "frame0_mass_default",
    "frame0_mass_change",
    "entropy_tokens",
    "entropy_tokens_default",
    "entropy_tokens_change",
)
VARIANT_EFFECTS_SCHEMA = pa.schema(
    _RUN_FIELDS
    + [("latent_frame", pa.int16()), ("block", pa.int16()), ("runs", pa.int16())]
    + [(name, pa.float64()) for name in EFFECTS_RUN_STD]
    + run_std_fields(EFFECTS_RUN_STD)
)
VARIANT_HEAD_EFFECTS_SCHEMA = pa.schema(
    _RUN_FIELDS
    + [("layer", pa.int16()), ("head", pa.int16()), ("runs", pa.int16()), ("calls", pa.int32()), ("edited", pa.bool_())]
    + [(name, pa.float64()) for name in HEAD_EFFECTS_RUN_STD]
    + run_std_fields(HEAD_EFFECTS_RUN_STD)
)

# The atlases of the sweeps (sinkscope.sweeps): what each swept head, layer, cached frame
# and head count does to the video against the untouched run (sinkscope.pipeline.atlas).
ATLAS_DRIFTS = ("drift_last_block", "drift_after_block0")
HEAD_ATLAS_RUN_STD = (*ATLAS_DRIFTS, "frame0_mass_default")
FRAME_ATLAS_RUN_STD = (*ATLAS_DRIFTS, "drift_after_frame", "frame_mass_default")
PRUNING_CURVE_RUN_STD = ATLAS_DRIFTS
_SWEEP_FIELDS = [
    ("checkpoint", pa.string()),
    ("sweep", pa.string()),
    ("variant", pa.string()),
    ("prompt_id", pa.string()),
    ("seed", pa.int64()),
]
HEAD_ATLAS_SCHEMA = pa.schema(
    _SWEEP_FIELDS
    + [("layer", pa.int16()), ("head", pa.int16()), ("runs", pa.int16()), ("head_class", pa.string())]
    + [(name, pa.float64()) for name in HEAD_ATLAS_RUN_STD]
    + run_std_fields(HEAD_ATLAS_RUN_STD)
)
FRAME_ATLAS_SCHEMA = pa.schema(
    _SWEEP_FIELDS
    + [("key_frame", pa.int16()), ("block", pa.int16()), ("sink", pa.bool_()), ("runs", pa.int16())]
    + [(name, pa.float64()) for name in FRAME_ATLAS_RUN_STD]
    + run_std_fields(FRAME_ATLAS_RUN_STD)
)
PRUNING_CURVE_SCHEMA = pa.schema(
    _SWEEP_FIELDS
    + [("order", pa.string()), ("head_count", pa.int16()), ("runs", pa.int16())]
    + [(name, pa.float64()) for name in PRUNING_CURVE_RUN_STD]
    + run_std_fields(PRUNING_CURVE_RUN_STD)
)

SCHEMAS = {
    "frame_attention": FRAME_ATTENTION_SCHEMA,
    "query_stats": QUERY_STATS_SCHEMA,
    "token_profiles": TOKEN_PROFILES_SCHEMA,
    "head_stats": HEAD_STATS_SCHEMA,
    "layer_stats": LAYER_STATS_SCHEMA,
    "block_stats": BLOCK_STATS_SCHEMA,
    "head_diagnostics": HEAD_DIAGNOSTICS_SCHEMA,
    "variant_effects": VARIANT_EFFECTS_SCHEMA,
    "variant_head_effects": VARIANT_HEAD_EFFECTS_SCHEMA,
    "head_atlas": HEAD_ATLAS_SCHEMA,
    "frame_atlas": FRAME_ATLAS_SCHEMA,
    "pruning_curve": PRUNING_CURVE_SCHEMA,
}

# What every column means; written into each file's metadata and into README.md.
COLUMN_DOCS: dict[str, str] = {
    "checkpoint": "the config's name for the checkpoint (or imported cache)",
    "variant": "the study's generation variant (variants:), 'default' when the config names none",
    "prompt_id": "the config's id for the prompt; '*' in rows that summarize the run-averaged curve",
    "seed": "noise seed; -1 in rows that summarize the run-averaged curve",
    "layer": "0-based transformer layer (paper notation L = layer + 1)",
    "head": "0-based head (paper notation H = head + 1); head_atlas: -1 for a run that edits every head of the "
    "layer (heads: each:layer)",
    "block": "generation block index",
    "pass": "'denoise' (a denoising step), 'cache' (the pass that writes the finished block's keys) or 'recache' (at a "
    "prompt switch, the kept frames recomputed under the new prompt before the block) or 'recompute' (Krea's "
    "call that rebuilds the cleared cache from the context frames before the block)",
    "step": "denoising step index; the cache pass has step = the block's number of steps; the re-cache pass 0; -1 for "
    "imported calls; the recompute pass 0",
    "timestep": "the model timestep of the call",
    "prompt_segment": "index of the prompt segment whose text the call is conditioned on (0 for a single prompt; the "
    "re-cache pass carries the new segment)",
    "query_frame": "absolute latent frame of the query tokens",
    "key_frame": "absolute latent frame the key tokens were generated at (whatever the cache did with them); "
    "frame_atlas: the frame whose cached keys the run edits",
    "logit_mean": "mean over token pairs of q.k/sqrt(d), pre-softmax (the Deep Forcing Figure 4 y axis)",
    "prob_mass": "mean over the query frame's tokens of the softmax mass on the key frame's tokens present; sums to 1 "
    "over key frames",
    "argmax_share": "share of the query frame's tokens whose highest-scoring key token lies in this key frame",
    "key_tokens": "tokens of the key frame present in the call (frame_seq_length unless a policy dropped tokens)",
    "key_position_shift": "(RoPE temporal position the keys were attended at minus the queries') minus (key frame "
    "minus query frame): how far the cache moved the keys relative to the queries; 0 when they kept their phase",
    "entropy_tokens": "mean over the query frame's tokens of the entropy (nats) of its softmax over every key token",
    "num_keys": "key tokens the call saw",
    "num_key_frames": "key frames present (in the call, or in the summarized curve)",
    "token": "index of the key token within its frame (row-major over the latent patch grid)",
    "token_logit_mean": "per key token of the frame (list index = token index, NaN where absent): mean over the call's "
    "query tokens of q.k_token/sqrt(d); its mean over the frame's present tokens is the query-averaged logit_mean",
    "token_prob_mean": "per key token of the frame (list index = token index, NaN where absent): mean over the call's "
    "query tokens of the token's softmax probability; its sum over the frame is the query-averaged prob_mass",
    "frame_logit_mean": "mean of token_logit_mean over the frame's present tokens (the query-averaged logit_mean), "
    "exact in float32; decoded token logits average to it",
    "frame_prob_mass": "sum of token_prob_mean over the frame's present tokens (the query-averaged prob_mass), exact "
    "in float32; decoded token probabilities sum to it",
    "token_logit_centered": "per key token of the frame (list index = token index, NaN where absent): "
    "token_logit_mean - frame_logit_mean, rounded to a power-of-two step of 2**-11 to 2**-10 of the row's largest "
    "|value| (float16 precision; decode: sinkscope.tokens.decode_token_values)",
    "token_prob_ratio": "per key token of the frame (list index = token index, NaN where absent): token_prob_mean / "
    "(frame_prob_mass / key_tokens), 1 = the frame's mean token, rounded to 11 significant bits (float16 precision; "
    "decode: sinkscope.tokens.decode_token_values)",
    "metric": "which statistic the row summarizes: logit_mean or prob_mass",
    "runs": "prompt x seed runs averaged into the curve (1 for per-run rows)",
    "query_frames": "the query frames averaged (the last block's frames)",
    "first_frame": "the oldest cache frame the block attends to (frame 0 unless evicted)",
    "last_frame": "the newest cache frame before the block's own frames",
    "first": "curve value at first_frame",
    "middle": "mean of the curve over the cache frames between first_frame and last_frame",
    "last": "curve value at last_frame",
    "own": "mean of the curve over the block's own frames",
    "sink_score": "first - middle (a difference: meaningful for both metrics)",
    "argmax_frame": "key frame with the largest value (own frames included)",
    "first_middle_ratio": "first / middle; prob_mass only (null for logit_mean)",
    "spread_pct": "(max - min) / mean of the cache frames, in %; prob_mass only",
    "frame0_mass": "softmax mass on frame 0 (null when frame 0 is not visible); prob_mass only",
    "frame0_uniform": "the mass frame 0 would get from uniform attention over every key token seen: its key_tokens / "
    "the tokens of every visible key frame (1 / visible key frames without dropped tokens); prob_mass only",
    "frame0_excess": "frame-0 excess over uniform: frame0_mass - frame0_uniform (0 = no preference for frame 0); "
    "prob_mass only",
    "first_k_mass": "softmax mass on the first k visible cache frames (diagnostics.first_k); prob_mass only",
    "cache_share": "softmax mass on the cache frames (everything before the block); prob_mass only",
    "own_share": "softmax mass on the block's own frames (1 - cache_share); prob_mass only",
    "diagonal_mean": "mean over query frames of the value at key frame = query frame (head-averaged, every block)",
    "first_column_mean": "mean over query frames of the value at key frame 0 (head-averaged, every block)",
    "sink_frames": "the policy's sink frames (frame 0 when the policy has none)",
    "sink_mass": "softmax mass on the sink frames, queries of the block averaged",
    "sink_uniform": "the sink frames' share of the key tokens the block sees (the sink mass of uniform attention); "
    "null when no sink frame is in the cache (block 0, or evicted)",
    "sink_excess": "sink_mass - sink_uniform; null when no sink frame is in the cache",
    "self_mass": "softmax mass on the block's own frames",
    "other_mass": "softmax mass on every other frame present; sink_mass + self_mass + other_mass = 1",
    "argmax_age": "frames between the block's first frame and argmax_frame (0 for its own frames and, in a Rolling "
    "Forcing window, later ones)",
    "entropy": "entropy (nats) of the block's key-frame mass distribution over the frames present",
    "entropy_frames": "entropy of each query frame's key-frame distribution / ln(key frames), averaged",
    "latent_sink_cosine": "the generated video: mean cosine similarity between the block's latent frames and the sink "
    "frames (frame 0 without a sink); null for the block holding them and for imported caches",
    "latent_previous_cosine": "the generated video: mean cosine similarity between the block's latent frames and the "
    "previous block's; null for block 0",
    "rope_periods": "temporal RoPE channel pairs (period >= 16 frames) whose turn ends inside the block's frames, as "
    "c<pair>@<frame position>",
    "frame0_argmax_share": "share of the block's query tokens whose highest-scoring key is in frame 0",
    "recent_mass": "softmax mass on the block's own frames and the frame before them",
    "frame0_ratio": "frame0_mass / frame0_uniform, each run's own, averaged over runs (1 = uniform); the sink "
    "class's statistic; null when frame 0 is not visible",
    "recent_uniform": "the mass uniform attention over the key tokens would give the recent_mass frames",
    "recent_ratio": "recent_mass / recent_uniform, each run's own, averaged over runs (1 = uniform); the local "
    "class's statistic",
    "sign_rate": "share of key frames with a positive logit_mean",
    "period": "dominant period (frames) of the key-frame logit_mean profile, by FFT",
    "period_power": "share of the profile's spectral power (DC excluded) at that period",
    "head_class": "sink, local, periodic or diffuse; sink? / local?: borderline, the statistic's interval between "
    "runs (frame0_ratio or recent_ratio ± its _run_std) holds the threshold; one run: no interval, no '?' "
    "(thresholds: config diagnostics:, docs/statistics.md)",
    "borderline": "head_class ends in '?': the runs do not settle the class (false with one run: no interval)",
    "pyramid_label": "Pyramid Forcing's head type from the logit_mean profile: -1 wave (oscillating: mixed signs, "
    "periodic), 1 anchor (stable, compact: positive on most key frames), 2 veil (stable-sparse: "
    "negative on most), the mean logit's sign deciding 1/2 otherwise; 0 no profile "
    "(thresholds: config diagnostics: pyramid_*, docs/statistics.md)",
    "latent_frame": "variant_effects: absolute latent frame, among the frames both the variant's and the default's "
    "video have",
    "latent_rel_distance": "variant_effects: ||x - x_default|| / ||x_default|| over the latent frame (L2 over channels "
    "and positions; 0 = the untouched frame); the default run of the same checkpoint, prompt "
    "and seed",
    "latent_cosine": "variant_effects: cosine between the latent frame and the untouched run's (1 = same direction)",
    "flicker": "variant_effects: ||x_f - x_(f-1)|| / the same in the untouched video (1 = as much change from the "
    "previous frame as untouched); NaN at frame 0, which has no previous frame",
    "first_frame_similarity": "variant_effects: cosine between the latent frame and frame 0 of its own video (the "
    "drift proxy)",
    "first_frame_similarity_default": "variant_effects: the same in the untouched (default) video, for comparison",
    "calls": "variant_head_effects: (call, query frame) pairs after block 0 that both runs make, matched by block, "
    "pass, step and query frame (per run; the first run's in run-averaged rows)",
    "edited": "variant_head_effects: the head is named by a mask_keys or logit_bias edit of the variant",
    "frame0_mass_default": "variant_head_effects: the default run's mean softmax mass on frame 0 over the "
    "matched calls; head_atlas: the same over the default run's calls after block 0 (a layer's row: the mean of its "
    "heads')",
    "frame0_mass_change": "variant_head_effects: mean over the matched calls after block 0 of the variant's "
    "frame-0 mass minus the default's (0 where frame 0 is not a key frame of the call)",
    "entropy_tokens_default": "variant_head_effects: the default run's mean token-level entropy (query_stats "
    "entropy_tokens, nats) over the matched calls",
    "entropy_tokens_change": "variant_head_effects: mean over the matched calls after block 0 of the variant's "
    "token-level entropy minus the default's (nats)",
    "sweep": "the sweep (sweeps:) whose run the row is; its variant is <sweep>/<item>",
    "drift_last_block": "head_atlas, frame_atlas, pruning_curve: the mean over the last block's latent frames of "
    "variant_effects latent_rel_distance (||x - x_default|| / ||x_default||): how far the edit moved the video's end",
    "drift_after_block0": "head_atlas, frame_atlas, pruning_curve: the mean latent_rel_distance over every latent "
    "frame after block 0 (block 0 has no cache: no edit reaches it)",
    "drift_after_frame": "frame_atlas: the mean latent_rel_distance over the frames of the blocks after the swept "
    "frame's own (where masking it can act)",
    "frame_mass_default": "frame_atlas: the default run's mean softmax mass on the frame over every captured head and "
    "every call of a later block whose keys hold it, query frames averaged",
    "sink": "frame_atlas: the frame is one of the policy's sink frames (frame 0 without a sink policy)",
    "order": "pruning_curve: the order the atlas's heads are taken in: drift (least drift_last_block first), random "
    "(a fixed random order), frame0_mass (least untouched frame-0 mass first), all (every head: the orders agree)",
    "head_count": "pruning_curve: k, the heads the run edits (the first k of the order)",
}
for _name in {
    *LAYER_RUN_STD,
    *DIAGNOSTICS_RUN_STD,
    *EFFECTS_RUN_STD,
    *HEAD_EFFECTS_RUN_STD,
    *HEAD_ATLAS_RUN_STD,
    *FRAME_ATLAS_RUN_STD,
}:
    COLUMN_DOCS[_name + RUN_STD_SUFFIX] = (
        f"sample standard deviation (ddof 1) of {_name} between the runs (prompts x seeds), each run's own value; "
        "in run-averaged rows (prompt_id '*'; every head_diagnostics row); null in per-run rows and with one run"
    )


# -- writing and reading -----------------------------------------------------------------------

# How a file's content digests are computed (metadata ``content_digest_version``; absent
# = 1). 2: a column's digest is built from separate streams (nulls, lengths, values), so
# a writer computes it row group by row group (``TableWriter``); 1: one stream per column
# over the whole table, still verified in the files that carry it.
CONTENT_DIGEST_VERSION = 2


def _encode_metadata(metadata: Mapping[str, Any] | None) -> dict[bytes, bytes]:
    encoded = {}
    for key, value in (metadata or {}).items():
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        encoded[(META_PREFIX + key).encode()] = text.encode()
    return encoded


def _metadata_digest(metadata: Mapping[bytes, bytes]) -> bytes:
    """sha256 of a file's key-value metadata (page checksums do not cover the footer)."""
    digest = hashlib.sha256()
    for key in sorted(metadata):
        if key not in (_METADATA_DIGEST, b"ARROW:schema"):
            digest.update(
                len(key).to_bytes(8, "little") + key + len(metadata[key]).to_bytes(8, "little") + metadata[key]
            )
    return digest.hexdigest().encode()


_METADATA_DIGEST = (META_PREFIX + "metadata_sha256").encode()


def _file_metadata(
    schema: pa.Schema,
    metadata: Mapping[str, Any] | None,
    digests: Mapping[str, str],
    existing: Mapping[bytes, bytes] | None = None,
) -> dict[bytes, bytes]:
    """A file's footer metadata: provenance, content digests, column docs, its own digest."""
    info = {
        **dict(metadata or {}),
        "content_digest_version": CONTENT_DIGEST_VERSION,
        "content_sha256": dict(digests),
        "columns": {name: COLUMN_DOCS[name] for name in schema.names if name in COLUMN_DOCS},
    }
    encoded = {**(existing or {}), **_encode_metadata(info)}
    encoded[_METADATA_DIGEST] = _metadata_digest(encoded)
    return encoded


def _column_array(column: Any, field: pa.Field, path: str | Path) -> pa.Array:
    """One column (pandas Series, numpy array, 2-D numpy array of equal-length lists, or
    Arrow array) as an Arrow array of ``field``'s type."""
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        return column if column.type == field.type else column.cast(field.type)
    if isinstance(column, np.ndarray) and column.ndim == 2:
        return _list_array(column, field.type)
    if isinstance(column, pd.Series):
        if pa.types.is_list(field.type) and len(column) and isinstance(column.iloc[0], np.ndarray):
            # Equal-length value lists (one per row): one flat buffer, no per-element conversion.
            return _list_array(np.stack(column.to_numpy()), field.type)
        if isinstance(column.dtype, pd.CategoricalDtype):
            # Codes + categories, cast in Arrow: no per-row Python objects (token tables are millions of rows).
            codes = pa.array(column.cat.codes.to_numpy(), mask=column.isna().to_numpy())
            return pa.DictionaryArray.from_arrays(codes, pa.array(column.cat.categories.astype(str))).cast(field.type)
    if isinstance(column, pd.Categorical):
        return _column_array(pd.Series(column), field, path)
    try:
        return pa.array(column, type=field.type, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise ValueError(f"table for {path}: column {field.name} is not {field.type} ({exc})") from None


def _list_array(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    values = np.ascontiguousarray(values, dtype=type_.value_type.to_pandas_dtype())
    width = values.shape[1]
    offsets = pa.array(np.arange(0, (len(values) + 1) * width, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values.ravel()), type=type_)


def to_arrow(frame: pd.DataFrame | Mapping[str, Any], schema: pa.Schema, path: str | Path = "table") -> pa.Table:
    """``frame`` (a DataFrame, or column name -> array; a 2-D array is a list column) with
    exactly ``schema``'s columns and types."""
    names = frame.columns if isinstance(frame, pd.DataFrame) else frame.keys()
    missing = [name for name in schema.names if name not in names]
    if missing:
        raise ValueError(f"table for {path} lacks columns {missing}")
    arrays = [_column_array(frame[field.name], field, path) for field in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _writer_options(schema: pa.Schema) -> dict[str, Any]:
    # Dictionaries for keys (they repeat), byte-stream-split for floats (random-looking
    # values that dictionaries do not shrink): half the time of the defaults, smaller files.
    floats = [field.name for field in schema if pa.types.is_floating(field.type)]
    float_lists = [
        field.name for field in schema if pa.types.is_list(field.type) and pa.types.is_floating(field.type.value_type)
    ]
    return dict(
        compression="zstd",
        write_page_checksum=True,
        use_dictionary=[name for name in schema.names if name not in floats + float_lists],
        column_encoding={
            **{name: "BYTE_STREAM_SPLIT" for name in floats},
            **{f"{name}.list.element": "BYTE_STREAM_SPLIT" for name in float_lists},
        },
    )


def write_table(
    frame: pd.DataFrame | pa.Table,
    path: str | Path,
    schema: pa.Schema,
    metadata: Mapping[str, Any] | None = None,
    *,
    row_groups_by: str | None = None,
) -> None:
    """Write ``frame`` with ``schema``'s columns, atomically, with checksums and digests.

    ``row_groups_by`` (a column, rows sorted by it) writes one row group per value, so
    a reader can filter a long run (e.g. by block) without loading it whole.
    """
    table = frame if isinstance(frame, pa.Table) else to_arrow(frame, schema, path)
    table = table.replace_schema_metadata(
        _file_metadata(schema, metadata, column_digests(table), table.schema.metadata)
    )
    with atomic_path(path) as tmp:
        options = _writer_options(table.schema)
        if row_groups_by is None or table.num_rows == 0:
            pq.write_table(table, tmp, **options)
            return
        keys = table.column(row_groups_by).to_numpy()
        bounds = [0, *(np.flatnonzero(np.diff(keys)) + 1).tolist(), len(keys)]
        with pq.ParquetWriter(tmp, table.schema, **options) as writer:
            for start, stop in zip(bounds[:-1], bounds[1:]):
                writer.write_table(table.slice(start, stop - start), row_group_size=stop - start)


class TableWriter:
    """A Parquet file written row group by row group (``write``), with the guarantees of
    ``write_table``: page checksums, per-column content digests (version 2, computed as
    the row groups go), column docs and provenance, a metadata digest; the file appears
    at ``path`` on ``close`` and not before (``abort`` leaves nothing).

    The metadata goes into the footer at ``close`` (it may hold what is known only then);
    the file therefore carries no Arrow schema copy, whose metadata would be the one at
    opening: readers get the same types from the Parquet schema.
    """

    def __init__(self, path: str | Path, schema: pa.Schema) -> None:
        self.path = Path(path)
        self.schema = schema
        self.rows = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        self._tmp = Path(name)
        self._digests = ContentDigests(schema)
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
            self._tmp, schema, store_schema=False, **_writer_options(schema)
        )

    def write(self, rows: pa.Table | pd.DataFrame | Mapping[str, Any]) -> None:
        """Append ``rows`` as one row group (nothing for zero rows)."""
        if self._writer is None:
            raise ValueError(f"{self.path}: written to after close or abort")
        table = rows if isinstance(rows, pa.Table) else to_arrow(rows, self.schema, self.path)
        if table.num_rows == 0:
            return
        table = table.select(self.schema.names)
        if not table.schema.equals(self.schema):
            table = table.cast(self.schema)
        self._digests.update(table)
        self._writer.write_table(table, row_group_size=table.num_rows)
        self.rows += table.num_rows

    def close(self, metadata: Mapping[str, Any] | None = None) -> None:
        """Write the footer (``metadata`` plus digests) and move the file into place."""
        if self._writer is None:
            raise ValueError(f"{self.path}: closed twice")
        writer, self._writer = self._writer, None
        try:
            writer.add_key_value_metadata(_file_metadata(self.schema, metadata, self._digests.hexdigests()))
            writer.close()
            os.chmod(self._tmp, 0o666 & ~_UMASK)  # as atomic_path does
            os.replace(self._tmp, self.path)
        finally:
            self._tmp.unlink(missing_ok=True)

    def abort(self) -> None:
        """Give up the file: nothing appears at ``path``."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the file is discarded anyway
                pass
        self._tmp.unlink(missing_ok=True)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``sinkscope.*`` provenance of a Parquet file (JSON values decoded)."""
    try:
        raw = pq.read_schema(path).metadata or {}
    except (pa.ArrowInvalid, OSError) as exc:
        raise DamagedFileError(path, f"is not a readable Parquet file ({exc})") from None
    result = {}
    for key, value in raw.items():
        try:
            key, text = key.decode(), value.decode()
        except UnicodeDecodeError:
            raise DamagedFileError(path, "is damaged: its metadata is not text") from None
        if not key.startswith(META_PREFIX):
            continue
        try:
            result[key[len(META_PREFIX) :]] = json.loads(text)
        except json.JSONDecodeError:
            result[key[len(META_PREFIX) :]] = text
    return result


def read_arrow(path: str | Path, columns: Sequence[str] | None = None, filters=None) -> pa.Table:
    """One Parquet file as an Arrow table, checksums verified; content digests too when
    the whole table is read (a filter reads a part, so only the checksums apply)."""
    try:
        table = pq.read_table(
            path, columns=list(columns) if columns else None, filters=filters, page_checksum_verification=True
        )
        footer = pq.ParquetFile(path).metadata.metadata or {}
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, UnicodeDecodeError, ValueError) as exc:
        raise DamagedFileError(path, f"is damaged or not a Parquet file ({str(exc).splitlines()[0][:160]})") from None
    # The footer holds the metadata twice (key-value pairs, and inside the Arrow schema):
    # both copies must match the digest.
    for raw in (table.schema.metadata or {}, footer):
        if _METADATA_DIGEST in footer and raw.get(_METADATA_DIGEST) != _metadata_digest(raw):
            raise DamagedFileError(path, "is damaged: its metadata does not match its digest")
    meta = read_metadata(path)
    expected = meta.get("content_sha256")
    if expected is None:
        if "package_version" in meta and "columns" in meta:
            raise DamagedFileError(path, "has lost its content digests (its metadata is damaged)")
        return table  # written by an older sinkscope, or by someone else
    if filters is None:
        version = meta.get("content_digest_version", 1)
        if version not in (1, 2):
            raise DamagedFileError(path, f"has content digests of an unknown version {version!r}")
        actual = column_digests(table) if version == 2 else column_digests_v1(table)
        bad = sorted(name for name, digest in actual.items() if expected.get(name) != digest)
        if bad:
            raise DamagedFileError(path, f"is damaged: column {bad[0]} does not match its content digest")
        _check_statistics(path, table, columns)
    return table


def _statistic(value: Any, type_: pa.DataType) -> Any:
    """A footer min/max as a Python value (float16 statistics come as their 2 raw bytes)."""
    if pa.types.is_float16(type_) and isinstance(value, bytes):
        return float(np.frombuffer(value, np.float16)[0])
    return value


def _check_statistics(path: str | Path, table: pa.Table, columns: Sequence[str] | None) -> None:
    """The footer's row-group statistics (min/max, which filtered reads use to skip row
    groups) against the values read: neither checksums nor digests cover them. Our writer
    keeps statistics for every numeric column, so a non-empty one without them is damaged too.
    A list column's statistics are those of its values (the leaf ``<name>.list.element``)."""
    import pyarrow.compute as pc

    metadata = pq.ParquetFile(path).metadata
    # Leaves by their top-level column: a list column's leaf is named "element".
    names = [metadata.schema.column(i).path.split(".")[0] for i in range(metadata.num_columns)]
    wanted = [
        (i, name) for i, name in enumerate(names) if (columns is None or name in columns) and name in table.column_names
    ]
    offset = 0
    for group in range(metadata.num_row_groups):
        chunk_meta = metadata.row_group(group)
        rows = chunk_meta.num_rows
        for index, name in wanted:
            values = table.column(name).slice(offset, rows)
            if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
                values = pa.chunked_array([chunk.flatten() for chunk in values.chunks], values.type.value_type)
            stats = chunk_meta.column(index).statistics
            if len(values) == 0 or values.null_count == len(values):
                continue
            if pa.types.is_floating(values.type):
                found = values.to_numpy().astype(np.float64)
                found = found[~np.isnan(found)]
                if found.size == 0:
                    continue  # all NaN: the writer keeps no min/max
                low, high = float(found.min()), float(found.max())
            else:
                if pa.types.is_dictionary(values.type):
                    values = values.cast(values.type.value_type)
                textual = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
                if (stats is None or not stats.has_min_max) and textual:
                    continue  # the writer leaves out the statistics of very long strings
                minmax = pc.min_max(values)
                low, high = minmax["min"].as_py(), minmax["max"].as_py()
            if stats is None or not stats.has_min_max:
                raise DamagedFileError(path, f"is damaged: column {name} (row group {group}) has lost its statistics")
            stored = (_statistic(stats.min, values.type), _statistic(stats.max, values.type))
            if stored != (low, high):
                raise DamagedFileError(
                    path, f"is damaged: the statistics of column {name} (row group {group}) do not match its values"
                )
        offset += rows


def check_footer(path: str | Path) -> None:
    """The cheap check of a Parquet file: its footer reads and matches its metadata digest
    (a truncated file, or a damaged footer); the pages are checked by ``read_arrow``."""
    try:
        footer = pq.read_metadata(path).metadata or {}
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DamagedFileError(path, f"is damaged or not a Parquet file ({str(exc).splitlines()[0][:160]})") from None
    if _METADATA_DIGEST in footer and footer[_METADATA_DIGEST] != _metadata_digest(footer):
        raise DamagedFileError(path, "is damaged: its metadata does not match its digest")


def read_table(
    paths: str | Path | Iterable[str | Path], columns: Sequence[str] | None = None, filters=None
) -> pd.DataFrame:
    """One DataFrame from one or more verified Parquet files of compatible schemas."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    tables = [read_arrow(p, columns, filters) for p in paths]
    if not tables:
        raise ValueError("no tables to read")
    return pa.concat_tables(tables, promote_options="default").to_pandas()


def with_default_columns(frame: pd.DataFrame, frame_seq_length: int | None = None) -> pd.DataFrame:
    """Fill the columns that older files (or imports) lack with what they mean there."""
    frame = frame.copy()
    if "variant" not in frame:
        frame.insert(1, "variant", DEFAULT_VARIANT)
    defaults = {
        "argmax_share": float("nan"),
        "key_position_shift": 0,
        "key_tokens": frame_seq_length or 0,
        "prompt_segment": 0,
    }
    for name, value in defaults.items():
        if name not in frame:
            frame[name] = value
    return frame
