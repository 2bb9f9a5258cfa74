"""One layer, every head: heads x key frames of the last block's query-averaged attention,
diverging colours centred on 0 for logits, sequential for the softmax mass, clipped to
percentiles (the clipped range on the colour bar); the query block's own frames boxed,
frames not in the KV cache grey; on softmax mass the uniform share 1 / visible frames
marked on the colour bar; the spread between runs in the caption; each row labelled with
its head's class (head_diagnostics), sink-class heads in bold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.figures.colours import (
    cell_size,
    colour_scale,
    colourbar,
    heat,
    scale_sentence,
)
from sinkscope.figures.layout import (
    finish,
    new_figure,
    set_frame_ticks,
    set_label_ticks,
)
from sinkscope.figures.marks import (
    UNIFORM_STYLE,
    nan_handle,
    outline_frames,
    own_box_handle,
    uniform_handle,
)
from sinkscope.figures.style import option
from sinkscope.figures.text import (
    METRIC_LABELS,
    METRIC_SHORT,
    frames_text,
    number,
    spread_note,
    subtitle,
)
from sinkscope.figures.views import figure4_view, head_classes, one_source, table, uniform_share
from sinkscope.naming import layer_label


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, layer: int, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "heads_heatmap"
    frame = one_source(table(tables, "frame_attention", kind), kind)
    metric, base = option(options, "metric"), int(option(options, "frame_base"))
    view = figure4_view(frame[frame["layer"] == layer], option(options, "step"), metric)
    per_head = view.curves.loc[layer]
    classes, classes_from = head_classes(tables.get("head_diagnostics"), frame[frame["layer"] == layer], view)
    heads, frames = list(per_head.index), view.frames.astype(int)
    values = per_head.to_numpy(dtype=float)
    width = min(12.0, max(6.5, 0.36 * len(frames) + 2.5))
    row = cell_size(len(heads), 1, largest=0.32, smallest=0.15, budget=7)
    given = ax is not None
    fig = ax.figure if given else new_figure(width, max(2.4, row * len(heads) + 1.0))
    ax = ax if given else fig.add_subplot()
    cmap, norm = colour_scale(values, metric)
    image = heat(ax, values, cmap, norm)
    outline_frames(ax, view.query_frames, (len(heads) - 0.5, -0.5), gid="own-block-heatmap")
    ax.set_xlim(frames[0] - 0.5, frames[-1] + 0.5)
    set_frame_ticks(ax, frames, base, length=width - 2)
    set_label_ticks(
        ax,
        [f"H{h + 1} · {classes.get((layer, int(h)), 'class n/a')}" for h in heads],
        axis="y",
        length=row * len(heads),
    )
    for tick in ax.get_yticklabels():
        tick.set_fontweight("bold" if tick.get_text().endswith(" · sink") else "normal")
    ax.set_xlabel("key frame")
    ax.set_ylabel("head")
    bar = colourbar(fig, image, values, METRIC_SHORT[metric].replace(" (", "\n("), fontsize=9, ax=ax, pad=0.02)
    uniform = uniform_share(view) if metric == "prob_mass" else None
    if uniform is not None:
        bar.ax.axhline(uniform, color="white", lw=1.6)
        bar.ax.axhline(uniform, **{**UNIFORM_STYLE, "zorder": 5})
    if given:
        ax.set_title(f"{layer_label(layer)} · {source} · {view.call}", fontsize=9)
        return fig
    missing = [f for f in frames if np.isnan(values[:, list(frames).index(f)]).all()]
    legend = [own_box_handle(view.query_frames, base)] + ([nan_handle()] if missing else [])
    if uniform is not None:
        legend.append(
            uniform_handle(f"uniform share on the colour bar: 1 / {len(view.visible)} = {number(uniform, 'prob_mass')}")
        )
    stds = [view.std(layer, head) for head in heads]
    spread = spread_note([v for s in stds if s is not None for v in s.to_numpy()], view.runs)
    return finish(
        fig,
        title=f"Layer {layer_label(layer)} (index {layer}): query frames {frames_text(view.query_frames, base)} "
        "across every head",
        subtitle=subtitle(source, view.call, METRIC_SHORT[metric], view.runs, "spread in the caption"),
        legend=legend,
        caption=f"Each cell: a head's {METRIC_LABELS[metric]} of a key frame, queries averaged over the last block "
        f"and the runs (the frame_attention column {metric}); {spread}. Rows: each head with its class "
        f"({classes_from}; bold: sink). {scale_sentence(norm)}",
    )
