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
when no Snakemake process on this machine has this directory as its working directory;
where processes cannot be listed (no ``/proc``), locks are left to ``--unlock``. For
each copy left behind it keeps the whole one of the two, by renames within the file
system (no copy that a full disk could stop half-way):

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

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from sinkscope.manifests import DATASET_MANIFEST, MANIFEST, check_directory
from sinkscope.naming import is_group_folder

_PNG_END = b"IEND\xaeB`\x82"
# atomic_path's temporaries and the extraction job's temporary folder.
_TEMPORARY = re.compile(r"^\..+\.tmp$|^\..+\.tmp-\d+$")


def recover_interrupted_run(workdir: str | Path = ".") -> list[str]:
    """Resolve backups and temporaries an interrupted run left; one line per action taken."""
    workdir = Path(workdir)
    actions = []
    locks = workdir / ".snakemake" / "locks"
    if locks.is_dir() and any(locks.iterdir()):
        if _another_snakemake_runs_in(workdir):
            return []  # a live run: its backups are in use
        for lock in locks.iterdir():
            _remove(lock)
        actions.append(f"{locks}: removed the locks of a stopped run (no Snakemake runs in this directory)")
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
    results = workdir / "results"
    if results.is_dir():
        for temporary in _temporaries(results):
            _remove(temporary)
            actions.append(f"{temporary}: removed (left by an interrupted job)")
    return actions


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
