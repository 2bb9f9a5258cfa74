"""Writing off the critical path and the float16 token layout: token values round-trip
with their identities exact, old float32 files still read, damaged files are seen, a
writer's error reaches the job and leaves nothing behind, the queue keeps order and
bounds what waits."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from synthetic import flip_bytes_and_read
from test_stats import brute_force_statistics, make_inputs

from sinkscope.errors import DamagedFileError
from sinkscope.generation.capture import FrameStatsCapture
from sinkscope.generation.sampler import generate
from sinkscope.manifests import (
    DATASET_MANIFEST,
    check_directory,
    read_manifest,
    write_manifest,
)
from sinkscope.model import build_model
from sinkscope.options import GenerationOptions
from sinkscope.pipeline import writing
from sinkscope.pipeline.writing import BackgroundQueue, ExtractionWriter
from sinkscope.tables import (
    META_PREFIX,
    TOKEN_PROFILES_SCHEMA,
    TOKEN_PROFILES_SCHEMA_V1,
    TableWriter,
    _metadata_digest,
    column_digests,
    column_digests_v1,
    read_arrow,
    read_metadata,
    read_table,
    write_table,
)
from sinkscope.tokens import (
    decode_token_values,
    encode_token_tensors,
    encode_token_values,
    round_significant,
    token_rows,
    token_values,
)

REPO = Path(__file__).resolve().parent.parent
FSL = 24  # the demo's tokens a frame


# -- the token layout -----------------------------------------------------------------------------


def _profiles(seed: int = 0, heads: int = 3, fsl: int = 16, lengths=(16, 16, 9, 16)):
    """Token profiles of one call, from a float64 brute force: dense [heads x key frames,
    fsl] float64 (NaN where a token is absent: frame 2 keeps 9 of its 16 tokens)."""
    q, k = make_inputs(seed, heads, fsl, 8, 2, list(lengths), sharp=3.0)
    ref = brute_force_statistics(q, k, fsl, 2, list(lengths), 8**-0.5)
    dense = {}
    for name in ("token_logit_mean", "token_prob_mean"):
        values = np.full((heads, len(lengths), fsl), np.nan)
        start = 0
        for f, n in enumerate(lengths):
            keep = np.arange(n) if n == fsl else np.sort(np.random.default_rng(seed).choice(fsl, n, replace=False))
            values[:, f, keep] = ref[name][:, start : start + n].numpy()
            start += n
        dense[name] = values.reshape(heads * len(lengths), fsl)
    return dense["token_logit_mean"], dense["token_prob_mean"]


@pytest.mark.parametrize("seed", range(4))
def test_token_values_round_trip_with_exact_identities_and_float16_error(seed):
    logit64, prob64 = _profiles(seed)
    stored = encode_token_values(logit64.astype(np.float32), prob64.astype(np.float32))
    assert stored["token_logit_centered"].dtype == stored["frame_logit_mean"].dtype == np.float32
    for name in ("token_logit_centered", "token_prob_ratio"):  # float16 precision: 11 significant bits
        values = stored[name]
        assert np.array_equal(values, round_significant(values, 11), equal_nan=True), name
    logit, prob = decode_token_values(
        stored["frame_logit_mean"],
        stored["frame_prob_mass"],
        stored["token_logit_centered"],
        stored["token_prob_ratio"],
    )
    assert logit.dtype == prob.dtype == np.float32
    present = ~np.isnan(prob64)
    assert (~np.isnan(prob) == present).all() and (~np.isnan(logit) == present).all()
    # The frame values: the float64 mean / sum of the float32 tokens, rounded to float32.
    count = present.sum(axis=1)
    assert np.allclose(stored["frame_logit_mean"], np.nansum(logit64, 1) / count, rtol=1e-6, atol=1e-7)
    assert np.allclose(stored["frame_prob_mass"], np.nansum(prob64, 1), rtol=1e-6, atol=0)
    # The identities, exact up to the float32 rounding of the decoded values.
    mean = np.nansum(logit.astype(np.float64), 1) / count
    scale = np.nanmax(np.abs(logit), axis=1)
    assert (np.abs(mean - stored["frame_logit_mean"]) <= 2**-23 * scale + 1e-12).all()
    total = np.nansum(prob.astype(np.float64), 1)
    assert (np.abs(total - stored["frame_prob_mass"]) <= 2**-23 * stored["frame_prob_mass"]).all()
    # Each value within float16 rounding of the float64 truth: 2**-11 of the ratio to the
    # frame's mean token (doubled: the rescaling), 2**-11 of the frame's logit spread (doubled).
    error = np.abs(prob - prob64)
    assert (error[present] <= (2**-10 * prob64 + 1e-12)[present]).all()
    spread = np.nanmax(np.abs(logit64 - (np.nansum(logit64, 1) / count)[:, None]), axis=1)[:, None]
    error = np.abs(logit - logit64)
    assert (error[present] <= (2**-10 * spread + 2**-22 * np.abs(logit64) + 1e-7)[present]).all()
    # Relative error of a typical token: about float16's half-ulp.
    relative = np.abs(prob - prob64)[present] / prob64[present]
    assert np.median(relative) < 5e-4


def test_extreme_frames_encode_and_decode():
    logit = np.array([[1e3, 1e3 + 1, np.nan, 1e3 - 1], [0.0, 0.0, 0.0, 0.0]], np.float32)
    prob = np.array([[1.0, 0.0, np.nan, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32)  # all mass on one token; none at all
    stored = encode_token_values(logit, prob)
    assert stored["token_prob_ratio"][0, 0] == 3 and np.isnan(stored["token_prob_ratio"][0, 2])
    decoded_logit, decoded_prob = decode_token_values(
        *(stored[name] for name in ("frame_logit_mean", "frame_prob_mass", "token_logit_centered", "token_prob_ratio"))
    )
    assert np.allclose(decoded_logit[0], logit[0], equal_nan=True) and (decoded_prob[1] == 0).all()
    assert decoded_prob[0, 0] == 1 and np.nansum(decoded_prob[0]) == 1
    with pytest.raises(ValueError, match="no present token"):
        encode_token_values(np.full((1, 3), np.nan, np.float32), np.full((1, 3), np.nan, np.float32))


def test_the_logit_step_is_the_power_of_two_the_spread_needs():
    # Spreads exactly a power of two, just above and just below one: the step must be the
    # power of two with 2**-11 <= step / spread < 2**-10, and every value a multiple of it.
    spreads = np.array([1.0, np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0), 2.0**-20, 3.0, 1e4])
    logit = np.zeros((len(spreads), 4), np.float32)
    logit[:, 0], logit[:, 1] = spreads, -spreads
    logit[:, 2] = spreads / 3
    prob = np.full(logit.shape, 0.25, np.float32)
    stored = encode_token_values(logit, prob)
    centered = stored["token_logit_centered"].astype(np.float64)
    spread = np.abs(logit.astype(np.float64) - stored["frame_logit_mean"][:, None]).max(axis=1)
    for row, value in enumerate(spread):
        step = 2.0 ** np.ceil(np.log2(value * 2.0**-11))
        assert 2.0**-11 <= step / value < 2.0**-10, row
        assert np.array_equal(np.round(centered[row] / step) * step, centered[row]), row


def test_device_encoding_is_the_host_encoding():
    # The capture encodes with torch where the profiles are; on the CPU that is exactly the
    # numpy entry point's result (which calls the same function on float64 copies).
    logit64, prob64 = _profiles(3)
    logit, prob = logit64.astype(np.float32), prob64.astype(np.float32)
    on_device = encode_token_tensors(torch.from_numpy(logit), torch.from_numpy(prob))
    for name, values in encode_token_values(logit, prob).items():
        assert on_device[name].dtype == torch.float32
        assert np.array_equal(on_device[name].numpy(), values, equal_nan=True), name


def _run_columns(n: int) -> dict:
    return {"checkpoint": ["demo"] * n, "variant": ["default"] * n, "prompt_id": ["p"] * n, "seed": [0] * n}


def _token_frame(seed: int = 0, old: bool = False) -> pd.DataFrame:
    logit, prob = _profiles(seed)
    n = len(logit)
    rows = pd.DataFrame(
        {
            **_run_columns(n),
            "layer": 4,
            "head": np.repeat(np.arange(3), 4),
            "block": 2,
            "pass": "cache",
            "step": 4,
            "timestep": 0.0,
            "prompt_segment": 0,
            "key_frame": np.tile(np.arange(4), 3),
            "key_tokens": (~np.isnan(prob)).sum(1),
            "key_position_shift": 0,
        }
    )
    if old:
        return rows.assign(
            token_logit_mean=list(logit.astype(np.float32)), token_prob_mean=list(prob.astype(np.float32))
        )
    stored = encode_token_values(logit.astype(np.float32), prob.astype(np.float32))
    return rows.assign(**{name: list(v) if v.ndim == 2 else v for name, v in stored.items()})


def write_old_token_file(path: Path, rows: pd.DataFrame) -> None:
    """A token_profiles file as sinkscope wrote it before the float16 layout: float32 lists,
    version-1 digests (no content_digest_version), the Arrow schema stored."""
    from sinkscope.tables import _encode_metadata, to_arrow

    table = to_arrow(rows, TOKEN_PROFILES_SCHEMA_V1)
    meta = _encode_metadata(
        {
            "package_version": "0.old",
            "layer": 4,
            "frame_seq_length": 16,
            "content_sha256": column_digests_v1(table),
            "columns": {},
        }
    )
    meta[(META_PREFIX + "metadata_sha256").encode()] = _metadata_digest(meta)
    pq.write_table(table.replace_schema_metadata(meta), path, compression="zstd", write_page_checksum=True)


def test_old_float32_token_files_still_read(tmp_path):
    rows = _token_frame(old=True)
    path = tmp_path / "layer4.tokens.parquet"
    write_old_token_file(path, rows)
    assert "content_digest_version" not in read_metadata(path)
    table = read_table(path)  # verified: checksums, version-1 digests, statistics of list values
    logit, prob = token_values(table)
    assert np.array_equal(prob, np.stack(rows["token_prob_mean"]), equal_nan=True)
    long = token_rows(table)
    assert len(long) == int(rows["key_tokens"].sum()) and long["token_prob_mean"].dtype == np.float32
    # A damaged old file is still seen.
    data = bytearray(path.read_bytes())
    position = data.find(np.float32(rows["token_prob_mean"][0][5]).tobytes())
    assert position > 0
    data[position] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match="layer4.tokens.parquet"):
        read_arrow(path)


def test_new_token_files_read_verified_and_decode_like_the_old(tmp_path):
    new, old = tmp_path / "new.parquet", tmp_path / "old.parquet"
    write_table(_token_frame(), new, TOKEN_PROFILES_SCHEMA, {"package_version": "x"})
    write_old_token_file(old, _token_frame(old=True))
    assert read_metadata(new)["content_digest_version"] == 2
    a, b = token_rows(read_table(new)), token_rows(read_table(old))
    assert list(a.columns) == list(b.columns)
    pd.testing.assert_frame_equal(
        a.drop(columns=["token_logit_mean", "token_prob_mean"]), b.drop(columns=["token_logit_mean", "token_prob_mean"])
    )
    assert np.allclose(a["token_prob_mean"], b["token_prob_mean"], rtol=2**-10, atol=1e-9)

    # The float16 lists take about half the float32 ones' bytes.
    def list_bytes(path):
        group = pq.ParquetFile(path).metadata.row_group(0)
        return sum(
            group.column(i).total_compressed_size
            for i in range(group.num_columns)
            if group.column(i).path_in_schema.endswith(".list.element")
        )

    assert list_bytes(new) < 0.7 * list_bytes(old)


def test_a_token_dataset_of_old_and_new_files_reads_for_figures(tmp_path):
    from sinkscope.figures.render import read_token_profiles

    folder = tmp_path / "token_profiles.parquet"
    (folder / "a").mkdir(parents=True)
    (folder / "b").mkdir()
    write_old_token_file(folder / "a" / "layer4.tokens.parquet", _token_frame(seed=1, old=True).assign(prompt_id="a"))
    write_table(
        _token_frame(seed=1).assign(prompt_id="b"), folder / "b" / "layer4.tokens.parquet", TOKEN_PROFILES_SCHEMA
    )
    write_manifest(
        folder,
        ["a/layer4.tokens.parquet", "b/layer4.tokens.parquet"],
        {"table": "token_profiles"},
        name=DATASET_MANIFEST,
    )
    frame = pd.DataFrame(
        {
            "layer": [4],
            "head": [1],
            "block": [2],
            "pass": ["cache"],
            "step": [4],
            "prompt_id": ["a"],
            "seed": [0],
            "timestep": [0.0],
            "query_frame": [3],
            "key_frame": [3],
            "logit_mean": [0.0],
            "prob_mass": [1.0],
        }
    )
    rows = read_token_profiles(folder, frame, {"heads": ["L5H2"], "step": "cache"})
    assert set(rows["prompt_id"]) == {"a", "b"} and set(rows["head"]) == {1} and "token" in rows.columns
    a, b = (
        rows[rows["prompt_id"] == p].sort_values(["key_frame", "token"])["token_prob_mean"].to_numpy() for p in "ab"
    )
    assert np.allclose(a, b, rtol=2**-10, atol=1e-9)


def test_verified_reads_of_list_columns_check_their_statistics(tmp_path):
    path = tmp_path / "t.parquet"
    write_table(_token_frame(), path, TOKEN_PROFILES_SCHEMA, {"package_version": "x"})
    read_arrow(path)
    stats = pq.ParquetFile(path).metadata.row_group(0)
    leaves = [stats.column(i).path_in_schema for i in range(stats.num_columns)]
    assert "token_prob_ratio.list.element" in leaves
    assert stats.column(leaves.index("token_prob_ratio.list.element")).statistics.has_min_max


# -- integrity of streamed files ------------------------------------------------------------------


def _streamed(path: Path, blocks: int = 3) -> pd.DataFrame:
    rows = pd.concat([_token_frame(seed=b).assign(block=b) for b in range(blocks)], ignore_index=True)
    writer = TableWriter(path, TOKEN_PROFILES_SCHEMA)
    for _, part in rows.groupby("block"):
        writer.write(part)
    assert not path.exists()  # nothing at its place before close
    writer.close({"package_version": "x", "layer": 4})
    return rows


def test_a_streamed_file_equals_the_one_written_whole(tmp_path):
    streamed, whole = tmp_path / "s.parquet", tmp_path / "w.parquet"
    rows = _streamed(streamed)
    write_table(rows, whole, TOKEN_PROFILES_SCHEMA, {"package_version": "x", "layer": 4}, row_groups_by="block")
    assert pq.ParquetFile(streamed).num_row_groups == 3
    assert read_metadata(streamed)["content_sha256"] == read_metadata(whole)["content_sha256"]
    pd.testing.assert_frame_equal(token_rows(read_table(streamed)), token_rows(read_table(whole)))
    assert read_metadata(streamed)["layer"] == 4 and not list(tmp_path.glob(".*tmp"))
    # Digests are those of the values, however chunked.
    table = read_arrow(streamed)
    assert column_digests(table) == column_digests(pa.concat_tables([table.slice(0, 5), table.slice(5)]))


@pytest.mark.parametrize("trial", range(12))
def test_flipped_bytes_in_a_streamed_token_file_never_give_wrong_values(tmp_path, trial):
    path = tmp_path / "layer4.tokens.parquet"
    _streamed(path)
    flip_bytes_and_read(path, trial, width=4)


def test_an_aborted_table_writer_leaves_nothing(tmp_path):
    writer = TableWriter(tmp_path / "t.parquet", TOKEN_PROFILES_SCHEMA)
    writer.write(_token_frame())
    writer.abort()
    assert list(tmp_path.iterdir()) == []


# -- the background queue ---------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_the_queue_keeps_the_order_of_each_key(workers):
    done: dict[int, list[int]] = {}
    background = BackgroundQueue(workers, maxsize=2)
    for i in range(60):
        background.submit(
            i % 4, lambda key, i: (time.sleep(0.0005 * (i % 3)), done.setdefault(key, []).append(i)), i % 4, i
        )
    background.close()
    assert done == {key: list(range(key, 60, 4)) for key in range(4)}
    assert background.busy_seconds > 0


def test_the_queue_is_bounded():
    release = threading.Event()
    background = BackgroundQueue(1, maxsize=2)
    background.submit(0, release.wait)  # the worker is busy with this one
    time.sleep(0.05)
    background.submit(0, lambda: None)
    background.submit(0, lambda: None)  # the queue is full now
    returned = threading.Event()
    thread = threading.Thread(target=lambda: (background.submit(0, lambda: None), returned.set()))
    thread.start()
    time.sleep(0.3)
    assert not returned.is_set()  # the producer waits for room
    release.set()
    thread.join(5)
    assert returned.is_set()
    background.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_task_error_reaches_the_producer(workers):
    ran = []

    def task(i):
        if i == 3:
            raise OSError("disk full at task 3")
        ran.append(i)

    background = BackgroundQueue(workers, maxsize=1)
    with pytest.raises(OSError, match="disk full at task 3"):
        for i in range(200):
            background.submit(0, task, i)
            if workers:
                time.sleep(0.001)
        background.close()
    assert 3 not in ran and len(ran) < 200 and background.failed
    with pytest.raises(OSError, match="disk full"):
        background.close()


# -- the extraction writer --------------------------------------------------------------------------


def _generate(writer=None, device="cpu", token_profiles="all", layers=(0, 2)):
    model = build_model("demo", seed=0, device=device)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1)).to(device)
    capture = FrameStatsCapture(
        model, layers, frame_seq_length=FSL, token_profiles=token_profiles, handoff=writer.submit if writer else None
    )
    with capture:
        result = generate(model, context, options=GenerationOptions(num_frames=9), seed=0, observers=[capture])
    return capture, result


def _write(folder: Path, workers: int, device: str = "cpu", **kw) -> tuple[list[str], dict[str, int]]:
    folder.mkdir(parents=True)
    writer = ExtractionWriter(
        folder,
        (0, 2),
        frame_seq_length=FSL,
        run_columns={"checkpoint": "demo", "variant": "default", "prompt_id": "p", "seed": 0},
        workers=workers,
    )
    _generate(writer, device=device, **kw)
    return writer.finish({"package_version": "x"})


def _compare_with_layer_tables(folder: Path, device: str = "cpu", exact: bool = True) -> None:
    capture, _ = _generate(device=device)
    tables = capture.layer_tables()
    for layer in (0, 2):
        for kind, suffix in (("frames", ""), ("queries", ".queries"), ("tokens", ".tokens")):
            got = read_table(folder / f"layer{layer}{suffix}.parquet")
            expected = tables[layer][kind]
            assert len(got) == len(expected), (layer, kind)
            for name in expected.columns:
                a, b = got[name], expected[name]
                if a.dtype == object and len(a) and isinstance(a.iloc[0], np.ndarray):
                    a, b = np.stack(a.to_numpy()).astype(np.float32), np.stack(b.to_numpy()).astype(np.float32)
                    assert np.allclose(a, b, equal_nan=True, rtol=0 if exact else 1e-2, atol=0 if exact else 1e-2), (
                        layer,
                        kind,
                        name,
                    )
                elif a.dtype.kind == "f":
                    assert np.allclose(a, b, equal_nan=True, rtol=0 if exact else 1e-4, atol=0 if exact else 1e-5), (
                        layer,
                        kind,
                        name,
                    )
                else:
                    assert (a.astype(str).to_numpy() == b.astype(str).to_numpy()).all(), (layer, kind, name)


def test_the_extraction_writer_writes_what_the_capture_collects(tmp_path):
    written, counts = _write(tmp_path / "inline", workers=0)
    assert sorted(written) == sorted(
        f"layer{layer}{suffix}.parquet" for layer in (0, 2) for suffix in ("", ".queries", ".tokens")
    )
    # One row group per block: 3 blocks, token profiles of every call.
    assert pq.ParquetFile(tmp_path / "inline" / "layer0.parquet").num_row_groups == 3
    assert pq.ParquetFile(tmp_path / "inline" / "layer0.tokens.parquet").num_row_groups == 3
    assert counts["layer0.tokens.parquet"] == 5 * 12 * (3 + 6 + 9)
    _compare_with_layer_tables(tmp_path / "inline")
    # Threads write the same bytes (each layer's rows in order on one thread).
    _write(tmp_path / "threads", workers=2)
    for name in written:
        assert (tmp_path / "inline" / name).read_bytes() == (tmp_path / "threads" / name).read_bytes(), name


def test_a_writer_error_reaches_the_job_and_leaves_no_file(tmp_path, monkeypatch):
    original = writing.record_rows

    def failing(record, arrays):
        if record.layer == 2 and record.call.block == 1:
            raise OSError("no space left on device (test)")
        return original(record, arrays)

    monkeypatch.setattr(writing, "record_rows", failing)
    for workers in (0, 2):
        folder = tmp_path / f"w{workers}"
        folder.mkdir()
        writer = ExtractionWriter(
            folder,
            (0, 2),
            frame_seq_length=FSL,
            run_columns={"checkpoint": "demo", "variant": "default", "prompt_id": "p", "seed": 0},
            workers=workers,
        )
        with pytest.raises(OSError, match="no space left on device"):
            try:
                _generate(writer)
            except BaseException:
                writer.abort()
                raise
            writer.finish({})
        assert list(folder.iterdir()) == [], workers


def test_a_failed_check_closes_no_file(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    writer = ExtractionWriter(
        folder,
        (0, 2),
        frame_seq_length=FSL,
        run_columns={"checkpoint": "demo", "variant": "default", "prompt_id": "p", "seed": 0},
    )
    _generate(writer)

    def check(layer, frames):
        assert frames.groupby(["block", "pass", "step"], observed=True).ngroups == 15
        if layer == 2:
            raise ValueError("layer 2 fails its check (test)")

    with pytest.raises(ValueError, match="layer 2 fails its check"):
        writer.finish({}, check)
    assert list(folder.iterdir()) == []


def test_finish_writes_each_layers_last_block_on_its_own_thread(tmp_path, monkeypatch):
    # The last block holds the token profiles, most of the bytes: finish writes the layers in
    # parallel, a thread per layer up to the usable cores, and the files are the same bytes.
    monkeypatch.setattr(writing, "usable_cores", lambda: 8)
    threads: dict[int, str] = {}
    original = ExtractionWriter._flush

    def flush(self, layer, files, before=None):
        if before is None:  # finish's flush of the last block
            threads[layer] = threading.current_thread().name
        return original(self, layer, files, before)

    monkeypatch.setattr(ExtractionWriter, "_flush", flush)
    written, _ = _write(tmp_path / "threads", workers=1)
    assert sorted(threads) == [0, 2] and len(set(threads.values())) == 2, threads
    assert threading.current_thread().name not in threads.values()
    monkeypatch.setattr(ExtractionWriter, "_flush", original)
    _write(tmp_path / "inline", workers=0)
    for name in written:
        assert (tmp_path / "inline" / name).read_bytes() == (tmp_path / "threads" / name).read_bytes(), name


def test_the_layers_of_a_job_spread_over_the_writer_threads_by_place(tmp_path, monkeypatch):
    # Layers 0 and 2 on 2 threads: keyed by their number both would land on the first.
    consumers: dict[int, set[str]] = {}
    original = ExtractionWriter._consume

    def consume(self, record, copy):
        consumers.setdefault(record.layer, set()).add(threading.current_thread().name)
        return original(self, record, copy)

    monkeypatch.setattr(ExtractionWriter, "_consume", consume)
    _write(tmp_path / "threads", workers=2)
    assert consumers == {0: {"sinkscope-writer-0"}, 2: {"sinkscope-writer-1"}}, consumers


def test_a_failure_writing_the_last_block_leaves_no_file(tmp_path, monkeypatch):
    original = writing.TableWriter.write
    rows_before = {}

    def failing(self, columns):
        # The first two blocks go through; the third (the last, written by finish) fails.
        seen = rows_before.setdefault(self.path, [])
        seen.append(len(columns["layer"]))
        if len(seen) == 3:
            raise OSError("disk full while writing the last block (test)")
        return original(self, columns)

    monkeypatch.setattr(writing.TableWriter, "write", failing)
    for workers in (0, 2):
        rows_before.clear()
        folder = tmp_path / f"w{workers}"
        folder.mkdir()
        writer = ExtractionWriter(
            folder,
            (0, 2),
            frame_seq_length=FSL,
            run_columns={"checkpoint": "demo", "variant": "default", "prompt_id": "p", "seed": 0},
            workers=workers,
        )
        _generate(writer)
        with pytest.raises(OSError, match="disk full while writing the last block"):
            writer.finish({})
        assert list(folder.iterdir()) == [], workers


def _cli_extract(tmp_path, monkeypatch, *extra: str) -> int:
    from sinkscope.cli import main

    monkeypatch.chdir(tmp_path)
    if not (tmp_path / "config.yaml").exists():
        shutil.copy(REPO / "config.yaml", tmp_path / "config.yaml")
    return main(["extract", "--out", "ext", "--layers", "0", "1", "--set", "generation.num_frames=6", *extra])


def test_an_extraction_job_that_fails_while_writing_keeps_the_previous_result(tmp_path, monkeypatch):
    assert _cli_extract(tmp_path, monkeypatch) == 0
    folder = tmp_path / "ext"
    before = read_manifest(folder)
    assert check_directory(folder) == [] and "layer1.tokens.parquet" in before["files"]
    tokens = read_table(folder / "layer1.tokens.parquet")
    assert "token_prob_ratio" in tokens.columns and len(token_rows(tokens)) == int(tokens["key_tokens"].sum())
    assert read_metadata(folder / "layer1.tokens.parquet")[
        "latents_sha256"
    ]  # provenance known only after the generation

    def failing(*args, **kw):
        raise OSError("the writer failed (test)")

    monkeypatch.setattr(writing, "record_rows", failing)
    with pytest.raises(OSError, match="the writer failed"):
        _cli_extract(tmp_path, monkeypatch, "--force")
    assert read_manifest(folder) == before and check_directory(folder) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ext")]
    # A check that fails: one line, nothing swapped in.
    monkeypatch.undo()
    from sinkscope.pipeline import extract

    def bad_rows(frames, **kw):
        raise DamagedFileError(kw["where"], "holds 1 calls of layer 0, the generation makes 10 (test)")

    monkeypatch.setattr(extract, "check_layer_rows", bad_rows)
    assert _cli_extract(tmp_path, monkeypatch, "--force") == 2
    assert read_manifest(folder) == before and not [p for p in tmp_path.iterdir() if p.name.startswith(".ext")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_records_are_handed_over_through_pinned_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    seen = []
    original = writing.HostCopy.__init__

    def spy(self, tensors):
        original(self, tensors)
        seen.append((self.host.is_pinned(), self.event is not None))

    monkeypatch.setattr(writing.HostCopy, "__init__", spy)
    _write(tmp_path / "gpu", workers=2, device="cuda")
    assert seen and all(pinned and event for pinned, event in seen)
    _compare_with_layer_tables(tmp_path / "gpu", device="cuda", exact=False)
