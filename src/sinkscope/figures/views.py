"""The data the figures draw: choosing a table's source and call, and the ``View`` of one call's
Figure 4 curves (every key frame a column, NaN where a frame is not visible)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.figures.text import call_label, number
from sinkscope.stats.summaries import (
    ALL_PROMPTS,
    block_calls,
    curve_stats,
    figure4_curves,
    head_diagnostics,
    last_block,
    resolve_step,
    runs_in,
)

# What an atlas run's name holds (sinkscope.sweeps.SEPARATOR): <sweep>/<item>.
ATLAS_RUN = "/"

VAE_TEMPORAL_STRIDE = 4


# -- selecting one source ------------------------------------------------------------------------


def table(tables: Mapping[str, pd.DataFrame], name: str, kind: str) -> pd.DataFrame:
    frame = tables.get(name)
    if frame is None:
        raise ValueError(f"figure {kind} needs the {name} table")
    if len(frame) == 0:
        raise ValueError(f"figure {kind}: the {name} table has no rows")
    return frame


def sources_in(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """The (checkpoint, variant) pairs of the table."""
    if "checkpoint" not in frame.columns:
        return []
    if "variant" not in frame.columns:
        return [(str(name), "default") for name in pd.unique(frame["checkpoint"])]
    pairs = frame.groupby(["checkpoint", "variant"], observed=True, sort=True).size().index
    return [(str(a), str(b)) for a, b in pairs]


def one_source(frame: pd.DataFrame, kind: str) -> pd.DataFrame:
    """``frame`` if it holds one (checkpoint, variant); a clear error otherwise."""
    found = sources_in(frame)
    if len(found) > 1:
        names = ", ".join(f"{c}@{v}" if v != "default" else c for c, v in sorted(found))
        raise ValueError(
            f"figure {kind} draws one checkpoint and variant; the table holds {names} "
            "(pick one: checkpoint=..., variant=...)"
        )
    return frame


def one_checkpoint(table: pd.DataFrame, kind: str) -> None:
    """Refuse a table of several checkpoints for a figure that draws one (its variants)."""
    checkpoints = sorted(str(x) for x in pd.unique(table["checkpoint"]))
    if len(checkpoints) > 1:
        raise ValueError(
            f"figure {kind} draws one checkpoint; the table holds {', '.join(checkpoints)} (checkpoint=...)"
        )


def run_averaged(rows: pd.DataFrame, kind: str) -> pd.DataFrame:
    """A variant table's (``sinkscope.pipeline.effects``) run-averaged rows (prompt_id '*'), or a table of
    one run a variant as its own average."""
    averaged = rows[rows["prompt_id"] == ALL_PROMPTS]
    if len(averaged):
        return averaged
    if (
        rows.groupby("variant", observed=True)[["prompt_id", "seed"]].apply(lambda g: len(g.drop_duplicates())).max()
        > 1
    ):
        raise ValueError(
            f"figure {kind} draws the run-averaged rows (prompt_id '*') that sinkscope.pipeline.effects "
            "writes beside the per-run rows; the table has none"
        )
    return rows.assign(runs=1)


def variants_in(frame: pd.DataFrame) -> list[str]:
    """Variants in the table's order of appearance, 'default' first; atlas runs (named
    ``<sweep>/<item>``, which the atlas figures draw) left out."""
    if "variant" not in frame.columns:
        return ["default"]
    found = [str(v) for v in pd.unique(frame["variant"]) if ATLAS_RUN not in str(v)]
    return sorted(found, key=lambda v: (v != "default", found.index(v)))


def without_atlas_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the study's variants: those of atlas runs (``<sweep>/<item>``) dropped."""
    if "variant" not in frame.columns:
        return frame
    return frame[~frame["variant"].astype(str).str.contains(ATLAS_RUN, regex=False)]


def step_of(frame: pd.DataFrame, step: str | int) -> tuple[str, int]:
    """``summaries.resolve_step`` of the rows."""
    return resolve_step(frame, step)


def run_count(frame: pd.DataFrame) -> int:
    return runs_in(frame) if {"prompt_id", "seed"} <= set(frame.columns) else 1


def last_block_calls(frame: pd.DataFrame) -> list[str | int]:
    """The calls of the last block as ``step`` options: denoising steps, then 'cache'."""
    rows = frame[frame["block"] == frame["block"].max()]
    steps = sorted(int(s) for s in set(rows.loc[rows["pass"] == "denoise", "step"]))
    calls: list[str | int] = [s for s in steps if s >= 0]
    if (rows["pass"] == "cache").any():
        calls.append("cache")
    if not calls:  # imported rows: one call, step -1
        calls = ["last"]
    return calls


def block_frames(frame: pd.DataFrame) -> dict[int, list[int]]:
    """Block -> its query frames, from the rows."""
    pairs = frame[["block", "query_frame"]].drop_duplicates()
    return {int(b): sorted(int(f) for f in g["query_frame"]) for b, g in pairs.groupby("block")}


def block_call_rows(frame: pd.DataFrame, step: str | int) -> tuple[pd.DataFrame, str]:
    """The rows of the chosen call of every block (``summaries.block_calls``) and its
    label: 'denoising step 3 (t=625) of every block', or, where blocks differ in their
    steps, 'the last denoising step of every block'."""
    rows = block_calls(frame, step)
    if rows.empty:
        raise ValueError(f"no rows of step {step!r} in any block")
    calls = rows[["pass", "step"]].drop_duplicates()
    if len(calls) == 1:
        return rows, every_block_call(rows, str(calls["pass"].iloc[0]), int(calls["step"].iloc[0]))
    if step == "cache":
        return rows, "the cache pass of every block"
    return rows, "the last denoising step of every block (blocks differ in their steps)"


def every_block_call(rows: pd.DataFrame, pass_: str, step: int) -> str:
    """'denoising step 3 (t=250) of every block', 'cache pass (t=0) of every block'."""
    chosen = rows[(rows["pass"] == pass_) & (rows["step"] == step)]
    timestep = float(chosen["timestep"].iloc[0]) if len(chosen) and "timestep" in chosen else None
    return (
        f"{call_label(pass_, step, timestep)} of every block" if step >= 0 or pass_ == "cache" else "the imported calls"
    )


def evenly(items: Sequence[Any], count: int) -> list[Any]:
    """Up to ``count`` items spread evenly, first and last included."""
    if len(items) <= count:
        return list(items)
    index = np.unique(np.round(np.linspace(0, len(items) - 1, count)).astype(int))
    return [items[i] for i in index]


# -- data views ----------------------------------------------------------------------------------


@dataclass
class View:
    """The Figure 4 view of one call (``summaries.figure4_curves``), every frame a column:
    the run-averaged curves, their uniform baselines and each run's curve."""

    curves: pd.DataFrame  # index (layer, head); columns 0..F-1; NaN = not visible
    query_frames: list[int]
    pass_: str
    step: int
    timestep: float
    runs: int
    metric: str
    uniform: pd.DataFrame | None = None  # as curves: summaries.uniform_mass averaged like the curves
    run_curves: pd.DataFrame | None = None  # index (prompt_id, seed, layer, head); columns as curves
    run_uniform: pd.DataFrame | None = None
    stats_cache: dict = field(default_factory=dict, repr=False)

    @property
    def call(self) -> str:
        return call_label(self.pass_, self.step, self.timestep)

    @property
    def frames(self) -> np.ndarray:
        return self.curves.columns.to_numpy()

    @property
    def visible(self) -> list[int]:
        return [int(f) for f in self.curves.columns[self.curves.notna().any(axis=0)]]

    def has(self, layer: int, head: int) -> bool:
        return (layer, head) in self.curves.index

    def curve(self, layer: int, head: int) -> pd.Series:
        return self.curves.loc[(layer, head)]

    def baseline(self, layer: int, head: int) -> pd.Series:
        """The uniform baseline of one head's curve (NaN where a frame is not visible)."""
        curve = self.curve(layer, head)
        if self.uniform is not None and (layer, head) in self.uniform.index:
            return self.uniform.loc[(layer, head)].where(curve.notna())
        return (curve.notna() / max(int(curve.notna().sum()), 1)).where(curve.notna())

    def stats(self, layer: int, head: int) -> dict[str, Any]:
        """``summaries.curve_stats`` of one head's curve (the head_stats row with prompt '*')."""
        key = (layer, head)
        if key not in self.stats_cache:
            values = self.curve(layer, head).to_numpy()
            self.stats_cache[key] = curve_stats(
                values, self.frames, self.query_frames, self.metric, uniform=self.baseline(layer, head).to_numpy()
            )
        return self.stats_cache[key]

    def _runs_of(self, layer: int, head: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """(curve, baseline) of each run: one head's, or the layer's head-averaged one."""
        if self.run_curves is None or self.runs < 2:
            return []
        curves = self.run_curves.xs(layer, level="layer")
        uniform = self.run_uniform.xs(layer, level="layer") if self.run_uniform is not None else None
        if head is not None:
            if head not in curves.index.get_level_values("head"):
                return []
            curves = curves.xs(head, level="head")
            uniform = uniform.xs(head, level="head") if uniform is not None else None
        else:
            curves = curves.groupby(["prompt_id", "seed"], observed=True).mean()
            uniform = uniform.groupby(["prompt_id", "seed"], observed=True).mean() if uniform is not None else None
        baselines = uniform.reindex(curves.index).to_numpy() if uniform is not None else [None] * len(curves)
        return list(zip(curves.to_numpy(dtype=float), baselines))

    def run_std(self, layer: int, head: int | None, name: str) -> float:
        """Sample std (ddof 1) between runs of statistic ``name`` of each run's curve (one
        head's, or the layer's head-averaged one with ``head=None``): head_stats /
        layer_stats ``<name>_run_std``. NaN with one run."""
        key = ("run_std", layer, head, name)
        if key not in self.stats_cache:
            values = [
                curve_stats(curve, self.frames, self.query_frames, self.metric, uniform=base)[name]
                for curve, base in self._runs_of(layer, head)
            ]
            finite = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
            self.stats_cache[key] = float(finite.std(ddof=1)) if finite.size >= 2 else float("nan")
        return self.stats_cache[key]

    def std(self, layer: int, head: int | None = None) -> pd.Series | None:
        """Per key frame, the sample std between runs of one head's curve (or of the layer's
        head-averaged curve); None with one run."""
        runs = self._runs_of(layer, head)
        if len(runs) < 2:
            return None
        return pd.Series(column_std(np.stack([curve for curve, _ in runs])), index=self.curves.columns)

    def layer_mean(self, layer: int) -> pd.Series:
        """The head-averaged curve of a layer (what layer_stats summarizes)."""
        return self.curves.loc[layer].mean(axis=0)

    def layer_baseline(self, layer: int) -> pd.Series:
        mean = self.layer_mean(layer)
        if self.uniform is not None:
            return self.uniform.loc[layer].mean(axis=0).where(mean.notna())
        return (mean.notna() / max(int(mean.notna().sum()), 1)).where(mean.notna())

    def layer_stats(self, layer: int) -> dict[str, Any]:
        return curve_stats(
            self.layer_mean(layer).to_numpy(),
            self.frames,
            self.query_frames,
            self.metric,
            uniform=self.layer_baseline(layer).to_numpy(),
        )

    @property
    def layers(self) -> list[int]:
        return sorted({int(x) for x in self.curves.index.get_level_values("layer")})

    def heads(self, layer: int) -> list[int]:
        return sorted(int(h) for h in self.curves.loc[layer].index)


def column_std(matrix: np.ndarray) -> np.ndarray:
    """Sample std (ddof 1) of each column over its finite values; NaN below two."""
    matrix = np.asarray(matrix, dtype=float)
    finite = np.isfinite(matrix)
    count = finite.sum(axis=0)
    filled = np.where(finite, matrix, 0.0)
    mean = filled.sum(axis=0) / np.maximum(count, 1)
    squares = np.where(finite, (matrix - mean) ** 2, 0.0).sum(axis=0)
    return np.where(count >= 2, np.sqrt(squares / np.maximum(count - 1, 1)), np.nan)


def layers_of(frame: pd.DataFrame, heads: Sequence[tuple[str, int, int]]) -> pd.DataFrame:
    """The rows of the layers the heads live in (or every row, when none of them is there:
    the panels then say that the layer was not extracted)."""
    rows = frame[frame["layer"].isin({layer for _, layer, _ in heads})]
    return rows if len(rows) else frame


def figure4_view(frame: pd.DataFrame, step: str | int, metric: str) -> View:
    """The last block's query-averaged curves of the chosen call, runs averaged, with their
    uniform baselines and each run's curve."""
    curves, info = figure4_curves(frame, step, metric, details=True)
    last = max([int(c) for c in curves.columns] + list(info["query_frames"]))
    columns = pd.RangeIndex(0, last + 1, name="key_frame")
    curves = curves.reindex(columns=columns)
    curves.columns.name = "key_frame"
    extra = {name: info[name].reindex(columns=columns) for name in ("uniform", "run_curves", "run_uniform")}
    return View(
        curves,
        list(info["query_frames"]),
        info["pass"],
        int(info["step"]),
        info["timestep"],
        info["runs"],
        metric,
        **extra,
    )


def mass_view(frame: pd.DataFrame, view: View) -> View:
    """The softmax-mass view of ``view``'s call (``view`` itself when it shows mass): the
    frame-0 excess over uniform is a statistic of the mass curve."""
    if view.metric == "prob_mass":
        return view
    step = "cache" if view.pass_ == "cache" else view.step
    return figure4_view(frame, step, "prob_mass")


def uniform_share(view: View) -> float | None:
    """The uniform baseline of the view's frame-level curves when it is one number (no
    dropped tokens: 1 / visible key frames, the same for every head), else None."""
    if view.uniform is None:
        return None
    values = view.uniform.to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    if not values.size or not np.allclose(values, values[0], rtol=1e-6):
        return None
    return float(values[0])


def latent_of_video_frame(video_frame: np.ndarray) -> np.ndarray:
    """Wan's causal VAE: video frame 0 -> latent 0, frames 4k-3..4k -> latent k."""
    return np.ceil(np.asarray(video_frame) / VAE_TEMPORAL_STRIDE).astype(int)


# -- head classes and what a head's title says ----------------------------------------------------


def head_classes(
    diagnostics: pd.DataFrame | None, frame: pd.DataFrame, view: View
) -> tuple[dict[tuple[int, int], str], str]:
    """Each head's ``head_class`` at the view's call, and where it comes from: the
    head_diagnostics table, or (without one) ``summaries.head_diagnostics`` of the frame
    rows at the schema's default thresholds."""
    source = "head_diagnostics"
    if diagnostics is None or diagnostics.empty:
        rows = last_block(frame)
        rows = rows[(rows["pass"] == view.pass_) & (rows["step"] == view.step)]
        diagnostics = head_diagnostics(rows) if len(rows) else None
        source = "head_diagnostics of these rows at the default thresholds"
    if diagnostics is None:
        return {}, source
    chosen = diagnostics[(diagnostics["pass"] == view.pass_) & (diagnostics["step"] == view.step)]
    classes = {(int(a), int(b)): str(k) for a, b, k in zip(chosen["layer"], chosen["head"], chosen["head_class"])}
    return classes, source


def excess_text(view: View, layer: int, head: int, *, short: bool = False, spread: bool = False) -> str:
    """'frame-0 excess +0.312' (over uniform; ``view`` shows softmax mass), ± the std
    between runs with ``spread``."""
    value = view.stats(layer, head)["frame0_excess"]
    if not np.isfinite(value):
        return "frame 0 not visible"
    text = f"{'excess' if short else 'frame-0 excess'} {number(value, 'prob_mass', signed=True)}"
    std = view.run_std(layer, head, "frame0_excess") if spread else float("nan")
    return text + (f" ± {number(std, 'prob_mass')}" if np.isfinite(std) else "")


def difference_text(view: View, layer: int, head: int) -> str:
    """'first − middle +0.29': head_stats' sink_score, in the view's metric."""
    return f"first − middle {number(view.stats(layer, head)['sink_score'], view.metric, signed=True)}"


# -- where a logit statistic and the softmax mass disagree ----------------------------------------

# A first − middle is marked as disagreeing with the softmax mass when its sign is the
# opposite of the first frame's excess over uniform and that excess is at least this share
# of the uniform baseline (a near-uniform head's ±1% says nothing either way).
DISAGREE_SHARE = 0.1


@dataclass(frozen=True)
class FirstFrameMass:
    """The softmax mass of the oldest visible cache frame (frame 0 unless evicted) beside
    what uniform attention over the key tokens gives it: head_stats / layer_stats
    ``frame0_mass`` and ``frame0_uniform`` (prob_mass rows) when that frame is frame 0."""

    frame: int
    mass: float
    uniform: float

    @property
    def excess(self) -> float:
        return self.mass - self.uniform


def first_frame_mass(mass: View, layer: int, head: int | None = None) -> FirstFrameMass:
    """One head's (or, with ``head=None``, the layer's head-averaged) first-frame mass;
    ``mass`` is a softmax-mass view (``mass_view``)."""
    stats = mass.stats(layer, head) if head is not None else mass.layer_stats(layer)
    baseline = mass.baseline(layer, head) if head is not None else mass.layer_baseline(layer)
    frame = int(stats["first_frame"])
    uniform = float(baseline.get(frame, np.nan)) if frame >= 0 else float("nan")
    return FirstFrameMass(frame, float(stats["first"]), uniform)


def disagrees(first_minus_middle: float, first: FirstFrameMass) -> bool:
    """Whether a first − middle (of logits or of mass) points the other way than the first
    frame's softmax mass against uniform: positive (red) while the frame gets less than
    uniform attention would give it, or negative (blue) while it gets more."""
    if not (np.isfinite(first_minus_middle) and np.isfinite(first.excess) and first.uniform > 0):
        return False
    if abs(first.excess) < DISAGREE_SHARE * first.uniform or first_minus_middle == 0:
        return False
    return (first_minus_middle > 0) != (first.excess > 0)
