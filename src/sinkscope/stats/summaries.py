"""The derived tables: head/layer statistics, block statistics, head diagnostics.

Every summary number is computed here, once; figures, the summary page and the tables
read it from here, so they agree (tests read all three).

The Figure 4 view: the last block's queries (averaged over its query frames) against
every key frame they see, for each call of that block. On that curve:

- cache frames are the visible key frames before the block; ``first`` / ``last`` are
  the oldest / newest of them, ``middle`` the mean of those between, ``own`` the mean
  over the block's own frames, ``sink_score = first - middle``;
- ratios and shares (``first_middle_ratio``, ``spread_pct``, ``frame0_mass``,
  ``first_k_mass``, ``cache_share``, ``own_share``) exist for ``prob_mass`` only: on
  signed logits they do not mean what they say, so they are null for ``logit_mean``;
- the uniform baseline (``uniform_mass``): the mass a key frame would get if the query
  attended uniformly over every key token it sees, ``key_tokens / Σ key_tokens`` (1 /
  visible key frames when no tokens were dropped); ``frame0_excess = frame0_mass -
  frame0_uniform`` is the "frame-0 excess over uniform" that figures and the summary
  page rank heads by. ``sink_score`` (first - middle) is a name, not a verdict: "sink"
  is reserved for heads whose ``head_class`` is ``sink``.

Head classes (``head_diagnostics``) are decided on ratios to that baseline, each run's
own, over the runs together: a head whose ratio's interval between runs (mean ± std)
holds a threshold gets the borderline label ``sink?`` / ``local?`` (``classify_head``).

Rows with ``prompt_id = '*'`` and ``seed = -1`` summarize the run-averaged curve (mean
over prompts and seeds, then the statistics); ``runs`` says how many runs it holds, and
``<stat>_run_std`` the sample standard deviation of each run's own statistic.
A zero denominator gives NaN, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.schemafile import section_defaults
from sinkscope.tables import (
    ALL_PROMPTS,
    ALL_SEEDS,
    BLOCK_STATS_SCHEMA,
    DIAGNOSTICS_RUN_STD,
    HEAD_DIAGNOSTICS_SCHEMA,
    HEAD_RUN_STD,
    HEAD_STATS_SCHEMA,
    LAYER_RUN_STD,
    LAYER_STATS_SCHEMA,
    METRICS,
    RUN_KEYS,
    RUN_STD_SUFFIX,
)

SOURCE_KEYS = ["checkpoint", "variant"]
HEAD_CLASSES = ("sink", "local", "periodic", "diffuse")
# A borderline label: the class's test statistic, mean ± its std between runs, holds the
# threshold ("sink?": some runs above, some below). Only the tests with a per-run
# statistic have one (sink, local); the labels in the order figures and counts list them.
BORDERLINE = "?"
HEAD_LABELS = ("sink", "sink" + BORDERLINE, "local", "local" + BORDERLINE, "periodic", "diffuse")
# The head-class thresholds of config diagnostics:, as the schema defines them.
DEFAULT_THRESHOLDS = section_defaults("diagnostics")
_PROB_ONLY = (
    "first_middle_ratio",
    "spread_pct",
    "frame0_mass",
    "frame0_uniform",
    "frame0_excess",
    "first_k_mass",
    "cache_share",
    "own_share",
)
# What one query frame of one call is: the rows over which its key-frame masses sum to 1.
_QUERY_KEYS = (*RUN_KEYS, "layer", "head", "block", "pass", "step", "query_frame")


# -- the uniform baseline ------------------------------------------------------------------------


def uniform_mass(frame: pd.DataFrame) -> pd.Series:
    """Per row: the softmax mass its key frame would get if the query attended uniformly
    over every key token it sees, ``key_tokens / Σ key_tokens`` over the key frames of
    that query frame and call. Without dropped tokens it is 1 / visible key frames, and
    so it is for rows without token counts (``key_tokens`` absent or 0)."""
    keys = [k for k in _QUERY_KEYS if k in frame.columns]
    grouped = frame.groupby(keys, observed=True, sort=False)
    count = grouped["key_frame"].transform("size").astype(np.float64)
    if "key_tokens" not in frame.columns:
        return 1.0 / count
    total = grouped["key_tokens"].transform("sum").astype(np.float64)
    share = frame["key_tokens"].astype(np.float64) / total.where(total > 0)
    return share.fillna(1.0 / count)


# -- the Figure 4 view ---------------------------------------------------------------------------


def resolve_step(frame: pd.DataFrame, step: str | int) -> tuple[str, int]:
    """Map the figures' ``step`` option to (pass, step) of the rows present.

    'last' is the last denoising step present, 'cache' the cache pass, an integer a
    denoising step index. Rows imported from older caches record no call (step -1):
    they are shown whatever the option asks for.
    """
    denoise = frame[frame["pass"] == "denoise"]
    if not denoise.empty and (denoise["step"] == -1).all() and not (frame["pass"] == "cache").any():
        return "denoise", -1
    if step == "cache":
        cache = frame.loc[frame["pass"] == "cache", "step"]
        return "cache", int(cache.max()) if len(cache) else -1
    if step == "last":
        if denoise.empty:
            raise ValueError("no denoising-step rows to show")
        return "denoise", int(denoise["step"].max())
    return "denoise", int(step)


def block_calls(frame: pd.DataFrame, step: str | int) -> pd.DataFrame:
    """The rows of one call of every block: ``'last'`` each block's last denoising step,
    ``'cache'`` its cache pass, an integer that denoising step (blocks without it left
    out). Blocks need not have the same steps (Causal Forcing++'s first block has 4, the
    others 1 or 2; variants may differ too). Imported rows (step -1) are all shown."""
    pass_, index = resolve_step(frame, step)
    if (pass_, index) == ("denoise", -1) or step not in ("last", "cache"):
        return frame[(frame["pass"] == pass_) & (frame["step"] == index)]
    if step == "cache":
        return frame[frame["pass"] == "cache"]
    keys = [k for k in ("checkpoint", "variant", "block") if k in frame.columns]
    denoise = frame[frame["pass"] == "denoise"]
    last = denoise.groupby(keys, observed=True)["step"].transform("max")
    return denoise[denoise["step"] == last]


def last_block(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of the last generated block of each run and layer."""
    keys = [k for k in RUN_KEYS + ["layer"] if k in frame.columns]
    last = frame.groupby(keys, observed=True)["block"].transform("max")
    return frame[frame["block"] == last]


def runs_in(frame: pd.DataFrame) -> int:
    return int(frame.groupby(["prompt_id", "seed"], observed=True).ngroups)


def figure4_curves(
    frame: pd.DataFrame, step: str | int, metric: str, *, details: bool = False
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The last block's query-averaged curves, averaged over runs (what figures draw).

    Returns (curves, info): curves has index (layer, head) and one column per key frame
    (NaN where a frame is not visible); info holds the query frames, the call, the
    pass/step/timestep and the number of runs; with ``details``, also ``uniform`` (the
    uniform baseline of each curve, ``uniform_mass`` averaged like the curves),
    ``run_curves`` (each run's curve: index (prompt_id, seed, layer, head)) and
    ``run_uniform`` (each run's baseline).
    """
    rows = last_block(frame)
    pass_, step_index = resolve_step(rows, step)
    rows = rows[(rows["pass"] == pass_) & (rows["step"] == step_index)]
    if rows.empty:
        raise ValueError(f"no rows of the last block for pass={pass_!r}, step={step_index}")
    curves = (
        rows.groupby(["layer", "head", "key_frame"], observed=True)[metric]
        .mean()
        .unstack("key_frame")
        .sort_index(axis=1)
    )
    info = {
        "query_frames": sorted(int(f) for f in set(rows["query_frame"])),
        "pass": pass_,
        "step": step_index,
        "timestep": float(rows["timestep"].iloc[0]),
        "runs": runs_in(rows),
    }
    if details:
        rows = rows.assign(uniform=uniform_mass(rows))
        uniform = rows.groupby(["layer", "head", "key_frame"], observed=True)["uniform"].mean()
        info["uniform"] = uniform.unstack("key_frame").reindex(index=curves.index, columns=curves.columns)
        per_run = rows.groupby(["prompt_id", "seed", "layer", "head", "key_frame"], observed=True)[
            [metric, "uniform"]
        ].mean()
        info["run_curves"] = per_run[metric].unstack("key_frame").reindex(columns=curves.columns)
        info["run_uniform"] = per_run["uniform"].unstack("key_frame").reindex(columns=curves.columns)
    return curves, info


def curve_stats(
    values: Sequence[float],
    frames: Sequence[int],
    query_frames: Sequence[int],
    metric: str,
    first_k: int = 3,
    uniform: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The statistics of one curve over its visible key frames (NaN values = not visible).

    ``uniform``: the uniform baseline of each frame (``uniform_mass`` averaged like the
    curve); without it, 1 / visible key frames."""
    values = np.asarray(values, dtype=np.float64)
    frames = np.asarray(frames)
    keep = ~np.isnan(values)
    baseline = None if uniform is None else np.asarray(uniform, dtype=np.float64)[keep]
    values, frames = values[keep], frames[keep]
    order = np.argsort(frames, kind="stable")
    values, frames = values[order], frames[order]
    baseline = None if baseline is None else baseline[order]
    own = np.isin(frames, np.asarray(query_frames))
    cache, cache_frames = values[~own], frames[~own]
    nan = float("nan")
    first = float(cache[0]) if cache.size else nan
    last = float(cache[-1]) if cache.size else nan
    middle = float(cache[1:-1].mean()) if cache.size > 2 else nan
    stats: dict[str, Any] = dict(
        num_key_frames=int(values.size),
        first_frame=int(cache_frames[0]) if cache.size else -1,
        last_frame=int(cache_frames[-1]) if cache.size else -1,
        first=first,
        middle=middle,
        last=last,
        own=float(values[own].mean()) if own.any() else nan,
        sink_score=first - middle,
        argmax_frame=int(frames[int(np.argmax(values))]) if values.size else -1,
    )
    stats.update({name: nan for name in _PROB_ONLY})
    if metric == "prob_mass" and values.size:
        cache_mean = float(cache.mean()) if cache.size else nan
        zero = frames == 0
        frame0 = float(values[zero][0]) if zero.any() else nan
        frame0_uniform = nan
        if zero.any():
            given = float(baseline[zero][0]) if baseline is not None else nan
            frame0_uniform = given if np.isfinite(given) else 1.0 / values.size
        stats.update(
            first_middle_ratio=first / middle if middle else nan,
            spread_pct=(float(cache.max() - cache.min()) / cache_mean * 100) if cache.size and cache_mean else nan,
            frame0_mass=frame0,
            frame0_uniform=frame0_uniform,
            frame0_excess=frame0 - frame0_uniform,
            first_k_mass=float(cache[:first_k].sum()),
            cache_share=float(cache.sum()),
            own_share=float(values[own].sum()),
        )
    return stats


def _frames_label(frames) -> str:
    return ",".join(str(int(f)) for f in sorted(set(frames)))


def _curve_rows(
    curves: pd.DataFrame, uniform: pd.DataFrame, base: Mapping[str, Any], query_frames, metric: str, first_k: int
) -> list[dict]:
    frames = curves.columns.to_numpy()
    label = _frames_label(query_frames)
    baselines = uniform.reindex(index=curves.index, columns=curves.columns).to_numpy()
    return [
        {
            **base,
            **dict(zip(curves.index.names, key if isinstance(key, tuple) else (key,))),
            "metric": metric,
            "query_frames": label,
            **curve_stats(row, frames, query_frames, metric, first_k, baseline),
        }
        for key, row, baseline in zip(curves.index, curves.to_numpy(), baselines)
    ]


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties) over the pairs where both are
    finite; NaN with fewer than 3 such pairs or a constant side."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3:
        return float("nan")
    rx = pd.Series(x[keep]).rank().to_numpy()
    ry = pd.Series(y[keep]).rank().to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def with_run_std(table: pd.DataFrame, keys: Sequence[str], names: Sequence[str]) -> pd.DataFrame:
    """``<stat>_run_std`` columns: in the run-averaged rows (``prompt_id == '*'``), the
    sample standard deviation (ddof 1) of each per-run row's statistic; null in per-run
    rows and where fewer than two runs have a value."""
    table = table.copy()
    columns = [name + RUN_STD_SUFFIX for name in names]
    averaged = (table["prompt_id"] == ALL_PROMPTS).to_numpy()
    per_run = table[~averaged]
    for column in columns:
        table[column] = np.nan
    if averaged.any() and len(per_run):
        spread = per_run.groupby(list(keys), observed=True, sort=False)[list(names)].std(ddof=1)
        spread.columns = columns
        joined = table.loc[averaged, list(keys)].join(spread, on=list(keys))
        table.loc[averaged, columns] = joined[columns].to_numpy(dtype=np.float64)
    return table


def _call_views(frame: pd.DataFrame):
    """(source keys, run keys or None for the run average, pass, step, rows) of each call of the last block."""
    rows = last_block(frame)
    rows = rows.assign(uniform=uniform_mass(rows))
    for (*source, pass_, step), call in rows.groupby([*SOURCE_KEYS, "pass", "step"], observed=True, sort=True):
        source = tuple(source)
        runs = call.groupby(["prompt_id", "seed"], observed=True, sort=True)
        for run, run_rows in runs:
            yield source, run, pass_, step, run_rows, 1
        yield source, (ALL_PROMPTS, ALL_SEEDS), pass_, step, call, runs.ngroups


def head_stats(frame: pd.DataFrame, first_k: int = 3) -> pd.DataFrame:
    """Per head, call of the last block and metric: the curve statistics."""
    rows = []
    for source, run, pass_, step, call, runs in _call_views(frame):
        query_frames = sorted(set(call["query_frame"]))
        for layer, layer_rows in call.groupby("layer", sort=True):
            base = dict(zip(SOURCE_KEYS, source)) | dict(zip(["prompt_id", "seed"], run))
            base |= {
                "layer": layer,
                "pass": pass_,
                "step": step,
                "timestep": float(call["timestep"].iloc[0]),
                "runs": runs,
            }
            uniform = layer_rows.groupby(["head", "key_frame"], observed=True)["uniform"].mean().unstack("key_frame")
            for metric in METRICS:
                curves = layer_rows.groupby(["head", "key_frame"], observed=True)[metric].mean().unstack("key_frame")
                rows += _curve_rows(curves.sort_index(axis=1), uniform, base, query_frames, metric, first_k)
    names = [name for name in HEAD_STATS_SCHEMA.names if not name.endswith(RUN_STD_SUFFIX)]
    table = pd.DataFrame(rows, columns=names)
    table = with_run_std(table, [*SOURCE_KEYS, "layer", "head", "pass", "step", "metric"], HEAD_RUN_STD)
    return table[HEAD_STATS_SCHEMA.names]


def layer_stats(frame: pd.DataFrame, first_k: int = 3) -> pd.DataFrame:
    """Per call of the last block and metric: statistics of the head-averaged curve, plus
    the diagonal and frame-0 column means of the head-averaged frame x frame matrix of
    every block at the same (pass, step)."""
    call_keys = ["layer", "pass", "step"]
    # Every (head, query frame) of a call has one row per key frame, so plain row means
    # equal the means of the head-averaged matrix, per run and over runs alike.
    diagonal = frame[frame["query_frame"] == frame["key_frame"]]
    column = frame[frame["key_frame"] == 0]
    cells = {
        "run": {
            name: rows.groupby([*RUN_KEYS, *call_keys], observed=True)[list(METRICS)].mean()
            for name, rows in (("diagonal_mean", diagonal), ("first_column_mean", column))
        },
        "all": {
            name: rows.groupby([*SOURCE_KEYS, *call_keys], observed=True)[list(METRICS)].mean()
            for name, rows in (("diagonal_mean", diagonal), ("first_column_mean", column))
        },
    }
    rows = []
    for source, run, pass_, step, call, runs in _call_views(frame):
        query_frames = sorted(set(call["query_frame"]))
        averaged = run == (ALL_PROMPTS, ALL_SEEDS)
        for layer, layer_rows in call.groupby("layer", sort=True):
            base = dict(zip(SOURCE_KEYS, source)) | dict(zip(["prompt_id", "seed"], run))
            base |= {
                "layer": layer,
                "pass": pass_,
                "step": step,
                "timestep": float(call["timestep"].iloc[0]),
                "runs": runs,
            }
            key = (*source, *(() if averaged else run), layer, pass_, step)
            uniform = layer_rows.groupby("key_frame")["uniform"].mean().sort_index()
            for metric in METRICS:
                curve = layer_rows.groupby("key_frame")[metric].mean().sort_index()
                extra = {}
                for name, table in cells["all" if averaged else "run"].items():
                    extra[name] = float(table.loc[key, metric]) if key in table.index else float("nan")
                stats = curve_stats(
                    curve.to_numpy(),
                    curve.index.to_numpy(),
                    query_frames,
                    metric,
                    first_k,
                    uniform.reindex(curve.index).to_numpy(),
                )
                rows.append({**base, "metric": metric, "query_frames": _frames_label(query_frames), **stats, **extra})
    names = [name for name in LAYER_STATS_SCHEMA.names if not name.endswith(RUN_STD_SUFFIX)]
    table = pd.DataFrame(rows, columns=names)
    table = with_run_std(table, [*SOURCE_KEYS, "layer", "pass", "step", "metric"], LAYER_RUN_STD)
    return table[LAYER_STATS_SCHEMA.names]


# -- over time -----------------------------------------------------------------------------------


def block_stats(
    frame: pd.DataFrame, sink_frames: Mapping[str, int] | int = 0, rollout: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Per run, layer, head, block and call: where the block's softmax mass goes.

    ``sink_frames`` (per variant, or one number): the policy's sink frames (the first
    S frames); frame 0 for policies without one. Sink mass counts sink frames before
    the block; self mass the block's own frames; other mass the rest (the frames after
    the block too, which a Rolling Forcing window call sees). The sink
    frames' uniform baseline (their share of the key tokens, ``uniform_mass``) and the
    excess over it are null where no sink frame is in the cache. ``rollout``: per run and
    block, the latent similarities and RoPE period ends of ``sinkscope.stats.rollout``
    (null where absent, e.g. imported caches).
    """
    keys = [*RUN_KEYS, "layer", "head", "block", "pass", "step"]
    if frame.empty:
        return pd.DataFrame(columns=BLOCK_STATS_SCHEMA.names)
    tokens = {"tokens": ("key_tokens", "mean")} if "key_tokens" in frame.columns else {}
    if "prompt_segment" not in frame.columns:
        frame = frame.assign(prompt_segment=0)
    curves = (
        frame.groupby([*keys, "key_frame"], observed=True)
        .agg(
            mass=("prob_mass", "mean"),
            timestep=("timestep", "first"),
            qmin=("query_frame", "min"),
            qmax=("query_frame", "max"),
            prompt_segment=("prompt_segment", "first"),
            **tokens,
        )
        .reset_index()
    )
    # The uniform baseline (uniform_mass): every query frame of a call sees the same keys,
    # so the key-token shares of the call's frames are those of each of its query frames.
    count = curves.groupby(keys, observed=True, sort=False)["key_frame"].transform("size").astype(np.float64)
    if tokens:
        total = curves.groupby(keys, observed=True, sort=False)["tokens"].transform("sum")
        curves["uniform"] = (curves["tokens"] / total.where(total > 0)).fillna(1.0 / count)
    else:
        curves["uniform"] = 1.0 / count
    variants = curves["variant"].astype(str)
    sinks = (
        variants.map(sink_frames) if isinstance(sink_frames, Mapping) else pd.Series(sink_frames, index=curves.index)
    )
    sinks = sinks.fillna(0).astype(int).clip(lower=1)  # no sink: frame 0
    # Own: the block's frames. Frames after it (later blocks of a Rolling Forcing window,
    # seen within the joint call) are other mass, never sink or history.
    own = (curves["key_frame"] >= curves["qmin"]) & (curves["key_frame"] <= curves["qmax"])
    sink = (curves["key_frame"] < sinks) & (curves["key_frame"] < curves["qmin"])
    curves["self"] = curves["mass"].where(own, 0.0)
    curves["sink"] = curves["mass"].where(sink, 0.0)
    curves["other"] = curves["mass"].where(~own & ~sink, 0.0)
    curves["sink_uniform"] = curves["uniform"].where(sink, 0.0)
    curves["sink_present"] = sink.astype(np.int64)
    p = curves["mass"].clip(lower=0)
    curves["plogp"] = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1)), 0.0)
    grouped = curves.groupby(keys, observed=True, sort=True)
    out = grouped.agg(
        timestep=("timestep", "first"),
        prompt_segment=("prompt_segment", "first"),
        qmin=("qmin", "first"),
        qmax=("qmax", "first"),
        sink_mass=("sink", "sum"),
        self_mass=("self", "sum"),
        other_mass=("other", "sum"),
        entropy=("plogp", "sum"),
        num_key_frames=("mass", "size"),
        sink_uniform=("sink_uniform", "sum"),
        sink_present=("sink_present", "sum"),
    )
    # No sink frame in the cache (block 0, or evicted): no baseline, and no excess.
    out["sink_uniform"] = out["sink_uniform"].where(out["sink_present"] > 0)
    out["sink_excess"] = out["sink_mass"] - out["sink_uniform"]
    out["argmax_frame"] = curves.loc[grouped["mass"].idxmax().to_numpy(), "key_frame"].to_numpy()
    out = out.reset_index()
    out["argmax_age"] = (out["qmin"] - out["argmax_frame"]).clip(lower=0)
    out["query_frames"] = [f"{a}-{b}" if a != b else f"{a}" for a, b in zip(out["qmin"], out["qmax"])]
    out_sinks = out["variant"].astype(str).map(sink_frames) if isinstance(sink_frames, Mapping) else sink_frames
    out_sinks = pd.Series(out_sinks, index=out.index).fillna(0).astype(int).clip(lower=1)
    out["sink_frames"] = [f"0-{s - 1}" if s > 1 else "0" for s in out_sinks]
    video_columns = ["latent_sink_cosine", "latent_previous_cosine", "rope_periods"]
    if rollout is not None and not rollout.empty:
        per_block = rollout.drop_duplicates([*RUN_KEYS, "block"])[[*RUN_KEYS, "block", *video_columns]]
        per_block = per_block.astype({key: out[key].dtype for key in [*RUN_KEYS, "block"] if key in out})
        out = out.drop(columns=[c for c in video_columns if c in out]).merge(
            per_block, on=[*RUN_KEYS, "block"], how="left"
        )
    for column in video_columns:
        if column not in out:
            out[column] = None if column == "rope_periods" else np.nan
    return out[BLOCK_STATS_SCHEMA.names]


# -- head diagnostics ----------------------------------------------------------------------------


def dominant_period(profile: Sequence[float]) -> tuple[float, float]:
    """(period in frames, share of spectral power) of the strongest non-DC frequency."""
    values = np.asarray(profile, dtype=np.float64)
    values = values[~np.isnan(values)]
    if values.size < 4:
        return float("nan"), float("nan")
    power = np.abs(np.fft.rfft(values - values.mean())) ** 2
    total = power[1:].sum()
    if total <= 0:
        return float("nan"), float("nan")
    k = 1 + int(np.argmax(power[1:]))
    return values.size / k, float(power[k] / total)


def _test(value: float, spread: float, threshold: float) -> str:
    """'yes', 'no' or 'borderline': is ``value`` at least ``threshold``, given the
    interval ``value ± spread`` between runs? Without a spread (one run) the value
    decides alone; a missing value is 'no'."""
    if value is None or not np.isfinite(value):
        return "no"
    if spread is None or not np.isfinite(spread):
        return "yes" if value >= threshold else "no"
    if value - spread >= threshold:
        return "yes"
    return "no" if value + spread < threshold else "borderline"


def classify_head(row: Mapping[str, float], thresholds: Mapping[str, float], num_key_frames: int) -> str:
    """sink > local > periodic > diffuse, by the thresholds of config ``diagnostics:``.

    sink: ``frame0_ratio`` (frame-0 mass / its uniform share) ≥ ``sink_ratio``; local:
    ``recent_ratio`` (mass on the block's own frames and the frame before / their
    uniform share) ≥ ``local_ratio``. Each is decided on the interval between runs,
    mean ± ``<stat>_run_std``: an interval that holds the threshold gives the
    borderline label ``sink?`` / ``local?`` (the next tests are not asked). periodic is
    decided on the run-averaged logit profile (one spectrum, no interval)."""
    for name, stat, key in (("sink", "frame0_ratio", "sink_ratio"), ("local", "recent_ratio", "local_ratio")):
        verdict = _test(row.get(stat), row.get(stat + RUN_STD_SUFFIX), thresholds[key])
        if verdict != "no":
            return name if verdict == "yes" else name + BORDERLINE
    period = row["period"]
    if row["period_power"] >= thresholds["periodic_power"] and 2 <= period <= num_key_frames / 2:
        return "periodic"
    return "diffuse"


def base_class(label: str) -> str:
    """'sink?' -> 'sink': the class a (possibly borderline) label is about."""
    return label[: -len(BORDERLINE)] if label.endswith(BORDERLINE) else label


def is_borderline(label: str) -> bool:
    return isinstance(label, str) and label.endswith(BORDERLINE)


def pyramid_label(row: Mapping[str, float], thresholds: Mapping[str, float], num_key_frames: int) -> int:
    """Pyramid Forcing's head type from the key-frame ``logit_mean`` profile (docs/statistics.md):
    1 anchor (positive on at least ``pyramid_sign_high`` of the key frames), 2 veil (on at
    most ``pyramid_sign_low``), else -1 wave when the mixed-sign profile is periodic (the
    dominant period holds ``pyramid_periodic_power`` of the spectral power, 2 <= period <=
    half the key frames), else the mean-logit fallback: 1 if the profile's mean is
    positive, 2 if not. 0: no profile."""
    rate = row["sign_rate"]
    if not np.isfinite(rate):
        return 0
    if rate >= thresholds["pyramid_sign_high"]:
        return 1
    if rate <= thresholds["pyramid_sign_low"]:
        return 2
    period, power = row["period"], row["period_power"]
    if np.isfinite(power) and power >= thresholds["pyramid_periodic_power"] and 2 <= period <= num_key_frames / 2:
        return -1
    return 1 if row["mean_logit"] > 0 else 2


def head_diagnostics(
    frame: pd.DataFrame, query_stats: pd.DataFrame | None = None, thresholds: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """Per checkpoint, variant, layer, head and call of the last block: each statistic
    per run (prompt, seed), then the mean over runs and its std between runs
    (``<stat>_run_std``); ``head_class`` from those means and spreads (``classify_head``)."""
    thresholds = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    rows = last_block(frame)
    if rows.empty:
        return pd.DataFrame(columns=HEAD_DIAGNOSTICS_SCHEMA.names)
    head_keys = [*SOURCE_KEYS, "layer", "head", "pass", "step"]
    run_keys = [*head_keys, "prompt_id", "seed"]
    qf_keys = [*run_keys, "query_frame"]
    rows = rows.assign(
        qmin=rows.groupby(run_keys, observed=True)["query_frame"].transform("min"),
        plogp=np.where(rows["prob_mass"] > 0, -rows["prob_mass"] * np.log(rows["prob_mass"].clip(lower=1e-30)), 0.0),
        uniform=uniform_mass(rows),
    )
    per_qf = rows.groupby(qf_keys, observed=True).agg(
        plogp=("plogp", "sum"), frames=("key_frame", "size"), timestep=("timestep", "first")
    )
    per_qf["entropy_frames"] = per_qf["plogp"] / np.log(per_qf["frames"].where(per_qf["frames"] > 1))
    frame0 = (
        rows[rows["key_frame"] == 0].groupby(qf_keys, observed=True)[["prob_mass", "argmax_share", "uniform"]].sum()
    )
    recent = rows[rows["key_frame"] >= rows["qmin"] - 1].groupby(qf_keys, observed=True)[["prob_mass", "uniform"]].sum()
    per_qf = per_qf.join(
        frame0.rename(
            columns={"prob_mass": "frame0_mass", "argmax_share": "frame0_argmax_share", "uniform": "frame0_uniform"}
        )
    )
    per_qf["recent_mass"], per_qf["recent_uniform"] = recent["prob_mass"], recent["uniform"]
    per_run = per_qf.groupby(run_keys, observed=True)[
        [
            "entropy_frames",
            "frame0_mass",
            "frame0_argmax_share",
            "recent_mass",
            "timestep",
            "frame0_uniform",
            "recent_uniform",
        ]
    ].mean()
    # Frame 0 not visible: its mass is undefined, not 0.
    visible0 = rows[rows["key_frame"] == 0].groupby(run_keys, observed=True).size()
    per_run.loc[~per_run.index.isin(visible0.index), ["frame0_mass", "frame0_argmax_share", "frame0_uniform"]] = np.nan
    per_run["frame0_excess"] = per_run["frame0_mass"] - per_run["frame0_uniform"]
    # The class statistics: each run's mass over what uniform attention would give the same frames.
    per_run["frame0_ratio"] = per_run["frame0_mass"] / per_run["frame0_uniform"].where(per_run["frame0_uniform"] > 0)
    per_run["recent_ratio"] = per_run["recent_mass"] / per_run["recent_uniform"].where(per_run["recent_uniform"] > 0)
    if query_stats is not None and not query_stats.empty:
        qs = last_block(query_stats)
        qs = qs.assign(normalized=qs["entropy_tokens"] / np.log(qs["num_keys"].where(qs["num_keys"] > 1)))
        per_run["entropy_tokens"] = qs.groupby(run_keys, observed=True)["normalized"].mean()
    else:
        per_run["entropy_tokens"] = np.nan
    out = per_run.groupby(head_keys, observed=True).mean()
    out["runs"] = per_run.groupby(head_keys, observed=True).size()
    spread = per_run.groupby(head_keys, observed=True)[list(DIAGNOSTICS_RUN_STD)].std(ddof=1)
    out = out.join(spread.rename(columns=lambda name: name + RUN_STD_SUFFIX).astype(np.float64))
    profiles = rows.groupby([*head_keys, "key_frame"], observed=True)["logit_mean"].mean()
    signs, periods, powers, counts, means = [], [], [], [], []
    for key in out.index:
        profile = profiles.loc[key].sort_index().to_numpy()
        signs.append(float((profile > 0).mean()) if profile.size else np.nan)
        means.append(float(profile.mean()) if profile.size else np.nan)
        period, power = dominant_period(profile)
        periods.append(period)
        powers.append(power)
        counts.append(profile.size)
    out["sign_rate"], out["period"], out["period_power"] = signs, periods, powers
    out = out.reset_index()
    out["head_class"] = [classify_head(row, thresholds, n) for row, n in zip(out.to_dict("records"), counts)]
    out["borderline"] = out["head_class"].map(is_borderline).astype(bool)
    out["pyramid_label"] = np.array(
        [
            pyramid_label({**row, "mean_logit": m}, thresholds, n)
            for row, m, n in zip(out.to_dict("records"), means, counts)
        ],
        dtype=np.int8,
    )
    return out[HEAD_DIAGNOSTICS_SCHEMA.names]


def head_class_grid(diagnostics: pd.DataFrame, step: str | int = "last") -> pd.DataFrame:
    """Rows = layers (L1, ...), columns = heads (H1, ...), values = head_class, for one call."""
    if diagnostics.empty:
        return pd.DataFrame()
    pass_, index = resolve_step(diagnostics, step)
    chosen = diagnostics[(diagnostics["pass"] == pass_) & (diagnostics["step"] == index)]
    grid = chosen.pivot_table(index="layer", columns="head", values="head_class", aggfunc="first")
    grid.index = [f"L{layer + 1}" for layer in grid.index]
    grid.columns = [f"H{head + 1}" for head in grid.columns]
    grid.index.name = "layer"
    return grid
