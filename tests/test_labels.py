"""Head labels from the literature: the study's pyramid_label rule, label files, agreement
tables, the label_agreement figure and `sinkscope compare-labels`."""

from __future__ import annotations

import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from sinkscope import plot
from sinkscope.errors import ConfigError, SinkscopeError
from sinkscope.labels import read_label_file
from sinkscope.stats import summaries
from sinkscope.stats.labels import agreement
from sinkscope.tables import HEAD_DIAGNOSTICS_SCHEMA, write_table

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "configs" / "head_labels" / "pyramid_forcing_best_labels.csv"


# -- the rule on synthetic frame_attention rows ------------------------------------------------------


def _frame(profiles: dict[int, list[float]]) -> pd.DataFrame:
    """The last block (query frames 12..14 of a 15-frame video, blocks of 3) of one call,
    one head per profile: logit_mean of key frame k = profiles[head][k] for every query frame."""
    rows = []
    for head, profile in profiles.items():
        for qf in (12, 13, 14):
            for kf in range(qf + 1):
                rows.append(
                    dict(
                        checkpoint="c",
                        variant="default",
                        prompt_id="p",
                        seed=0,
                        layer=0,
                        head=head,
                        block=4,
                        query_frame=qf,
                        key_frame=kf,
                        **{"pass": "denoise"},
                        step=0,
                        timestep=1000.0,
                        logit_mean=profile[kf],
                        prob_mass=1.0 / (qf + 1),
                        argmax_share=1.0 / (qf + 1),
                        key_tokens=4,
                    )
                )
    return pd.DataFrame(rows)


def test_each_pyramid_label_by_hand():
    n = 15
    k = np.arange(n)
    profiles = {
        0: list(1.0 + 0.1 * k),  # positive on every key frame: sign rate 1 -> anchor (1)
        1: [2.0] + [-1.0] * (n - 1),  # positive on frame 0 only: 1/15 <= 0.2 -> veil (2)
        2: list(np.cos(2 * np.pi * k / 5)),  # period 5 = 15/3, mixed signs -> wave (-1)
        3: [-1.0] * 7 + [0.5, 3.0, 0.5, 2.0, 0.5, 4.0, 0.5, 3.0],  # 8/15 positive, aperiodic, mean > 0 -> 1
        4: [1.0] * 7 + [-3.0, -0.5, -2.0, -0.5, -4.0, -0.5, -3.0, -2.0],  # 7/15 positive, mean < 0 -> 2
    }
    diagnostics = summaries.head_diagnostics(_frame(profiles)).set_index("head")
    # By hand: the sign rates of the full 15-frame profiles (queries see frames 0..12..14;
    # the profile averages each key frame over the query frames that see it).
    assert diagnostics.loc[0, "sign_rate"] == 1.0
    assert diagnostics.loc[1, "sign_rate"] == pytest.approx(1 / 15)
    assert diagnostics.loc[2, "period"] == pytest.approx(5.0) and diagnostics.loc[2, "period_power"] > 0.5
    assert diagnostics.loc[3, "sign_rate"] == pytest.approx(8 / 15)
    assert diagnostics.loc[4, "sign_rate"] == pytest.approx(7 / 15)
    for head in (3, 4):  # aperiodic: the fallback decides
        assert not (diagnostics.loc[head, "period_power"] >= 0.5 and 2 <= diagnostics.loc[head, "period"] <= 7.5)
    assert diagnostics["pyramid_label"].to_dict() == {0: 1, 1: 2, 2: -1, 3: 1, 4: 2}
    assert diagnostics["pyramid_label"].dtype == np.int8


def test_pyramid_label_thresholds_come_from_the_config():
    thresholds = {**summaries.DEFAULT_THRESHOLDS}
    row = {"sign_rate": 0.7, "period": float("nan"), "period_power": float("nan"), "mean_logit": -1.0}
    assert summaries.pyramid_label(row, thresholds, 21) == 2  # mixed, aperiodic, mean < 0
    assert summaries.pyramid_label(row, {**thresholds, "pyramid_sign_high": 0.7}, 21) == 1
    periodic = {**row, "period": 6.0, "period_power": 0.4}
    assert summaries.pyramid_label(periodic, thresholds, 21) == 2
    assert summaries.pyramid_label(periodic, {**thresholds, "pyramid_periodic_power": 0.4}, 21) == -1
    assert summaries.pyramid_label({**periodic, "period_power": 0.9, "period": 12.0}, thresholds, 21) == 2  # > half
    assert summaries.pyramid_label({**row, "sign_rate": float("nan")}, thresholds, 21) == 0


# -- label files -------------------------------------------------------------------------------------


def test_the_shipped_file_reads_as_30_by_12():
    labels = read_label_file(SHIPPED, 30, 12)
    assert labels[0][:4] == [-1, 1, 1, 1] and labels[29][-1] == -1
    assert sum(row.count(2) for row in labels) == 32


@pytest.mark.parametrize(
    "text, message",
    [
        ("1,1\n1,7\n", "line 2, column 2: '7' is not one of -1, 1, 2"),
        ("1,1\n1,x\n", "line 2, column 2: 'x' is not one of"),
        ("1,1\n1,1,1\n", "line 2 has 3 columns, the first row 2"),
        ("1,1\n1,1\n", "2 rows x 2 columns, expected 3 x 2 (layers x heads)"),
        ("# only a comment\n", "no rows"),
    ],
)
def test_a_bad_label_file_is_one_line_naming_the_file_and_cell(tmp_path, text, message):
    file = tmp_path / "labels.csv"
    file.write_text(text)
    with pytest.raises(SinkscopeError) as error:
        read_label_file(file, layers=3 if "expected" in message else None)
    assert str(file) in str(error.value) and message in str(error.value) and "\n" not in str(error.value)


# -- agreement ----------------------------------------------------------------------------------------


def _diagnostics(classes: list[list[str]], codes: list[list[int]]) -> pd.DataFrame:
    rows = [
        dict(
            checkpoint="c",
            variant="default",
            layer=layer,
            head=head,
            step=0,
            timestep=250.0,
            runs=1,
            head_class=classes[layer][head],
            pyramid_label=codes[layer][head],
            **{"pass": "denoise"},
        )
        for layer in range(len(classes))
        for head in range(len(classes[0]))
    ]
    frame = pd.DataFrame(rows)
    frame["borderline"] = frame["head_class"].str.endswith("?")
    for name in HEAD_DIAGNOSTICS_SCHEMA.names:
        if name not in frame:
            frame[name] = np.nan
    return frame[HEAD_DIAGNOSTICS_SCHEMA.names].astype({"pyramid_label": np.int8})


CLASSES = [["sink", "local", "periodic"], ["diffuse", "sink", "local"]]
STUDY = [[1, 2, -1], [1, 1, 2]]
FILE = [[1, 2, 2], [-1, 1, 2]]


def test_agreement_counts_by_hand():
    result = agreement(_diagnostics(CLASSES, STUDY), FILE)
    # file 1: (0,0) sink/1, (1,1) sink/1; file 2: (0,1) local/2, (0,2) periodic/-1, (1,2) local/2;
    # file -1: (1,0) diffuse/1
    assert result.by_class.loc["anchor (1)", "sink"] == 2 and result.by_class.loc["anchor (1)"].sum() == 2
    assert result.by_class.loc["veil (2)", "local"] == 2 and result.by_class.loc["veil (2)", "periodic"] == 1
    assert result.by_class.loc["wave (-1)", "diffuse"] == 1
    assert result.by_label.loc["anchor (1)", "anchor (1)"] == 2
    assert result.by_label.loc["veil (2)", "veil (2)"] == 2 and result.by_label.loc["veil (2)", "wave (-1)"] == 1
    assert result.by_label.loc["wave (-1)", "anchor (1)"] == 1
    assert (result.heads, result.agree, result.missing) == (6, 4, 0)
    assert result.percent == pytest.approx(100 * 4 / 6)
    assert int(result.by_class.to_numpy().sum()) == int(result.by_label.to_numpy().sum()) == 6


def test_borderline_classes_are_counted_apart_from_settled_ones():
    borderline = [["sink?", "local", "periodic"], ["diffuse", "sink", "local?"]]
    result = agreement(_diagnostics(borderline, STUDY), FILE)
    assert result.by_class.loc["anchor (1)", "sink?"] == 1 and result.by_class.loc["anchor (1)", "sink"] == 1
    assert result.by_class.loc["veil (2)", "local?"] == 1 and result.by_class.loc["veil (2)", "local"] == 1
    assert int(result.by_class.to_numpy().sum()) == 6


def test_heads_the_table_lacks_are_counted():
    result = agreement(_diagnostics(CLASSES[:1], STUDY[:1]), FILE)
    assert (result.heads, result.agree, result.missing) == (3, 2, 3)


def test_the_figure_draws():
    fig = plot.plot_label_agreement(_diagnostics(CLASSES, STUDY), FILE)
    assert isinstance(fig, Figure)
    texts = " ".join(t.get_text() for t in fig.texts)
    assert "4 of 6 heads agree" in texts
    gids = {a.get_gid() for ax in fig.axes for a in ax.get_children()}
    assert {"label-agreement-class", "label-agreement-pyramid"} <= gids


# -- the command line ---------------------------------------------------------------------------------


def _sinkscope(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg", "HOME": str(cwd)}
    return subprocess.run(
        [sys.executable, "-m", "sinkscope.cli", *args], capture_output=True, text=True, cwd=cwd, env=env
    )


def test_compare_labels_end_to_end(tmp_path):
    table = tmp_path / "head_diagnostics.parquet"
    write_table(_diagnostics(CLASSES, STUDY), table, HEAD_DIAGNOSTICS_SCHEMA)
    labels = tmp_path / "labels.csv"
    labels.write_text("\n".join(",".join(map(str, row)) for row in FILE) + "\n")
    done = _sinkscope(
        "compare-labels", "--labels", str(labels), "--input", str(table), "--out", str(tmp_path / "agree"), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "agreement with pyramid_label: 4 of 6 heads (66.7%)" in done.stdout
    assert (tmp_path / "agree.svg").is_file() and (tmp_path / "agree.png").is_file()
    labels.write_text("1,1,1\n1,1,9\n")
    done = _sinkscope("compare-labels", "--labels", str(labels), "--input", str(table), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and str(labels) in done.stderr and "line 2, column 3" in done.stderr


def test_the_config_names_a_bad_label_file_in_one_line(tmp_path):
    from sinkscope.pipeline.config import _check_reference_labels

    assert _check_reference_labels(None, tmp_path, {"c": (30, 12)}) == []
    assert _check_reference_labels(str(SHIPPED), tmp_path, {"c": (30, 12)}) == []
    (problem,) = _check_reference_labels("missing.csv", tmp_path, {"c": (30, 12)})
    assert problem == "config key diagnostics.reference_labels: file 'missing.csv' does not exist"
    (problem,) = _check_reference_labels(str(SHIPPED), tmp_path, {"demo": (4, 12)})
    assert "diagnostics.reference_labels" in problem and "30 layers x 12 heads, checkpoint 'demo' 4 x 12" in problem
    (tmp_path / "bad.csv").write_text("1,2\n3,1\n")
    (problem,) = _check_reference_labels("bad.csv", tmp_path, {})
    assert "bad.csv" in problem and "line 2, column 1" in problem
    assert ConfigError.invalid([problem]).args[0].count("\n") == 0


# -- borderline head classes in the figure, the titles and the summary page ------------------------------


@lru_cache(maxsize=1)
def _planted_tables() -> dict[str, pd.DataFrame]:
    """test_summaries' three seeds: L4H1 a sink in every run, L4H2 sink?, L4H3 local?."""
    from test_summaries import _three_seeds_with_planted_ratios

    rows = _three_seeds_with_planted_ratios()
    last = rows[rows["block"] == rows["block"].max()]
    return {
        "frame_attention": rows,
        "head_diagnostics": summaries.head_diagnostics(last),
        "head_stats": summaries.head_stats(last),
        "layer_stats": summaries.layer_stats(last),
    }


def test_borderline_heads_are_drawn_titled_and_counted_apart():
    from sinkscope import figures
    from sinkscope.figures.report import summary_html

    tables = _planted_tables()
    diagnostics = tables["head_diagnostics"]
    fig = figures.draw("head_classes", tables, source="ck", options={"dpi": 40})
    legend = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert {"sink (1)", "sink? borderline (1)", "local (0)", "local? borderline (1)"} <= set(legend), legend
    hatched = [p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith("borderline-")]
    assert len(hatched) == 2 and all(p.get_hatch() for p in hatched)
    words = " ".join(" ".join(t.get_text() for t in fig.texts).split())
    assert "mean ± 1 std between runs" in words and "sink_ratio" in words
    title = figures.draw("figure4", tables, source="ck", options={"dpi": 40, "heads": ["L4H2"]}).axes[0].get_title()
    assert "sink? head" in title and "sink head" not in title
    page = summary_html(
        tables["layer_stats"],
        tables["head_stats"],
        diagnostics,
        {"step": "last", "metric": "prob_mass", "diagnostics": {"sink_ratio": 5.0}},
    )
    counts = page.split("<h3>Head classes</h3>")[1].split("</p>")[0]
    assert "sink: 1, sink? (borderline): 1, local: 0, local? (borderline): 1" in counts and "on 3 runs" in counts
    section = page.split("<h3>Sink-class heads</h3>")[1].split("<h3>")[0]
    assert "1 of 3 heads" in section and "1 more is borderline" in section
    assert "<tr><td>L4H1</td><td>sink</td>" in section and "<tr><td>L4H2</td><td>sink?</td>" in section


def test_with_one_run_the_figure_says_there_is_no_interval():
    from sinkscope import figures

    tables = _planted_tables()
    one = tables["frame_attention"]
    one = one[(one["seed"] == 0) & (one["block"] == one["block"].max())]
    fig = figures.draw(
        "head_classes", {"head_diagnostics": summaries.head_diagnostics(one)}, source="ck", options={"dpi": 40}
    )
    words = " ".join(" ".join(t.get_text() for t in fig.texts).split())
    assert "With one run: no interval, so no borderline label" in words
    assert not any("borderline" in t.get_text() for legend in fig.legends for t in legend.get_texts())
