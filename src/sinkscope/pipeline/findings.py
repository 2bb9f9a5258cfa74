"""Numbers in the docs, written from a study's tables (``sinkscope findings``), never typed.

A doc marks each region that a study's numbers fill, with the region's kind and, where it
needs them, parameters:

    <!-- begin: findings intervention-table -->
    ... written by update_text ...
    <!-- end -->

``update_text`` (and ``update_docs`` for files) rewrites every marked region from the
tables of one study (``results/tables/<table>.parquet``, read verified on first use) and
leaves everything else as it is. A region names its source with ``checkpoint=`` and
``variant=`` (default ``demo`` and ``default``); ``heads=`` lists the heads a region names
(paper labels, comma-separated).

Every "±" is one thing: mean ± the sample standard deviation (ddof 1) between runs
(prompts x seeds), each run's own statistic first, as the tables' ``<stat>_run_std``
columns hold it (docs/statistics.md). Ratios to uniform are ``head_diagnostics``'
(``frame0_ratio``: frame-0 mass over frame 0's share of the key tokens); the layer
profiles are the last block's Figure 4 curves (``summaries.figure4_curves``, last
denoising step, softmax mass, runs averaged), averaged over heads.

The regions (``REGIONS``):

- ``layer-profile``: the layers x key frames table of those profiles (a code block);
- ``layer-peaks``: the layers whose profile puts at least twice uniform on frame 0, and
  those that put at least twice uniform on the two frames before the block (recency);
- ``head-classes``: the head classes at the last denoising step, each sink head's
  frame-0 ratio ± its std between runs, the borderline heads and the runs that call them
  sinks, and the first run's classes alone;
- ``demo-summary``: the README's sentence of the two above;
- ``head-note``: one head's class and frame-0 ratio (``heads=``), and the share of sink heads;
- ``sink-mass-blocks``: block_stats' mass on frame 0 against uniform in block 1 and the
  last block (every call, heads and layers averaged);
- ``intervention-heads``: the untouched run's sink heads and the heads a control variant
  (``control=``) edits instead;
- ``intervention-table``: per edited variant, the latent distance to the untouched video
  after block 0 per run, in the last block (mean ± std between runs), and the frame-0 mass
  change of its edited heads and of any head;
- ``intervention-drift``: per edited variant, the drift proxy (cosine to frame 0) where it
  lies above the untouched video's, and in the last block;
- ``atlas-heads``: a head sweep's atlas (``sweep=``): the heads of most drift at the last
  block, the spread over the heads, the sink-class heads' drift against the others', and
  Spearman's rank correlation between drift and untouched frame-0 mass (head_atlas);
- ``atlas-frames``: a frame sweep's atlas (``sweep=``): the frames of most and least drift,
  the sink frame's, and the rank correlation with the untouched mass on the frame
  (frame_atlas);
- ``pruning-table``: a pruning sweep's curve (``sweep=``): per head count, the drift at the
  last block of each order (mean ± std between runs) and each order's area under the curve
  (pruning_curve).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sinkscope.errors import SinkscopeError
from sinkscope.io import atomic_path
from sinkscope.naming import head_label, parse_head_label
from sinkscope.stats.summaries import (
    DEFAULT_THRESHOLDS,
    figure4_curves,
    head_diagnostics,
    last_block,
    rank_correlation,
    resolve_step,
)
from sinkscope.sweeps import is_atlas_run
from sinkscope.tables import ALL_PROMPTS, RUN_STD_SUFFIX, read_table

REGION = re.compile(
    r"(?P<begin><!-- begin: findings (?P<kind>[\w-]+)(?P<params>(?: \w+=\S+)*) -->)(?P<body>.*?)(?P<end><!-- end -->)",
    re.S,
)
PEAK = 2.0  # a layer "peaks" on frames that get at least twice their uniform share
WIDTH = 90  # the docs' line length: words a region writes into a sentence are wrapped to it
# A line that starts with one of these would turn into a list, heading or quote.
BLOCK_START = re.compile(r"^(?:[-+*#>]|\d+[.)])(?:\s|$)")
MINUS = "−"  # the sign printed before a negative number in running text (U+2212)


class FindingsError(SinkscopeError):
    """A doc region the tables cannot fill, in one line naming the doc and the region."""


class StudyTables:
    """The tables of one study, ``<folder>/<table>.parquet``, each read (verified) once."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._read: dict[str, pd.DataFrame] = {}

    def __getitem__(self, name: str) -> pd.DataFrame:
        if name not in self._read:
            path = self.folder / f"{name}.parquet"
            if not path.is_file():
                raise FindingsError(f"{path} not found (the study's tables: results/tables/ of its run)")
            self._read[name] = read_table(path)
        return self._read[name]


# -- numbers as the docs print them ----------------------------------------------------------------


def fixed(value: float, decimals: int = 3) -> str:
    """0.7314 -> '0.731'; an exact 0 -> '0'."""
    return "0" if value == 0 else f"{value:.{decimals}f}"


def signed(value: float, decimals: int = 3) -> str:
    """'+0.074', '−0.005' (running text's minus sign); an exact 0 -> '0'."""
    return "0" if value == 0 else ("+" if value > 0 else MINUS) + f"{abs(value):.{decimals}f}"


def ratio(value: float) -> str:
    """A ratio to uniform: one decimal from 1 on (6.4), two below (0.35)."""
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.2f}"


def spread(mean: float, std: float, decimals: int = 3) -> str:
    """'1.335 ± 0.172': mean ± std between runs (one run: the mean alone)."""
    return fixed(mean, decimals) if not np.isfinite(std) else f"{fixed(mean, decimals)} ± {fixed(std, decimals)}"


def span(values: Iterable[float], decimals: int = 2) -> str:
    """'0.29-0.43' (a single value alone)."""
    values = [float(v) for v in values]
    low, high = f"{min(values):.{decimals}f}", f"{max(values):.{decimals}f}"
    return low if low == high else f"{low}-{high}"


def frames_span(frames: Sequence[int]) -> str:
    """[3, ..., 20] -> '3-20'; [7] -> '7'."""
    return str(frames[0]) if len(frames) == 1 else f"{frames[0]}-{frames[-1]}"


def listing(items: Sequence[str]) -> str:
    """['1', '4', '5'] -> '1, 4 and 5'; consecutive numbers of three or more -> '2-6'."""
    numbers = [int(i) for i in items] if all(str(i).isdigit() for i in items) else None
    if numbers and len(numbers) >= 3 and numbers == list(range(numbers[0], numbers[0] + len(numbers))):
        return f"{numbers[0]}-{numbers[-1]}"
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" and {items[-1]}"


def seeds_text(runs: pd.DataFrame) -> str:
    """'seeds 0-2' (one prompt), or the runs as 'prompt seed' pairs."""
    if runs["prompt_id"].nunique() == 1:
        seeds = sorted(int(s) for s in runs["seed"])
        consecutive = seeds == list(range(seeds[0], seeds[0] + len(seeds)))
        if len(seeds) == 1:
            return f"seed {seeds[0]}"
        return f"seeds {seeds[0]}-{seeds[-1]}" if consecutive else "seeds " + listing([str(s) for s in seeds])
    return ", ".join(f"{p} seed {s}" for p, s in runs.itertuples(index=False))


# -- what the regions read -------------------------------------------------------------------------


def source_rows(table: pd.DataFrame, params: Mapping[str, str]) -> pd.DataFrame:
    checkpoint, variant = params.get("checkpoint", "demo"), params.get("variant", "default")
    rows = table[(table["checkpoint"] == checkpoint) & (table["variant"] == variant)]
    if rows.empty:
        raise ValueError(f"no rows of checkpoint {checkpoint!r}, variant {variant!r}")
    return rows


def last_step(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the last denoising step (the call figures and head classes use)."""
    pass_, step = resolve_step(rows, "last")
    return rows[(rows["pass"] == pass_) & (rows["step"] == step)]


@dataclass
class Profiles:
    """The last block's head-averaged Figure 4 profile of each layer, and what it is measured against."""

    mass: pd.DataFrame  # index layer, columns key frames
    uniform: pd.DataFrame  # the same, uniform attention's share
    query_frames: list[int]
    runs: pd.DataFrame  # prompt_id, seed


def profiles(tables: StudyTables, params: Mapping[str, str]) -> Profiles:
    frame = source_rows(tables["frame_attention"], params)
    curves, info = figure4_curves(frame, "last", "prob_mass", details=True)
    runs = frame[["prompt_id", "seed"]].drop_duplicates().sort_values(["prompt_id", "seed"])
    return Profiles(
        curves.groupby(level="layer").mean(), info["uniform"].groupby(level="layer").mean(), info["query_frames"], runs
    )


def peaks(profile: Profiles) -> tuple[pd.Series, pd.Series, list[int]]:
    """Each layer's frame-0 mass over uniform (layers at PEAK or more), the mass on the two
    frames before the block for the layers with PEAK times their uniform share there, and
    those two frames."""
    first = profile.mass[0] / profile.uniform[0]
    recent = [f for f in (profile.query_frames[0] - 2, profile.query_frames[0] - 1) if f >= 0]
    mass, uniform = profile.mass[recent].sum(axis=1), profile.uniform[recent].sum(axis=1)
    return first[first >= PEAK], mass[mass >= PEAK * uniform], recent


def layers_text(layers: Iterable[int]) -> str:
    numbers = [str(int(layer) + 1) for layer in layers]
    return ("layer " if len(numbers) == 1 else "layers ") + listing(numbers)


@dataclass
class Classes:
    rows: pd.DataFrame  # head_diagnostics at the last denoising step, indexed (layer, head)
    per_run: dict[tuple[str, int], pd.DataFrame]  # run -> that run's diagnostics alone, as rows
    thresholds: Mapping[str, float]


def classes(tables: StudyTables, params: Mapping[str, str], *, runs: bool = False) -> Classes:
    """The head classes at the last denoising step (head_diagnostics), and with ``runs``
    each run's own (its frame_attention rows alone, at the thresholds of ``params`` or
    the schema's defaults)."""
    thresholds = {**DEFAULT_THRESHOLDS, **{k: float(v) for k, v in params.items() if k in DEFAULT_THRESHOLDS}}
    rows = last_step(source_rows(tables["head_diagnostics"], params)).set_index(["layer", "head"]).sort_index()
    if not runs:
        return Classes(rows, {}, thresholds)
    frame = last_block(source_rows(tables["frame_attention"], params))
    per_run = {}
    for (prompt, seed), run in frame.groupby(["prompt_id", "seed"], observed=True):
        per_run[(str(prompt), int(seed))] = last_step(head_diagnostics(run, thresholds=thresholds)).set_index(
            ["layer", "head"]
        )
    return Classes(rows, per_run, thresholds)


def labels(index: Iterable[tuple[int, int]]) -> list[str]:
    return [head_label(int(layer), int(head)) for layer, head in index]


def named_heads(params: Mapping[str, str]) -> list[tuple[int, int]]:
    return [parse_head_label(label) for label in params.get("heads", "").split(",") if label]


def class_counts(known: Classes) -> dict[str, pd.DataFrame]:
    """Class -> its heads' rows, the sink-like first by frame-0 ratio, the local-like by recent ratio."""
    out = {}
    for klass, by in (("sink", "frame0_ratio"), ("sink?", "frame0_ratio"), ("local", "recent_ratio")):
        out[klass] = known.rows[known.rows["head_class"] == klass].sort_values(by, ascending=False)
    out["local?"] = known.rows[known.rows["head_class"] == "local?"].sort_values("recent_ratio", ascending=False)
    return out


def ratio_spread(row: pd.Series) -> str:
    """'6.4 ± 0.8': a head's frame-0 ratio, mean ± std between runs (the std to the mean's decimals)."""
    std = row.get("frame0_ratio" + RUN_STD_SUFFIX, float("nan"))
    decimals = 1 if abs(row["frame0_ratio"]) >= 1 else 2
    return ratio(row["frame0_ratio"]) + (f" ± {std:.{decimals}f}" if np.isfinite(std) else "")


def sink_runs(known: Classes, head: tuple[int, int]) -> str:
    """'a sink at seeds 0 and 2, not at seed 1': how each run alone classes the head."""
    sink = [run for run, alone in known.per_run.items() if alone["head_class"].get(head) == "sink"]
    other = [run for run in known.per_run if run not in sink]

    def runs(chosen: list[tuple[str, int]]) -> str:
        prompts = {p for p, _ in known.per_run}
        words = [f"{s}" if len(prompts) == 1 else f"{p} seed {s}" for p, s in chosen]
        return ("seed " if len(chosen) == 1 else "seeds ") + listing(words) if len(prompts) == 1 else listing(words)

    if not sink:
        return "a sink in no run alone"
    return f"a sink at {runs(sink)}" + (f", not at {runs(other)}" if other else "")


# -- the regions -----------------------------------------------------------------------------------


def layer_profile(tables: StudyTables, params: Mapping[str, str]) -> str:
    profile = profiles(tables, params)
    frames = list(profile.mass.columns)
    lines = ["key frame" + "".join(f"{int(f):>6}" for f in frames)]
    for layer, row in profile.mass.iterrows():
        cells = "".join(f"{f'{v:.3f}'.lstrip('0') if np.isfinite(v) else '-':>6}" for v in row.to_numpy())
        lines.append(f"{'L' + str(int(layer) + 1):<9}{cells}")
    return "```\n" + "\n".join(lines) + "\n```"


def peaks_text(profile: Profiles) -> tuple[str, str]:
    """('3.4x uniform in L1, 2.4x in L4, 2.0x in L5', 'layers 2-6 put 0.29-0.43 of their
    mass on the two most recent frames (16-17)')."""
    first, recent, frames = peaks(profile)
    first = first.sort_values(ascending=False)
    peak = ", ".join(
        f"{ratio(v)}x{' uniform' if i == 0 else ''} in L{int(layer) + 1}" for i, (layer, v) in enumerate(first.items())
    )
    recency = (
        f"{layers_text(recent.index)} put {span(recent.to_numpy())} of their mass on the two most recent "
        f"frames ({frames_span(frames)})"
    )
    return peak, recency


def layer_peaks(tables: StudyTables, params: Mapping[str, str]) -> str:
    peak, recency = peaks_text(profiles(tables, params))
    return f"a peak on frame 0 ({peak}) and recency: {recency}"


def head_classes(tables: StudyTables, params: Mapping[str, str]) -> str:
    known = classes(tables, params, runs=True)
    groups = class_counts(known)
    bold = set(named_heads(params))
    sinks = []
    for head, row in groups["sink"].iterrows():
        text = f"{head_label(*head)} {ratio_spread(row)}"
        text = f"**{text}**" if head in bold else text
        whole = row["frame0_mass"] >= 0.995
        sinks.append(text + (", all of its mass on frame 0;" if whole else ","))
    listed = " ".join(sinks).rstrip(",;")
    parts = [f"calls {len(groups['sink'])} `sink` (frame-0 mass / uniform, mean ± std between runs: {listed})"]
    if len(groups["sink?"]):
        borderline = "; ".join(
            f"{head_label(*head)}, {ratio_spread(row)}: {sink_runs(known, head)}"
            for head, row in groups["sink?"].iterrows()
        )
        parts.append(f"{len(groups['sink?'])} borderline `sink?` ({borderline})")
    local = f"{len(groups['local'])} `local`"
    if len(groups["local?"]):
        local += f" and {len(groups['local?'])} `local?` ({', '.join(labels(groups['local?'].index))})"
    parts.append(local)
    text = ", ".join(parts[:-1]) + f", {parts[-1]}." if len(parts) > 1 else parts[0] + "."
    if len(known.per_run) > 1:  # the first run alone: no interval between runs, so no borderline label
        (prompt, seed), solo = next(iter(known.per_run.items()))
        alone = solo[solo["head_class"] == "sink"]
        extra = [head for head in groups["sink?"].index if head in alone.index]
        run = f"Seed {seed}" if len({p for p, _ in known.per_run}) == 1 else f"{prompt} seed {seed}"
        among = "".join(f", {head_label(*h)} among them ({ratio(alone.loc[h, 'frame0_ratio'])}x)" for h in extra)
        text += f" {run} alone (no interval, so no borderline label) has {len(alone)} `sink`{among}."
    return text


def demo_summary(tables: StudyTables, params: Mapping[str, str]) -> str:
    profile = profiles(tables, params)
    first, recent, _ = peaks(profile)
    known = classes(tables, params)
    groups = class_counts(known)
    heads = len(known.rows)
    peak_layers = layers_text(sorted(first.index))
    text = (
        f"over the default's {len(profile.runs)} runs ({seeds_text(profile.runs)}), the last block puts "
        f"{span(first.to_numpy(), 1)}x uniform on frame 0 in {peak_layers}, and {layers_text(recent.index)} put "
        f"{span(recent.to_numpy())} of their mass on the two most recent frames. The head classifier, which "
        f"decides on the ratio to uniform over the runs together, calls {len(groups['sink'])} of its {heads} heads "
        "`sink`"
    )
    named = [h for h in named_heads(params) if h in groups["sink"].index]
    if named:
        shown = ", ".join(f"{head_label(*h)}, {ratio_spread(groups['sink'].loc[h])}x uniform" for h in named)
        text += f" (among them the figure head{'s' if len(named) > 1 else ''} {shown}, mean ± std between runs)"
    if len(groups["sink?"]):
        threshold = f"{known.thresholds['sink_ratio']:g}"
        borderline = "; ".join(
            f"{head_label(*h)}, {ratio_spread(row)}x against the threshold of {threshold}x"
            for h, row in groups["sink?"].iterrows()
        )
        text += f", {len(groups['sink?'])} more borderline `sink?` ({borderline})"
    text += f", {len(groups['local'])} `local` and {len(groups['local?'])} `local?`."
    return text


def head_note(tables: StudyTables, params: Mapping[str, str]) -> str:
    known = classes(tables, params)
    sinks = int((known.rows["head_class"] == "sink").sum())
    notes = []
    for head in named_heads(params):
        row = known.rows.loc[head]
        notes.append(
            f"the paper's {head_label(*head)} is a {row['head_class']} head here ({ratio(row['frame0_ratio'])}x "
            "uniform on frame 0)"
        )
    share = 100 * sinks / len(known.rows)
    return ", ".join(notes) + f", and {sinks} sink heads is {share:.1f}%"


def sink_mass_blocks(tables: StudyTables, params: Mapping[str, str]) -> str:
    stats = source_rows(tables["block_stats"], params)
    per_run = stats.groupby(["block", "prompt_id", "seed"], observed=True)[["sink_mass", "sink_uniform"]].mean()
    blocks = per_run.groupby(level="block").mean()
    blocks = blocks[blocks["sink_uniform"].notna()]
    first, last = int(blocks.index.min()), int(blocks.index.max())
    mass, uniform = blocks["sink_mass"], blocks["sink_uniform"]
    excess = mass - uniform
    return (
        f"frame 0 gets {mass[first]:.2g} of block {first}'s mass and {mass[last]:.2g} of block {last}'s, against a "
        f"uniform {uniform[first]:.2g} and {uniform[last]:.2g}: an excess of {signed(excess[first], 3)} that ends at "
        f"{signed(excess[last], 3)}"
    )


def effects_rows(tables: StudyTables, name: str, params: Mapping[str, str]) -> pd.DataFrame:
    table = tables[name]
    return table[table["checkpoint"] == params.get("checkpoint", "demo")]


def edited_variants(table: pd.DataFrame) -> list[str]:
    """The variants paired with the untouched run, the nearest to it (last block's mean
    latent distance) first; atlas runs (``<sweep>/<item>``) left to the atlas regions."""
    last = table[(table["block"] == table["block"].max()) & (table["variant"] != "default")]
    last = last[~last["variant"].astype(str).map(is_atlas_run)]
    return list(last.groupby("variant", observed=True)["latent_rel_distance"].mean().sort_values().index.astype(str))


def intervention_heads(tables: StudyTables, params: Mapping[str, str]) -> str:
    known = classes(tables, {**params, "variant": "default"})
    sinks = labels(known.rows.index[known.rows["head_class"] == "sink"])
    text = f"The untouched run classes {len(sinks)} heads `sink` ({', '.join(sinks)})"
    control = params.get("control")
    if control:
        heads = effects_rows(tables, "variant_head_effects", params)
        chosen = heads[(heads["variant"] == control) & (heads["prompt_id"] == ALL_PROMPTS) & heads["edited"]]
        if chosen.empty:
            raise ValueError(f"control {control!r} has no edited heads in variant_head_effects")
        drawn = labels(sorted(zip(chosen["layer"], chosen["head"])))
        text += f"; its control `{control}` edits {', '.join(drawn)} instead"
    return text + "."


def intervention_table(tables: StudyTables, params: Mapping[str, str]) -> str:
    frames = effects_rows(tables, "variant_effects", params)
    heads = effects_rows(tables, "variant_head_effects", params)
    per_run = frames[frames["prompt_id"] != ALL_PROMPTS]
    runs = per_run[["prompt_id", "seed"]].drop_duplicates().sort_values(["prompt_id", "seed"])
    later = sorted(int(f) for f in per_run.loc[per_run["block"] > 0, "latent_frame"].unique())
    last_block_ = int(per_run["block"].max())
    last = sorted(int(f) for f in per_run.loc[per_run["block"] == last_block_, "latent_frame"].unique())
    block0 = sorted(int(f) for f in per_run.loc[per_run["block"] == 0, "latent_frame"].unique())
    seeds = " / ".join(str(s) for s in runs["seed"]) if runs["prompt_id"].nunique() == 1 else seeds_text(runs)
    lines = [
        f"| variant | mean latent distance, frames {frames_span(later)} ({seeds_label(runs)} {seeds}) "
        f"| last block (frames {frames_span(last)}), mean ± std between runs "
        "| frame-0 mass of the edited heads, change | largest frame-0 mass change of any head |",
        "|---|---|---|---|---|",
    ]
    averaged = heads[heads["prompt_id"] == ALL_PROMPTS]
    for variant in edited_variants(per_run):
        rows = per_run[per_run["variant"] == variant]
        after = rows[rows["latent_frame"].isin(later)].groupby(["prompt_id", "seed"])["latent_rel_distance"].mean()
        closing = rows[rows["latent_frame"].isin(last)].groupby(["prompt_id", "seed"])["latent_rel_distance"].mean()
        std = closing.std(ddof=1) if len(closing) > 1 else float("nan")
        own = averaged[averaged["variant"] == variant]
        edited = own[own["edited"]]
        if edited.empty:
            change = "(no edited head)"
        else:
            worst = edited.loc[edited["frame0_mass_change"].idxmin()]
            change = f"{fixed(edited['frame0_mass_change'].mean())} on average ({len(edited)} heads)"
            if worst["frame0_mass_change"] < 0:
                change += (
                    f", at most {fixed(worst['frame0_mass_change'])} ({head_label(worst['layer'], worst['head'])})"
                )
        largest = own.loc[own["frame0_mass_change"].abs().idxmax()] if len(own) else None
        anyhead = (
            "n/a"
            if largest is None
            else f"{fixed(largest['frame0_mass_change'])} ({head_label(largest['layer'], largest['head'])})"
            if largest["frame0_mass_change"] != 0
            else "0"
        )
        lines.append(
            f"| `{variant}` | {' / '.join(fixed(v) for v in after.to_numpy())} | {spread(closing.mean(), std)} "
            f"| {change} | {anyhead} |"
        )
    zero = per_run.loc[per_run["latent_frame"].isin(block0), "latent_rel_distance"].abs().max()
    lines.append("")
    lines.append(
        f"Block 0 (frames {frames_span(block0)}), which no edit reaches (it has no cache): the largest latent "
        f"distance of any variant and run there is {fixed(float(zero))}."
    )
    return "\n".join(lines)


def seeds_label(runs: pd.DataFrame) -> str:
    return "seeds" if runs["prompt_id"].nunique() == 1 else "runs:"


def intervention_drift(tables: StudyTables, params: Mapping[str, str]) -> str:
    frames = effects_rows(tables, "variant_effects", params)
    averaged = frames[frames["prompt_id"] == ALL_PROMPTS]
    last_block_ = int(averaged["block"].max())
    last = sorted(int(f) for f in averaged.loc[averaged["block"] == last_block_, "latent_frame"].unique())
    lines = [
        "| variant | frames where its cosine to frame 0 lies above the untouched video's: its / the untouched's "
        f"| last block (frames {frames_span(last)}): its / the untouched's |",
        "|---|---|---|",
    ]
    for variant in edited_variants(averaged):
        rows = averaged[(averaged["variant"] == variant) & (averaged["block"] > 0)].sort_values("latent_frame")
        own, untouched = rows["first_frame_similarity"].to_numpy(), rows["first_frame_similarity_default"].to_numpy()
        above = rows["latent_frame"].to_numpy()[own > untouched + 1e-12]
        stretches = [run for run in _stretches(above) if len(run) >= 2]
        where = (
            "; ".join(
                f"{frames_span(run)}: {span(own[np.isin(rows['latent_frame'], run)])} against "
                f"{span(untouched[np.isin(rows['latent_frame'], run)])}"
                for run in stretches
            )
            or "none"
        )
        closing = rows["block"].to_numpy() == last_block_
        lines.append(f"| `{variant}` | {where} | {span(own[closing])} against {span(untouched[closing])} |")
    return "\n".join(lines)


def _stretches(frames: Iterable[int]) -> list[list[int]]:
    """Consecutive frames grouped: [7, 8, 9, 12] -> [[7, 8, 9], [12]]."""
    out: list[list[int]] = []
    for frame in sorted(int(f) for f in frames):
        if out and frame == out[-1][-1] + 1:
            out[-1].append(frame)
        else:
            out.append([frame])
    return out


def atlas_rows(tables: StudyTables, name: str, params: Mapping[str, str]) -> pd.DataFrame:
    """The run-averaged rows of one sweep (``sweep=``) of a checkpoint's atlas table ``name``."""
    table = effects_rows(tables, name, params)
    sweep = params.get("sweep")
    rows = table[(table["sweep"].astype(str) == sweep) & (table["prompt_id"] == ALL_PROMPTS)]
    if rows.empty:
        raise ValueError(f"{name} has no run-averaged rows of sweep {sweep!r}")
    return rows


def drift_of(row: pd.Series) -> str:
    return spread(row["drift_last_block"], row["drift_last_block" + RUN_STD_SUFFIX])


def atlas_heads(tables: StudyTables, params: Mapping[str, str]) -> str:
    rows = atlas_rows(tables, "head_atlas", params).sort_values(["drift_last_block", "layer", "head"], ascending=False)
    rows = rows[rows["head"] >= 0]
    if rows.empty:
        raise ValueError(
            f"sweep {params.get('sweep')!r} has no head rows (a sweep over layers?); atlas-heads reads a head sweep"
        )
    top = [
        f"{head_label(r['layer'], r['head'])} ({drift_of(r)})"
        for _, r in rows.head(int(params.get("top", 5))).iterrows()
    ]
    drift = rows["drift_last_block"]
    sinks = rows[rows["head_class"].astype(str) == "sink"]
    others = rows[rows["head_class"].astype(str) != "sink"]
    text = (
        f"over its {len(rows)} heads and {int(rows['runs'].max())} runs, the drift at the last block runs from "
        f"{fixed(drift.min())} to {fixed(drift.max())} (median {fixed(drift.median())}); the most: {', '.join(top)}"
    )
    if len(sinks):
        text += (
            f"; the untouched run's {len(sinks)} sink-class heads {fixed(sinks['drift_last_block'].mean())} on "
            f"average, its other {len(others)} heads {fixed(others['drift_last_block'].mean())}"
        )
    rho = rank_correlation(rows["drift_last_block"], rows["frame0_mass_default"])
    return text + f"; Spearman's ρ between a head's drift and its untouched frame-0 mass is {rho:.2f}"


def atlas_frames(tables: StudyTables, params: Mapping[str, str]) -> str:
    rows = atlas_rows(tables, "frame_atlas", params).sort_values("key_frame")
    ranked = rows.sort_values(["drift_last_block", "key_frame"], ascending=[False, True])
    top = [f"{int(r['key_frame'])} ({drift_of(r)})" for _, r in ranked.head(int(params.get("top", 5))).iterrows()]
    least = ranked.tail(3).iloc[::-1]
    sinks = rows[rows["sink"].astype(bool)]
    text = (
        f"over its {len(rows)} cached frames ({frames_span([int(f) for f in rows['key_frame']])}) and "
        f"{int(rows['runs'].max())} runs, editing frame {', '.join(top)} moves the last block most; frame "
        + ", ".join(f"{int(r['key_frame'])} ({fixed(r['drift_last_block'])})" for _, r in least.iterrows())
        + " least"
    )
    if len(sinks):
        text += "; the sink frame " + ", ".join(f"{int(r['key_frame'])}: {drift_of(r)}" for _, r in sinks.iterrows())
    rho = rank_correlation(rows["drift_last_block"], rows["frame_mass_default"])
    return text + f"; Spearman's ρ between a frame's drift and its untouched mass is {rho:.2f}"


def pruning_table(tables: StudyTables, params: Mapping[str, str]) -> str:
    rows = atlas_rows(tables, "pruning_curve", params)
    orders = ("drift", "random", "frame0_mass")
    counts = sorted(int(k) for k in rows["head_count"].unique())
    every = rows[rows["order"] == "all"]
    lines = [
        "| heads edited (k) | " + " | ".join(f"`{order}` order" for order in orders) + " |",
        "|---|" + "---|" * len(orders),
    ]
    for count in counts:
        chosen = rows[rows["head_count"] == count]
        if (chosen["order"] == "all").any():
            cells = [drift_of(chosen[chosen["order"] == "all"].iloc[0])] * len(orders)
        else:
            cells = [
                drift_of(chosen[chosen["order"] == order].iloc[0]) if (chosen["order"] == order).any() else "-"
                for order in orders
            ]
        lines.append(f"| {count} | " + " | ".join(cells) + " |")
    largest = max(counts)
    areas = []
    for order in orders:
        curve = pd.concat([rows[rows["order"] == order], every])[["head_count", "drift_last_block"]]
        points = sorted([(0, 0.0), *((int(k), float(d)) for k, d in curve.itertuples(index=False))])
        k, d = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
        areas.append(f"`{order}` {fixed(float(np.sum((k[1:] - k[:-1]) * (d[1:] + d[:-1]) / 2)) / largest)}")
    lines += ["", f"Area under each curve over k = 0-{largest}, divided by {largest}: {', '.join(areas)}."]
    return "\n".join(lines)


# kind: (writer, the region is a block of its own lines rather than words in a sentence)
REGIONS: dict[str, tuple[Callable[[StudyTables, Mapping[str, str]], str], bool]] = {
    "layer-profile": (layer_profile, True),
    "layer-peaks": (layer_peaks, False),
    "head-classes": (head_classes, False),
    "demo-summary": (demo_summary, False),
    "head-note": (head_note, False),
    "sink-mass-blocks": (sink_mass_blocks, False),
    "intervention-heads": (intervention_heads, False),
    "intervention-table": (intervention_table, True),
    "intervention-drift": (intervention_drift, True),
    "atlas-heads": (atlas_heads, False),
    "atlas-frames": (atlas_frames, False),
    "pruning-table": (pruning_table, True),
}


def wrapped(words: str, column: int) -> str:
    """``words`` wrapped to WIDTH, the first line starting at ``column``; a line that
    markdown would read as a list, heading or quote stays on the line before."""
    lines = textwrap.wrap(words, WIDTH, initial_indent="x" * column, break_on_hyphens=False, break_long_words=False)
    if lines:
        lines[0] = lines[0][column:]
    joined: list[str] = []
    for line in lines:
        if joined and BLOCK_START.match(line):
            joined[-1] += " " + line
        else:
            joined.append(line)
    return "\n".join(joined)


def region_params(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split())


def update_text(text: str, tables: StudyTables, doc: str = "the doc") -> tuple[str, list[str]]:
    """``text`` with every findings region rewritten from ``tables``, and the kinds of the
    regions whose text changed. A region of an unknown kind, or one the tables cannot
    fill, is refused in one line naming ``doc`` and the region."""
    changed: list[str] = []

    def rewrite(match: re.Match) -> str:
        kind, params = match["kind"], region_params(match["params"])
        if kind not in REGIONS:
            raise FindingsError(f"{doc}: unknown findings region {kind!r} (known: {', '.join(REGIONS)})")
        writer, block = REGIONS[kind]
        try:
            body = writer(tables, params)
        except FindingsError as error:
            raise FindingsError(f"{doc}: region {kind}: {error}") from None
        except (KeyError, ValueError) as error:
            message = error.args[0] if error.args else type(error).__name__
            raise FindingsError(f"{doc}: region {kind}: the tables cannot fill it ({message})") from None
        if block:
            body = f"\n{body}\n"
        else:
            column = match.start() - (text.rfind("\n", 0, match.start()) + 1) + len(match["begin"])
            body = wrapped(body, column)
        if body != match["body"]:
            changed.append(kind)
        return f"{match['begin']}{body}{match['end']}"

    return REGION.sub(rewrite, text), changed


def update_docs(paths: Sequence[str | Path], tables: str | Path, *, check: bool = False) -> dict[str, list[str]]:
    """Rewrite the findings regions of each doc from the study tables in ``tables``
    (``check``: write nothing); doc -> the kinds of its regions that changed (or would)."""
    study = StudyTables(tables)
    out = {}
    for path in paths:
        path = Path(path)
        text = path.read_text()
        if not REGION.search(text):
            raise FindingsError(f"{path}: no findings region (<!-- begin: findings KIND --> ... <!-- end -->)")
        new, changed = update_text(text, study, str(path))
        out[str(path)] = changed
        if changed and not check:
            with atomic_path(path) as tmp:
                tmp.write_text(new)
    return out
