"""What the KV cache holds, block by block: for one run of a source, at one call of every
block (the last denoising step by default), every key frame the call saw (x: absolute
frame, y: block), at which RoPE position (the numbers: key frame + key_position_shift,
in the queries' frame of reference), and what it is: a sink frame, a whole frame of the
window (a cached frame, under a policy without a window such as ``global``), a frame
kept in part (fewer tokens than a frame: the filled share is what stays, averaged over
the captured layers), the block's own frames; frames an edit of the variant touches
(``generation.interventions``: masked or biased for the edited heads, quantized,
replaced) are outlined. Read from the captured rows only (``key_frame``, ``key_tokens``,
``key_position_shift``); the sink frames and the edits come from the source's
generation options (the option ``generation``; without it neither is marked)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from matplotlib.patches import Patch, Rectangle

from sinkscope.figures.colours import GAP_COLOR, OWN_COLOR, OWN_EDGE
from sinkscope.figures.layout import finish, new_figure, set_frame_ticks, set_label_ticks
from sinkscope.figures.style import option
from sinkscope.figures.text import frames_text, subtitle
from sinkscope.figures.views import block_call_rows, evenly, one_source, table
from sinkscope.interventions import QuantizeCache, parse_interventions

# Blocks drawn at most (evenly spread, first and last kept); a long rollout's row each
# would not fit a page.
MOST_BLOCKS = 48
KINDS = {  # kind: (fill colour, legend label)
    "sink": ("#C73E1D", "sink frame (generation.sink_frames)"),
    "window": ("#7FB3D5", "window frame, whole"),  # "cached frame, whole" without a window (window_label)
    "compressed": ("#6A994E", "kept in part: the filled share of its tokens stays"),
    "own": (OWN_COLOR, "the block's own frames"),
}
EDIT_EDGE = "#F18F01"
TEXT_SIZES = (7.0, 6.0, 5.0)  # tried in turn until a position label fits its cells


def window_label(generation: Mapping[str, Any]) -> str:
    """The legend's words for a whole cached frame that is no sink: a window frame only
    under a policy with a window (``global`` keeps every frame; without the generation
    options the window is not known)."""
    window = generation.get("local_attn_frames")
    if window is None or int(window) < 0:
        return "cached frame, whole"
    return KINDS["window"][1]


def _sink_frames(generation: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(range(int(generation.get("sink_frames") or 0)))


def _edits(generation: Mapping[str, Any], source: str) -> tuple:
    return parse_interventions(generation.get("interventions") or [], f"generation.interventions of {source}")


def _edit_text(edit: Any) -> str:
    """One edit as its config reads: 'mask_keys L1H1, L5H10 · frames 0'."""
    config = edit.to_config()
    parts = [config["edit"]]
    if "heads" in config:
        heads = config["heads"]
        parts.append("heads " + (", ".join(heads) if isinstance(heads, list) else str(heads)))
    if "key_frames" in config:
        frames = config["key_frames"]
        parts.append("frames " + (frames_text(frames) if isinstance(frames, list) else str(frames)))
    parts += [f"{key} {config[key]}" for key in ("bias", "format", "tensors", "source") if key in config]
    return " · ".join(parts)


def edited_frames(edits: Sequence[Any], cached: Sequence[int], sink: Sequence[int]) -> set[int]:
    """The cached frames (of a block: those before it) that any edit touches; ``sink``:
    the policy's sink frames (frame 0 without a sink, as the edits read ``sink``)."""
    touched: set[int] = set()
    sink = tuple(sink) or (0,)
    for edit in edits:
        if isinstance(edit, QuantizeCache):
            touched |= set(cached)
        elif hasattr(edit, "key_frames"):  # masked, biased or replaced
            touched |= set(edit.key_frames.resolve(cached, sink))
    return touched


def cells(rows: pd.DataFrame, frame_seq_length: int, sink: Sequence[int], edits: Sequence[Any]) -> pd.DataFrame:
    """One row per (block, key frame, RoPE shift) of the chosen call of every block:
    its position, kept share (over the captured layers), kind and whether an edit touches it."""
    layers = rows["layer"].nunique()
    keys = rows[["block", "layer", "key_frame", "key_position_shift", "key_tokens"]].drop_duplicates(
        ["block", "layer", "key_frame", "key_position_shift"]
    )
    grouped = keys.groupby(["block", "key_frame", "key_position_shift"], observed=True)["key_tokens"].sum()
    out = grouped.reset_index(name="tokens")
    out["share"] = out["tokens"] / (layers * frame_seq_length)
    out["position"] = out["key_frame"] + out["key_position_shift"]
    owns = rows.groupby("block", observed=True)["query_frame"].agg(lambda f: set(int(x) for x in f))
    kinds, edited = [], []
    touched: dict[int, set[int]] = {}
    for block, frame, share in zip(out["block"], out["key_frame"], out["share"]):
        own = owns[block]
        if block not in touched:
            cached = sorted({int(f) for f in out.loc[out["block"] == block, "key_frame"] if f < min(own)})
            touched[block] = edited_frames(edits, cached, sink) if edits else set()
        if frame in own:
            kinds.append("own")
        elif share < 1 - 1e-9:
            kinds.append("compressed")
        elif frame in sink:
            kinds.append("sink")
        else:
            kinds.append("window")
        edited.append(frame in touched[block])
    out["kind"], out["edited"] = kinds, edited
    return out


def _runs(entries: list[tuple[int, int, str]]) -> list[list[tuple[int, int, str]]]:
    """(frame, position, kind) sorted by frame -> runs of consecutive frames at consecutive
    positions of one kind (labelled once: 'a–b')."""
    runs: list[list[tuple[int, int, str]]] = []
    for entry in entries:
        last = runs[-1][-1] if runs else None
        if last and entry[0] == last[0] + 1 and entry[1] == last[1] + 1 and entry[2] == last[2]:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


def _label(ax, run, y: float, height: float, cell_w: float) -> None:
    """The run's RoPE positions as text centred on it, in the largest size that fits."""
    first, last = run[0], run[-1]
    text = str(first[1]) if len(run) == 1 else f"{first[1]}–{last[1]}"
    width_pt = len(run) * cell_w * 72 - 2.0
    for size in TEXT_SIZES:
        if 0.56 * size * len(text) <= width_pt and size * 1.15 <= height * 72:
            color = "white" if first[2] == "sink" else "0.1"
            label = ax.text(
                (first[0] + last[0]) / 2, y, text, ha="center", va="center", fontsize=size, color=color, zorder=5
            )
            label.set_gid(f"position-{y:g}-{first[0]}")
            return


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "cache_timeline"
    if ax is not None:
        raise ValueError(f"{kind} draws its own figure (leave ax out)")
    frame = one_source(table(tables, "frame_attention", kind), kind)
    base = int(option(options, "frame_base"))
    generation = options.get("generation") or {}
    runs = frame[["prompt_id", "seed"]].drop_duplicates().sort_values(["prompt_id", "seed"])
    prompt, seed = (str(runs.iloc[0, 0]), int(runs.iloc[0, 1])) if len(runs) else ("", 0)
    rows = frame[(frame["prompt_id"] == prompt) & (frame["seed"] == seed)] if len(runs) else frame
    rows, call = block_call_rows(rows, option(options, "step"))
    fsl = int(frame["key_tokens"].max())
    sink = _sink_frames(generation)
    edits = _edits(generation, source) if generation else ()
    data = cells(rows, fsl, sink, edits)
    blocks = evenly(sorted(int(b) for b in data["block"].unique()), MOST_BLOCKS)
    frames = int(max(data["key_frame"].max(), rows["query_frame"].max())) + 1
    cell_w = min(0.36, 17.0 / frames)
    cell_h = 0.34 if len(blocks) <= 24 else 0.24
    fig = new_figure(frames * cell_w + 1.3, len(blocks) * cell_h + 0.9)
    ax = fig.subplots()
    edge = min(1.6, max(0.4, cell_w * 72 / 12))  # the edit outline, thinner on narrow cells
    for y, block in enumerate(blocks):
        here = data[data["block"] == block].sort_values(["key_frame", "key_position_shift"])
        copies = here.groupby("key_frame")["key_frame"].transform("size").to_numpy()
        slot = here.groupby("key_frame").cumcount().to_numpy()
        entries_by_slot: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
        for record, n, i in zip(here.itertuples(index=False), copies, slot):
            height = 0.9 / n
            bottom = y - 0.45 + i * height
            fill, _ = KINDS[record.kind]
            frame_no = int(record.key_frame)
            background = GAP_COLOR if record.kind == "compressed" else fill  # the kept share is drawn over it
            box = Rectangle(
                (frame_no - 0.45, bottom),
                0.9,
                height,
                facecolor=background,
                edgecolor=OWN_EDGE if record.kind == "own" else "none",
                lw=0.8,
                zorder=2,
            )
            box.set_gid(f"{'own-block' if record.kind == 'own' else record.kind}-{block}-{frame_no}-{i}")
            ax.add_patch(box)
            if record.kind == "compressed":
                kept = Rectangle(
                    (frame_no - 0.45, bottom), 0.9, height * float(record.share), facecolor=fill, lw=0, zorder=3
                )
                kept.set_gid(f"kept-{block}-{frame_no}-{i}")
                ax.add_patch(kept)
            if record.edited:
                mark = Rectangle(
                    (frame_no - 0.45, bottom), 0.9, height, facecolor="none", edgecolor=EDIT_EDGE, lw=edge, zorder=4
                )
                mark.set_gid(f"edited-{block}-{frame_no}-{i}")
                ax.add_patch(mark)
            entries_by_slot.setdefault((int(n), int(i)), []).append((frame_no, int(record.position), record.kind))
        for (n, i), entries in entries_by_slot.items():
            height = 0.9 / n
            for run in _runs(entries):
                _label(ax, run, y - 0.45 + (i + 0.5) * height, height * cell_h, cell_w)
    ax.set_xlim(-0.6, frames - 0.4)
    ax.set_ylim(len(blocks) - 0.5, -0.5)
    set_frame_ticks(ax, range(frames), base, length=frames * cell_w)
    set_label_ticks(ax, [str(b) for b in blocks], axis="y", length=len(blocks) * cell_h)
    ax.set_xlabel("absolute key frame" + (" (1-based)" if base else ""))
    ax.set_ylabel("block")
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    present = [k for k in KINDS if (data["kind"] == k).any()]
    labels = {**{k: text for k, (_, text) in KINDS.items()}, "window": window_label(generation)}
    handles = [
        Patch(facecolor=KINDS[k][0], edgecolor=OWN_EDGE if k == "own" else "none", label=labels[k]) for k in present
    ]
    if edits:
        listed = "; ".join(_edit_text(edit) for edit in edits)
        handles.append(Patch(facecolor="none", edgecolor=EDIT_EDGE, lw=1.6, label=f"edited ({listed})"))
    shown = "" if len(blocks) == data["block"].nunique() else f" ({len(blocks)} of {data['block'].nunique()} blocks)"
    policy = generation.get("cache_policy") or "?"
    window = generation.get("local_attn_frames")
    setting = (
        f"cache_policy {policy}"
        + (f", W {window}" if window not in (None, -1) else "")
        + (f", S {len(sink)}" if sink else "")
    )
    what = f"run {prompt} / seed {seed}" + (f" · {setting}" if generation else "")
    return finish(
        fig,
        title=f"What the KV cache of {source} holds, block by block{shown}",
        subtitle=subtitle(source, call, what, 1),
        legend=handles,
        caption=(
            "Each row: the key frames one call of the block saw (x: the absolute frame the keys were generated "
            "at), one cell per frame, a frame held twice (at two RoPE positions) split in two. Numbers: the RoPE "
            "position the keys are attended at, relative to the queries at their own frames (key frame + "
            "key_position_shift; a run of frames at consecutive positions is labelled once, a–b). Kept in part: "
            f"fewer than a frame's {fsl} tokens (the share kept, averaged over the captured layers). "
            + (
                "Sink frames and edits from the source's generation options. "
                if generation
                else "No generation options given: sink frames and edits are not marked. "
            )
            + "The same layout holds in every run of a policy that keeps whole frames; a policy that keeps tokens "
            "by their scores differs between runs in which tokens stay. sinkscope check --results compares each "
            "call with the layout the policy declares."
        ),
    )
