"""What an interrupted run leaves behind, put right before the next run starts.

Every output is a Snakemake ``update()`` output: before a job runs, Snakemake copies
the previous result to ``.snakemake/backups/<path>``; after a failure it copies it
back, after a success it deletes the copy. A run stopped in between (Ctrl-C, a kill of
the process group, a full disk during the copy or the restore) leaves copies behind,
and Snakemake then refuses every later run that must back up the same output
(``FileExistsError``), ``--unlock`` included; a restore stopped half-way leaves the
previous result truncated. A job's own temporary files (``.<name>.*.tmp``,
``.<folder>.tmp-<pid>``) may be left too.

``recover_interrupted_run`` runs while the Snakefile is parsed, in a run that will
execute jobs, and only when no other Snakemake runs in this directory. Locks left by a
killed run (which Snakemake would have the user remove with ``--unlock``) are removed
only when they are provably this machine's stopped run: every run records itself once
it holds its locks (``mark_run_start``, called from the workflow's ``onstart``, writes
``.snakemake/sinkscope-run.json``: host, process id, start time and the lock files it
found), and the locks go only when that record names this host, its process is gone
(or is no Snakemake process) and the lock files are the very ones it recorded. On a
cluster's shared file system, a run started from another login node holds its locks
legitimately: a lock from another host, or one no record explains, stops the run with
Snakemake's own advice (``snakemake --unlock``) in one line; where processes cannot be
listed (no ``/proc``), locks are left to Snakemake. For each copy left behind it keeps
the whole one of the two, by renames within the file system (no copy that a full disk
could stop half-way):

- the result in place is whole (the previous one, or the new one of a job that ended
  just before the kill): the copy is deleted;
- the result in place is missing or incomplete and the copy is whole: the copy is
  moved back;
- neither is whole: the copy is deleted, and the pre-run scan moves the damaged result
  aside so that the run rebuilds it.

"Whole" means: a folder whose manifest matches its files, a Parquet file whose footer
reads, a PNG that ends with its IEND chunk, an SVG or HTML page that ends with its
closing tag, any other file that is not a prefix of the copy (a restore cut short).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from sinkscope.errors import SinkscopeError
from sinkscope.io import atomic_path
from sinkscope.manifests import DATASET_MANIFEST, MANIFEST, check_directory
from sinkscope.naming import is_group_folder

# What a run records about itself under .snakemake/ once it holds its locks.
RUN_MARKER = "sinkscope-run.json"
_UNLOCK_ADVICE = (
    "if no Snakemake runs in this directory on any machine, remove the lock with "
    "`snakemake --unlock` (with this run's options), then run again"
)

_PNG_END = b"IEND\xaeB`\x82"
# atomic_path's temporaries and the extraction job's temporary folder.
_TEMPORARY = re.compile(r"^\..+\.tmp$|^\..+\.tmp-\d+$")


def recover_interrupted_run(workdir: str | Path = ".", results: str | Path = "results") -> list[str]:
    """Resolve backups and temporaries an interrupted run left (temporaries: in the
    results folder ``results``); one line per action taken."""
    workdir = Path(workdir)
    actions = []
    locks = workdir / ".snakemake" / "locks"
    if locks.is_dir() and any(locks.iterdir()):
        if _another_snakemake_runs_in(workdir):
            return []  # a live run: its backups are in use
        holder = _stopped_run_of_this_machine(workdir, locks)
        for lock in locks.iterdir():
            _remove(lock)
        actions.append(
            f"{locks}: removed the locks of this machine's stopped run (pid {holder['pid']}, "
            f"started {holder['started']}; no Snakemake runs in this directory)"
        )
    backups = workdir / ".snakemake" / "backups"
    if backups.is_dir():
        for copy in _backup_units(backups):
            result = workdir / copy.relative_to(backups)
            if _whole(result, copy):
                _remove(copy)
            elif _whole(copy, None):
                _remove(result)
                result.parent.mkdir(parents=True, exist_ok=True)
                os.replace(copy, result)
                actions.append(f"{result}: restored the previous result (an interrupted run left it incomplete)")
            else:
                _remove(copy)
        _prune_empty_folders(backups)
    results = workdir / results
    if results.is_dir():
        for temporary in _temporaries(results):
            _remove(temporary)
            actions.append(f"{temporary}: removed (left by an interrupted job)")
    return actions


def mark_run_start(workdir: str | Path = ".") -> Path:
    """Record this run in ``.snakemake/sinkscope-run.json``: this host, this process, the
    time, and the lock files present (name, inode, mtime, size). Called by the main
    Snakemake process once it holds its locks (the workflow's ``onstart``), so that a
    later run can tell this run's stale locks from another machine's live ones."""
    folder = Path(workdir) / ".snakemake"
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "locks": _lock_files(folder / "locks"),
    }
    with atomic_path(folder / RUN_MARKER) as tmp:
        tmp.write_text(json.dumps(record, indent=1) + "\n")
    return folder / RUN_MARKER


def _lock_files(locks: Path) -> dict[str, list[int]]:
    """{name: [inode, mtime_ns, size]} of the lock files: a lock written later differs."""
    if not locks.is_dir():
        return {}
    found = {}
    for lock in sorted(locks.iterdir()):
        try:
            stat = lock.stat()
        except OSError:
            continue  # removed meanwhile
        found[lock.name] = [stat.st_ino, stat.st_mtime_ns, stat.st_size]
    return found


def _stopped_run_of_this_machine(workdir: Path, locks: Path) -> dict:
    """The record of the run that left ``locks``, when it is provably this machine's
    and stopped; otherwise a SinkscopeError with Snakemake's advice, in one line."""
    marker = workdir / ".snakemake" / RUN_MARKER
    try:
        record = json.loads(marker.read_text())
        host, pid, started = str(record["host"]), int(record["pid"]), str(record["started"])
        recorded = {name: list(value) for name, value in record["locks"].items()}
        if pid <= 0:
            raise ValueError(pid)
    except FileNotFoundError:
        raise SinkscopeError(
            f"{locks}: held by a run that left no {marker} (it may run on another machine); {_UNLOCK_ADVICE}"
        ) from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        raise SinkscopeError(f"{locks}: held by a run whose record {marker} is unreadable; {_UNLOCK_ADVICE}") from None
    if host != socket.gethostname():
        raise SinkscopeError(
            f"{locks}: held by a run started on host {host} (pid {pid}, {started}), which this "
            f"machine cannot see; {_UNLOCK_ADVICE}"
        )
    if _is_snakemake(pid):
        raise SinkscopeError(
            f"{locks}: held by Snakemake process {pid} on this machine (started {started}); {_UNLOCK_ADVICE}"
        )
    if _lock_files(locks) != recorded:
        raise SinkscopeError(
            f"{locks}: written after this machine's last run (pid {pid}, {started}) started, by a "
            f"run that may be on another machine; {_UNLOCK_ADVICE}"
        )
    return {"pid": pid, "started": started}


def _is_snakemake(pid: int) -> bool:
    """Whether process ``pid`` of this machine runs and is a Snakemake process (True where
    that cannot be read: a process that may be the run is never declared gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    try:
        return b"snakemake" in (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # gone meanwhile; or no /proc to ask
    except OSError:
        return True


def _another_snakemake_runs_in(workdir: Path) -> bool:
    """Whether a Snakemake process other than this one (and its parents) works in
    ``workdir``; True where processes cannot be listed, so that nothing is touched."""
    proc = Path("/proc")
    if not (proc / "self" / "cwd").exists():
        return True
    here = workdir.resolve()
    ours = {os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in ours:
        ours.add(pid)
        try:
            pid = int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            if b"snakemake" in command and Path(os.readlink(entry / "cwd")).resolve() == here:
                return True
        except OSError:
            continue  # gone, or not ours to read
    return False


def _backup_units(backups: Path) -> Iterator[Path]:
    """The copies Snakemake made, one per output: a file, or a folder output (an
    extraction folder or a Parquet dataset folder) taken whole."""
    for directory, folders, files in os.walk(backups):
        for name in list(folders):
            if is_group_folder(name) or name.endswith(".parquet"):
                folders.remove(name)
                yield Path(directory, name)
        for name in files:
            yield Path(directory, name)


def _whole(path: Path, copy: Path | None) -> bool:
    if path.is_dir():
        for manifest in (MANIFEST, DATASET_MANIFEST):
            if (path / manifest).is_file():
                return not check_directory(path, name=manifest)
        return False
    if not path.is_file() or path.stat().st_size == 0:
        return False
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            pq.read_metadata(path)
        except (OSError, ValueError):
            return False
        return True
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - 64))
        tail = handle.read()
    if path.suffix == ".png":
        return tail.endswith(_PNG_END)
    if path.suffix in (".svg", ".html"):
        closing = b"</svg>" if path.suffix == ".svg" else b"</html>"
        return closing in tail
    return copy is None or not _is_prefix(path, copy)


def _is_prefix(path: Path, copy: Path) -> bool:
    """Whether ``path`` is a strict prefix of ``copy`` (a copy cut short)."""
    if not copy.is_file() or path.stat().st_size >= copy.stat().st_size:
        return False
    with open(path, "rb") as short, open(copy, "rb") as full:
        while chunk := short.read(1 << 20):
            if full.read(len(chunk)) != chunk:
                return False
    return True


def _temporaries(results: Path) -> Iterator[Path]:
    for directory, folders, files in os.walk(results):
        for name in list(folders):
            if _TEMPORARY.match(name):
                folders.remove(name)
                yield Path(directory, name)
        for name in files:
            if _TEMPORARY.match(name):
                yield Path(directory, name)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _prune_empty_folders(root: Path) -> None:
    for directory, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        try:
            Path(directory).rmdir()
        except OSError:
            pass  # not empty
