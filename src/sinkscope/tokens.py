"""Token-profile values: the stored form of token_profiles and its decoding.

A token_profiles row (one per call, head and key frame) stores the frame's exact mean
logit and softmax mass in float32 and its token values relative to them at float16's
precision (``encode_token_values``; ``encode_token_tensors`` is the same on torch tensors,
on the device that computed the profiles); the readers give back float32 ``token_logit_mean`` /
``token_prob_mean`` whose frame mean and sum equal the stored frame values
(``decode_token_values``, ``token_values``, ``token_rows``). docs/statistics.md has the
layout and its error bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import torch

TOKEN_ENCODED = ("frame_logit_mean", "frame_prob_mass", "token_logit_centered", "token_prob_ratio")
TOKEN_DECODED = ("token_logit_mean", "token_prob_mean")
# The long form of token_profiles that figures and users read (``token_rows``).
TOKEN_ROW_COLUMNS = (
    "layer",
    "head",
    "block",
    "pass",
    "step",
    "timestep",
    "prompt_segment",
    "key_frame",
    "token",
    "token_logit_mean",
    "token_prob_mean",
)


# Significant bits kept of each token value: float16's precision (half an ulp = 2**-11 relative).
TOKEN_BITS = 11


def round_significant(values: np.ndarray, bits: int = TOKEN_BITS) -> np.ndarray:
    """float32 ``values`` rounded (to nearest, ties to even) to ``bits`` significant bits;
    NaN and infinities stay. The low bytes become zero, which byte-stream-split compresses
    away: float16's precision without float16's range (no overflow, no subnormals)."""
    drop = 24 - bits  # float32 holds 24 significant bits
    raw = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    half = np.uint32((1 << (drop - 1)) - 1)
    rounded = (raw + half + ((raw >> np.uint32(drop)) & np.uint32(1))) & np.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
    return rounded.view(np.float32)


def encode_token_values(logit: np.ndarray, prob: np.ndarray) -> dict[str, np.ndarray]:
    """The stored form of token profiles: ``logit`` and ``prob`` [rows, frame_seq_length]
    (float32, NaN where a token is absent) -> ``frame_logit_mean`` and ``frame_prob_mass``
    [rows] (float32: the mean / sum over each row's present tokens, computed in float64)
    and ``token_logit_centered`` / ``token_prob_ratio`` [rows, frame_seq_length] (float32
    holding float16-precision values, NaN where absent).

    ``token_logit_centered`` = logit - frame_logit_mean, rounded to multiples of a power of
    two ``step`` with 2**-11 <= step / (the row's largest |centered|) < 2**-10: at most
    2**-11 of that spread off, 11 significant bits. ``token_prob_ratio`` = prob /
    (frame_prob_mass / present tokens), rounded to 11 significant bits (2**-11 relative).
    Centering, and the ratio to the frame's mean token, spend the bits on how a token
    differs from its frame; the frame's own values stay exact in float32.

    The arithmetic is ``encode_token_tensors``'s (torch, on the CPU here): the capture runs
    the same function on the device that computed the profiles.
    """
    import torch

    logit, prob = np.asarray(logit), np.asarray(prob)
    if logit.shape != prob.shape or logit.ndim != 2:
        raise ValueError(
            f"token logits {logit.shape} and probabilities {prob.shape} must be equal [rows, tokens] arrays"
        )
    if np.isnan(prob).all(axis=1).any():
        raise ValueError("a token profile row has no present token")
    encoded = encode_token_tensors(
        torch.from_numpy(np.asarray(logit, np.float64)), torch.from_numpy(np.asarray(prob, np.float64))
    )
    return {name: values.numpy() for name, values in encoded.items()}


def encode_token_tensors(logit: torch.Tensor, prob: torch.Tensor) -> dict[str, torch.Tensor]:
    """``encode_token_values`` on torch tensors, on their device and without a host
    synchronization (so the capture encodes a call's profiles where it computed them and
    hands the host only the stored form). Sums in float64; results float32. Every row
    must hold a present token (the caller knows which from the call's key layout)."""
    import torch

    logit, prob = logit.to(torch.float64), prob.to(torch.float64)
    present = ~torch.isnan(prob)
    count = present.sum(dim=1)
    frame_logit = (torch.nansum(logit, dim=1) / count).to(torch.float32)
    frame_mass = torch.nansum(prob, dim=1).to(torch.float32)
    # Centered on the stored float32 mean: decoding adds back exactly that value.
    centered = logit - frame_logit.to(torch.float64)[:, None]
    spread = torch.where(present, centered.abs(), 0.0).amax(dim=1)
    # A power-of-two step, 2**ceil(log2(spread * 2**-11)) taken exactly from the exponent:
    # every multiple up to the spread has at most 11 significant bits, and small values
    # carry no more precision than the spread needs (fewer bytes).
    mantissa, exponent = torch.frexp(spread * 2.0**-TOKEN_BITS)  # x = mantissa * 2**exponent, mantissa in [0.5, 1)
    exponent = exponent - (mantissa == 0.5).to(exponent.dtype)  # x a power of two: its own exponent
    step = torch.where(spread > 0, torch.ldexp(torch.ones_like(spread), exponent), 1.0)[:, None]
    centered = (torch.round(centered / step) * step).to(torch.float32)
    mean_token = (frame_mass.to(torch.float64) / count)[:, None]
    ratio = torch.where(mean_token > 0, prob / torch.where(mean_token > 0, mean_token, 1.0), 0.0)
    # NaN as a Python scalar: a device tensor made from it would be a synchronizing copy.
    return {
        "frame_logit_mean": frame_logit,
        "frame_prob_mass": frame_mass,
        "token_logit_centered": torch.where(present, centered, float("nan")),
        "token_prob_ratio": torch.where(present, _round_significant_tensor(ratio.to(torch.float32)), float("nan")),
    }


def _round_significant_tensor(values: torch.Tensor, bits: int = TOKEN_BITS) -> torch.Tensor:
    """``round_significant`` on a float32 tensor: the same bit arithmetic, in int64 (torch
    has no uint32 arithmetic on every device)."""
    import torch

    drop = 24 - bits
    raw = values.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (raw + ((1 << (drop - 1)) - 1) + ((raw >> drop) & 1)) & (0xFFFFFFFF & ~((1 << drop) - 1))
    return torch.where(rounded >= 2**31, rounded - 2**32, rounded).to(torch.int32).view(torch.float32)


def decode_token_values(
    frame_logit_mean: np.ndarray, frame_prob_mass: np.ndarray, centered: np.ndarray, ratio: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``token_logit_mean`` and ``token_prob_mean`` [rows, tokens] from the stored
    form (NaN where absent). Each row is adjusted so that the identities hold exactly (up
    to the float32 rounding of the result): the decoded logits average to
    ``frame_logit_mean`` (the centered values minus their own mean, rounding errors and
    all), the decoded probabilities sum to ``frame_prob_mass`` (the ratios scaled by
    mass / their sum). A single value is within float16 rounding of the original: a
    probability 2**-11 relative (2**-10 at worst, with the adjustment), a logit 2**-11
    (2**-10 at worst) of the frame's largest distance from its mean."""
    centered = np.asarray(centered, np.float64)
    ratio = np.asarray(ratio, np.float64)
    present = ~np.isnan(ratio)
    count = np.maximum(present.sum(axis=1), 1)
    shift = np.nansum(centered, axis=1) / count
    logit = np.asarray(frame_logit_mean, np.float64)[:, None] + (centered - shift[:, None])
    total = np.nansum(ratio, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(total > 0, np.asarray(frame_prob_mass, np.float64) / total, 0.0)
    prob = ratio * scale[:, None]
    return logit.astype(np.float32), prob.astype(np.float32)


def _stacked(column: pd.Series) -> np.ndarray:
    return np.stack(column.to_numpy()) if len(column) else np.empty((0, 0))


def token_values(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(token_logit_mean, token_prob_mean) [rows, tokens] float32 of token_profiles rows in
    their stored form, whichever layout wrote them: the compact one (decoded) or the
    float32 lists of older files (as they are)."""
    if all(name in table.columns for name in TOKEN_ENCODED):
        return decode_token_values(
            table["frame_logit_mean"].to_numpy(),
            table["frame_prob_mass"].to_numpy(),
            _stacked(table["token_logit_centered"]),
            _stacked(table["token_prob_ratio"]),
        )
    if all(name in table.columns for name in TOKEN_DECODED):
        return (
            _stacked(table["token_logit_mean"]).astype(np.float32, copy=False),
            _stacked(table["token_prob_mean"]).astype(np.float32, copy=False),
        )
    raise ValueError(
        f"token_profiles rows lack their token columns ({', '.join(TOKEN_ENCODED)}); "
        f"columns: {', '.join(map(str, table.columns))}"
    )


def decode_token_profiles(table: pd.DataFrame) -> pd.DataFrame:
    """token_profiles rows in either stored layout -> the float32 layout (a row per call,
    head and key frame, ``token_logit_mean`` / ``token_prob_mean`` as lists)."""
    if "token" in table.columns or all(name in table.columns for name in TOKEN_DECODED):
        return table
    logit, prob = token_values(table)
    out = table.drop(columns=[name for name in TOKEN_ENCODED if name in table.columns])
    out["token_logit_mean"] = list(logit)
    out["token_prob_mean"] = list(prob)
    return out


def token_rows(table: pd.DataFrame) -> pd.DataFrame:
    """token_profiles rows (one per call, head and key frame, the frame's values as lists;
    either stored layout) as one row per key token present: ``TOKEN_ROW_COLUMNS`` (float32
    values, decoded) plus whatever run columns the table has. A table already in that long
    form is returned as it is."""
    if "token" in table.columns or table.empty:
        return table
    logit, prob = token_values(table)
    present = ~np.isnan(prob)
    row, token = np.nonzero(present)
    dropped = {*TOKEN_ENCODED, *TOKEN_DECODED, "key_tokens"}
    keep = [name for name in table.columns if name not in dropped]
    out = table[keep].iloc[row].reset_index(drop=True)
    out["token"] = token.astype(np.int32)
    out["token_logit_mean"] = logit[present]
    out["token_prob_mean"] = prob[present]
    return out


def token_lists(rows: pd.DataFrame, frame_seq_length: int) -> pd.DataFrame:
    """The inverse of ``token_rows``: a row per key token -> the stored form, a row per
    call, head and key frame with its tokens' values encoded (``encode_token_values``) as
    ``frame_seq_length`` lists (NaN where a token is absent); ``key_tokens`` counts the
    present ones."""
    if "token" not in rows.columns:
        return rows
    value_columns = ("token", "token_logit_mean", "token_prob_mean")
    keys = [name for name in rows.columns if name not in value_columns]
    grouped = rows.groupby(keys, observed=True, sort=False, dropna=False)
    group = grouped.ngroup().to_numpy()
    out = grouped.size().reset_index(name="key_tokens")
    out["key_tokens"] = out["key_tokens"].astype(np.int32)
    if "key_position_shift" not in out.columns:
        out["key_position_shift"] = np.int32(0)
    token = rows["token"].to_numpy()
    dense = {}
    for name in ("token_logit_mean", "token_prob_mean"):
        values = np.full((len(out), frame_seq_length), np.nan, np.float32)
        values[group, token] = rows[name].to_numpy()
        dense[name] = values
    for name, values in encode_token_values(dense["token_logit_mean"], dense["token_prob_mean"]).items():
        out[name] = list(values) if values.ndim == 2 else values
    return out
