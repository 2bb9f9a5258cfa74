"""What figures say and which colours they say it in, read from the written SVG (its text
stays text) and from the drawn artists: a cache without a window has no window frames,
a study without variants names no variant, every head panel carries its class, an
edited variant's line stands apart from the untouched video's and every band's legend
swatch has the band's colour, and a comparison of variants calls them variants."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from synthetic import cache_rows, synthetic_effects
from test_figures import classes_of, page_text, render, saved, study

from sinkscope import figures
from sinkscope.naming import head_label
from sinkscope.stats import summaries

SVG = "{http://www.w3.org/2000/svg}"


def svg_texts(svg: str) -> list[str]:
    """Every text element of the SVG, its pieces joined."""
    return [" ".join(" ".join(t.split()) for t in e.itertext()).strip() for e in ET.fromstring(svg).iter(f"{SVG}text")]


def written(fig, tmp_path: Path, name: str) -> list[str]:
    svg, _ = saved(fig, tmp_path, name)
    return svg_texts(svg)


def legend_entries(fig) -> dict[str, object]:
    """Legend text -> its handle (the figure's legends and the panels')."""
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return {t.get_text(): h for legend in legends for h, t in zip(legend.legend_handles, legend.get_texts())}


# -- cache_timeline: a cache without a window holds no window frames -------------------------------


def growing_cache(blocks: int = 5) -> dict:
    """Block -> (its frames, every earlier frame whole): what `global` keeps."""
    return {b: ([3 * b, 3 * b + 1, 3 * b + 2], [(f, 0, 24) for f in range(3 * b + 3)]) for b in range(blocks)}


def test_cache_timeline_calls_the_frames_of_a_global_cache_cached_not_window(tmp_path):
    rows = cache_rows(growing_cache())
    options = {"dpi": 60, "generation": {"cache_policy": "global", "local_attn_frames": -1, "sink_frames": 0}}
    texts = written(
        figures.draw("cache_timeline", {"frame_attention": rows}, source="ck", options=options), tmp_path, "g"
    )
    assert "cached frame, whole" in texts and not any("window frame" in t for t in texts)
    assert any("cache_policy global" in t for t in texts)
    # Without the generation options the window is not known: the frames are cached frames.
    bare = figures.draw("cache_timeline", {"frame_attention": rows}, source="ck", options={"dpi": 60})
    assert "cached frame, whole" in legend_entries(bare)


def test_cache_timeline_calls_the_frames_of_a_window_window_frames(tmp_path):
    layouts = {
        b: ([3 * b, 3 * b + 1, 3 * b + 2], [(f, 0, 24) for f in range(max(0, 3 * b - 6), 3 * b + 3)]) for b in range(5)
    }
    options = {"dpi": 60, "generation": {"cache_policy": "window", "local_attn_frames": 9, "sink_frames": 0}}
    fig = figures.draw("cache_timeline", {"frame_attention": cache_rows(layouts)}, source="ck", options=options)
    texts = written(fig, tmp_path, "w")
    assert "window frame, whole" in texts and "cached frame, whole" not in texts


# -- sink_mass_over_time: a line per variant, named only where there are variants -------------------


def test_sink_mass_over_time_without_variants_names_no_variant(tmp_path):
    frame = study("demo")["frame_attention"]
    stats = summaries.block_stats(frame, 0)
    fig = figures.draw("sink_mass_over_time", {"block_stats": stats}, source="demo", options={"dpi": 40})
    texts = written(fig, tmp_path, "one")
    assert "mass on frame 0 (upper panels), its excess over uniform (lower)" in texts
    assert not any("default" in t or "frames 0)" in t for t in texts), [t for t in texts if "default" in t]


def test_sink_mass_over_time_names_each_variant_and_its_sink_frames(tmp_path):
    texts = written(render("sink_mass_over_time"), tmp_path, "two")
    assert "default (frame 0)" in texts and "sink (frames 0-2)" in texts
    assert not any("(frames 0)" in t for t in texts)
    # Variants on the same frames (edits, no sink policy): each named, the frames in the title.
    frame = study("demo")["frame_attention"]
    both = pd.concat([frame, frame.assign(variant="edited")], ignore_index=True)
    stats = summaries.block_stats(both, 0)
    texts = written(
        figures.draw("sink_mass_over_time", {"block_stats": stats}, source="demo", options={"dpi": 40}),
        tmp_path,
        "same",
    )
    assert "default" in texts and "edited" in texts and not any("(frame 0)" in t for t in texts)


# -- attention_over_time: every head titled with its class -----------------------------------------


def test_attention_over_time_titles_each_head_with_its_class(tmp_path):
    data = study("demo")
    classes = classes_of(data["head_diagnostics"])
    heads = [(0, 0), (4, 9), (2, 3)]
    fig = render("attention_over_time", options={"heads": [head_label(*h) for h in heads]})
    svg, _ = saved(fig, tmp_path, "over-time")
    texts = svg_texts(svg)
    for layer, head in heads:
        title = f"{head_label(layer, head)} (layer {layer}, head {head}) · {classes[(layer, head)]} head"
        assert title in texts, (title, texts[:12])
    caption = page_text(svg, "page-caption")
    assert "Titles: each head's class at the last block's denoising step 3" in caption
    assert "(head_diagnostics)" in caption


# -- variant_drift: lines apart from the untouched video's, swatches in their bands' colours -----------

SIX = (
    ("sink_heads", [(0, 1), (4, 9)]),
    ("sink_control", [(0, 2), (4, 3)]),
    ("all_heads", "all"),
    ("identity", "all"),
    ("kv_int4", []),
    ("kv_nvfp4", []),
)


def drift_figure():
    effects = synthetic_effects(6, 12, runs=(("drift", 0), ("drift", 1), ("drift", 2)), checkpoint="demo", variants=SIX)
    return figures.draw("variant_drift", effects, source="demo", options={"dpi": 40})


def distance(a, b) -> float:
    return float(np.linalg.norm(np.subtract(mcolors.to_rgb(a), mcolors.to_rgb(b))))


def test_variant_drift_keeps_every_variant_line_apart_from_the_untouched_line():
    """Six edited variants (the interventions example's): each line's colour is far from
    the dashed untouched line's near-black and from every other variant's."""
    fig = drift_figure()
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.get_lines() if line.get_gid()}
    untouched = lines["first-frame-similarity-default"].get_color()
    variants = [name for name, _ in SIX]
    drawn = {v: lines[f"latent-rel-distance-{v}"].get_color() for v in variants}
    assert all(lines[f"first-frame-similarity-{v}"].get_color() == drawn[v] for v in variants)
    assert min(distance(color, untouched) for color in drawn.values()) > 0.45, drawn
    pairs = [(a, b) for i, a in enumerate(variants) for b in variants[i + 1 :]]
    assert min(distance(drawn[a], drawn[b]) for a, b in pairs) > 0.25, drawn


def test_variant_drift_band_swatches_have_their_bands_colours(tmp_path):
    fig = drift_figure()
    top, bottom = fig.axes[:2]
    upper = [c.get_facecolor()[0] for c in top.collections if (c.get_gid() or "").startswith("spread-")]
    (lower,) = [c.get_facecolor()[0] for c in bottom.collections if (c.get_gid() or "").startswith("spread-")]
    assert len(upper) == len(SIX)  # a band a variant above; the untouched video's alone below
    entries = legend_entries(fig)
    upper_swatch = next(h for text, h in entries.items() if "std" in text and "upper panel" in text)
    lower_swatch = next(h for text, h in entries.items() if "std" in text and "lower panel" in text)
    assert any(np.allclose(upper_swatch.get_facecolor(), band) for band in upper), upper_swatch.get_facecolor()
    assert np.allclose(lower_swatch.get_facecolor(), lower)
    assert not any(np.allclose(lower_swatch.get_facecolor()[:3], band[:3]) for band in upper)
    texts = written(fig, tmp_path, "drift")
    assert not any("upper: each variant's; lower: the default's" in t for t in texts)


# -- policy_comparison: variants are variants --------------------------------------------------------


def test_policy_comparison_calls_its_rows_variants_not_policies(tmp_path):
    texts = written(render("policy_comparison"), tmp_path, "variants")
    assert "The variants of demo side by side: the last block's attention, one row per variant" in texts
    assert not any("polic" in t for t in texts), [t for t in texts if "polic" in t]
