"""Runs that heal themselves: an interrupted run (Ctrl-C, a killed process group, a full
disk) leaves nothing that blocks the next plain run, and the results it gives equal a
clean run's (sinkscope.pipeline.recovery)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import SNAKEFILE

from sinkscope.errors import SinkscopeError
from sinkscope.pipeline.recovery import RUN_MARKER, recover_interrupted_run

TINY = "layers: [0]\ngeneration: {num_frames: 3}\ncapture: {token_profiles: none}\n"


def _backup(workdir: Path, relative: str) -> Path:
    return workdir / ".snakemake" / "backups" / relative


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _png(size: int = 200) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * (size // 256 + 1) + b"\x00\x00\x00\x00IEND\xaeB`\x82"


def test_a_whole_result_stays_and_its_leftover_backup_goes(tmp_path):
    result = _write(tmp_path / "results/figures/demo/figure4.png", _png())
    _write(_backup(tmp_path, "results/figures/demo/figure4.png"), _png(400))
    before = result.read_bytes()
    assert recover_interrupted_run(tmp_path) == []
    assert result.read_bytes() == before and not (tmp_path / ".snakemake/backups").exists()


@pytest.mark.parametrize(
    "relative, truncate",
    [
        ("results/figures/demo/figure4.png", lambda data: data[: len(data) // 2]),
        ("results/figures/demo/figure4.svg", lambda data: data[:40]),
        ("results/tables/checkpoints/demo/head_classes.csv", lambda data: data[:7]),
        ("results/report/summary.html", lambda data: b""),
    ],
)
def test_a_result_cut_short_by_a_failed_restore_gets_the_previous_one_back(tmp_path, relative, truncate):
    whole = {
        ".png": _png(),
        ".svg": b"<svg>" + b"x" * 100 + b"</svg>\n",
        ".csv": b"layer,head\n0,1\n1,2\n",
        ".html": b"<html>" + b"y" * 50 + b"</html>\n",
    }[Path(relative).suffix]
    result = _write(tmp_path / relative, truncate(whole))
    _write(_backup(tmp_path, relative), whole)
    actions = recover_interrupted_run(tmp_path)
    assert result.read_bytes() == whole and len(actions) == 1 and "restored the previous result" in actions[0]


def test_a_damaged_parquet_or_folder_is_replaced_by_its_whole_backup(tmp_path):
    import pyarrow as pa

    from sinkscope.manifests import write_manifest

    table = tmp_path / "results/tables/checkpoints/demo/frame_attention.parquet"
    table.parent.mkdir(parents=True)
    pq.write_table(pa.table({"x": list(range(100))}), table)
    _write(_backup(tmp_path, "results/tables/checkpoints/demo/frame_attention.parquet"), table.read_bytes())
    table.write_bytes(table.read_bytes()[:100])
    folder = tmp_path / "results/extract/demo/drift/seed0/layers0"
    folder.mkdir(parents=True)
    (folder / "layer0.parquet").write_bytes(b"rows" * 10)
    write_manifest(folder, ["layer0.parquet"], {})
    backup = _backup(tmp_path, "results/extract/demo/drift/seed0/layers0")
    shutil.copytree(folder, backup)
    (folder / "layer0.parquet").write_bytes(b"rows")  # a restore cut short
    recover_interrupted_run(tmp_path)
    assert pq.read_table(table).num_rows == 100
    assert (folder / "layer0.parquet").read_bytes() == b"rows" * 10 and not backup.exists()


def test_temporaries_of_an_interrupted_job_are_removed(tmp_path):
    stray = [
        _write(tmp_path / "results/tables/.frame_attention.parquet.k2j3.tmp", b"partial"),
        tmp_path / "results/extract/demo/drift/seed0/.layers0.tmp-4242",
    ]
    stray[1].mkdir(parents=True)
    keep = _write(tmp_path / "results/tables/frame_attention.parquet", b"data")
    recover_interrupted_run(tmp_path)
    assert not any(path.exists() for path in stray) and keep.exists()


def _stopped_run(workdir: Path, host: str | None = None) -> dict:
    """A run recorded by a process that then ended (on ``host``, when given, instead of
    this machine), holding the locks present."""
    code = f"from sinkscope.pipeline.recovery import mark_run_start; mark_run_start({str(workdir)!r})"
    subprocess.run([sys.executable, "-c", code], check=True)
    marker = workdir / ".snakemake" / RUN_MARKER
    record = json.loads(marker.read_text())
    if host is not None:
        record["host"] = host
        marker.write_text(json.dumps(record))
    return record


def test_the_locks_of_this_machines_stopped_run_are_removed(tmp_path):
    lock = _write(tmp_path / ".snakemake/locks/0.output.lock", b"results/x\n")
    _stopped_run(tmp_path)
    actions = recover_interrupted_run(tmp_path)
    assert len(actions) == 1 and "removed the locks of this machine's stopped run" in actions[0]
    assert not lock.exists()


@pytest.mark.parametrize("case", ["another host", "no record", "written after the record", "record damaged"])
def test_a_lock_that_may_be_another_machines_stays_with_the_unlock_advice(tmp_path, case):
    lock = _write(tmp_path / ".snakemake/locks/0.output.lock", b"results/x\n")
    backup = _write(_backup(tmp_path, "results/figures/demo/figure4.png"), _png())
    if case == "another host":
        _stopped_run(tmp_path, host=f"{socket.gethostname()}-login2")
    elif case == "written after the record":
        _stopped_run(tmp_path)
        lock.unlink()
        _write(tmp_path / ".snakemake/locks/0.output.lock", b"results/y\n")  # a later run's
    elif case == "record damaged":
        _write(tmp_path / ".snakemake" / RUN_MARKER, b'{"host": ')
    with pytest.raises(SinkscopeError) as error:
        recover_interrupted_run(tmp_path)
    message = str(error.value)
    assert "\n" not in message and "snakemake --unlock" in message and str(tmp_path / ".snakemake/locks") in message
    if case == "another host":
        assert f"{socket.gethostname()}-login2" in message
    assert lock.exists() and backup.exists()  # nothing touched


def test_nothing_is_touched_while_another_snakemake_works_here(tmp_path):
    _write(tmp_path / ".snakemake/locks/0.output.lock", b"results/x\n")
    backup = _write(_backup(tmp_path, "results/figures/demo/figure4.png"), _png())
    # A process whose command line names snakemake, working in this directory.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "snakemake"], cwd=tmp_path)
    try:
        time.sleep(0.3)
        _stopped_run(tmp_path)  # an older record: the live process is what counts
        assert recover_interrupted_run(tmp_path) == []
        assert backup.exists() and (tmp_path / ".snakemake/locks/0.output.lock").exists()
    finally:
        other.kill()
        other.wait()
    actions = recover_interrupted_run(tmp_path)
    assert any("removed the locks of this machine's stopped run" in line for line in actions)
    assert not (tmp_path / ".snakemake/locks/0.output.lock").exists()


# -- real runs, interrupted ------------------------------------------------------------------


def _snakemake(workdir: Path, *args: str, **kwargs) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(SNAKEFILE),
        "--directory",
        str(workdir),
        "--cores",
        "1",
        "--resources",
        "gpu=1",
        *args,
    ]
    return subprocess.Popen(
        command,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        **kwargs,
    )


def _run(workdir: Path, *args: str) -> str:
    process = _snakemake(workdir, *args)
    out, _ = process.communicate(timeout=900)
    assert process.returncode == 0, out[-4000:]
    return out


def _values(workdir: Path):
    table = pq.read_table(workdir / "results/tables/frame_attention.parquet")
    return table.drop([name for name in ("code_digest",) if name in table.column_names]).to_pandas()


def _interrupt(workdir: Path, moment: str, signal_number: int) -> None:
    """A forced rerun of the extraction, stopped at ``moment``: 'before' (the job just
    scheduled), 'during' (the job computing), 'after' (its folder written, downstream
    jobs running)."""
    folder = next(workdir.glob("results/extract/demo/drift/seed0/layers0"))
    written = (folder / "manifest.json").stat().st_mtime_ns
    log = workdir / "interrupted.log"
    with open(log, "w") as handle:
        command = [
            sys.executable,
            "-m",
            "snakemake",
            "--snakefile",
            str(SNAKEFILE),
            "--directory",
            str(workdir),
            "--cores",
            "1",
            "--resources",
            "gpu=1",
            "--forcerun",
            "extract_attention",
        ]
        process = subprocess.Popen(
            command, cwd=workdir, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 300

    def reached() -> bool:
        text = log.read_text()
        if moment == "before":
            return "rule extract_attention" in text
        if moment == "during":
            job_log = workdir / "results/logs/extract_attention/demo/drift/seed0/layers0.log"
            return "rule extract_attention" in text and job_log.exists() and job_log.stat().st_size > 0
        manifest = folder / "manifest.json"
        return manifest.exists() and manifest.stat().st_mtime_ns != written

    while not reached():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    if signal_number == signal.SIGKILL:
        os.killpg(process.pid, signal.SIGKILL)
    else:
        process.send_signal(signal_number)
    process.wait(timeout=300)


@pytest.mark.slow
@pytest.mark.workflow
def test_a_run_leaves_a_lock_from_another_host_in_place_and_says_unlock(tmp_path):
    """A run started from another login node of a shared file system holds its lock:
    the workflow stops in one line before any job, naming the host, and touches nothing."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(TINY)
    lock = _write(workdir / ".snakemake/locks/0.output.lock", b"results/tables/frame_attention.parquet\n")
    record = {
        "host": "login2.cluster",
        "pid": os.getpid(),
        "started": "2026-01-01T00:00:00Z",
        "locks": {"0.output.lock": [0, 0, 0]},
    }
    _write(workdir / ".snakemake" / RUN_MARKER, json.dumps(record).encode())
    process = _snakemake(workdir)
    out, _ = process.communicate(timeout=900)
    lines = [line for line in out.splitlines() if line.startswith("sinkscope:")]
    assert process.returncode == 1 and len(lines) == 1, out[-3000:]
    assert "login2.cluster" in lines[0] and "snakemake --unlock" in lines[0] and "Traceback" not in out
    assert lock.read_bytes() == b"results/tables/frame_attention.parquet\n" and not (workdir / "results").exists()


@pytest.mark.workflow
def test_an_interrupted_run_never_blocks_the_next_plain_run(tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(TINY)
    _run(workdir)
    reference = _values(workdir)
    for moment, signal_number in (
        ("before", signal.SIGKILL),
        ("during", signal.SIGKILL),
        ("after", signal.SIGKILL),
        ("during", signal.SIGINT),
    ):
        _interrupt(workdir, moment, signal_number)
        out = _run(workdir)  # the next plain run
        assert "FileExistsError" not in out and "Traceback" not in out, (moment, out[-3000:])
        assert _run(workdir, "--dry-run").count("rule ") == 0, moment  # nothing left to do
        assert _values(workdir).equals(reference), moment
    assert not any((workdir / ".snakemake" / "backups").rglob("*.*")), "no backups left behind"


@pytest.mark.workflow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a small tmpfs needs root")
def test_a_full_disk_never_blocks_the_next_run_nor_damages_the_previous_result(tmp_path):
    workdir = tmp_path / "small"
    workdir.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(workdir)]).returncode != 0:
        pytest.skip("this machine refuses to mount a tmpfs")
    try:
        (workdir / "config.yaml").write_text(TINY)
        _run(workdir)
        reference = _values(workdir)
        for leave_free in (40_000, 400_000, 2_000_000):  # full during the backup, the job, the downstream jobs
            filler = workdir / "filler"
            free = shutil.disk_usage(workdir).free
            with open(filler, "wb") as handle:
                handle.truncate(0)
                handle.write(b"\0" * max(0, free - leave_free))
            process = _snakemake(workdir, "--forcerun", "extract_attention")
            process.communicate(timeout=900)  # fails somewhere: the backup, the job, or after
            filler.unlink()
            out = _run(workdir)
            assert "Traceback" not in out, out[-3000:]
            assert _values(workdir).equals(reference), leave_free
    finally:
        subprocess.run(["umount", "-l", str(workdir)])


@pytest.mark.workflow
def test_damage_to_any_result_is_seen_moved_aside_and_rebuilt_by_the_next_run(tmp_path):
    """Snakemake sees a result missing, never damaged: the pre-run scan must see it."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "config.yaml").write_text("layers: [0]\ngeneration: {num_frames: 3}\n")
    _run(workdir)
    reference = _values(workdir)
    results = workdir / "results"
    table = results / "tables/frame_attention.parquet"
    png = results / "figures/demo/figure4.png"
    dataset = results / "tables/checkpoints/demo/token_profiles.parquet"
    extraction = results / "extract/demo/drift/seed0/layers0"
    manifest = extraction / "manifest.json"

    def flip(path: Path, keep_mtime: bool = False) -> None:
        stat = path.stat()
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x20
        path.write_bytes(bytes(data))
        if keep_mtime:
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    rounds = [
        # flipped bytes in a table; a figure cut short; a file lost from a dataset folder;
        # one digit of a manifest's sha256 changed
        (
            lambda: (
                flip(table),
                png.write_bytes(png.read_bytes()[:300]),
                next(p for p in dataset.rglob("*.parquet")).unlink(),
                manifest.write_text(manifest.read_text().replace('"sha256": "', '"sha256": "0', 1)),
            ),
            [str(table), str(png), str(dataset), f"{manifest}: is damaged: it does not match its own digest"],
        ),
        # a stray file in a dataset folder; a layer file damaged with its mtime put back
        (
            lambda: (
                (dataset / "stray.parquet").write_bytes(b"x"),
                flip(extraction / "layer0.parquet", keep_mtime=True),
            ),
            [f"{dataset}: holds files its job did not write", str(extraction / "layer0.parquet")],
        ),
    ]
    for damage, named in rounds:
        damage()
        process = _snakemake(workdir)
        out, _ = process.communicate(timeout=900)
        assert process.returncode == 1 and "moved aside" in out, out[-3000:]
        for name in named:
            name = name.replace(f"{workdir}/", "")  # the run names results relative to its directory
            assert name in out, (name, out[-3000:])
        _run(workdir)  # the next run rebuilds exactly what was moved aside
        assert _values(workdir).equals(reference)
        verify = subprocess.run(
            [sys.executable, "-m", "sinkscope.cli", "verify", str(results)], capture_output=True, text=True
        )
        assert verify.returncode == 0 and "moved aside as damaged, not checked" in verify.stderr, verify.stdout
