"""The words figures print: frame runs, call labels, subtitles, numbers and head names."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from sinkscope.naming import head_label

# The two statistics in the words every caption, axis and colour bar uses, each with the
# table column it is, so that a reader checks a figure against the table by name.
METRIC_LABELS = {
    "logit_mean": "mean pre-softmax logit q·k/√d (logit_mean)",
    "prob_mass": "softmax mass on the key frame (prob_mass)",
}
METRIC_SHORT = {"logit_mean": "mean logit (pre-softmax q·k/√d, logit_mean)", "prob_mass": "softmax mass (prob_mass)"}


# -- words ---------------------------------------------------------------------------------------


def runs_of(values: Iterable[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 9, 10] -> [(0, 2), (9, 10)]: the runs of consecutive integers."""
    values = sorted({int(v) for v in values})
    if not values:
        return []
    runs, start, previous = [], values[0], values[0]
    for value in values[1:]:
        if value != previous + 1:
            runs.append((start, previous))
            start = value
        previous = value
    runs.append((start, previous))
    return runs


def frames_text(frames: Iterable[int], base: int = 0) -> str:
    """[18, 19, 20] -> '18-20'; [0, 1, 2, 9, 10] -> '0-2, 9-10' (shifted by ``base``)."""
    runs = runs_of(frames)
    if not runs:
        return "none"
    return ", ".join(f"{a + base}" if a == b else f"{a + base}-{b + base}" for a, b in runs)


def timestep_text(timestep: float) -> str:
    """A model timestep as the figures print it: 833.333 -> '833', 0.25 -> '0.25'."""
    return f"{timestep:.0f}" if abs(timestep) >= 10 else f"{timestep:.3g}"


def call_label(pass_: str, step: int, timestep: float | None = None) -> str:
    """'denoising step 3 (t=250)', 'cache pass (t=0)' or 'imported call'."""
    missing = timestep is None or (isinstance(timestep, float) and math.isnan(timestep))
    t = "" if missing else f" (t={timestep_text(float(timestep))})"
    if pass_ == "cache":
        return f"cache pass{t}"
    if step < 0:
        return "imported call"
    return f"denoising step {step}{t}"


def runs_text(runs: int, spread: str | None = None) -> str:
    """'mean of n = 2 runs, bars ±1 std between runs', or 'n = 1 run: no spread between
    runs' (``spread``: how the figure shows the spread between runs)."""
    if runs < 2:
        return f"n = {runs} run{'s' if runs != 1 else ''}: no spread between runs"
    return f"mean of n = {runs} runs" + (f", {spread}" if spread else "")


def subtitle(source: str, call: str, metric: str, runs: int, spread: str | None = None) -> str:
    return " · ".join([source, call, metric, runs_text(runs, spread)])


def metric_axis_label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


def class_text(klass: str | None) -> str:
    """'sink head', 'periodic head', ...: a head is called sink only when its class is."""
    return f"{klass} head" if klass else "class n/a"


def spread_note(stds: Iterable[float], runs: int, what: str = "a cell") -> str:
    """'between-run std of a cell: median 0.012, max 0.051 (n = 2 runs)'."""
    values = np.asarray([v for v in stds if v is not None and np.isfinite(v)], dtype=float)
    if runs < 2 or not values.size:
        return f"n = {runs} run{'s' if runs != 1 else ''}: no spread between runs"
    return (
        f"between-run std of {what}: median {significant(float(np.median(values)))}, "
        f"max {significant(float(values.max()))} (n = {runs} runs)"
    )


def significant(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, without exponents for ordinary sizes."""
    if value is None or not np.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    if abs(value) >= 10**digits:
        return f"{value:.0f}"
    value = float(f"{value:.{digits}g}")  # 0.09996 -> 0.1, then printed as 0.100
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))
    return f"{value:.{decimals}f}"


def head_text(layer: int, head: int) -> str:
    return f"{head_label(layer, head)} (layer {layer}, head {head})"


def number(value: float, metric: str, signed: bool = False) -> str:
    """A statistic as the figures print it: 2 decimals for logits, 3 for masses."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    digits = 3 if metric == "prob_mass" else 2
    return f"{value:{'+' if signed else ''}.{digits}f}"


def against_mass(name: str, value: float, metric: str, frame: int, mass: float, uniform: float, base: int = 0) -> str:
    """'L5H7 +7.63 while frame 0 gets 0.005 of the softmax mass (uniform 0.048)': a first −
    middle beside its first frame's mass, for the captions that mark where they disagree."""
    return (
        f"{name} {number(value, metric, signed=True)} while frame {frame + base} gets {number(mass, 'prob_mass')} "
        f"of the softmax mass (uniform {number(uniform, 'prob_mass')})"
    )


def listed(items: list[tuple[str, str]], detailed: int = 4, most: int = 30) -> str:
    """(name, text) pairs as 'text; text; also name, name, … and N more': the first
    ``detailed`` with their text, the names of the rest up to ``most`` in all."""
    shown = "; ".join(text for _, text in items[:detailed])
    names = [name for name, _ in items[detailed:most]]
    more = len(items) - max(len(items[:most]), detailed)
    return shown + (f"; also {', '.join(names)}" if names else "") + (f", … and {more} more" if more > 0 else "")
