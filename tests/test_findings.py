"""Numbers in the docs written from a study's tables (sinkscope.pipeline.findings,
``sinkscope findings``): each region kind on small synthetic tables against the numbers
worked out here by hand from the same rows, "±" the std between runs (not over runs x
frames), text outside the regions untouched, a second run changing nothing, --check, and
one-line refusals. The shipped docs' regions are checked to be filled by a known kind."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO
from synthetic import synthetic_effects
from test_figures import synthetic_frames

from sinkscope.cli import main
from sinkscope.naming import head_label
from sinkscope.pipeline.effects import with_run_means
from sinkscope.pipeline.findings import REGION, REGIONS, FindingsError, StudyTables, update_docs, update_text
from sinkscope.stats import summaries
from sinkscope.tables import ALL_PROMPTS, EFFECTS_RUN_STD, RUN_STD_SUFFIX, SCHEMAS, write_table

RUNS = (("drift", 0), ("drift", 1), ("drift", 2))
VARIANTS = (("sink_heads", [(0, 0), (1, 2)]), ("sink_control", [(0, 1), (1, 3)]), ("identity", "all"), ("kv_int4", []))


@cache
def tables() -> dict[str, pd.DataFrame]:
    """A small study: 2 layers x 4 heads, 3 seeds of one prompt, 21 frames in blocks of 3,
    and four edited variants' effects against it."""
    frame = synthetic_frames(2, 4, runs=RUNS, checkpoint="demo", tokens=24)
    effects = synthetic_effects(2, 4, runs=RUNS, checkpoint="demo", variants=VARIANTS, seed=3)
    # Distances that grow frame by frame and differ between runs, as an edit's do, so that
    # the std between runs and the std over runs x frames differ.
    per_run = effects["variant_effects"]
    per_run = per_run[per_run["prompt_id"] != ALL_PROMPTS].drop(columns=["runs"])
    per_run = per_run[[c for c in per_run.columns if not c.endswith(RUN_STD_SUFFIX)]]
    growth = (1 + per_run["latent_frame"]) * (1 + 0.4 * per_run["seed"])
    per_run = per_run.assign(latent_rel_distance=per_run["latent_rel_distance"] * growth)
    effects["variant_effects"] = with_run_means(
        per_run, ["checkpoint", "variant", "latent_frame"], EFFECTS_RUN_STD, ["block"]
    )
    return {
        "frame_attention": frame,
        "head_diagnostics": summaries.head_diagnostics(frame),
        "block_stats": summaries.block_stats(frame, 0),
        **effects,
    }


def last_call(diagnostics: pd.DataFrame) -> pd.DataFrame:
    denoise = diagnostics[diagnostics["pass"] == "denoise"]
    return denoise[denoise["step"] == denoise["step"].max()]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tables")
    for name, rows in tables().items():
        write_table(rows, root / f"{name}.parquet", SCHEMAS[name])
    return root


def filled(folder: Path, kind: str, params: str = "") -> str:
    text = f"before <!-- begin: findings {kind}{' ' + params if params else ''} --><!-- end --> after"
    new, changed = update_text(text, StudyTables(folder))
    assert changed == [kind] and new.startswith("before <!-- begin") and new.endswith("<!-- end --> after")
    return REGION.search(new)["body"]


def words(text: str) -> str:
    return " ".join(text.split())


def last_step_rows() -> pd.DataFrame:
    frame = tables()["frame_attention"]
    last = frame[(frame["block"] == frame["block"].max()) & (frame["pass"] == "denoise")]
    return last[last["step"] == last["step"].max()]


def test_layer_profile_is_the_head_averaged_last_block_curve(folder):
    body = filled(folder, "layer-profile")
    lines = body.strip().strip("`").strip().splitlines()
    assert lines[0].split() == ["key", "frame", *[str(f) for f in range(21)]]
    rows = last_step_rows()
    # Per head: the mean over its runs and query frames; then the mean over heads.
    expected = rows.groupby(["layer", "head", "key_frame"])["prob_mass"].mean().groupby(["layer", "key_frame"]).mean()
    for line in lines[1:]:
        label, *cells = line.split()
        layer = int(label[1:]) - 1
        shown = [float(cell) for cell in cells]
        assert np.allclose(shown, expected.loc[layer].to_numpy(), atol=5e-4), layer


def test_head_classes_list_each_sink_head_with_its_ratio_and_std_between_runs(folder):
    body = words(filled(folder, "head-classes", "heads=L1H1"))
    diagnostics = tables()["head_diagnostics"]
    last = last_call(diagnostics)
    sinks = last[last["head_class"] == "sink"].sort_values("frame0_ratio", ascending=False)
    assert len(sinks) >= 2
    assert body.startswith(f"calls {len(sinks)} `sink` (frame-0 mass / uniform, mean ± std between runs: ")
    for row in sinks.itertuples():
        shown = f"{head_label(row.layer, row.head)} {row.frame0_ratio:.1f} ± {row.frame0_ratio_run_std:.1f}"
        assert shown in body, shown
    assert "**L1H1 " in body  # the named head in bold (L1H1 is a sink head here)
    locals_ = int((last["head_class"] == "local").sum())
    assert f"{locals_} `local`" in body and "Seed 0 alone (no interval, so no borderline label) has" in body


def test_intervention_table_gives_the_std_between_runs_not_over_runs_and_frames(folder):
    body = filled(folder, "intervention-table")
    effects = tables()["variant_effects"]
    per_run = effects[(effects["prompt_id"] != ALL_PROMPTS) & (effects["variant"] == "sink_heads")]
    last = per_run[per_run["block"] == per_run["block"].max()]
    by_run = last.groupby("seed")["latent_rel_distance"].mean()
    between, pooled = by_run.std(ddof=1), last["latent_rel_distance"].std(ddof=1)
    assert abs(between - pooled) > 0.01  # the two meanings differ here
    row = next(line for line in body.splitlines() if line.startswith("| `sink_heads` |"))
    assert f"{by_run.mean():.3f} ± {between:.3f}" in row and f"± {pooled:.3f}" not in row
    later = per_run[per_run["block"] > 0].groupby("seed")["latent_rel_distance"].mean()
    assert " / ".join(f"{v:.3f}" for v in later) in row
    assert "| `identity` | 0 / 0 / 0 | 0 ± 0 |" in body
    assert "| `kv_int4` |" in body and "(no edited head)" in body
    assert "frames 3-20" in body and "frames 18-20" in body
    assert body.strip().endswith("the largest latent distance of any variant and run there is 0.")
    order = [line.split("`")[1] for line in body.splitlines() if line.startswith("| `")]
    assert order[0] == "identity" and set(order) == {name for name, _ in VARIANTS}


def test_intervention_heads_name_the_sink_heads_and_the_controls(folder):
    body = words(filled(folder, "intervention-heads", "control=sink_control"))
    diagnostics = tables()["head_diagnostics"]
    last = last_call(diagnostics)
    sinks = [
        head_label(a, b) for a, b in sorted(zip(*last.loc[last["head_class"] == "sink", ["layer", "head"]].T.values))
    ]
    assert f"classes {len(sinks)} heads `sink` ({', '.join(sinks)})" in body
    assert body.endswith("its control `sink_control` edits L1H2, L2H4 instead.")


def test_drift_and_sink_mass_regions_read_their_tables(folder):
    drift = filled(folder, "intervention-drift")
    assert drift.count("\n| `") == len(VARIANTS) and "| `identity` | none |" in drift
    mass = words(filled(folder, "sink-mass-blocks"))
    stats = tables()["block_stats"]
    block1 = stats[stats["block"] == 1].groupby(["prompt_id", "seed"])["sink_mass"].mean().mean()
    assert mass.startswith(f"frame 0 gets {block1:.2g} of block 1's mass and ") and "of block 6's" in mass


def test_docs_are_rewritten_only_inside_their_regions_and_once(folder, tmp_path):
    doc = tmp_path / "doc.md"
    text = (
        "# Title\n\nWords before <!-- begin: findings head-note heads=L1H1 -->stale<!-- end -->, words after.\n\n"
        "<!-- begin: findings layer-profile -->\nold table\n<!-- end -->\n\nThe end.\n"
    )
    doc.write_text(text)
    assert update_docs([doc], folder, check=True) == {str(doc): ["head-note", "layer-profile"]}
    assert doc.read_text() == text  # --check writes nothing
    update_docs([doc], folder)
    new = doc.read_text()
    outside = re.sub(r"(<!-- begin: findings [^>]*-->).*?(<!-- end -->)", r"\1\2", new, flags=re.S)
    assert outside == re.sub(r"(<!-- begin: findings [^>]*-->).*?(<!-- end -->)", r"\1\2", text, flags=re.S)
    assert "stale" not in new and "old table" not in new and "the paper's L1H1 is a sink head here" in words(new)
    note = REGION.search(new)  # words in a sentence: wrapped to the docs' 90 columns from where they start
    start = note.start("body") - (new.rfind("\n", 0, note.start()) + 1)
    lines = note["body"].splitlines()
    assert len(lines) > 1 and start + len(lines[0]) <= 90 and all(len(line) <= 90 for line in lines[1:])
    assert update_docs([doc], folder) == {str(doc): []}  # a second run changes nothing


def test_the_command_checks_writes_and_refuses_in_one_line(folder, tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text("A <!-- begin: findings head-note heads=L1H1 -->old<!-- end -->.\n")
    assert main(["findings", "--check", "--tables", str(folder), str(doc)]) == 1
    assert capsys.readouterr().out.strip() == f"{doc}: would rewrite head-note"
    assert main(["findings", "--tables", str(folder), str(doc)]) == 0
    assert main(["findings", "--check", "--tables", str(folder), str(doc)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{doc}: up to date")
    doc.write_text("A <!-- begin: findings head-notes --><!-- end -->.\n")
    assert main(["findings", "--tables", str(folder), str(doc)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"sinkscope findings: error: {doc}: unknown findings region 'head-notes' (known: ")
    doc.write_text("A <!-- begin: findings layer-profile checkpoint=other --><!-- end -->.\n")
    assert main(["findings", "--tables", str(folder), str(doc)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"sinkscope findings: error: {doc}: region layer-profile: the tables cannot fill it "
        "(no rows of checkpoint 'other', variant 'default')"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    doc.write_text("A <!-- begin: findings layer-profile --><!-- end -->.\n")
    assert main(["findings", "--tables", str(empty), str(doc)]) == 2
    assert f"region layer-profile: {empty / 'frame_attention.parquet'} not found" in capsys.readouterr().err
    with pytest.raises(FindingsError, match="no findings region"):
        update_docs([REPO / "pyproject.toml"], folder)


def test_the_shipped_docs_mark_their_run_numbers_with_known_regions():
    """The docs whose numbers come from a run hold findings regions, each of a known kind."""
    found = {}
    for name in ("README.md", "docs/trained-demo.md", "docs/statistics.md", "docs/interventions.md", "docs/atlas.md"):
        kinds = [m["kind"] for m in REGION.finditer((REPO / name).read_text())]
        assert kinds and set(kinds) <= set(REGIONS), (name, kinds)
        found[name] = kinds
    assert "intervention-table" in found["docs/interventions.md"] and "demo-summary" in found["README.md"]
    assert {"atlas-heads", "atlas-frames", "pruning-table"} <= set(found["docs/atlas.md"])


# -- the atlas regions -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def atlas_folder(tmp_path_factory) -> Path:
    from synthetic import synthetic_atlas

    root = tmp_path_factory.mktemp("atlas")
    for name, rows in synthetic_atlas(3, 4, runs=RUNS, checkpoint="demo", seed=5).items():
        write_table(rows, root / f"{name}.parquet", SCHEMAS[name])
    return root


def _averaged(folder: Path, name: str, sweep: str) -> pd.DataFrame:
    rows = pd.read_parquet(folder / f"{name}.parquet")
    return rows[(rows["sweep"] == sweep) & (rows["prompt_id"] == ALL_PROMPTS)]


def _rho(x, y) -> float:
    """Spearman's rho by hand: Pearson's r of the average ranks."""
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    return float(np.corrcoef(rx, ry)[0, 1])


def test_atlas_heads_name_the_heads_of_most_drift_and_the_rank_correlation(atlas_folder):
    text = words(filled(atlas_folder, "atlas-heads", "sweep=sink_per_head top=2"))
    rows = _averaged(atlas_folder, "head_atlas", "sink_per_head").sort_values("drift_last_block", ascending=False)
    first, second = rows.iloc[0], rows.iloc[1]
    std = first["drift_last_block" + RUN_STD_SUFFIX]
    assert "over its 12 heads and 3 runs" in text
    assert (
        f"the most: {head_label(first['layer'], first['head'])} ({first['drift_last_block']:.3f} ± {std:.3f})" in text
    )
    assert f", {head_label(second['layer'], second['head'])} (" in text
    assert f"median {rows['drift_last_block'].median():.3f}" in text
    sinks = rows[rows["head_class"] == "sink"]
    assert f"sink-class heads {sinks['drift_last_block'].mean():.3f} on average" in text
    assert text.endswith(f"is {_rho(rows['drift_last_block'], rows['frame0_mass_default']):.2f}")


def test_atlas_frames_name_the_frames_of_most_and_least_drift(atlas_folder):
    text = words(filled(atlas_folder, "atlas-frames", "sweep=cache_per_frame top=1"))
    rows = _averaged(atlas_folder, "frame_atlas", "cache_per_frame").sort_values("drift_last_block")
    most, least = rows.iloc[-1], rows.iloc[0]
    assert f"editing frame {int(most['key_frame'])} ({most['drift_last_block']:.3f} ±" in text
    assert f"frame {int(least['key_frame'])} ({least['drift_last_block']:.3f})" in text.split("least")[0]
    assert text.endswith(f"is {_rho(rows['drift_last_block'], rows['frame_mass_default']):.2f}")


def test_pruning_table_gives_each_order_per_k_and_its_area(atlas_folder):
    body = filled(atlas_folder, "pruning-table", "sweep=prune")
    rows = _averaged(atlas_folder, "pruning_curve", "prune")
    total = int(rows["head_count"].max())
    for k in sorted(int(k) for k in rows["head_count"].unique()):
        chosen = rows[rows["head_count"] == k]
        line = next(line for line in body.splitlines() if line.startswith(f"| {k} |"))
        for order in ("drift", "random", "frame0_mass"):
            row = chosen[chosen["order"] == (order if k < total else "all")].iloc[0]
            assert f"{row['drift_last_block']:.3f} ± {row['drift_last_block' + RUN_STD_SUFFIX]:.3f}" in line
    for order in ("drift", "random", "frame0_mass"):
        points = rows[rows["order"].isin([order, "all"])].sort_values("head_count")
        k = np.concatenate([[0], points["head_count"].to_numpy(float)])
        d = np.concatenate([[0], points["drift_last_block"].to_numpy(float)])
        assert f"`{order}` {np.trapezoid(d, k) / total:.3f}" in body
