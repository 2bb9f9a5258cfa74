"""How training moves the sink: for every checkpoint of the study (x: its training step
when every checkpoint has one, else the config's order), the softmax mass on frame 0 and
the normalized entropy over key frames of each layer, averaged over heads
(head_diagnostics, last block, last denoising step), and the number of heads the head
classifier calls ``sink``, stacked by layer; one row per variant. The mean over layers
carries error bars: the mean over heads of each head's std between runs
(head_diagnostics ``*_run_std``); frame-0 mass has the uniform share beside it (dashed).
The workflow draws it only for a study of two or more checkpoints."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib import colors as mcolors

from sinkscope.figures.colours import layer_colors
from sinkscope.figures.layout import finish, new_figure, set_label_ticks
from sinkscope.figures.marks import (
    UNIFORM_COLOR,
    error_bars,
    line_handle,
    spread_handle,
)
from sinkscope.figures.text import call_label, subtitle
from sinkscope.figures.views import step_of, table, variants_in
from sinkscope.naming import layer_label

METRICS = (("frame0_mass", "softmax mass on frame 0"), ("entropy_frames", "normalized entropy over key frames"))


def draw(
    tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], train_steps=None, ax=None, **_: Any
):
    kind = "attention_across_checkpoints"
    if ax is not None:
        raise ValueError(f"{kind} has several panels; it draws its own figure (leave ax out)")
    diagnostics = table(tables, "head_diagnostics", kind)
    step = options.get("step") or "last"
    parts = []
    for _, rows in diagnostics.groupby(["checkpoint", "variant"], observed=True, sort=False):
        pass_, index = step_of(rows, step)
        parts.append(rows[(rows["pass"] == pass_) & (rows["step"] == index)])
    rows = pd.concat(parts, ignore_index=True)
    found = [str(x) for x in pd.unique(rows["checkpoint"])]
    named = list(train_steps or {})
    order = [name for name in named if name in found] + [name for name in found if name not in named]
    numeric = bool(train_steps) and all(train_steps.get(name) is not None for name in order)
    if numeric:
        order.sort(key=lambda name: train_steps[name])
    x_of = {name: float(train_steps[name]) if numeric else float(i) for i, name in enumerate(order)}
    variants = variants_in(rows)
    layers = sorted(int(x) for x in rows["layer"].unique())
    colors = layer_colors(layers)
    fig = new_figure(3 * 4.4 + 0.9, len(variants) * 3.0)
    axes = fig.subplots(len(variants), 3, squeeze=False)
    means = rows.groupby(["variant", "layer", "checkpoint"], observed=True)[[m for m, _ in METRICS]].mean()
    single = len(order) < 2  # one point a line: markers only, and the legend says so
    style = "o" if single else "o-"
    runs = int(rows["runs"].max())
    spread = False
    for i, variant in enumerate(variants):
        for j, (metric, what) in enumerate(METRICS):
            ax_ = axes[i, j]
            for layer in layers:
                key = (variant, layer)
                if key not in means.droplevel("checkpoint").index:
                    continue
                series = means.loc[key][metric].reindex(order)
                xs = [x_of[name] for name in series.index]
                (line,) = ax_.plot(xs, series.to_numpy(), style, color=colors[layer], lw=1.1, ms=3, alpha=0.85)
                line.set_gid(f"{metric}-{variant}-{layer_label(layer)}")
            chosen = rows[rows["variant"] == variant]
            overall = means.loc[variant][metric].groupby("checkpoint", observed=True).mean().reindex(order)
            xs = [x_of[n] for n in overall.index]
            (line,) = ax_.plot(xs, overall.to_numpy(), "s" if single else "s-", color="black", lw=2.2, ms=4, zorder=5)
            line.set_gid(f"{metric}-{variant}-mean")
            column = f"{metric}_run_std"
            if runs >= 2 and column in chosen:
                std = chosen.groupby("checkpoint", observed=True)[column].mean().reindex(order).to_numpy(dtype=float)
                spread |= error_bars(ax_, xs, overall.to_numpy(), std, gid=f"{metric}-{variant}-mean", color="black")
            if metric == "frame0_mass" and "frame0_uniform" in chosen:
                uniform = chosen.groupby("checkpoint", observed=True)["frame0_uniform"].mean().reindex(order)
                (line,) = ax_.plot(
                    xs,
                    uniform.to_numpy(),
                    color=UNIFORM_COLOR,
                    lw=1.1,
                    marker="_" if single else "",
                    ls="none" if single else (0, (4, 2)),
                    ms=14,
                    zorder=4,
                )
                line.set_gid(f"uniform-{variant}")
            ax_.set_title(f"{variant} · {metric}" if len(variants) > 1 else metric, fontsize=9.5)
            ax_.set_ylabel(what, fontsize=8.5)
            if numeric:
                steps = [x_of[n] for n in order]
                if min(steps) > 0 and max(steps) / min(steps) >= 50:  # steps spanning decades
                    ax_.set_xscale("log")
                    ax_.minorticks_off()
                ax_.set_xticks(steps, labels=[f"{int(train_steps[n])}" for n in order])
            else:
                set_label_ticks(ax_, order, length=4.0)
            ax_.set_xlabel("training step" if numeric else "checkpoint (config order)")
            if metric == "frame0_mass":  # fitted to the data: layer means are small next to 1
                ax_.set_ylim(0, min(1.0, max(0.1, 1.25 * float(np.nanmax(ax_.dataLim.y1)))))
            else:
                ax_.set_ylim(0, 1.0)
        _sink_heads(axes[i, 2], rows[rows["variant"] == variant], order, x_of, layers, colors, numeric)
        axes[i, 2].set_title(f"{variant} · sink heads" if len(variants) > 1 else "sink heads", fontsize=9.5)
    marker_only = {"ls": "none"} if single else {}
    if len(layers) <= 8:
        legend = [line_handle(colors[layer], layer_label(layer), marker="o", ms=3, **marker_only) for layer in layers]
    else:
        legend = []
        mappable = matplotlib.cm.ScalarMappable(
            norm=mcolors.Normalize(layers[0] + 1, layers[-1] + 1),
            cmap=mcolors.ListedColormap([colors[x] for x in layers]),
        )
        fig.colorbar(mappable, ax=axes.ravel().tolist(), pad=0.02, shrink=0.85, aspect=30).set_label(
            "layer (L1 = first)"
        )
    legend.append(line_handle("black", "mean over layers", marker="s", ms=4, lw=2.2, **marker_only))
    legend.append(line_handle(UNIFORM_COLOR, "uniform share of frame 0 (1 / visible frames)", lw=1.1, ls=(0, (4, 2))))
    legend += [spread_handle("mean over heads of a head's ±1 std between runs")] if spread else []
    pass_, index = step_of(rows, step)
    return finish(
        fig,
        title="Frame-0 mass, entropy and sink heads across checkpoints",
        subtitle=subtitle(
            "every checkpoint of the study" if source in (None, "study") else source,
            call_label(pass_, index) + " of the last block",
            "head_diagnostics",
            runs,
            "error bars on the mean over layers",
        ),
        legend=legend,
        caption=(
            "Per layer, the mean over heads of frame0_mass (softmax mass of the last block's queries on frame 0; "
            "dashed: the mass uniform attention over the key tokens would give it) and entropy_frames (entropy over "
            "key frames / ln(frames)); runs averaged in head_diagnostics, error bars: the mean over heads of each "
            "head's std between runs. Sink heads: heads the head classifier calls sink (frame-0 mass at least "
            "diagnostics.sink_ratio x uniform; borderline sink? not counted), stacked by layer, the total above. "
            "Checkpoints: "
            + ", ".join(f"{n}{f' (step {int(train_steps[n])})' if numeric else ''}" for n in order)
            + "."
        ),
    )


def _sink_heads(
    ax_, rows: pd.DataFrame, order: list[str], x_of: Mapping[str, float], layers: list[int], colors, numeric: bool
) -> None:
    """Stacked bars: per checkpoint, the heads classed ``sink``, by layer; the total written above."""
    sink = rows[rows["head_class"] == "sink"]
    counts = sink.groupby(["checkpoint", "layer"], observed=True).size()
    xs = np.array([x_of[name] for name in order])
    log = numeric and xs.min() > 0 and xs.max() / xs.min() >= 50
    gaps = np.diff(np.sort(xs))
    width = 0.6 * (gaps.min() if len(gaps) and gaps.min() > 0 else 1.0)
    heads = int(rows.groupby("checkpoint", observed=True).size().max())
    totals = []
    for name, x in zip(order, xs, strict=True):
        left, span = (x / 1.2, x * (1.2 - 1 / 1.2)) if log else (x - width / 2, width)
        bottom = 0
        for layer in layers:
            n = int(counts.get((name, layer), 0))
            if n:
                bar = ax_.bar(left, n, width=span, bottom=bottom, align="edge", color=colors[layer], alpha=0.85)
                bar.patches[0].set_gid(f"sink-{name}-{layer_label(layer)}")
                bottom += n
        ax_.text(x, bottom, f"{bottom}/{heads}", ha="center", va="bottom", fontsize=7.5)
        totals.append(bottom)
    if log:
        ax_.set_xscale("log")
        ax_.minorticks_off()
    else:
        ax_.set_xlim(xs.min() - width, xs.max() + width)
    if numeric:
        ax_.set_xticks(list(xs), labels=[f"{int(x)}" for x in xs])
    else:
        set_label_ticks(ax_, order, length=4.0)
    ax_.set_xlabel("training step" if numeric else "checkpoint (config order)")
    ax_.set_ylabel("heads classed sink", fontsize=8.5)
    ax_.set_ylim(0, max(totals + [1]) * 1.3 + 0.5)
    ax_.yaxis.get_major_locator().set_params(integer=True)
