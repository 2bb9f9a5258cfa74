"""Figures: every kind drawn from synthetic tables at the demo's, the 1.3B's and the 14B's
sizes, with layout checks (sizes, overlapping texts, legends over data, titles that fit),
editable SVG text, own-block marking, broken lines at gaps, the summaries' numbers,
byte-identical reruns, and the pipeline job on real Parquet files."""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib import colors as mcolors
from synthetic import synthetic_atlas, synthetic_effects

from sinkscope import figures
from sinkscope.errors import DamagedFileError
from sinkscope.figures import colours
from sinkscope.figures.colours import colour_scale
from sinkscope.figures.registry import FIGURES
from sinkscope.figures.style import DEFAULTS
from sinkscope.figures.text import call_label, frames_text, significant
from sinkscope.figures.views import figure4_view
from sinkscope.manifests import DATASET_MANIFEST, write_manifest
from sinkscope.naming import head_label, parse_head_label
from sinkscope.stats import summaries
from sinkscope.tables import ALL_PROMPTS, SCHEMAS, write_table
from sinkscope.tokens import token_lists

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = (1000, 750, 500, 250)

# -- synthetic tables ------------------------------------------------------------------------------


def head_kind(layer: int, head: int) -> str:
    """A fixed mix of head behaviours: sink heads (L1H1 among them), local, periodic, diffuse."""
    return ("sink", "local", "periodic", "diffuse")[(layer * 5 + head * 3) % 4]


def synthetic_frames(
    layers: int,
    heads: int,
    *,
    frames: int = 21,
    per_block: int = 3,
    steps: tuple[int, ...] = STEPS,
    runs: tuple[tuple[str, int], ...] = (("eagle", 0), ("city", 0)),
    checkpoint: str = "demo",
    variant: str = "default",
    window: int | None = None,
    sinks: int = 0,
    tokens: int = 24,
    switch_block: int | None = None,
) -> pd.DataFrame:
    """frame_attention rows of a block-causal generation: every block, every call (the
    denoising steps and the cache pass), every head; a sliding ``window`` (frames,
    own block included) keeps the first ``sinks`` frames, so later blocks see gaps. With
    ``switch_block`` the first run's prompt switches there (prompt_segment 1 from it on)."""
    rng = np.random.default_rng(layers * 1000 + heads + (window or 0) + sinks)
    structure = []  # (block, pass, step, timestep, query_frame, key_frame)
    calls = [("denoise", i, float(t)) for i, t in enumerate(steps)] + [("cache", len(steps), 0.0)]
    for block in range(frames // per_block):
        own = list(range(block * per_block, (block + 1) * per_block))
        visible = [k for k in range(own[-1] + 1) if window is None or k > own[-1] - window or k < sinks]
        for pass_, step, t in calls:
            for q in own:
                structure += [(block, pass_, step, t, q, k) for k in visible]
    base = pd.DataFrame(structure, columns=["block", "pass", "step", "timestep", "query_frame", "key_frame"])
    lh = np.array([(layer, head) for layer in range(layers) for head in range(heads)])
    kinds = np.array([("sink", "local", "periodic", "diffuse").index(head_kind(a, b)) for a, b in lh])
    parts = []
    for run_index, (prompt, seed) in enumerate(runs):
        n, m = len(base), len(lh)
        k = np.tile(base["key_frame"].to_numpy(), m)
        q = np.tile(base["query_frame"].to_numpy(), m)
        step = np.tile(base["step"].to_numpy(), m)
        kind = np.repeat(kinds, n)
        scale = np.repeat(1.0 + 0.05 * lh[:, 0], n)
        logit = (
            np.select(
                [kind == 0, kind == 1, kind == 2],
                [1.0 + 4.5 * (k == 0) + 1.5 * (k < sinks), 3.0 - 0.35 * (q - k), 2.0 * np.cos(2 * np.pi * k / 6)],
                0.3 * np.sin(k),
            )
            * scale
            + 0.15 * step / len(steps)
            + rng.normal(0, 0.08, n * m)
            + 0.05 * run_index
        )
        rows = pd.DataFrame(
            {
                "checkpoint": checkpoint,
                "variant": variant,
                "prompt_id": prompt,
                "seed": seed,
                "layer": np.repeat(lh[:, 0], n),
                "head": np.repeat(lh[:, 1], n),
                **{
                    c: np.tile(base[c].to_numpy(), m)
                    for c in ["block", "pass", "step", "timestep", "query_frame", "key_frame"]
                },
                "logit_mean": logit,
            }
        )
        call = ["layer", "head", "block", "pass", "step", "query_frame"]
        peak = rows.groupby(call, sort=False)["logit_mean"].transform("max")
        weight = np.exp(rows["logit_mean"] - peak)
        rows["prob_mass"] = weight / weight.groupby([rows[c] for c in call]).transform("sum")
        sharp = np.exp(4 * (rows["logit_mean"] - peak))
        rows["argmax_share"] = sharp / sharp.groupby([rows[c] for c in call]).transform("sum")
        rows["key_tokens"] = tokens
        rows["key_position_shift"] = 0
        switched = switch_block is not None and run_index == 0
        rows["prompt_segment"] = (rows["block"] >= switch_block).astype("int16") if switched else np.int16(0)
        parts.append(rows)
    frame = pd.concat(parts, ignore_index=True)
    return frame.astype(
        {
            "logit_mean": "float32",
            "prob_mass": "float32",
            "argmax_share": "float32",
            "layer": "int16",
            "head": "int16",
            "block": "int16",
            "step": "int16",
            "timestep": "float32",
            "query_frame": "int16",
            "key_frame": "int16",
            "key_tokens": "int32",
            "key_position_shift": "int32",
            "prompt_segment": "int16",
        }
    )


def synthetic_queries(frame: pd.DataFrame, tokens: int) -> pd.DataFrame:
    keys = [c for c in SCHEMAS["query_stats"].names if c in frame.columns]
    p = frame["prob_mass"].clip(lower=1e-12)
    rows = (
        frame.assign(plogp=-p * np.log(p))
        .groupby(keys, observed=True)
        .agg(entropy=("plogp", "sum"), num_key_frames=("key_frame", "size"))
        .reset_index()
    )
    rows["num_keys"] = rows["num_key_frames"] * tokens
    rows["entropy_tokens"] = rows["entropy"] + 0.8 * np.log(tokens)
    return rows.drop(columns="entropy")


def synthetic_tokens(frame: pd.DataFrame, heads: list[tuple[int, int]], grid: tuple[int, int]) -> pd.DataFrame:
    """token_profiles of the last block's calls for ``heads``: each frame's tokens spread
    around its frame value (mean = logit_mean, sum = prob_mass) with a blob in the picture."""
    rows, cols = grid
    n = rows * cols
    yy, xx = np.divmod(np.arange(n), cols)
    last = frame[frame["block"] == frame["block"].max()]
    wanted = pd.MultiIndex.from_tuples(heads, names=["layer", "head"])
    last = last[pd.MultiIndex.from_frame(last[["layer", "head"]].astype(int)).isin(wanted)]
    keys = [
        "checkpoint",
        "variant",
        "prompt_id",
        "seed",
        "layer",
        "head",
        "block",
        "pass",
        "step",
        "timestep",
        "prompt_segment",
        "key_frame",
    ]
    per_frame = last.groupby(keys, observed=True)[["logit_mean", "prob_mass"]].mean().reset_index()
    out = []
    for record in per_frame.to_dict("records"):
        k = record["key_frame"]
        cy, cx = (k * 7) % rows, (k * 11 + record["head"] * 5) % cols
        blob = np.exp(-(((yy - cy) / max(rows / 5, 1)) ** 2 + ((xx - cx) / max(cols / 5, 1)) ** 2))
        pattern = 2.0 * blob + 0.2 * np.sin(xx / 3.0)
        logits = record["logit_mean"] + pattern - pattern.mean()
        weight = np.exp(pattern)
        out.append(
            pd.DataFrame(
                {
                    **{c: record[c] for c in keys},
                    "token": np.arange(n),
                    "token_logit_mean": logits,
                    "token_prob_mean": record["prob_mass"] * weight / weight.sum(),
                }
            )
        )
    table = pd.concat(out, ignore_index=True)
    return table.astype({"token": "int32", "token_logit_mean": "float32", "token_prob_mean": "float32"})


def synthetic_contact_frames(frames: int = 6, shape: tuple[int, int] = (16, 24)) -> pd.DataFrame:
    """The contact sheet's frames table: two variants of one run, an image a frame (a
    gradient that moves with the frame, the variant's brighter)."""
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    rows = []
    for shift, variant in enumerate(("default", "sink")):
        for frame in range(frames):
            image = np.stack([(xx * 10 + frame * 20) % 256, (yy * 12) % 256, np.full(shape, 60 + 80 * shift)], axis=-1)
            rows.append(
                {
                    "checkpoint": "demo",
                    "variant": variant,
                    "prompt_id": "eagle",
                    "seed": 0,
                    "frame": frame,
                    "image": image.astype(np.uint8),
                    "unit": "latent",
                }
            )
    return pd.DataFrame(rows)


SIZES = {
    # name: (layers, heads, latent patch grid, denoising steps, runs)
    "demo": (6, 12, (4, 6), STEPS, (("eagle", 0), ("city", 0))),
    "wan1.3b": (30, 12, (30, 52), STEPS, (("eagle", 0),)),
    "wan14b": (40, 40, (30, 52), (1000, 500), (("eagle", 0),)),
}


@cache
def study(size: str, window: int | None = None, sinks: int = 0) -> dict[str, pd.DataFrame]:
    """Every table a figure reads, for one source at ``size`` (and a sliding-window variant
    of the same checkpoint for the checkpoint figures)."""
    layers, heads, grid, steps, runs = SIZES[size]
    tokens = grid[0] * grid[1]
    frame = synthetic_frames(layers, heads, steps=steps, runs=runs, window=window, sinks=sinks, tokens=tokens)
    token_heads = [(0, 0), (min(4, layers - 1), min(9, heads - 1))]
    # The checkpoint figures' variants: the same runs, the first prompt switching at block 4.
    both = pd.concat(
        [
            synthetic_frames(
                layers, heads, steps=steps, runs=runs, window=window, sinks=sinks, tokens=tokens, switch_block=4
            ),
            synthetic_frames(
                layers, heads, steps=steps, runs=runs, window=12, sinks=3, variant="sink", tokens=tokens, switch_block=4
            ),
        ],
        ignore_index=True,
    )
    queries = synthetic_queries(frame, tokens)
    last = frame["block"] == frame["block"].max()  # all head_diagnostics reads (and 4x faster)
    diagnostics = summaries.head_diagnostics(frame[last], queries[queries["block"] == frame["block"].max()])
    return {
        "frame_attention": frame,
        "token_profiles": synthetic_tokens(frame, token_heads, grid),
        "head_diagnostics": diagnostics,
        "block_stats": summaries.block_stats(both, {"default": 0, "sink": 3}),
        "variants": both,
        "variants_diagnostics": summaries.head_diagnostics(both[both["block"] == both["block"].max()]),
        # The paired effects of three edited variants against the default run (checkpoint figures).
        **synthetic_effects(layers, heads, runs=runs, checkpoint="demo"),
        # The atlases of four sweeps (every head, every layer, every cached frame, a pruning curve).
        **synthetic_atlas(layers, heads, runs=runs, checkpoint="demo"),
        "grid": grid,
        "frames": synthetic_contact_frames(),
        "diagnostics_all": pd.concat(
            [
                diagnostics,
                diagnostics.assign(
                    checkpoint="step2000",
                    frame0_mass=diagnostics["frame0_mass"] * 1.5,
                    entropy_frames=diagnostics["entropy_frames"] * 0.8,
                ),
                diagnostics.assign(checkpoint="step500", frame0_mass=diagnostics["frame0_mass"] * 0.5),
            ],
            ignore_index=True,
        ),
    }


# -- layout checks ---------------------------------------------------------------------------------

MAX_SIZE = (20.0, 30.0)  # inches: a page, or two
MIN_PANEL = (1.0, 0.6)  # inches a data panel needs to be read


def _drawn_ticks(axis):
    """The tick labels matplotlib draws: those inside the view interval."""
    lo, hi = sorted(axis.get_view_interval())
    tolerance = (hi - lo) * 1e-6
    return [
        tick.label1
        for tick in axis.get_major_ticks()[: len(axis.get_majorticklocs())]
        if lo - tolerance <= tick.get_loc() <= hi + tolerance and tick.label1.get_visible()
    ]


def _texts(fig):
    """(kind, owner, Text) of every visible, non-empty text of the figure."""
    found = []
    for text in fig.texts:
        found.append(("page", None, text))
    for legend in fig.legends:
        found += [("legend", legend, t) for t in legend.get_texts()]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for text in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label):
            found.append(("label", ax, text))
        found += [("xtick", ax, t) for t in _drawn_ticks(ax.xaxis)]
        found += [("ytick", ax, t) for t in _drawn_ticks(ax.yaxis)]
        found += [("annotation", ax, t) for t in ax.texts]
        if ax.get_legend() is not None:
            found += [("legend", ax.get_legend(), t) for t in ax.get_legend().get_texts()]
    return [(kind, owner, t) for kind, owner, t in found if t.get_visible() and t.get_text().strip()]


def _overlap(a, b, pad=0.5) -> bool:
    return a.x0 + pad < b.x1 and b.x0 + pad < a.x1 and a.y0 + pad < b.y1 and b.y0 + pad < a.y1


def layout_problems(fig) -> list[str]:
    """What makes the figure hard to read: its size, overlapping texts, legends over data
    panels, texts outside the page, panels too small."""
    problems = []
    width, height = fig.get_size_inches()
    if width > MAX_SIZE[0] or height > MAX_SIZE[1]:
        problems.append(f"figure is {width:.1f} x {height:.1f} in, more than {MAX_SIZE}")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    texts = [(kind, owner, t, t.get_window_extent(renderer)) for kind, owner, t in _texts(fig)]
    for kind, _, text, box in texts:
        if box.x0 < page.x0 - 1 or box.x1 > page.x1 + 1 or box.y0 < page.y0 - 1 or box.y1 > page.y1 + 1:
            problems.append(f"{kind} {text.get_text()!r} leaves the page")
    for i, (kind_a, owner_a, a, box_a) in enumerate(texts):
        for kind_b, owner_b, b, box_b in texts[i + 1 :]:
            if kind_a == kind_b == "legend" and owner_a is owner_b:
                continue
            if _overlap(box_a, box_b):
                problems.append(f"{kind_a} {a.get_text()!r} overlaps {kind_b} {b.get_text()!r}")
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    for legend in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]:
        box = legend.get_window_extent(renderer)
        for ax in panels:
            if ax.get_legend() is legend:
                continue
            if _overlap(box, ax.get_window_extent(renderer), pad=1):
                problems.append(f"a legend overlaps the panel {ax.get_title()!r}")
    for i, a in enumerate(fig.axes):
        for b in fig.axes[i + 1 :]:
            if not (a.get_visible() and b.get_visible()):
                continue
            if _overlap(a.get_window_extent(renderer), b.get_window_extent(renderer), pad=1):
                problems.append(f"panels {a.get_title()!r} and {b.get_title()!r} overlap")
    for ax in panels:
        box = ax.get_window_extent(renderer)
        if box.width / fig.dpi < MIN_PANEL[0] or box.height / fig.dpi < MIN_PANEL[1]:
            problems.append(f"panel {ax.get_title()!r} is {box.width / fig.dpi:.2f} x {box.height / fig.dpi:.2f} in")
    return problems


def unlabelled_axes(fig) -> list[str]:
    """Axes a reader cannot name: a data panel's x axis needs a label on a panel of its
    column, its y axis one on a panel of its row (grids label their outer panels); every
    colour bar needs a label."""
    problems = []
    visible = [ax for ax in fig.axes if ax.get_visible()]
    panels = [ax for ax in visible if ax.get_label() != "<colorbar>"]
    for ax in visible:
        if ax.get_label() == "<colorbar>" and not (ax.get_ylabel() or ax.get_xlabel()):
            problems.append("a colour bar without a label")
    for ax in panels:
        spec = ax.get_subplotspec()
        if not ax.has_data():  # a message panel ("was not extracted")
            continue
        column = [
            o
            for o in panels
            if spec is not None and o.get_subplotspec() is not None and o.get_subplotspec().colspan == spec.colspan
        ] or [ax]
        row = [
            o
            for o in panels
            if spec is not None
            and o.get_subplotspec() is not None
            and o.get_subplotspec().get_gridspec() is spec.get_gridspec()
            and o.get_subplotspec().rowspan == spec.rowspan
        ] or [ax]
        if not any(o.get_xlabel() for o in column):
            problems.append(f"the x axis of {ax.get_title()!r} has no label")
        if not any(o.get_ylabel() for o in row):
            problems.append(f"the y axis of {ax.get_title()!r} has no label")
    return problems


# -- rendering every kind at every size ------------------------------------------------------------

# Kinds that mark the query block's own frames (a span or a box with an 'own-block' id).
MARKS_OWN = {
    "figure4",
    "figure4_tokens",
    "figure4_steps",
    "layer_comparison",
    "attention_over_time",
    "per_head_grid",
    "heads_heatmap",
    "query_key_maps",
    "policy_comparison",
}


# Redrawn from scratch and compared byte for byte: one of each way of drawing (bars and
# lines, rasterized token curves, images with masks and alpha).
RERUN = {"figure4", "figure4_tokens", "attention_over_time"}


def tables_for(kind: str, data: dict) -> dict[str, pd.DataFrame]:
    """What the workflow hands the kind: its tables and the ones it uses (head classes)."""
    if FIGURES[kind].scope == "checkpoint":
        return {
            "frame_attention": data["variants"],
            "block_stats": data["block_stats"],
            "head_diagnostics": data["variants_diagnostics"],
            "variant_effects": data["variant_effects"],
            "variant_head_effects": data["variant_head_effects"],
        }
    if FIGURES[kind].scope == "study":
        return {"head_diagnostics": data["diagnostics_all"]}
    if FIGURES[kind].scope == "sweep":
        return {name: data[name] for name in FIGURES[kind].tables}
    if FIGURES[kind].scope == "run":  # the contact sheet: images, not tables
        return {"frames": data["frames"]}
    tables = {name: data[name] for name in ("frame_attention", "token_profiles", "head_diagnostics")}
    if FIGURES[kind].needs_reference_labels:  # the config's label file: codes cycling over the heads
        heads = data["head_diagnostics"][["layer", "head"]].drop_duplicates()
        tables["reference_labels"] = heads.assign(reference=[(-1, 1, 2)[(a + b) % 3] for a, b in heads.to_numpy()])
    return tables


def render(kind: str, size: str = "demo", options: dict | None = None, data: dict | None = None, **kwargs):
    data = data or study(size)
    layer = 0 if FIGURES[kind].scope == "layer" else None
    return figures.draw(
        kind,
        tables_for(kind, data),
        source="demo",
        layer=layer,
        options={"dpi": 40, **(options or {})},
        grid=data["grid"],
        train_steps={"demo": 1000, "step2000": 2000, "step500": 500},
        **kwargs,
    )


@cache
def demo_figure(kind: str):
    """The demo's figure of ``kind`` with default options, drawn once for the tests that
    only look at it."""
    return render(kind)


def saved(fig, tmp_path: Path, name: str, dpi: int = 40) -> tuple[str, bytes]:
    svg, png = tmp_path / f"{name}.svg", tmp_path / f"{name}.png"
    figures.save_figure(fig, svg, png, dpi=dpi)
    return svg.read_text(), png.read_bytes()


def page_text(svg: str, gid: str) -> str:
    """The text of the page element ``gid`` (title, subtitle, caption) in the SVG."""
    root = ET.fromstring(svg)
    for element in root.iter():
        if element.get("id") == gid:
            return " ".join(t.strip() for t in element.itertext() if t.strip())
    return ""


# The demo size runs in the fast subset; the real model sizes (seconds a figure) are slow.
@pytest.mark.parametrize(
    "size", [size if size == "demo" else pytest.param(size, marks=pytest.mark.slow) for size in SIZES]
)
@pytest.mark.parametrize("kind", list(figures.KINDS))
def test_every_kind_renders_legibly_at_every_size(kind, size, tmp_path):
    """Drawn (Agg) and checked at every size; written as SVG and PNG, and redrawn for
    byte identity, at the demo's (the files do not depend on the size)."""
    fig = demo_figure(kind) if size == "demo" else render(kind, size)
    assert layout_problems(fig) == []
    subtitle = " ".join(next(t.get_text() for t in fig.texts if t.get_gid() == "page-subtitle").split())
    assert re.search(r"n = \d+ runs?", subtitle) and ("demo" in subtitle or "checkpoint" in subtitle), subtitle
    assert unlabelled_axes(fig) == []
    if kind in MARKS_OWN:
        assert any((a.get_gid() or "").startswith("own-block") for ax in fig.axes for a in ax.get_children())
    if size != "demo":
        return
    svg, png = saved(fig, tmp_path, f"{size}-{kind}")
    ET.fromstring(svg)  # well-formed
    assert svg.count("<text") >= 5 and "font-family" in svg  # text stays text (svg.fonttype none)
    assert png[:8] == PNG_MAGIC
    assert page_text(svg, "page-subtitle") == subtitle
    if kind in MARKS_OWN:
        assert 'id="own-block' in svg
    if kind in RERUN:  # a rerun draws the same bytes (no timestamps, stable ids)
        assert saved(render(kind, size), tmp_path, f"{size}-{kind}-again") == (svg, png)


# -- what the figures say ----------------------------------------------------------------------------


@cache
def demo_head_stats() -> pd.DataFrame:
    return summaries.head_stats(study("demo")["frame_attention"])


def head_stats_rows(metric: str) -> pd.DataFrame:
    """The demo's run-averaged head_stats rows of the last denoising step (what the summary
    page shows)."""
    stats = demo_head_stats()
    pass_, step = summaries.resolve_step(stats, "last")
    return stats[
        (stats["prompt_id"] == ALL_PROMPTS)
        & (stats["metric"] == metric)
        & (stats["pass"] == pass_)
        & (stats["step"] == step)
    ].set_index(["layer", "head"])


def classes_of(diagnostics: pd.DataFrame, pass_: str = "denoise", step: int = 3) -> dict[tuple[int, int], str]:
    chosen = diagnostics[(diagnostics["pass"] == pass_) & (diagnostics["step"] == step)]
    return {(int(a), int(b)): k for a, b, k in zip(chosen["layer"], chosen["head"], chosen["head_class"])}


HEAD_TITLE = re.compile(
    r"(L\d+H\d+) \(layer \d+, head \d+\) · (\w+) head\n"
    r"frame-0 excess ([+-]\d+\.\d{3})(?: ± (\d+\.\d{3}))? · first − middle ([+-]\d+\.\d+)"
)


@pytest.mark.parametrize("metric", ["logit_mean", "prob_mass"])
@pytest.mark.parametrize("kind", ["figure4", "figure4_tokens"])
def test_head_titles_print_the_tables_numbers(kind, metric, tmp_path):
    """Each head's title: its class (head_diagnostics), frame-0 excess ± its std between
    runs (head_stats, prob_mass rows) and first − middle (head_stats sink_score of the
    metric), read back from the SVG and compared with the tables of the same rows."""
    data = study("demo")
    heads = ["L1H1", "L5H10"] if kind == "figure4_tokens" else ["L1H1", "L5H10", "L2H3"]
    fig = render(kind, options={"metric": metric, "heads": heads})
    svg, _ = saved(fig, tmp_path, kind)
    texts = [
        " ".join(t.strip() for t in e.itertext()) for e in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")
    ]
    mass, shown = head_stats_rows("prob_mass"), head_stats_rows(metric)
    classes = classes_of(data["head_diagnostics"])
    digits = 3 if metric == "prob_mass" else 2
    found = [HEAD_TITLE.fullmatch(ax.get_title()) for ax in fig.axes if ax.get_title()]
    assert len([m for m in found if m]) == len(heads), [ax.get_title() for ax in fig.axes]
    for match in filter(None, found):
        label, klass, excess, std, difference = match.groups()
        layer, head = parse_head_label(label)
        assert klass == classes[(layer, head)]
        assert excess == f"{mass.loc[(layer, head), 'frame0_excess']:+.3f}"
        assert std == f"{mass.loc[(layer, head), 'frame0_excess_run_std']:.3f}"  # two runs: a spread
        assert difference == f"{shown.loc[(layer, head), 'sink_score']:+.{digits}f}"
        assert any(excess in t for t in texts) and any(difference in t for t in texts)  # the file says the same
        if kind == "figure4":
            assert f"max@{int(shown.loc[(layer, head), 'argmax_frame'])}<" in svg


def test_small_panel_titles_print_the_tables_numbers():
    """per_head_grid, figure4_steps and policy_comparison: class and frame-0 excess of
    every panel against head_stats and head_diagnostics of the same rows."""
    data = study("demo")
    mass = head_stats_rows("prob_mass")
    classes = classes_of(data["head_diagnostics"])
    titles = [ax.get_title() for ax in demo_figure("per_head_grid").axes if ax.get_title()]
    assert len(titles) == 12
    for title in titles:
        head, klass, excess = re.fullmatch(r"H(\d+) · (\w+)\nexcess ([+-]\d\.\d{3})", title).groups()
        assert klass == classes[(0, int(head) - 1)]
        assert excess == f"{mass.loc[(0, int(head) - 1), 'frame0_excess']:+.3f}"
    # Every call of figure4_steps: the head_stats rows of that call.
    stats = demo_head_stats()
    for title in (ax.get_title() for ax in demo_figure("figure4_steps").axes):
        label, call, klass, excess = re.fullmatch(
            r"(L\d+H\d+) · (.+) · (\w+) head\nframe-0 excess ([+-]\d\.\d{3})"
            r" · max@\d+",
            title,
        ).groups()
        layer, head = parse_head_label(label)
        pass_, step = ("cache", 4) if call.startswith("cache") else ("denoise", int(call.split()[1]))
        row = stats[
            (stats["prompt_id"] == ALL_PROMPTS)
            & (stats["metric"] == "prob_mass")
            & (stats["pass"] == pass_)
            & (stats["step"] == step)
            & (stats["layer"] == layer)
            & (stats["head"] == head)
        ]
        assert excess == f"{row['frame0_excess'].item():+.3f}"
        assert klass == classes_of(data["head_diagnostics"], pass_, step)[(layer, head)]
    # policy_comparison: each variant's own rows and classes.
    variants = data["variants"]
    for title in (ax.get_title() for ax in demo_figure("policy_comparison").axes if ax.get_title()):
        variant, label, klass, excess = re.fullmatch(
            r"variant '(\w+)' · (L\d+H\d+) · (\w+) head\nframe-0 excess "
            r"([+-]\d\.\d{3}) · max@\d+",
            title,
        ).groups()
        layer, head = parse_head_label(label)
        rows = summaries.head_stats(variants[(variants["variant"] == variant) & (variants["layer"] == layer)])
        row = rows[
            (rows["prompt_id"] == ALL_PROMPTS)
            & (rows["metric"] == "prob_mass")
            & (rows["pass"] == "denoise")
            & (rows["step"] == 3)
            & (rows["head"] == head)
        ]
        assert excess == f"{row['frame0_excess'].item():+.3f}"
        diagnostics = data["variants_diagnostics"]
        assert klass == classes_of(diagnostics[diagnostics["variant"] == variant])[(layer, head)]


HEAD_NAMED = re.compile(r"\b(L\d+H\d+|H\d+)\b")


@pytest.mark.parametrize(
    "kind",
    [
        "figure4",
        "figure4_tokens",
        "figure4_steps",
        "key_frame_maps",
        "per_head_grid",
        "policy_comparison",
        "sink_score_overview",
    ],
)
def test_no_title_calls_a_head_a_sink_unless_its_class_is_sink(kind):
    """ "sink" in a head's title only for a head whose head_class is sink; and the demo's
    heads include sink-class ones, which are called so."""
    data = study("demo")
    fig = demo_figure(kind)
    said = 0
    for ax in fig.axes:
        title = ax.get_title()
        names = HEAD_NAMED.findall(title)
        if not names:
            continue
        name = names[0]
        layer = 0 if kind == "per_head_grid" and not name.startswith("L") else int(name[1 : name.index("H")]) - 1
        head = int(name[name.index("H") + 1 :]) - 1
        variant = "default"
        if kind == "policy_comparison":  # "variant 'sink' · L1H1 · ...": the variant's name is no claim about the head
            variant = title.split("'")[1]
            title = title.split(" · ", 1)[1]
        diagnostics = data["variants_diagnostics"] if kind == "policy_comparison" else data["head_diagnostics"]
        call = title.split(" · ")[1] if kind == "figure4_steps" else "step 3"
        pass_, step = ("cache", 4) if call.startswith("cache") else ("denoise", int(call.split()[1]))
        klass = classes_of(diagnostics[diagnostics["variant"] == variant], pass_, step).get((layer, head))
        if "sink" in title.lower():
            assert klass == "sink" or (klass == "sink?" and "sink?" in title), (title, klass)
            said += 1
    assert said or kind == "sink_score_overview"
    if kind == "sink_score_overview":  # the sink-class heads are outlined, and only they
        outlined = {a.get_gid() for a in fig.axes[0].patches if (a.get_gid() or "").startswith("sink-head-")}
        expected = {
            f"sink-head-{head_label(a, b)}" for (a, b), k in classes_of(data["head_diagnostics"]).items() if k == "sink"
        }
        assert outlined == expected and expected


def test_uniform_baselines_are_one_over_the_visible_frames(tmp_path):
    """The dashed uniform line of a mass figure against a hand computation: 1 / 21 key
    frames in the demo's last block; with half of frame 5's tokens dropped, frame 5 gets
    12 / (20 x 24 + 12) and every other frame 24 / (20 x 24 + 12)."""
    frame = study("demo")["frame_attention"]
    fig = render("figure4", options={"metric": "prob_mass", "heads": ["L1H1"]})
    (line,) = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "uniform-L1H1"]
    y = np.asarray(line.get_ydata(), dtype=float)
    assert np.allclose(y[np.isfinite(y)], 1 / 21)
    dropped = frame.copy()
    dropped.loc[dropped["key_frame"] == 5, "key_tokens"] = 12
    fig = figures.draw(
        "figure4",
        {"frame_attention": dropped},
        source="demo",
        options={"metric": "prob_mass", "heads": ["L1H1"], "dpi": 40},
    )
    (line,) = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "uniform-L1H1"]
    x, y = (np.asarray(v, dtype=float)[::3] for v in line.get_data())  # each step: its left end, right end, a break
    steps = {round(a + 0.45): b for a, b in zip(x, y)}
    assert steps[5] == pytest.approx(12 / 492) and steps[0] == pytest.approx(24 / 492) and len(steps) == 21
    assert "frame-0 excess" in fig.axes[0].get_title()


def test_sink_mass_over_time_shows_mass_uniform_and_excess_without_block_0():
    """The mass, uniform and excess lines against block_stats and a hand computation:
    without sink frames, frame 0's uniform share is 1 / 3(b + 1) in block b; the sink
    variant (window of 12 with 3 sink frames) keeps 6, 9, 12, 15, 15, 15 frames from block
    1 on, 3 of them sinks. Block 0 has no cache: no point."""
    data = study("demo")
    fig = demo_figure("sink_mass_over_time")
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.get_lines() if line.get_gid()}
    uniform = np.asarray(lines["uniform-default-L1"].get_ydata(), dtype=float)
    assert np.isnan(uniform[0]) and np.allclose(uniform[1:], [1 / (3 * (b + 1)) for b in range(1, 7)])
    sink = np.asarray(lines["uniform-sink-L1"].get_ydata(), dtype=float)
    assert np.isnan(sink[0]) and np.allclose(sink[1:], [3 / n for n in (6, 9, 12, 15, 15, 15)])
    stats = data["block_stats"]
    rows = stats[
        (stats["variant"] == "default") & (stats["layer"] == 0) & (stats["pass"] == "denoise") & (stats["step"] == 3)
    ]
    per_run = rows.groupby(["block", "prompt_id", "seed"])[["sink_mass", "sink_excess"]].mean()
    for name in ("sink_mass", "sink_excess"):
        y = np.asarray(lines[f"{name.replace('_', '-')}-default-L1"].get_ydata(), dtype=float)
        expected = per_run[name].groupby("block").mean().to_numpy()
        assert np.isnan(y[0]) and np.allclose(y[1:], expected[1:])
    assert any((a.get_gid() or "").startswith("no-cache-") for ax in fig.axes for a in ax.patches)


def test_spread_between_runs_is_drawn_and_stated():
    """With two runs: figure4's error bars are the std between the runs' curves (by hand),
    layer_comparison's bands exist, and subtitles say n; with one run they say so."""
    frame = study("demo")["frame_attention"]
    fig = render("figure4", options={"metric": "prob_mass", "heads": ["L5H10"]})
    bars = [c for ax in fig.axes for c in ax.collections if c.get_gid() == "spread-L5H10"]
    assert bars
    last = frame[
        (frame["block"] == 6)
        & (frame["pass"] == "denoise")
        & (frame["step"] == 3)
        & (frame["layer"] == 4)
        & (frame["head"] == 9)
    ]
    runs = last.groupby(["prompt_id", "seed", "key_frame"])["prob_mass"].mean().unstack("key_frame")
    std = runs.std(ddof=1).to_numpy()
    segments = bars[0].get_segments()
    assert np.allclose([abs(seg[1][1] - seg[0][1]) / 2 for seg in segments], std, atol=1e-7)
    assert "mean of n = 2 runs" in fig.texts[1].get_text()
    one = render("figure4", "wan1.3b")
    assert "n = 1 run: no spread between runs" in " ".join(one.texts[1].get_text().split())
    layers = demo_figure("layer_comparison")
    assert any((c.get_gid() or "").startswith("spread-L") for ax in layers.axes for c in ax.collections)


def test_first_middle_last_error_bars_are_the_layer_stats_run_std():
    frame = study("demo")["frame_attention"]
    stats = summaries.layer_stats(frame)
    rows = stats[
        (stats["prompt_id"] == ALL_PROMPTS)
        & (stats["metric"] == "prob_mass")
        & (stats["pass"] == "denoise")
        & (stats["step"] == 3)
    ].set_index("layer")
    fig = demo_figure("first_middle_last")  # softmax mass: the figure's own default
    bars = [c for c in fig.axes[0].collections if c.get_gid() == "spread-series-first"]
    halves = [abs(seg[1][1] - seg[0][1]) / 2 for seg in bars[0].get_segments()]
    assert np.allclose(halves, rows["first_run_std"].to_numpy(), rtol=1e-4, atol=1e-9)  # float32 masses


def test_sink_score_overview_prints_head_stats_and_clips_an_outlier(tmp_path):
    rows = head_stats_rows("logit_mean")
    overview, _ = saved(render("sink_score_overview", options={"metric": "logit_mean"}), tmp_path, "overview")
    cells = [float(x) for x in re.findall(r">(-?\d+\.\d\d)</text>", overview)]
    assert np.allclose(cells, rows["sink_score"].sort_index().to_numpy(), atol=0.005)
    # One head far off (as L2H5 at -15.93 in a demo run): the colours keep the others' range.
    frame = study("demo")["frame_attention"].copy()
    outlier = (frame["layer"] == 1) & (frame["head"] == 4) & (frame["key_frame"] == 0)
    frame.loc[outlier, "logit_mean"] -= 20
    fig = figures.draw(
        "sink_score_overview", {"frame_attention": frame}, source="demo", options={"dpi": 40, "metric": "logit_mean"}
    )
    image = fig.axes[0].images[0]
    scores = image.get_array().compressed()
    assert scores.min() < -15 and image.norm.vmax < 7
    assert image.norm.vmin == -image.norm.vmax
    label = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"][0].get_ylabel()
    assert f"clipped to ±{significant(image.norm.vmax)} (2nd–98th pct)" in label


def test_heavy_tailed_signed_values_get_a_log_scale_that_keeps_small_cells_coloured():
    # The default demo's first − middle: most heads within ±5, a few local heads at −40 .. −230.
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.uniform(-2, 2, 60), [2.6, 3.3, 4.3], [-230.0, -194.0, -153.0, -112.0, -88.0, -73.0]])
    cmap, norm = colour_scale(values, "signed")
    assert isinstance(norm, mcolors.SymLogNorm) and norm.vmin == -norm.vmax
    assert norm.linthresh == float(f"{np.median(np.abs(values)):.1g}")
    # A sink head's +3 is clearly red (a linear ±vmax scale would put it within 2% of white) ...
    assert norm(3.3) > 0.65 and abs(mcolors.Normalize(-norm.vmax, norm.vmax)(3.3) - 0.5) < 0.02
    # ... and the largest negatives are still told apart from the moderate ones.
    assert norm(-150.0) < norm(-40.0) - 0.05
    assert colours.log_note(norm) == f"log beyond ±{significant(norm.linthresh, 1)}"
    assert "logarithmic beyond ±" in colours.scale_sentence(norm)
    # Values within LOG_SPAN of their median size keep the linear scale.
    _, linear = colour_scale(rng.uniform(-3, 3, 72), "signed")
    assert type(linear) is mcolors.Normalize and colours.log_note(linear) == ""
    assert colours.scale_sentence(linear) == "Colours clip at the 2nd–98th percentile."


def test_sink_score_overview_states_its_log_scale_on_the_bar_and_in_the_caption(tmp_path):
    frame = study("demo")["frame_attention"].copy()
    far = (frame["layer"] == 1) & frame["head"].isin([2, 5]) & (frame["key_frame"] == 0)
    frame.loc[far, "logit_mean"] -= 200  # two local-looking heads with logits far below the rest
    fig = figures.draw(
        "sink_score_overview", {"frame_attention": frame}, source="demo", options={"dpi": 40, "metric": "logit_mean"}
    )
    norm = fig.axes[0].images[0].norm
    assert isinstance(norm, mcolors.SymLogNorm)
    label = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"][0].get_ylabel()
    assert f"log beyond ±{significant(norm.linthresh, 1)}" in label
    svg, _ = saved(fig, tmp_path, "log")
    assert f"logarithmic beyond ±{significant(norm.linthresh, 1)}," in page_text(svg, "page-caption")


def test_logit_levels_do_not_hide_small_layers():
    """A layer whose logits all sit 150 higher attends exactly as before: layer_comparison's
    map (each layer minus its mean) does not change, its panels and per_head_grid's take
    their own y scales (on masses they share one), and first_middle_last turns its y axis
    logarithmic so the other layers' bars stay readable."""
    frame = study("demo")["frame_attention"]
    lifted = frame.assign(logit_mean=frame["logit_mean"] + np.where(frame["layer"] == 1, 150.0, 0.0))
    maps = [
        figures.draw("layer_comparison", {"frame_attention": f}, source="demo", options={"dpi": 40})
        for f in (frame, lifted)
    ]
    before, after = (m.axes[0].images[0].get_array().filled(np.nan) for m in maps)
    np.testing.assert_allclose(after, before, atol=1e-4)
    view = figure4_view(frame, "last", "logit_mean")
    means = np.array([view.layer_mean(layer).to_numpy() for layer in view.layers])
    np.testing.assert_allclose(before, means - np.nanmean(means, axis=1, keepdims=True), atol=1e-6)
    panels = [ax for ax in maps[1].axes[1:] if ax.get_label() != "<colorbar>" and ax.lines]
    assert len({ax.get_ylim() for ax in panels}) == len(panels)
    assert "its own y scale" in next(t.get_text() for t in maps[1].texts if t.get_gid() == "page-caption")
    mass = figures.draw("layer_comparison", {"frame_attention": frame}, source="demo", options={"metric": "prob_mass"})
    mass_panels = [ax for ax in mass.axes[1:] if ax.get_label() != "<colorbar>" and ax.lines]
    assert len({ax.get_ylim() for ax in mass_panels}) == 1  # masses compare: one scale

    caption = lambda fig: next(t.get_text() for t in fig.texts if t.get_gid() == "page-caption")  # noqa: E731
    grid = figures.draw("per_head_grid", {"frame_attention": lifted}, source="demo", layer=1, options={"dpi": 40})
    heads = [ax for ax in grid.axes if ax.lines]
    assert len({ax.get_ylim() for ax in heads}) == len(heads) and "Each head on its own y scale" in caption(grid)
    assert "{" not in caption(grid)
    mass_grid = figures.draw(
        "per_head_grid", {"frame_attention": frame}, source="demo", layer=1, options={"metric": "prob_mass"}
    )
    assert len({ax.get_ylim() for ax in mass_grid.axes if ax.lines}) == 1 and "One y scale" in caption(mass_grid)

    bars = figures.draw(
        "first_middle_last", {"frame_attention": lifted}, source="demo", options={"dpi": 40, "metric": "logit_mean"}
    )
    assert bars.axes[0].get_yscale() == "symlog"
    assert "y axis is logarithmic beyond" in next(t.get_text() for t in bars.texts if t.get_gid() == "page-caption")
    plain = figures.draw(
        "first_middle_last", {"frame_attention": frame}, source="demo", options={"metric": "prob_mass"}
    )
    assert plain.axes[0].get_yscale() == "linear"


def test_timesteps_print_as_whole_numbers():
    assert call_label("denoise", 2, 833.3333) == "denoising step 2 (t=833)"
    assert call_label("cache", 4, 0.0) == "cache pass (t=0)"
    assert call_label("denoise", 1, 0.25) == "denoising step 1 (t=0.25)"
    frame = study("demo")["frame_attention"]
    shifted = frame.assign(timestep=frame["timestep"].where(frame["step"] != 1, np.float32(833.3333)))
    fig = figures.draw("figure4_steps", {"frame_attention": shifted}, source="demo", options={"heads": ["L1H1"]})
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert "step 1 (t=833)" in titles and "833.3" not in titles


@pytest.mark.parametrize("metric", ["prob_mass", "logit_mean"])
def test_layer_figures_print_the_layer_stats_numbers(metric):
    frame = study("demo")["frame_attention"]
    fig = (
        demo_figure("first_middle_last")
        if metric == "prob_mass"
        else render("first_middle_last", options={"metric": metric})
    )
    stats = summaries.layer_stats(frame)
    pass_, step = summaries.resolve_step(stats, "last")
    rows = stats[
        (stats["prompt_id"] == ALL_PROMPTS)
        & (stats["metric"] == metric)
        & (stats["pass"] == pass_)
        & (stats["step"] == step)
    ].set_index("layer")
    bars = [p for p in fig.axes[0].patches]
    heights = np.array([b.get_height() for b in bars]).reshape(4, -1)  # first, middle, last, own x layers
    for i, name in enumerate(["first", "middle", "last", "own"]):
        assert np.allclose(heights[i], rows[name].to_numpy(), atol=1e-9)


def gappy() -> dict:
    """The demo at the sink-window policy: last block sees frames 0-2 and 9-20."""
    return study("demo", 12, 3)


def curve_paths(svg: str, prefix: str) -> list[str]:
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    groups = [group for group in root.iter(f"{ns}g") if (group.get("id") or "").startswith(prefix)]
    return [next(group.iter(f"{ns}path")).get("d") for group in groups]  # the line (its markers follow)


@pytest.mark.parametrize("kind, prefix", [("figure4", "curve-L1H1"), ("layer_comparison", "curve-L1")])
def test_gaps_stay_gaps_in_the_files(kind, prefix, tmp_path):
    svg, _ = saved(render(kind, data=gappy()), tmp_path, kind)
    paths = curve_paths(svg, prefix)
    assert paths, f"no {prefix} line in the SVG"
    # A line across frames 3-8 (evicted) would be one stroke: the curve must break in two.
    assert all(d.count("M") >= 2 for d in paths), paths
    assert 'id="gap-' in svg  # the evicted frames are shaded grey


@pytest.mark.parametrize(
    "kind, gid",
    [
        ("per_head_grid", "curve-L1H1"),
        ("policy_comparison", "curve-L1H1-sink"),
        ("figure4_steps", "curve-L1H1-denoise3"),
    ],
)
def test_gaps_stay_gaps_in_every_curve(kind, gid):
    fig = render(kind, data=study("demo") if kind == "policy_comparison" else gappy())
    lines = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == gid]
    assert len(lines) == 1
    x, y = lines[0].get_data()
    assert (
        np.isnan(np.asarray(y, dtype=float)[3:9]).all() and np.isfinite(np.asarray(y, dtype=float)[[0, 2, 9, 20]]).all()
    )
    assert list(x) == list(range(21))


def test_curves_of_the_window_policy_have_nan_at_evicted_frames():
    view = figure4_view(gappy()["frame_attention"], "last", "logit_mean")
    curve = view.curve(0, 0)
    assert curve.index.tolist() == list(range(21))
    assert curve.loc[3:8].isna().all() and curve.loc[[0, 1, 2, 9, 20]].notna().all()
    assert frames_text(view.visible) == "0-2, 9-20"
    assert frames_text(view.visible, base=1) == "1-3, 10-21"


def test_frame_base_shows_the_papers_numbers(tmp_path):
    svg, _ = saved(render("figure4", options={"frame_base": 1}), tmp_path, "base1")
    assert "query frames 19-21" in page_text(svg, "page-title")
    assert "max@1<" in svg  # L1H1's sink, frame 0, printed 1-based
    svg0, _ = saved(demo_figure("figure4"), tmp_path, "base0")
    assert "query frames 18-20" in page_text(svg0, "page-title") and "max@0<" in svg0


def test_signed_metrics_get_a_zero_centred_diverging_scale():
    # Few values: their extremes; many: the 2nd and 98th percentiles.
    cmap, norm = colour_scale(np.array([-1.0, 3.0, np.nan]), "logit_mean")
    assert (norm.vmin, norm.vmax) == (-3.0, 3.0) and cmap.name.startswith("RdBu")
    cmap, norm = colour_scale(np.array([0.1, 0.4]), "prob_mass")
    assert (norm.vmin, norm.vmax) == (0.0, 0.4) and cmap.name.startswith("viridis")
    values = np.append(np.linspace(-1, 1, 99), 50.0)
    cmap, norm = colour_scale(values, "logit_mean")
    assert norm.vmax == pytest.approx(max(abs(np.percentile(values, 2)), np.percentile(values, 98)))
    assert colours.clip_note(values, norm) == f"clipped to ±{significant(norm.vmax)} (2nd–98th pct)"
    cmap, norm = colour_scale(np.abs(values), "prob_mass")
    assert (norm.vmin, norm.vmax) == (0.0, pytest.approx(np.percentile(np.abs(values), 98)))
    assert colours.clip_note(np.array([0.1, 0.2]), mcolors.Normalize(0, 0.3)) == ""
    image = demo_figure("heads_heatmap").axes[0].images[0]
    assert image.norm.vmin == -image.norm.vmax


def test_figure4_legend_keeps_off_the_bars():
    fig = demo_figure("figure4")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not _overlap(legend, ax.get_tightbbox(renderer))


def test_own_frames_show_in_svg_and_png(tmp_path):
    svg, png = saved(demo_figure("figure4"), tmp_path, "own", dpi=60)
    root = ET.fromstring(svg)
    spans = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if (g.get("id") or "").startswith("own-block-")]
    assert spans
    fills = {p.get("style", "") for g in spans for p in g.iter("{http://www.w3.org/2000/svg}path")}
    assert any(colours.OWN_COLOR.lower() in style.lower() for style in fills), fills
    import matplotlib.image

    pixels = matplotlib.image.imread(str(tmp_path / "own.png"))[..., :3]
    own = np.array(mcolors.to_rgb(colours.OWN_COLOR))
    assert (np.abs(pixels - own).max(axis=-1) < 0.02).sum() > 200  # the span shows in the PNG


def test_figure4_steps_shows_every_call_and_turns_for_many_heads():
    titles = [ax.get_title() for ax in demo_figure("figure4_steps").axes]
    assert sum("cache pass" in t for t in titles) == 2 and sum("step 0 (t=1000)" in t for t in titles) == 2
    many = render("figure4_steps", options={"heads": ["L1H1", "L1H2", "L2H1", "L2H2", "L3H1"]})
    assert many.axes[0].get_subplotspec().get_gridspec().get_geometry() == (5, 5)
    assert layout_problems(many) == []


def test_missing_heads_and_layers_say_so():
    data = study("demo")
    frame = data["frame_attention"]
    fig = figures.draw(
        "figure4", {"frame_attention": frame[frame["layer"] != 4]}, source="demo", options={"heads": ["L1H1", "L5H10"]}
    )
    assert any("was not extracted" in t.get_text() for ax in fig.axes for t in ax.texts)
    with pytest.raises(ValueError, match="needs the token_profiles table"):
        figures.draw("figure4_tokens", {"frame_attention": frame}, source="demo", options={})
    with pytest.raises(ValueError, match="unknown figure"):
        figures.draw("figure5", {"frame_attention": frame}, source="demo", options={})
    two = pd.concat([frame, frame.assign(checkpoint="other")])
    with pytest.raises(ValueError, match="demo, other"):
        figures.draw("figure4", {"frame_attention": two}, source="demo", options={})


# -- the package's shape ---------------------------------------------------------------------------


def test_defaults_are_the_config_schemas():
    from sinkscope.schema import load_schema

    schema = load_schema()["properties"]["figures"]["properties"]
    assert DEFAULTS == {name: spec.get("default") for name, spec in schema.items()}


def test_registry_declares_the_options_each_kind_draws_with():
    """The registry is the truth the workflow's params are built from: a kind that reads
    an option the registry does not list would not rerun when that option changes."""
    import inspect
    import re

    from sinkscope.figures.registry import COMMON_OPTIONS, FIGURES

    for name, kind in FIGURES.items():
        module = figures.module(name)
        assert figures.KINDS[name] == f"sinkscope.figures.{name}" and callable(module.draw)
        pairs = re.findall(r'option\(options, "(\w+)"\)|options(?:\.get\(|\[)"(\w+)"', inspect.getsource(module))
        read = {a or b for a, b in pairs} - {"heads"}  # heads are read through style.heads_of
        declared = set(kind.options) | set(kind.extra_options) | set(COMMON_OPTIONS)
        assert read <= declared, (name, read - declared)
        assert set(kind.options) - {"heads"} <= read, (name, set(kind.options) - read)


def test_each_kind_module_imports_only_the_shared_code():
    """A changed figure module reruns that figure only: no kind imports another."""
    from sinkscope.pipeline.codedigest import _imports

    shared = {f"sinkscope.figures.{name}" for name in ("style", "text", "views", "layout", "colours", "marks")}
    allowed = {
        "sinkscope.figures",
        *shared,
        "sinkscope.stats.summaries",
        "sinkscope.tables",
        "sinkscope.naming",
        "sinkscope.stats.labels",
        "sinkscope.interventions",
        "sinkscope.model.latent_preview",  # the contact sheet names the projection its latents are drawn in
    }
    for kind, module in figures.KINDS.items():
        assert _imports(module) <= allowed, (kind, _imports(module) - allowed)
    for module in shared:
        assert _imports(module) <= {
            "sinkscope.io",
            "sinkscope.naming",
            "sinkscope.schemafile",
            "sinkscope.stats.summaries",
            *shared,
        }, module
    digests = {
        kind: __import__("sinkscope.pipeline.study", fromlist=["Study"]).Study.code(kind) for kind in figures.KINDS
    }
    assert len(set(digests.values())) == len(digests)


# -- the pipeline job on real files ----------------------------------------------------------------


def write_source(root: Path, data: dict, source: str = "demo") -> dict[str, str]:
    """The per-source tables and token dataset folder the aggregation writes, and one
    extraction folder per run (layer files only)."""
    meta = {"frame_grid": list(data["grid"]), "checkpoint": source}
    paths = {}
    frame = data["frame_attention"]
    for name in ("frame_attention", "head_diagnostics", "block_stats"):
        path = root / "tables" / source / f"{name}.parquet"
        write_table(data[name], path, SCHEMAS[name], meta)
        paths[name] = str(path)
    tokens = root / "tables" / source / "token_profiles.parquet"
    listed = []
    for (prompt, seed, layer), rows in data["token_profiles"].groupby(["prompt_id", "seed", "layer"]):
        listed.append(f"{prompt}/seed{seed}/layers0-5/layer{layer}.tokens.parquet")
        write_table(token_lists(rows, int(np.prod(data["grid"]))), tokens / listed[-1], SCHEMAS["token_profiles"], meta)
    write_manifest(tokens, listed, {"table": "token_profiles", "source": source}, name=DATASET_MANIFEST)
    paths["token_profiles"] = str(tokens)
    extractions = []
    for (prompt, seed), rows in frame.groupby(["prompt_id", "seed"]):
        folder = root / "extract" / source / prompt / f"seed{seed}" / "layers0-5"
        for layer, layer_rows in rows.groupby("layer"):
            write_table(layer_rows, folder / f"layer{layer}.parquet", SCHEMAS["frame_attention"], meta)
        extractions.append(str(folder))
    paths["extract"] = extractions
    return paths


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("written")
    return root, write_source(root, study("demo"))


def test_figure_job_reads_tables_token_folders_and_layer_files(written):
    root, paths = written
    options = {"dpi": 50, "frame_base": 0, "step": "last", "heads": ["L1H1", "L5H10"]}
    jobs = [
        ("figure4_tokens", [paths["token_profiles"], paths["frame_attention"]], None),
        ("per_head_grid", paths["extract"] + [paths["head_diagnostics"]], 4),
        ("sink_mass_over_time", [paths["block_stats"]], None),
    ]
    for kind, inputs, layer in jobs:
        out = root / "figures" / kind
        figures.figure_job(
            kind=kind, inputs=inputs, svg=f"{out}.svg", png=f"{out}.png", options=options, source="demo", layer=layer
        )
        assert "<text" in Path(f"{out}.svg").read_text() and Path(f"{out}.png").read_bytes()[:8] == PNG_MAGIC
    tokens = Path(root / "figures" / "figure4_tokens.svg").read_text()
    assert "4 x 6 patch grid" in tokens  # the frame grid came from the tables' metadata
    grid = Path(root / "figures" / "per_head_grid.svg").read_text()
    assert "Layer L5 (index 4)" in grid
    # The head classes came from the head_diagnostics file among the layer figure's inputs.
    klass = classes_of(study("demo")["head_diagnostics"])[(4, 0)]
    assert f"H1 · {klass}<" in grid and "class (head_diagnostics;" in grid


def test_a_token_folder_that_lost_or_gained_a_file_is_damaged(tmp_path):
    paths = write_source(tmp_path, study("demo"))
    folder = Path(paths["token_profiles"])
    frame = study("demo")["frame_attention"]
    options = {"heads": ["L5H10"], "step": "cache"}
    victim = sorted(folder.rglob("*.tokens.parquet"))[0]
    victim.rename(victim.with_name("moved"))
    with pytest.raises(DamagedFileError, match=r"token_profiles.parquet: .*tokens.parquet: missing"):
        figures.read_token_profiles(folder, frame, options)
    victim.with_name("moved").rename(victim)
    figures.read_token_profiles(folder, frame, options)
    (folder / "stray.parquet").write_bytes(b"PAR1")
    with pytest.raises(DamagedFileError, match=r"holds files its job did not write \(stray.parquet\)"):
        figures.read_token_profiles(folder, frame, options)


def test_token_profiles_are_read_with_a_filter(written):
    _, paths = written
    frame = study("demo")["frame_attention"]
    rows = figures.read_token_profiles(paths["token_profiles"], frame, {"heads": ["L5H10"], "step": "cache"})
    assert set(zip(rows["layer"], rows["head"], strict=True)) == {(4, 9)}
    assert set(rows["pass"]) == {"cache"} and set(rows["block"]) == {6}


def test_study_figure_orders_checkpoints_by_training_step(tmp_path):
    data = study("demo")
    fig = figures.draw(
        "attention_across_checkpoints",
        {"head_diagnostics": data["diagnostics_all"]},
        source=None,
        options={},
        train_steps={"demo": 1000, "step2000": 2000, "step500": 500},
    )
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["500", "1000", "2000"]
    fig = figures.draw(
        "attention_across_checkpoints",
        {"head_diagnostics": data["diagnostics_all"]},
        source=None,
        options={},
        train_steps={"step500": None, "demo": 1000, "step2000": None},
    )
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["step500", "demo", "step2000"]


def test_study_figure_counts_each_checkpoints_sink_heads_from_its_table():
    """The sink-head panel prints, per checkpoint, the heads head_diagnostics classes sink."""
    data = study("demo")["diagnostics_all"].assign(head_class="diffuse")
    pairs = sorted(set(zip(data["layer"], data["head"], strict=True)))
    wanted = {"step500": 0, "demo": 2, "step2000": 5}
    for checkpoint, n in wanted.items():
        chosen = data["checkpoint"].eq(checkpoint) & pd.Series(
            list(zip(data["layer"], data["head"], strict=True))
        ).isin(pairs[:n])
        data.loc[chosen, "head_class"] = "sink"
    fig = figures.draw(
        "attention_across_checkpoints",
        {"head_diagnostics": data},
        source=None,
        options={},
        train_steps={"demo": 1000, "step2000": 2000, "step500": 500},
    )
    panel = fig.axes[2]
    assert panel.get_title().endswith("sink heads")
    assert [t.get_text() for t in panel.texts] == [f"{n}/{len(pairs)}" for n in (0, 2, 5)]  # in step order
    heights = {}
    for patch in panel.patches:
        checkpoint = patch.get_gid().split("-")[1]
        heights[checkpoint] = heights.get(checkpoint, 0) + patch.get_height()
    assert heights == {"demo": 2, "step2000": 5}


# -- the summary page ------------------------------------------------------------------------------


@cache
def summary_tables() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    data = study("demo")
    frame = data["frame_attention"]
    return summaries.layer_stats(frame), demo_head_stats(), data["head_diagnostics"]


TRAINED = {"demo": {"format": "self_forcing", "weights": "sinkscope:demo_trained.pt", "model": "demo"}}
SUMMARY_OPTIONS = {"step": "last", "metric": "logit_mean", "checkpoints": TRAINED, "diagnostics": {"sink_ratio": 5.0}}


def cells(page: str) -> list[str]:
    return [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", page)]


def test_summary_page_lists_sink_class_heads_apart_from_the_highest_frame0_excess():
    from sinkscope.figures.report import summary_html

    layers, heads, diagnostics = summary_tables()
    page = summary_html(layers, heads, diagnostics, SUMMARY_OPTIONS)
    sinks = diagnostics[
        (diagnostics["head_class"] == "sink") & (diagnostics["pass"] == "denoise") & (diagnostics["step"] == 3)
    ]
    section = page.split("<h3>Sink-class heads</h3>")[1].split("<h3>")[0]
    listed = re.findall(r"<tr><td>(L\d+H\d+)</td>", section)
    assert sorted(listed) == sorted(head_label(a, b) for a, b in zip(sinks["layer"], sinks["head"])) and listed
    top = page.split("Highest frame-0 excess over uniform")[1].split("</table>")[0]
    rows = head_stats_rows("prob_mass").sort_values("frame0_excess", ascending=False).head(10)
    assert re.findall(r"<tr><td>(L\d+H\d+)</td>", top) == [head_label(a, b) for a, b in rows.index]
    first = rows.iloc[0]
    assert f"<td>{report_number(first['frame0_excess'])} ± {report_number(first['frame0_excess_run_std'])}</td>" in top
    # No sink-class head: the page says so, and lists the top heads as what they are.
    none = diagnostics.assign(head_class=diagnostics["head_class"].replace("sink", "diffuse"))
    page = summary_html(layers, heads, none, SUMMARY_OPTIONS)
    assert "None: no head is classed sink at this call (frame-0 mass ≥ 5.00× its uniform share" in page
    assert "Strongest sink heads" not in page and "sink score" not in page
    top = page.split("Highest frame-0 excess over uniform")[1].split("</table>")[0]
    assert "<td>sink</td>" not in top


def test_summary_page_shows_every_figure_it_is_handed_among_them_the_atlases():
    from sinkscope.figures.report import summary_html
    from sinkscope.pipeline.figureplan import SUMMARY_FIGURES

    layers, heads, diagnostics = summary_tables()
    checkpoint = str(layers["checkpoint"].iloc[0])
    figures = {checkpoint: {kind: f"figures/{kind}.svg" for kind in SUMMARY_FIGURES}}
    page = summary_html(layers, heads, diagnostics, SUMMARY_OPTIONS, figures)
    assert [kind for kind in SUMMARY_FIGURES if f"figures/{kind}.svg" not in page] == []
    assert "<h3>Atlases</h3>" in page
    # A checkpoint with no source of its name (only its variants'): its figures on a part of their own.
    page = summary_html(layers, heads, diagnostics, SUMMARY_OPTIONS, {"other": {"head_atlas": "h.svg"}})
    assert "<h2>other: every variant</h2><h3>Atlases</h3>" in page and "h.svg" in page


def report_number(value) -> str:
    from sinkscope.figures.report import number

    return number(value)


def test_summary_page_prints_every_number_to_three_significant_digits():
    from sinkscope.figures.report import number, summary_html

    layers, heads, diagnostics = summary_tables()
    page = summary_html(layers, heads, diagnostics, SUMMARY_OPTIONS)
    assert [number(x) for x in (0.0476190, 15.9312, -15.93, 0.09996, 1234.5, 3, 0.0)] == [
        "0.0476",
        "15.9",
        "-15.9",
        "0.100",
        "1234",
        "3",
        "0",
    ]
    numbers = [n for cell in cells(page) for n in re.findall(r"-?\d+(?:\.\d+)?", cell)]
    assert numbers
    for text in numbers:
        digits = text.lstrip("-").replace(".", "").lstrip("0")
        assert len(digits) <= 3 or "." not in text, text  # integers (frames) as they are
    # The same numbers as the tables: L1's first − middle of logits, ± its std between runs.
    row = layers[
        (layers["prompt_id"] == ALL_PROMPTS)
        & (layers["metric"] == "logit_mean")
        & (layers["pass"] == "denoise")
        & (layers["step"] == 3)
        & (layers["layer"] == 0)
    ].iloc[0]
    assert f"{number(row['sink_score'])} ± {number(row['sink_score_run_std'])}" in cells(page)


@pytest.mark.parametrize(
    "entry, words",
    [
        (TRAINED["demo"], "shipped demo model (trained here, not Self-Forcing)"),
        ({"format": "demo", "weights": None, "model": "demo"}, "untrained"),
        (
            {"format": "self_forcing", "weights": "/models/self_forcing_dmd.pt", "model": "wan2.1-t2v-1.3b"},
            "your checkpoint <code>/models/self_forcing_dmd.pt</code> (format <code>self_forcing</code>",
        ),
    ],
)
def test_summary_page_says_which_model_at_the_top(entry, words):
    from sinkscope.figures.report import summary_html

    layers, heads, diagnostics = summary_tables()
    page = summary_html(layers, heads, diagnostics, {**SUMMARY_OPTIONS, "checkpoints": {"demo": entry}})
    top = page.split("<h2>")[0]
    assert words in top


def test_summary_job_embeds_the_key_figures_with_relative_links(tmp_path):
    from sinkscope.figures.report import summary_job

    layers, heads, diagnostics = summary_tables()
    paths = {}
    for name, table in (("layer_stats", layers), ("head_stats", heads), ("head_diagnostics", diagnostics)):
        paths[name] = tmp_path / "results" / "tables" / f"{name}.parquet"
        write_table(table, paths[name], SCHEMAS[name])
    shown = {"demo": {kind: f"results/figures/demo/{kind}.svg" for kind in ("figure4", "head_classes")}}
    output = tmp_path / "results" / "report" / "summary.html"
    import os

    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        summary_job(
            paths["layer_stats"],
            paths["head_stats"],
            paths["head_diagnostics"],
            "results/report/summary.html",
            {**SUMMARY_OPTIONS, "figures": shown},
        )
    finally:
        os.chdir(here)
    page = output.read_text()
    assert "<img src='../figures/demo/figure4.svg'" in page and "<img src='../figures/demo/head_classes.svg'" in page


def test_without_head_diagnostics_the_classes_come_from_the_rows_at_default_thresholds():
    data = study("demo")
    frame = data["frame_attention"]
    given = render("figure4")
    derived = figures.draw("figure4", {"frame_attention": frame}, source="demo", options={"dpi": 40})
    assert [ax.get_title() for ax in given.axes] == [ax.get_title() for ax in derived.axes]
    caption = lambda fig: " ".join(next(t.get_text() for t in fig.texts if t.get_gid() == "page-caption").split())  # noqa: E731
    assert "diffuse; head_diagnostics)" in caption(given)
    assert "head_diagnostics of these rows at the default thresholds" in caption(derived)


def test_summary_page_shows_a_checkpoints_figures_over_its_variants():
    from sinkscope.figures.report import summary_html

    layers, heads, diagnostics = summary_tables()
    rename = lambda t: t.assign(variant="global")  # noqa: E731 - no source is named like the checkpoint
    shown = {
        "demo@global": {"figure4": "../figures/demo@global/figure4.svg"},
        "demo": {
            "sink_mass_over_time": "../figures/demo/sink_mass_over_time.svg",
            "policy_comparison": "../figures/demo/policy_comparison.svg",
        },
    }
    page = summary_html(rename(layers), rename(heads), rename(diagnostics), SUMMARY_OPTIONS, shown)
    assert "<h2>demo: every variant</h2>" in page
    for link in (
        "../figures/demo@global/figure4.svg",
        "../figures/demo/sink_mass_over_time.svg",
        "../figures/demo/policy_comparison.svg",
    ):
        assert f"<img src='{link}'" in page


# -- figures that say what they draw: logits against softmax mass -----------------------------------


def disagreeing_heads(runs: tuple[int, ...] = (0, 1), heads: int = 12, frames: int = 21) -> pd.DataFrame:
    """The last block (frames 18-20) of two layers whose logits and mass disagree, as
    issue 33 found them: every layer-4 head like L5H7 (frame 0's mean logit 6-7.6 above the
    rest, yet 0.005 of its mass on frame 0 and 0.41 on frame 17; uniform 1/21 = 0.048),
    every layer-3 head like L4H11 (a 2.2 lead in logits, all its mass on frame 0)."""
    cells = []
    for seed in runs:
        for layer in (3, 4):
            for head in range(heads):
                logit = np.zeros(frames)
                if layer == 4:
                    logit[0] = (7.63 if head == 6 else 6.0 + 0.01 * head) + 0.002 * seed  # L5H7 the reddest
                    mass = np.full(frames, (1 - 0.005 - 0.41) / (frames - 2))
                    mass[0], mass[17] = 0.005, 0.41
                else:
                    logit[0] = 2.2 + 0.01 * head + 0.002 * seed
                    mass = np.eye(frames)[0]
                cells.append((seed, layer, head, logit, mass))
    queries = range(frames - 3, frames)
    rows = pd.DataFrame(
        [
            dict(
                seed=seed,
                layer=layer,
                head=head,
                query_frame=q,
                key_frame=k,
                logit_mean=logit[k],
                prob_mass=mass[k],
                argmax_share=float(k == int(np.argmax(mass))),
            )
            for seed, layer, head, logit, mass in cells
            for q in queries
            for k in range(frames)
        ]
    )
    rows = rows.assign(
        checkpoint="ck",
        variant="default",
        prompt_id="p",
        block=frames // 3 - 1,
        step=0,
        timestep=500.0,
        key_tokens=24,
        key_position_shift=0,
        **{"pass": "denoise"},
    )
    return rows.astype(
        {
            "seed": "int64",
            "layer": "int16",
            "head": "int16",
            "block": "int16",
            "step": "int16",
            "query_frame": "int16",
            "key_frame": "int16",
            "logit_mean": "float32",
            "prob_mass": "float32",
            "timestep": "float32",
        }
    )


def _caption(fig) -> str:
    return " ".join(next(t.get_text() for t in fig.texts if t.get_gid() == "page-caption").split())


def _colourbar_label(fig) -> str:
    return " ".join(next(ax for ax in fig.axes if ax.get_label() == "<colorbar>").get_ylabel().split())


@cache
def disagreeing_tables() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    frame = disagreeing_heads()
    run_averaged = lambda t: t[t["prompt_id"] == ALL_PROMPTS]  # noqa: E731
    return frame, run_averaged(summaries.head_stats(frame)), run_averaged(summaries.layer_stats(frame))


@pytest.mark.parametrize("metric", [None, "logit_mean"])
def test_sink_score_overview_says_what_its_colours_hold(metric):
    """Its cells, colour bar and caption name the statistic the head_stats table holds:
    softmax mass unless asked for logits; on logits, L5H7 (red, +7.6, but 0.005 of its mass
    on frame 0 against a uniform 0.048) is crossed and listed with those numbers, L4H11
    (+2.2, all its mass on frame 0) is not."""
    frame, heads, _ = disagreeing_tables()
    shown = metric or "prob_mass"
    fig = figures.draw(
        "sink_score_overview",
        {"frame_attention": frame},
        source="ck",
        options={"dpi": 40, **({"metric": metric} if metric else {})},
    )
    rows = heads[heads["metric"] == shown].set_index(["layer", "head"])
    mass = heads[heads["metric"] == "prob_mass"].set_index(["layer", "head"])
    cells = fig.axes[0].images[0].get_array().filled(np.nan)  # layers 3, 4 x heads 0..11
    np.testing.assert_allclose(cells[0], rows.loc[3, "sink_score"].to_numpy(), atol=1e-6)
    np.testing.assert_allclose(cells[1], rows.loc[4, "sink_score"].to_numpy(), atol=1e-6)
    words = {"prob_mass": "softmax mass (prob_mass)", "logit_mean": "mean logit (logit_mean)"}[shown]
    assert words in _colourbar_label(fig) and f"in {words} (head_stats sink_score of the rows with metric {shown}" in (
        _caption(fig)
    )
    crossed = {line.get_gid() for line in fig.axes[0].get_lines() if (line.get_gid() or "").startswith("disagree-")}
    l5h7, l4h11 = mass.loc[(4, 6)], mass.loc[(3, 10)]
    logits = heads[heads["metric"] == "logit_mean"].set_index(["layer", "head"])["sink_score"]
    assert l5h7["sink_score"] < 0 < l4h11["sink_score"] and logits[(4, 6)] > 7.6 and 2.2 < logits[(3, 10)] < 7.6
    if shown == "prob_mass":  # the colours are the mass: red where the first frame draws more mass
        assert "Red: the first cache frame gets more softmax mass (prob_mass)" in _caption(fig)
        assert cells[1, 6] < 0 < cells[0, 10] and not crossed
    else:
        assert "Red: the first cache frame's mean pre-softmax logit (logit_mean)" in _caption(fig)
        assert "disagree-L5H7" in crossed and "disagree-L4H11" not in crossed
        assert crossed == {f"disagree-{head_label(4, h)}" for h in range(12)}
        said = (
            f"L5H7 {rows.loc[(4, 6), 'sink_score']:+.2f} while frame 0 gets {l5h7['frame0_mass']:.3f} of the "
            f"softmax mass (uniform {l5h7['frame0_uniform']:.3f})"
        )
        assert said == "L5H7 +7.63 while frame 0 gets 0.005 of the softmax mass (uniform 0.048)"
        assert said in _caption(fig) and "L4H11" not in _caption(fig)


@pytest.mark.parametrize("metric", [None, "logit_mean"])
def test_first_middle_last_says_what_its_bars_hold(metric):
    """Softmax mass unless asked: layer L4's first bar (frame 0) stands at its mass 1.00
    and L5's at 0.005 below the uniform line; on logits L5 stands highest, and is crossed
    and listed with the layer_stats mass numbers."""
    frame, _, layers = disagreeing_tables()
    shown = metric or "prob_mass"
    fig = figures.draw(
        "first_middle_last",
        {"frame_attention": frame},
        source="ck",
        options={"dpi": 40, **({"metric": metric} if metric else {})},
    )
    rows = layers[layers["metric"] == shown].set_index("layer")
    mass = layers[layers["metric"] == "prob_mass"].set_index("layer")
    heights = np.array([p.get_height() for p in fig.axes[0].patches]).reshape(4, -1)  # first, middle, last, own
    np.testing.assert_allclose(heights[0], rows["first"].to_numpy(), atol=1e-6)
    np.testing.assert_allclose(heights[1], rows["middle"].to_numpy(), atol=1e-6)
    label = fig.axes[0].get_ylabel()
    assert (
        label
        == {
            "prob_mass": "head-averaged softmax mass (prob_mass)",
            "logit_mean": "head-averaged mean logit (pre-softmax q·k/√d, logit_mean)",
        }[shown]
    )
    assert f"the layer_stats rows with metric {shown} and prompt_id '*'" in _caption(fig)
    crossed = [line for line in fig.axes[0].get_lines() if line.get_gid() == "disagree"]
    if shown == "prob_mass":
        assert heights[0, 0] == pytest.approx(1.0) and heights[0, 1] == pytest.approx(0.005, abs=1e-6)
        assert not crossed and "uniform attention" in _caption(fig)
    else:
        (cross,) = crossed
        assert list(cross.get_xdata()) == [1]  # L5, not L4
        said = (
            f"L5 first − middle {rows.loc[4, 'sink_score']:+.2f} while frame 0 gets {mass.loc[4, 'frame0_mass']:.3f} "
            f"of the softmax mass (uniform {mass.loc[4, 'frame0_uniform']:.3f})"
        )
        assert said in _caption(fig) and "L4 first" not in _caption(fig)


def test_layer_figures_title_each_head_with_its_class():
    """heads_heatmap's rows and query_key_maps' panels carry each head's head_class."""
    data = study("demo")
    classes = classes_of(data["head_diagnostics"])
    rows = demo_figure("heads_heatmap").axes[0].get_yticklabels()
    for tick in rows:
        head, klass = tick.get_text().split(" · ")
        assert classes[(0, int(head[1:]) - 1)] == klass
        assert (tick.get_fontweight() == "bold") == (klass == "sink")
    titles = [ax.get_title() for ax in demo_figure("query_key_maps").axes if ax.get_title()]
    assert titles and all(classes[(0, int(t.split(" · ")[0][1:]) - 1)] == t.split(" · ")[1] for t in titles)


def test_sink_mass_over_time_band_swatch_has_the_bands_colour():
    fig = demo_figure("sink_mass_over_time")
    legend = next(t for t in fig.legends)
    swatch = next(h for h, t in zip(legend.legend_handles, legend.get_texts()) if "std between runs" in t.get_text())
    bands = [c for ax in fig.axes for c in ax.collections if (c.get_gid() or "").startswith("spread-sink-mass-default")]
    assert bands and np.allclose(swatch.get_facecolor()[:3], bands[0].get_facecolor()[0][:3])


def test_figure_command_names_its_source_and_refuses_highlight_layers_it_cannot_draw(tmp_path, capsys):
    """``sinkscope figure`` titles the source by the table's checkpoint (never 'the
    input'), and refuses a --highlight-layers value the input lacks, in one line."""
    from sinkscope.cli import main

    table = tmp_path / "frame_attention.parquet"
    disagreeing_heads(runs=(0,), heads=2).to_parquet(table)
    out = tmp_path / "overview"
    assert main(["figure", "sink_score_overview", "--input", str(table), "--out-prefix", str(out), "--dpi", "50"]) == 0
    subtitle = page_text((tmp_path / "overview.svg").read_text(), "page-subtitle")
    assert subtitle.startswith("ck · ") and "the input" not in subtitle and "softmax mass (prob_mass)" in subtitle
    capsys.readouterr()
    assert (
        main(
            [
                "figure",
                "layer_comparison",
                "--input",
                str(table),
                "--out-prefix",
                str(out),
                "--highlight-layers",
                "4",
                "99",
            ]
        )
        == 2
    )
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "sinkscope figure: error: --highlight-layers 99 is not in the input (it has layers [3, 4])"
    assert (
        main(
            [
                "figure",
                "figure4",
                "--input",
                str(table),
                "--out-prefix",
                str(out),
                "--heads",
                "L4H1",
                "--highlight-layers",
                "4",
            ]
        )
        == 2
    )
    assert "does not draw --highlight-layers" in capsys.readouterr().err
