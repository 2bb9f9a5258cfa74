"""What the KV cache holds: the cache_timeline figure's marks from synthetic rows, and the
check of a finished run's cache contents against the layout its policy declares
(sinkscope.pipeline.cachecheck) on tiny in-process generations."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pandas as pd
import pytest
import torch
from fakes import TINY
from synthetic import cache_rows

from sinkscope import figures
from sinkscope.generation.capture import FrameStatsCapture
from sinkscope.generation.sampler import generate
from sinkscope.model import build_model
from sinkscope.options import GenerationOptions
from sinkscope.pipeline.cachecheck import check_rows, declared_calls

FSL = TINY.frame_seq_length()  # 6 tokens a frame


# -- the figure ------------------------------------------------------------------------------------

SINKS, WINDOW = 3, 9


def deep_sink_layouts(blocks: int = 7, partial: dict[int, int] | None = None) -> dict:
    """Block -> (query frames, [(key frame, shift, tokens)]) of a deep sink (W 9, S 3,
    blocks of 3): the sink moves up by 3 a block once the window rolls; in block 5 the
    frames of ``partial`` keep only that many of their 24 tokens."""
    layouts = {}
    for block in range(blocks):
        start = 3 * block
        if start + 3 <= WINDOW:
            keys = [(f, 0, 24) for f in range(start + 3)]
        else:
            keys = [(f, start - WINDOW, 24) for f in range(SINKS)]
            keys += [(f, 0, 24) for f in range(start + 3 - (WINDOW - SINKS), start + 3)]
        if block == 5:
            keys = [(f, s, (partial or {}).get(f, t)) for f, s, t in keys]
        layouts[block] = ([start, start + 1, start + 2], keys)
    return layouts


GENERATION = {
    "cache_policy": "deep_sink",
    "local_attn_frames": WINDOW,
    "sink_frames": SINKS,
    "interventions": [{"edit": "mask_keys", "heads": ["L1H1"], "key_frames": "sink"}],
}


def marks(fig) -> dict[str, set[tuple[int, int]]]:
    """Kind -> {(block, frame)} of the figure's cells, from their ids."""
    found: dict[str, set[tuple[int, int]]] = {}
    for artist in fig.axes[0].patches:
        match = re.fullmatch(r"([a-z-]+)-(\d+)-(\d+)-\d+", artist.get_gid() or "")
        if match:
            found.setdefault(match[1], set()).add((int(match[2]), int(match[3])))
    return found


def test_cells_are_marked_sink_window_compressed_own_and_edited(tmp_path):
    layouts = deep_sink_layouts(partial={13: 8})
    rows = cache_rows(layouts, layers=(0, 1), heads=2)
    fig = figures.draw(
        "cache_timeline", {"frame_attention": rows}, source="ck@no_sink", options={"dpi": 60, "generation": GENERATION}
    )
    found = marks(fig)
    cells = {(b, f, t) for b, (queries, keys) in layouts.items() for f, _, t in keys if f not in queries}
    assert found["own-block"] == {(b, f) for b, (queries, _) in layouts.items() for f in queries}
    assert found["sink"] == {(b, f) for b, f, _ in cells if f < SINKS}
    assert found["compressed"] == found["kept"] == {(5, 13)}  # 8 of 24 tokens
    assert found["window"] == {(b, f) for b, f, t in cells if f >= SINKS and t == 24}
    # mask_keys on the sink: the sink frames of every block after block 0, nothing else.
    assert found["edited"] == {(b, f) for b, f, _ in cells if f < SINKS}
    kept = next(p for p in fig.axes[0].patches if p.get_gid() == "kept-5-13-0")
    assert kept.get_height() == pytest.approx(0.9 * 8 / 24)
    svg = tmp_path / "timeline.svg"
    figures.save_figure(fig, svg, tmp_path / "timeline.png", dpi=60)
    text = svg.read_text()
    assert "6–8" in text and "mask_keys" in text  # block 5: the sink frames 0-2 attended at 6-8; the edit named


def test_every_cell_shows_its_rope_position_once():
    """Positions as text: each row's labels ('a' or 'a–b') cover exactly the positions of its
    cells (key frame + shift), moved sink frames included."""
    layouts = deep_sink_layouts()
    fig = figures.draw(
        "cache_timeline",
        {"frame_attention": cache_rows(layouts)},
        source="ck",
        options={"dpi": 60, "generation": GENERATION},
    )
    shown: dict[int, list[int]] = {}
    for label in fig.axes[0].texts:
        y = int(float((label.get_gid() or "").split("-")[1]))
        first, _, last = label.get_text().partition("–")
        shown.setdefault(y, []).extend(range(int(first), int(last or first) + 1))
    expected = {b: sorted(f + s for f, s, _ in keys) for b, (_, keys) in layouts.items()}
    assert {y: sorted(p) for y, p in shown.items()} == expected
    assert 3 in shown[4] and 0 not in shown[4]  # block 4 (frames 12-14): the sink sits at 3-5


def test_without_generation_options_nothing_is_called_sink_or_edited():
    fig = figures.draw(
        "cache_timeline", {"frame_attention": cache_rows(deep_sink_layouts())}, source="ck", options={"dpi": 60}
    )
    found = marks(fig)
    assert "sink" not in found and "edited" not in found and found["window"]


# -- the check -------------------------------------------------------------------------------------

POLICIES = {
    "window": {"cache_policy": "window", "local_attn_frames": 6},
    "deep_sink": {"cache_policy": "deep_sink", "local_attn_frames": 6, "sink_frames": 2},
    "participative_compression": {
        "cache_policy": "participative_compression",
        "local_attn_frames": 6,
        "sink_frames": 1,
        "budget_frames": 5,
        "recent_frames": 3,
    },
}


@cache
def captured(policy: str) -> tuple[pd.DataFrame, GenerationOptions]:
    """A tiny generation of 12 frames (blocks of 3, one denoising step) captured in
    layers 0 and 1."""
    options = GenerationOptions.from_config({"num_frames": 12, "denoising_steps": [1000], **POLICIES[policy]})
    model = build_model(TINY, seed=0)
    context = torch.randn(1, 4, TINY.text_dim, generator=torch.Generator().manual_seed(1))
    capture = FrameStatsCapture(model, [0, 1], frame_seq_length=FSL, token_profiles="none")
    with capture:
        generate(model, context, options=options, seed=0, observers=[capture])
    return capture.to_frame(), options


def listed_calls(lines: list[str]) -> set[tuple[int, int, str, int]]:
    return {
        (int(a), int(b), c, int(d))
        for a, b, c, d in (re.match(r"layer (\d+) block (\d+) (\w+) step (\d+):", line).groups() for line in lines)
    }


@pytest.mark.parametrize("policy", list(POLICIES))
def test_an_untouched_run_agrees_with_its_policy(policy):
    rows, options = captured(policy)
    assert check_rows(rows, options, frame_seq_length=FSL) == []
    if policy == "participative_compression":  # the tolerance for chosen tokens is exercised
        assert (rows["key_tokens"] < FSL).any()
    if policy == "deep_sink":
        assert (rows["key_position_shift"] != 0).any()


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_dropped_key_frame_is_listed(policy):
    rows, options = captured(policy)
    frame = 0 if policy != "window" else 7  # the sink (compression: frame 0, its sink), or a window frame
    block = 3
    altered = rows[~((rows["block"] == block) & (rows["key_frame"] == frame))]
    lines = check_rows(altered, options, frame_seq_length=FSL, where="run")
    assert listed_calls([line.removeprefix("run: ") for line in lines]) == {
        (layer, block, p, s) for layer in (0, 1) for p, s in (("denoise", 0), ("cache", 1))
    }
    assert all(f"frame {frame} is missing" in line for line in lines), lines


def test_a_shifted_position_and_a_partial_frame_are_listed():
    rows, options = captured("deep_sink")
    shifted = rows.copy()
    chosen = (shifted["block"] == 2) & (shifted["key_frame"] == 5) & (shifted["pass"] == "cache")
    shifted.loc[chosen, "key_position_shift"] += 1
    assert check_rows(shifted, options, frame_seq_length=FSL) == [
        f"layer {layer} block 2 cache step 1: frame 5 is held at RoPE shift +1, the policy's is +0" for layer in (0, 1)
    ]
    partial = rows.copy()
    chosen = (partial["block"] == 1) & (partial["key_frame"] == 0) & (partial["layer"] == 1) & (partial["step"] == 0)
    partial.loc[chosen, "key_tokens"] = FSL - 1
    assert check_rows(partial, options, frame_seq_length=FSL) == [
        f"layer 1 block 1 denoise step 0: frame 0 holds {FSL - 1} of its {FSL} tokens (the policy keeps it whole)"
    ]


def test_compressed_frames_are_checked_by_their_total():
    """Which tokens a compression keeps depends on the video: a chosen frame kept in part
    or dropped passes, but not a total of key tokens other than the policy's."""
    rows, options = captured("participative_compression")
    declared = {call.key: call for call in declared_calls(options)}
    block = 3
    chosen = sorted(declared[(block, "denoise", 0)].chosen)
    assert chosen
    call = (rows["block"] == block) & (rows["layer"] == 0)
    partial = rows[call & rows["key_frame"].isin(chosen)]
    frame = int(partial.loc[partial["key_tokens"].idxmax(), "key_frame"])
    fewer = rows.copy()
    fewer.loc[call & (fewer["key_frame"] == frame), "key_tokens"] -= 1
    lines = check_rows(fewer, options, frame_seq_length=FSL)
    assert listed_calls(lines) == {(0, block, "denoise", 0), (0, block, "cache", 1)}
    assert all("key tokens, the policy keeps" in line for line in lines)


def test_check_results_lists_the_finished_runs_contradicting_calls(tmp_path, monkeypatch, capsys):
    """The declared calls are the procedure's (a block's steps and its cache pass, in
    order); ``sinkscope check --results`` reads a study's finished extraction folders
    (their generation options from their files' metadata), skips unfinished ones and lists
    a contradicting call a line, with exit status 1."""
    from sinkscope.cli import main as cli
    from sinkscope.manifests import write_manifest
    from sinkscope.pipeline.config import normalize_config, read_config_file
    from sinkscope.pipeline.study import Study
    from sinkscope.tables import SCHEMAS, write_table

    rows, options = captured("window")
    calls = declared_calls(options)
    assert [call.key for call in calls] == [(b, p, s) for b in range(4) for p, s in (("denoise", 0), ("cache", 1))]
    assert calls[-1].query_frames == (9, 10, 11) and calls[-1].segments == tuple((f, 0) for f in range(6, 12))
    config = tmp_path / "config.yaml"
    config.write_text(
        "layers: [0]\nseeds: [0, 1]\ngeneration: {num_frames: 12, denoising_steps: [1000], "
        "cache_policy: window, local_attn_frames: 6}\n"
    )
    monkeypatch.chdir(tmp_path)
    folders = Study(normalize_config(read_config_file(config))).all_extract_dirs()
    assert len(folders) == 2  # seed 1 never ran

    def write(run: pd.DataFrame) -> None:
        run = run[run["layer"] == 0].assign(checkpoint="demo", variant="default", prompt_id="drift", seed=0)
        write_table(
            run,
            Path(folders[0]) / "layer0.parquet",
            SCHEMAS["frame_attention"],
            {"generation": options.to_dict(), "frame_seq_length": FSL},
        )
        write_manifest(folders[0], ["layer0.parquet"], {"layers": [0]})

    write(rows)
    assert cli(["check", "--results", str(config)]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "1 of 2 extraction folders finished and checked: no calls contradict" in err
    write(rows[~((rows["block"] == 2) & (rows["key_frame"] == 4))])
    assert cli(["check", "--results", str(config)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"{folders[0]}: layer 0 block 2 {call}: frame 4 is missing (the policy holds it at RoPE shift +0)"
        for call in ("denoise step 0", "cache step 1")
    ]


def test_the_figure_command_reads_the_generation_options_of_an_extraction_folder(tmp_path):
    """``sinkscope figure cache_timeline --input <extraction folder>`` marks the sink frames
    its files' generation options name."""
    from sinkscope.cli import main as cli
    from sinkscope.manifests import write_manifest
    from sinkscope.tables import SCHEMAS, write_table

    rows, options = captured("deep_sink")
    folder = tmp_path / "layers0"
    run = rows[rows["layer"] == 0].assign(checkpoint="demo", variant="deep", prompt_id="drift", seed=0)
    write_table(run, folder / "layer0.parquet", SCHEMAS["frame_attention"], {"generation": options.to_dict()})
    write_manifest(folder, ["layer0.parquet"], {"layers": [0]})
    assert (
        cli(["figure", "cache_timeline", "--input", str(folder), "--out-prefix", str(tmp_path / "t"), "--dpi", "50"])
        == 0
    )
    svg = (tmp_path / "t.svg").read_text()
    assert 'id="sink-3-0-0"' in svg and "cache_policy deep_sink, W 6, S 2" in svg
