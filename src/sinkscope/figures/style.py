"""The figures' matplotlib style, their option defaults and the saving of SVG and PNG."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.style
from matplotlib.figure import Figure
from matplotlib.layout_engine import PlaceHolderLayoutEngine

from sinkscope.figures.layout import PAGE, settle
from sinkscope.io import atomic_path
from sinkscope.naming import parse_head_label
from sinkscope.schemafile import section_defaults

STYLE = {
    "svg.fonttype": "none",  # SVG text stays text: editable in Illustrator / Inkscape
    "svg.hashsalt": "sinkscope",  # stable element ids between runs
    "font.family": "sans-serif",
    "font.sans-serif": ["Arial", "DejaVu Sans", "Helvetica"],
    "font.size": 10,
    "axes.labelsize": 10,
    "axes.titlesize": 10.5,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "legend.fontsize": 9,
    "figure.dpi": 100,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.1,
    "axes.grid": True,
    "grid.alpha": 0.35,
    "grid.linestyle": "--",
    "image.interpolation": "nearest",
}
# What a kind draws with when its options leave a key out: the config schema's
# figures defaults (one definition, the schema file: sinkscope.schemafile).
DEFAULTS: dict[str, Any] = section_defaults("figures")


# -- style and saving --------------------------------------------------------------------------


@contextlib.contextmanager
def figure_style() -> Iterator[None]:
    # A style matplotlib ships (seaborn's look without the seaborn package, which the
    # figures do not otherwise need).
    with matplotlib.style.context("seaborn-v0_8-whitegrid"), matplotlib.rc_context(STYLE):
        yield


def save_figure(fig: Figure, svg: str | Path, png: str | Path, dpi: int = 200) -> None:
    """Write SVG and PNG atomically, without timestamps (byte-stable reruns).

    The style is applied again here: svg.fonttype is read at save time. A figure still
    under a layout engine (one drawn into a given axes, say) is settled first and saved
    with that layout held, the same in both files. Dense artists drawn with
    ``rasterized=True`` (token curves) are embedded in the SVG at ``dpi``.
    """
    engine = fig.get_layout_engine()
    with figure_style():
        if engine is not None and not isinstance(engine, PlaceHolderLayoutEngine):
            settle(fig)
            fig.set_layout_engine("none")
        # A page laid out by finish() fits its figure already: no second, "tight" layout pass.
        bbox = None if fig.get_gid() == PAGE else "tight"
        try:
            with atomic_path(svg) as tmp:
                fig.savefig(tmp, format="svg", dpi=dpi, metadata={"Date": None}, bbox_inches=bbox)
            with atomic_path(png) as tmp:
                fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": None}, bbox_inches=bbox)
        finally:
            if engine is not None:
                fig.set_layout_engine(engine)


def option(options: Mapping[str, Any], name: str) -> Any:
    value = options.get(name)
    return DEFAULTS[name] if value is None and name != "highlight_layers" else value


def heads_of(options: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """The option's heads as (paper label, 0-based layer, 0-based head)."""
    return [(label, *parse_head_label(label)) for label in option(options, "heads")]
