"""Integrity: checksums and content digests on every Parquet file, manifests, quarantine."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from synthetic import flip_bytes_and_read, synthetic_rows

from sinkscope.errors import DamagedFileError
from sinkscope.manifests import check_directory, read_manifest, write_manifest
from sinkscope.pipeline.integrity import quarantine, scan_results
from sinkscope.tables import (
    FRAME_ATTENTION_SCHEMA,
    column_digests,
    read_arrow,
    read_metadata,
    read_table,
    write_table,
)


def test_column_digests_do_not_depend_on_chunking_or_storage(tmp_path):
    rows = synthetic_rows()
    table = pa.Table.from_pandas(
        rows[FRAME_ATTENTION_SCHEMA.names], schema=FRAME_ATTENTION_SCHEMA, preserve_index=False
    )
    chunked = pa.concat_tables([table.slice(0, 100), table.slice(100)])
    assert column_digests(table) == column_digests(chunked)
    path = tmp_path / "t.parquet"
    write_table(rows, path, FRAME_ATTENTION_SCHEMA, row_groups_by="block")
    assert read_metadata(path)["content_sha256"] == column_digests(table)
    changed = rows.copy()
    changed.loc[5, "prob_mass"] += 1e-6
    assert (
        column_digests(
            pa.Table.from_pandas(
                changed[FRAME_ATTENTION_SCHEMA.names], schema=FRAME_ATTENTION_SCHEMA, preserve_index=False
            )
        )["prob_mass"]
        != column_digests(table)["prob_mass"]
    )


def test_row_groups_per_block_let_a_reader_filter(tmp_path):
    rows = synthetic_rows(blocks=(3, 3, 3, 3))
    path = tmp_path / "t.parquet"
    write_table(rows.sort_values("block", kind="stable"), path, FRAME_ATTENTION_SCHEMA, row_groups_by="block")
    import pyarrow.parquet as pq

    assert pq.ParquetFile(path).num_row_groups == 4
    last = read_table(path, filters=[("block", "=", 3)])
    assert set(last["block"]) == {3} and len(last) == (rows["block"] == 3).sum()


@pytest.mark.parametrize("trial", range(40))
def test_flipped_bytes_never_give_wrong_values(tmp_path, trial):
    """A damaged file fails its read naming the file, or reads exactly what was written:
    only bytes of the footer's column statistics (which a full read does not use) may
    change without notice."""
    path = tmp_path / "layer0.parquet"
    write_table(synthetic_rows(seed=trial), path, FRAME_ATTENTION_SCHEMA, {"package_version": "x"})
    flip_bytes_and_read(path, trial, width=8)


def test_a_file_without_its_digests_is_damaged_not_trusted(tmp_path):
    path = tmp_path / "t.parquet"
    write_table(synthetic_rows(), path, FRAME_ATTENTION_SCHEMA, {"package_version": "x"})
    table = read_arrow(path)
    stripped = table.replace_schema_metadata(
        {k: v for k, v in table.schema.metadata.items() if b"content_sha256" not in k}
    )
    import pyarrow.parquet as pq

    pq.write_table(stripped, path)
    with pytest.raises(DamagedFileError, match="metadata does not match its digest|lost its content digests"):
        read_arrow(path)


def _folder(tmp_path):
    folder = tmp_path / "layers0-1"
    folder.mkdir()
    for layer in (0, 1):
        write_table(synthetic_rows(seed=layer), folder / f"layer{layer}.parquet", FRAME_ATTENTION_SCHEMA)
    write_manifest(folder, ["layer0.parquet", "layer1.parquet"], {"layers": [0, 1]})
    return folder


def test_manifest_checks_find_missing_changed_and_extra_files(tmp_path):
    folder = _folder(tmp_path)
    assert check_directory(folder) == [] and read_manifest(folder)["contents"] == {"layers": [0, 1]}
    # A touch is not damage.
    os.utime(folder / "layer0.parquet", ns=(1, 1))
    assert check_directory(folder) == []
    (folder / "layer1.parquet").unlink()
    (folder / "stray.parquet").write_bytes(b"x")
    problems = check_directory(folder)
    assert any("layer1.parquet: missing" in p for p in problems)
    assert any("holds files its job did not write (stray.parquet)" in p for p in problems)
    data = bytearray((folder / "layer0.parquet").read_bytes())
    data[100] ^= 1
    (folder / "layer0.parquet").write_bytes(bytes(data))
    assert any("layer0.parquet: damaged (its content changed" in p for p in check_directory(folder))


def test_a_folder_without_manifest_is_incomplete_and_quarantine_keeps_it(tmp_path):
    folder = _folder(tmp_path)
    (folder / "manifest.json").unlink()
    damaged = scan_results([folder, tmp_path / "not-yet-run"])
    assert list(damaged) == [str(folder)] and "incomplete" in damaged[str(folder)][0]
    moved = quarantine(folder / "layer0.parquet")
    assert moved == tmp_path / "layers0-1.damaged" and not folder.exists() and (moved / "layer0.parquet").exists()
    table = tmp_path / "head_stats.parquet"
    table.write_bytes(b"x")
    assert quarantine(table) == tmp_path / "head_stats.parquet.damaged"
    assert quarantine(tmp_path / "gone.parquet") is None


def test_reading_several_files_verifies_each(tmp_path):
    good, bad = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_table(synthetic_rows(), good, FRAME_ATTENTION_SCHEMA, {"package_version": "x"})
    bad.write_bytes(good.read_bytes()[:-40])
    with pytest.raises(DamagedFileError, match="b.parquet"):
        read_table([good, bad])
    assert isinstance(read_table([good, good]), pd.DataFrame) and np.isfinite(read_table(good)["prob_mass"]).all()


def test_cli_figure_refuses_mixed_checkpoints_and_draws_one(tmp_path, capsys):
    from sinkscope.cli import main as cli

    path = tmp_path / "mixed.parquet"
    write_table(
        pd.concat([synthetic_rows(checkpoint="a"), synthetic_rows(1, checkpoint="b")]), path, FRAME_ATTENTION_SCHEMA
    )
    assert cli(["figure", "figure4", "--input", str(path), "--out-prefix", str(tmp_path / "f"), "--heads", "L4H1"]) == 2
    assert "several checkpoints (a, b)" in capsys.readouterr().err
    assert (
        cli(
            [
                "figure",
                "figure4",
                "--input",
                str(path),
                "--checkpoint",
                "b",
                "--out-prefix",
                str(tmp_path / "f"),
                "--heads",
                "L4H1",
                "--dpi",
                "60",
            ]
        )
        == 0
    )
    assert (tmp_path / "f.svg").exists() and (tmp_path / "f.png").exists()


def test_cli_errors_are_one_line(tmp_path, capsys, monkeypatch):
    from sinkscope.cli import main as cli

    monkeypatch.setattr("sinkscope.pipeline.resources.cuda_device_count", lambda: 0)
    (tmp_path / "config.yaml").write_text("layers: [0]\n")
    code = cli(
        ["extract", "--config", str(tmp_path / "config.yaml"), "--out", str(tmp_path / "x"), "--set", "device=cuda"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "config key device: 'cuda'" in err
    code = cli(["check", str(tmp_path / "config.yaml"), "generation={num_frames: 20}"])
    err = capsys.readouterr().err
    assert code == 2 and "generation.num_frames: 20 must be a multiple" in err and "Traceback" not in err


def test_a_damaged_prompt_embedding_is_named_not_used(tmp_path):
    import torch

    from sinkscope.model.text import TextEncoderSpec, load_embedding, save_embedding

    path = tmp_path / "eagle.safetensors"
    context = torch.randn(7, 16, generator=torch.Generator().manual_seed(0))
    save_embedding(path, context, prompt="an eagle", encoder=TextEncoderSpec(kind="demo", text_dim=16))
    loaded, metadata = load_embedding(path)
    assert torch.equal(loaded, context) and metadata["prompt"] == "an eagle"

    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40  # inside the tensor's bytes
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match="do not match the digest") as caught:
        load_embedding(path)
    assert caught.value.path == str(path)

    path.write_bytes(b"\xff" * 8 + b"{not json")
    with pytest.raises(DamagedFileError, match="not a readable prompt embedding"):
        load_embedding(path)


def test_the_executor_is_read_from_the_command_line_and_the_profiles(tmp_path):
    from sinkscope.pipeline.invocation import requested_executor

    workflow_dir = tmp_path / "workflow"
    (workflow_dir / "profiles" / "default").mkdir(parents=True)
    (workflow_dir / "profiles" / "default" / "config.yaml").write_text("cores: 1\n")
    slurm = tmp_path / "slurm-profile"
    slurm.mkdir()
    (slurm / "config.yaml").write_text("executor: slurm\njobs: 10\n")
    env = {}
    assert requested_executor(["snakemake", "--cores", "1"], workflow_dir, env) == "local"
    assert requested_executor(["snakemake", "--executor", "slurm"], workflow_dir, env) == "slurm"
    assert requested_executor(["snakemake", "-e", "slurm", "-n"], workflow_dir, env) == "slurm"
    assert requested_executor(["snakemake", "--executor=cluster-generic"], workflow_dir, env) == "cluster-generic"
    assert requested_executor(["snakemake", "--workflow-profile", str(slurm)], workflow_dir, env) == "slurm"
    assert requested_executor(["snakemake", "--profile", str(slurm)], workflow_dir, env) == "slurm"
    assert requested_executor(["snakemake"], workflow_dir, {"SNAKEMAKE_PROFILE": str(slurm)}) == "slurm"
    # The command line wins over a profile.
    assert (
        requested_executor(["snakemake", "--profile", str(slurm), "--executor", "local"], workflow_dir, env) == "local"
    )
    # The workflow's default profile names an executor: that one.
    (workflow_dir / "profiles" / "default" / "config.yaml").write_text("executor: slurm\n")
    assert requested_executor(["snakemake"], workflow_dir, env) == "slurm"


def test_mixed_precisions_are_refused_naming_the_files():
    from sinkscope.errors import SinkscopeError
    from sinkscope.pipeline.aggregate import _check_precision

    fp32 = {"file": "results/extract/demo/a/seed0/layers0/layer0.parquet", "device_kind": "cpu", "dtype": "float32"}
    bf16 = {"file": "results/extract/demo/a/seed1/layers0/layer0.parquet", "device_kind": "cuda", "dtype": "bfloat16"}
    _check_precision([fp32, dict(fp32, file="other.parquet"), {"file": "imported.parquet"}], "source 'demo'")
    with pytest.raises(
        SinkscopeError, match=r"source .demo. mixes precisions \(float32 on cpu: .*seed0.*; bfloat16 on cuda: .*seed1"
    ):
        _check_precision([fp32, bf16], "source 'demo'")


def test_a_source_of_two_attention_kernels_is_kept_and_said_so(caplog):
    from sinkscope.pipeline.aggregate import _note_attention_kernels

    flash = {"file": "a/layers0/layer0.parquet", "attention_kernel": "flash4"}
    with caplog.at_level("WARNING", logger="sinkscope"):
        _note_attention_kernels([flash, dict(flash, file="b"), {"file": "imported.parquet"}], "source 'demo'")
        assert not caplog.records
        _note_attention_kernels([flash, dict(flash, attention_kernel="cudnn")], "source 'demo'")
    (record,) = caplog.records
    assert "source 'demo' mixes attention kernels (cudnn, flash4)" in record.getMessage()


def test_verify_checks_extraction_folders_dataset_folders_and_tables(tmp_path, capsys):
    from sinkscope.cli import main as cli_main
    from sinkscope.manifests import DATASET_MANIFEST

    results = tmp_path / "results"
    (results / "extract").mkdir(parents=True)
    extraction = _folder(results / "extract")
    write_table(synthetic_rows(seed=3), results / "tables" / "frame_attention.parquet", FRAME_ATTENTION_SCHEMA)
    dataset = results / "tables" / "token_profiles.parquet"
    write_table(synthetic_rows(seed=4), dataset / "p" / "layer0.parquet", FRAME_ATTENTION_SCHEMA)
    write_manifest(dataset, ["p/layer0.parquet"], {"table": "token_profiles"}, name=DATASET_MANIFEST)
    assert cli_main(["verify", str(results)]) == 0
    assert "checked 3 results (2 folders, 1 files): all whole" in capsys.readouterr().err

    (dataset / "p" / "layer0.parquet").unlink()
    data = bytearray((extraction / "layer1.parquet").read_bytes())
    data[len(data) // 2] ^= 0x01
    (extraction / "layer1.parquet").write_bytes(bytes(data))
    assert cli_main(["verify", str(results)]) == 1
    printed = capsys.readouterr().out
    assert "layer1.parquet: damaged" in printed and "p/layer0.parquet: missing" in printed


def test_verify_checks_csv_tables_and_prompt_embeddings_and_counts_logs(tmp_path, capsys):
    from types import SimpleNamespace

    import torch

    from sinkscope.cli import main as cli_main
    from sinkscope.model.text import load_embedding, save_embedding

    results = tmp_path / "results"
    csv = results / "tables" / "head_classes.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text('layer,H1,H2\n0,sink,"diffuse, wide"\n1,local,sink\n')
    embedding = results / "prompts" / "demo" / "drift.safetensors"
    save_embedding(embedding, torch.arange(24.0).reshape(4, 6), prompt="a ball", encoder=SimpleNamespace(key="demo"))
    (results / "logs").mkdir()
    (results / "logs" / "job.log").write_text("done\n")
    incomplete = results / "extract" / "demo" / "drift" / "seed0" / "layers0"  # a job that never finished
    incomplete.mkdir(parents=True)
    write_table(synthetic_rows(seed=1), incomplete / "layer0.parquet", FRAME_ATTENTION_SCHEMA)
    assert cli_main(["verify", str(results)]) == 1
    captured = capsys.readouterr()
    assert (
        captured.out.strip() == f"{incomplete}: incomplete: it has no manifest (the job that wrote it did not finish)"
    )
    assert "checked 3 results (1 folders, 2 files); 1 other files not checked (.log): 1 problems" in captured.err

    write_manifest(incomplete, ["layer0.parquet"], {"layers": [0]})
    assert cli_main(["verify", str(results)]) == 0
    capsys.readouterr()
    whole = embedding.read_bytes()
    data = bytearray(whole)
    data[-5] ^= 0x10  # one bit of one float
    embedding.write_bytes(bytes(data))
    with pytest.raises(DamagedFileError):
        load_embedding(embedding)  # the job's own check agrees
    csv.write_text(csv.read_text()[:-6])  # cut short in the last row
    assert cli_main(["verify", str(results)]) == 1
    printed = capsys.readouterr().out
    assert (
        f"{embedding}: is damaged (its bytes do not match the digest" in printed and f"{csv}: is cut short" in printed
    )
    embedding.write_bytes(whole[: len(whole) - 8])
    csv.write_text("layer,H1,H2\n0,sink\n")
    assert cli_main(["verify", str(results)]) == 1
    printed = capsys.readouterr().out
    assert "holds 88 bytes of data, its header says 96" in printed and "row 2 has 2 fields, the header 3" in printed
