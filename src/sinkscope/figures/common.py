"""What every figure shares, re-exported from the modules that hold it: ``style`` (style,
option defaults, saving), ``text`` (words), ``views`` (the data), ``layout`` (the page and its
panels), ``colours`` (palette, colour scales, heat maps), ``marks`` (axis marks, legend handles).

The figure modules import those directly, so that a changed concern reruns only the figures
that use it; ``from sinkscope.figures.common import X`` keeps working for every name here.

The page of a figure, top to bottom: a bold title, a subtitle (source · call · metric ·
runs averaged), a legend strip, the panels, a caption. Title, subtitle and caption are
wrapped to the figure's width by measuring them, and the panels are laid out by
matplotlib's constrained layout inside what is left, so nothing overlaps at any size.

Every number a figure prints comes from ``sinkscope.stats.summaries``; the views here only
select and reindex what it returns (every key frame 0..F-1 becomes a column, NaN where
a frame is not visible, so bars are missing and lines break there).

Figures are ``matplotlib.figure.Figure`` objects with an Agg canvas, never pyplot
figures: the pipeline keeps no global state and a notebook's backend is left alone.
"""

# ruff: noqa: F401 - every name is a re-export

from __future__ import annotations

# What this module imported before the split, still reachable as common.<name>.
import contextlib
import math
import textwrap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.style
import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.layout_engine import PlaceHolderLayoutEngine
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FixedLocator

from sinkscope.figures.colours import (
    CLASS_COLORS,
    CLIP_FROM,
    CLIP_PERCENTILES,
    GAP_COLOR,
    NAN_COLOR,
    OWN_COLOR,
    OWN_EDGE,
    PANEL_COLORS,
    annotate_cells,
    cell_size,
    class_cmap,
    clip_note,
    colour_range,
    colour_scale,
    colourbar,
    darker,
    heat,
    layer_colors,
)
from sinkscope.figures.layout import (
    _PAD,
    CAPTION_SIZE,
    PAGE,
    SUBTITLE_SIZE,
    TITLE_SIZE,
    _legend_columns,
    _overlapping,
    _positions,
    _text_size,
    declutter,
    finish,
    freeze,
    message_panel,
    new_figure,
    outer_labels,
    outer_ticks,
    panel_columns,
    panel_grid,
    panels,
    set_frame_ticks,
    set_label_ticks,
    settle,
    share_y,
    tick_step,
    wrap,
)
from sinkscope.figures.marks import (
    SPREAD_COLOR,
    UNIFORM_COLOR,
    UNIFORM_STYLE,
    annotate_max,
    band_handle,
    bars,
    curve_panel,
    error_bars,
    gap_handle,
    headroom,
    line_handle,
    mark_gaps,
    mark_own,
    nan_handle,
    outline_frames,
    own_box_handle,
    own_handle,
    own_label,
    spread_handle,
    uniform_handle,
    uniform_label,
    uniform_steps,
)
from sinkscope.figures.style import (
    DEFAULTS,
    STYLE,
    figure_style,
    heads_of,
    option,
    save_figure,
)
from sinkscope.figures.text import (
    METRIC_LABELS,
    METRIC_SHORT,
    call_label,
    class_text,
    frames_text,
    head_text,
    metric_axis_label,
    number,
    runs_of,
    runs_text,
    significant,
    spread_note,
    subtitle,
    timestep_text,
)
from sinkscope.figures.views import (
    VAE_TEMPORAL_STRIDE,
    View,
    block_call_rows,
    block_frames,
    column_std,
    difference_text,
    evenly,
    every_block_call,
    excess_text,
    figure4_view,
    head_classes,
    last_block_calls,
    latent_of_video_frame,
    layers_of,
    mass_view,
    one_checkpoint,
    one_source,
    run_count,
    sources_in,
    step_of,
    table,
    uniform_share,
    variants_in,
)
from sinkscope.io import atomic_path
from sinkscope.naming import head_label, layer_label, parse_head_label
from sinkscope.schema import schema_defaults
from sinkscope.stats.summaries import (
    block_calls,
    curve_stats,
    figure4_curves,
    head_diagnostics,
    last_block,
    resolve_step,
    runs_in,
)
