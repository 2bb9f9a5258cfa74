"""Every subcommand refuses bad arguments before doing any work: exit status 2, one line
on stderr naming the argument, no traceback; and no command replaces a file it did not
write."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from synthetic import synthetic_rows
from test_legacy import token_level_cache

from sinkscope.cli import main
from sinkscope.tables import FRAME_ATTENTION_SCHEMA, write_table

REPO = Path(__file__).resolve().parent.parent


def _sinkscope(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sinkscope.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    write_table(synthetic_rows(seed=1), folder / "frame_attention.parquet", FRAME_ATTENTION_SCHEMA)
    torch.save(token_level_cache(layers=(0,), num_frames=6), folder / "old.pt")
    (folder / "notes.txt").write_text("the user's own file\n")
    (folder / "blob.bin").write_bytes(bytes(range(256)) * 8)
    (folder / "text.pt").write_text("not a checkpoint\n")
    (folder / "own").mkdir()
    (folder / "own" / "keep.txt").write_text("keep\n")
    (folder / "config.yaml").write_text((REPO / "config.yaml").read_text())
    return folder


BAD = [
    (["check", "."], "is a folder, not a YAML file"),
    (["check", "blob.bin"], "is not a text file"),
    (["check", "--bogus"], "unrecognized arguments: --bogus"),
    (["models", "extra"], "unrecognized arguments: extra"),
    (["extract", "--out", "x", "--seed", "-1"], "argument --seed: -1 is negative"),
    (["extract", "--out", "x", "--seed", "abc"], "argument --seed: 'abc' is not a whole number"),
    (["extract", "--out", "x", "--layers", "-1"], "argument --layers: -1 is negative"),
    (["extract", "--out", "x", "--layers", "99"], "config key layers: [99] do not exist"),
    (["extract", "--out", "x", "--prompt", "nope"], "prompt 'nope' is not in the config"),
    (["extract", "--out", "notes.txt"], "--out 'notes.txt' is an existing file this command did not write"),
    (["extract", "--out", "own"], "--out 'own' is an existing folder this command did not write"),
    (["extract", "--out", "config.yaml"], "--out 'config.yaml' is an input of this command"),
    (["import-cache", "old.pt", "--out", "old.pt"], "--out 'old.pt' is an input of this command"),
    (["aggregate", "--input", "missing", "--out", "o"], "--input 'missing' does not exist"),
    (
        ["aggregate", "--input", "frame_attention.parquet", "--out", "o"],
        "--input 'frame_attention.parquet' is neither an extraction folder nor a table import-cache wrote",
    ),
    (["aggregate", "--out", "o"], "the following arguments are required: --input"),
    (["import-cache", "missing.pt", "--out", "o.parquet"], "attention cache 'missing.pt' does not exist"),
    (
        ["import-cache", "old.pt", "--out", "notes.txt"],
        "--out 'notes.txt' is an existing file this command did not write",
    ),
    (["import-cache", "old.pt", "--out", "o.parquet", "--seed", "-3"], "argument --seed: -3 is negative"),
    (
        ["figure", "figure4", "--input", "frame_attention.parquet", "--out-prefix", "f", "--step", "abc"],
        "argument --step: 'abc' is not a whole number",
    ),
    (
        ["figure", "figure4", "--input", "frame_attention.parquet", "--out-prefix", "f", "--step", "-1"],
        "argument --step: -1 is negative",
    ),
    (
        ["figure", "figure4", "--input", "frame_attention.parquet", "--out-prefix", "f", "--step", "99"],
        "--step 99 is past the last denoising step",
    ),
    (
        ["figure", "figure4", "--input", "frame_attention.parquet", "--out-prefix", "f", "--dpi", "0"],
        "argument --dpi: 0 is outside 50..1200",
    ),
    (
        ["figure", "figure4", "--input", "frame_attention.parquet", "--out-prefix", "f", "--dpi", "100000"],
        "argument --dpi: 100000 is outside 50..1200",
    ),
    (
        ["figure", "per_head_grid", "--input", "frame_attention.parquet", "--out-prefix", "f", "--layer", "99"],
        "--layer 99 is not in the input",
    ),
    (
        ["figure", "figure4_tokens", "--input", "frame_attention.parquet", "--out-prefix", "f"],
        "figure 'figure4_tokens' draws token_profiles rows; --input holds none",
    ),
    (
        ["figure", "figure4", "--input", "frame_attention.parquet", "--out-prefix", "f", "--heads", "L99H99"],
        "--heads L99H99: the input has heads",
    ),
    (
        ["figure", "figure4", "--input", "frame_attention.parquet", "--out-prefix", "f", "--heads", "X1"],
        "argument --heads: 'X1' is not a head like L1H1",
    ),
    (
        ["figure", "figure4", "--input", "missing.parquet", "--out-prefix", "f"],
        "--input 'missing.parquet' does not exist",
    ),
    (["verify", "missing"], "'missing' does not exist"),
    (["verify", "notes.txt"], "'notes.txt': sinkscope cannot check a file of this kind"),
    (["verify", "own"], "'own' holds nothing sinkscope can check"),
    (["findings", "missing.md"], "'missing.md' is not a file"),
    (["findings", "--tables", "missing", "notes.txt"], "--tables 'missing' is not a folder"),
    (["findings", "--tables", "own", "notes.txt"], "notes.txt: no findings region"),
    # Output paths: only the last folder may be missing; a file is no folder.
    (
        ["extract", "--out", "/nonexistent/dir/x"],
        "argument --out: '/nonexistent/dir/x': folder '/nonexistent' does not exist",
    ),
    (["import-cache", "old.pt", "--out", "/nonexistent/dir/x.parquet"], "folder '/nonexistent' does not exist"),
    (
        ["import-cache", "old.pt", "--out", "notes.txt/x.parquet"],
        "argument --out: 'notes.txt/x.parquet': 'notes.txt' is a file",
    ),
    (
        ["aggregate", "--input", "own", "--out", "missing/deeper/o"],
        "argument --out: 'missing/deeper/o': folder 'missing' does not exist",
    ),
    (
        ["figure", "figure4", "--input", "frame_attention.parquet", "--out-prefix", "/nonexistent/dir/f"],
        "argument --out-prefix: '/nonexistent/dir/f': folder '/nonexistent' does not exist",
    ),
    (
        [
            "compare-labels",
            "--labels",
            "notes.txt",
            "--input",
            "frame_attention.parquet",
            "--out",
            "/nonexistent/dir/c",
        ],
        "argument --out: '/nonexistent/dir/c': folder '/nonexistent' does not exist",
    ),
    *[
        (["train-demo", "--out", "t", *bad], message)
        for bad, message in [
            (["--steps", "0"], "argument --steps: 0 is not positive"),
            (["--steps", "-1"], "argument --steps: -1 is negative"),
            (["--batch-size", "0"], "argument --batch-size: 0 is not positive"),
            (["--lr", "-1"], "argument --lr: -1 is not positive"),
            (["--lr", "nan"], "argument --lr: 'nan' is not a finite number"),
            (["--device", "foo"], "argument --device: 'foo' is not cpu, cuda or cuda:N"),
            (["--stage", "ode"], "argument --teacher: --stage ode distils a teacher"),
            (["--stage", "ode", "--teacher", "missing.pt"], "argument --teacher: 'missing.pt' does not exist"),
            (["--autocast", "garbage"], "argument --autocast: invalid choice: 'garbage'"),
            (["--log-every", "0"], "argument --log-every: 0 is not positive"),
            (["--ema", "2"], "argument --ema: 2 is not between 0 and 1"),
            (["--sampler-prob", "2"], "argument --sampler-prob: 2 is not between 0 and 1"),
            (["--warmup", "-5"], "argument --warmup: -5 is negative"),
            (["--ode-steps", "6"], "argument --ode-steps: 6 is not a multiple of 4"),
            (["--evaluate-only", "notes.txt"], "argument --evaluate-only: 'notes.txt' is not a .pt checkpoint"),
            (["--evaluate-only", "text.pt"], "argument --evaluate-only: text.pt is not a torch .pt file"),
            (["--out", "notes.txt"], "argument --out: 'notes.txt' is an existing file, not a folder"),
            (["--out", "notes.txt/run"], "argument --out: 'notes.txt/run': 'notes.txt' is a file, not a folder"),
            (
                ["--out", "/nonexistent/dir/run"],
                "argument --out: '/nonexistent/dir/run': folder '/nonexistent' does not exist",
            ),
        ]
    ],
]


def _user_files(folder: Path) -> dict:
    # What the user has (the .snakemake/ caches of file checks aside).
    return {path: path.read_bytes() for path in folder.rglob("*") if path.is_file() and ".snakemake" not in path.parts}


def _sinkscope_in_process(args: list[str], cwd: Path, monkeypatch, capsys) -> tuple[int, str]:
    """``sinkscope ARGS`` through ``cli.main`` in this process (what the console script runs,
    without a new interpreter's second of imports): exit status and stderr."""
    monkeypatch.chdir(cwd)
    try:
        status = main(list(args))
    except SystemExit as exit_:
        status = exit_.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(args)[:60] for args, _ in BAD])
def test_bad_arguments_are_one_line_naming_the_argument(inputs, args, message, monkeypatch, capsys):
    before = _user_files(inputs)
    status, stderr = _sinkscope_in_process(args, inputs, monkeypatch, capsys)
    lines = stderr.strip().splitlines()
    assert status == 2, stderr
    assert len(lines) == 1 and message in lines[0], stderr
    assert "Traceback" not in stderr
    assert _user_files(inputs) == before


# The same refusals through the installed entry point, in a fresh interpreter, for one
# argument of each kind of check (argparse types, the config check, the output paths).
ENTRY_POINT_CASES = [
    (["extract", "--out", "x", "--seed", "-1"], "argument --seed: -1 is negative"),
    (["extract", "--out", "x", "--layers", "99"], "config key layers: [99] do not exist"),
    (
        ["import-cache", "old.pt", "--out", "notes.txt/x.parquet"],
        "argument --out: 'notes.txt/x.parquet': 'notes.txt' is a file",
    ),
    (["train-demo", "--out", "t", "--lr", "nan"], "argument --lr: 'nan' is not a finite number"),
]


@pytest.mark.parametrize("args, message", ENTRY_POINT_CASES, ids=[" ".join(args)[:60] for args, _ in ENTRY_POINT_CASES])
def test_bad_arguments_through_the_entry_point(inputs, args, message):
    before = _user_files(inputs)
    result = _sinkscope(*args, cwd=inputs)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert _user_files(inputs) == before


@pytest.mark.slow
def test_an_earlier_import_is_replaced_only_with_force(inputs, tmp_path):
    out = tmp_path / "new" / "imported.parquet"  # the one missing folder is created
    assert _sinkscope("import-cache", str(inputs / "old.pt"), "--out", str(out), cwd=inputs).returncode == 0
    written = out.read_bytes()
    again = _sinkscope("import-cache", str(inputs / "old.pt"), "--out", str(out), cwd=inputs)
    assert again.returncode == 2 and "add --force" in again.stderr and out.read_bytes() == written
    assert _sinkscope("import-cache", str(inputs / "old.pt"), "--out", str(out), "--force", cwd=inputs).returncode == 0


def test_an_output_folder_that_takes_no_files_is_refused(tmp_path, monkeypatch):
    import argparse

    from sinkscope.arguments import output_folder, output_path

    assert output_path(str(tmp_path / "new" / "x.parquet")) == str(tmp_path / "new" / "x.parquet")
    assert output_folder(str(tmp_path / "run")) == str(tmp_path / "run")
    monkeypatch.setattr("os.access", lambda *args: False)  # as for a user without write permission
    with pytest.raises(argparse.ArgumentTypeError, match=f"folder '{tmp_path}' is not writable"):
        output_path(str(tmp_path / "x.parquet"))


def test_verify_takes_one_file(inputs):
    result = _sinkscope("verify", "frame_attention.parquet", cwd=inputs)
    assert result.returncode == 0 and "checked 1 results (0 folders, 1 files): all whole" in result.stderr


@pytest.mark.slow
def test_aggregate_builds_every_table_from_extraction_folders(inputs, tmp_path):
    """CLI parity with the workflow: `sinkscope aggregate` makes the source tables the
    aggregation rule makes (block_stats included), and figures draw from them."""
    import pandas as pd

    from sinkscope.stats.summaries import block_stats

    extraction = tmp_path / "ext"
    done = _sinkscope(
        "extract", "--out", str(extraction), "--layers", "0", "1", "--set", "generation.num_frames=6", cwd=inputs
    )
    assert done.returncode == 0, done.stderr
    out = tmp_path / "tables"
    result = _sinkscope("aggregate", "--input", str(extraction), "--out", str(out), cwd=inputs)
    assert result.returncode == 0, result.stderr
    for table in ("frame_attention", "query_stats", "head_stats", "layer_stats", "block_stats", "head_diagnostics"):
        assert (out / f"{table}.parquet").is_file(), table
    frame = pd.read_parquet(out / "frame_attention.parquet")
    assert set(frame["layer"]) == {0, 1} and set(frame["checkpoint"]) == {"demo"}
    video = ["latent_sink_cosine", "latent_previous_cosine", "rope_periods"]  # from the extraction's manifest
    expected = block_stats(frame, 0).drop(columns=video).reset_index(drop=True)
    stats = pd.read_parquet(out / "block_stats.parquet")
    got = stats[list(expected.columns)].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, check_categorical=False)
    assert stats.loc[stats["block"] == 1, "latent_sink_cosine"].notna().all()
    assert stats.loc[stats["block"] == 0, "latent_sink_cosine"].isna().all()
    from sinkscope.tables import read_metadata

    sources = read_metadata(out / "frame_attention.parquet")["sources"]
    assert [source["attention_kernel"] for source in sources] == ["sdpa", "sdpa"]  # the CPU's, from the manifest
    again = _sinkscope("aggregate", "--input", str(extraction), "--out", str(out), cwd=inputs)
    assert again.returncode == 2 and "add --force" in again.stderr
    drawn = _sinkscope(
        "figure",
        "sink_mass_over_time",
        "--input",
        str(out / "block_stats.parquet"),
        "--out-prefix",
        str(tmp_path / "sink"),
        cwd=inputs,
    )
    assert drawn.returncode == 0, drawn.stderr
    refused = _sinkscope("aggregate", "--input", "notes.txt", "--out", str(tmp_path / "x"), cwd=inputs)
    assert (
        refused.returncode == 2 and "is neither an extraction folder nor a table import-cache wrote" in refused.stderr
    )


@pytest.mark.parametrize("kind", ["head_atlas", "frame_atlas", "pruning_curve"])
def test_the_figure_command_draws_an_atlas_from_its_table(kind, tmp_path, capsys):
    from synthetic import synthetic_atlas

    from sinkscope.tables import SCHEMAS

    for name, rows in synthetic_atlas(3, 4, checkpoint="demo", seed=5).items():
        write_table(rows, tmp_path / f"{name}.parquet", SCHEMAS[name])
    prefix = tmp_path / kind
    assert main(["figure", kind, "--input", str(tmp_path / f"{kind}.parquet"), "--out-prefix", str(prefix)]) == 0
    assert prefix.with_suffix(".svg").stat().st_size > 0 and prefix.with_suffix(".png").stat().st_size > 0
    # Given another table, the refusal names the atlas table to give.
    other = tmp_path / ("frame_atlas.parquet" if kind == "head_atlas" else "head_atlas.parquet")
    assert main(["figure", kind, "--input", str(other), "--out-prefix", str(prefix)]) == 2
    assert f"give results/tables/{kind}.parquet" in capsys.readouterr().err
