"""Which study a results folder holds, so that one study never silently replaces another's.

A study is its config file (``config.yaml``, or the ``--configfile`` files instead): the
same file run again, with a layer added, a figure option changed or any ``--config``
override, is the same study, and Snakemake reruns only what changed. The first run into
a results folder records the study there (``study.json``: its config files).
A run of another study into that folder is refused, before anything runs, in one line
naming both ways on: another results folder keeps both studies; ``replace_results``
deletes the recorded study's results (the layout's folders, less any folder of another
study inside them) and records the new one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from sinkscope.errors import SinkscopeError
from sinkscope.io import atomic_path
from sinkscope.pipeline.layout import BENCHMARKS, LOGS, PATTERNS, RESULTS_VAR, STAGING

STAMP = "study.json"
# What a study writes at the top of its results folder (extract/, tables/, figures/ ...,
# and the runs an interrupted job of several runs left in .staging/).
TOP_FOLDERS = tuple(
    sorted(
        {
            *(
                pattern.removeprefix(RESULTS_VAR + "/").split("/", 1)[0]
                for pattern in (*PATTERNS.values(), LOGS, BENCHMARKS)
            ),
            STAGING,
        }
    )
)


def study_files(config_files: Sequence[str | Path], workdir: str | Path = ".") -> list[str]:
    """The config files that define a study, as paths from the working directory where
    they lie inside it (``config.yaml``, ``configs/interventions.yaml``), else absolute."""
    here = Path(workdir).resolve()
    named = []
    for file in config_files:
        full = (here / Path(file)).resolve()
        named.append(full.relative_to(here).as_posix() if full.is_relative_to(here) else full.as_posix())
    return named


def recorded_study(results: str | Path) -> list[str] | None:
    """The config files recorded in a results folder; None where none is recorded."""
    stamp = Path(results) / STAMP
    try:
        record = json.loads(stamp.read_text())
        return [str(file) for file in record["config_files"]]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise SinkscopeError(f"{stamp}: unreadable ({error}); delete it if this folder holds this study") from None


def other_study(
    results: str, config_files: Sequence[str | Path], *, replace: bool = False, workdir: str | Path = "."
) -> list[str] | None:
    """The config files of another study that ``results`` holds (None: none, or this
    study's). Raises SinkscopeError, in one line naming both ways on, unless ``replace``."""
    ours = study_files(config_files, workdir)
    theirs = recorded_study(Path(workdir) / results)
    if theirs is None or theirs == ours:
        return None
    if not replace:
        raise SinkscopeError(
            f"{results}/ holds the results of {_names(theirs)}, not of {_names(ours)}: to keep both, give "
            f"this study another folder (results: results/<name> in {ours[0]}, or --config "
            f"results=results/<name>); to replace them, --config replace_results=true"
        )
    return theirs


def claim_results_folder(
    results: str, config_files: Sequence[str | Path], *, replace: bool = False, workdir: str | Path = "."
) -> list[str]:
    """Record this study in ``results`` (a run that executes jobs, once no stopped run's
    locks are left): with ``replace``, another study's results there are deleted first.
    Returns one line per action taken (a deletion; results found without a record, kept
    as this study's); raises as ``other_study`` does."""
    theirs = other_study(results, config_files, replace=replace, workdir=workdir)
    folder = Path(workdir) / results
    actions = []
    if theirs is not None:
        locks = Path(workdir) / ".snakemake" / "locks"
        if locks.is_dir() and any(locks.iterdir()):
            raise SinkscopeError(
                f"{results}/: replace_results deletes nothing while a Snakemake run holds this directory ({locks})"
            )
        removed = remove_study_results(folder)
        actions.append(f"{results}/: deleted the results of {_names(theirs)} ({removed} entries; replace_results)")
    ours = study_files(config_files, workdir)
    recorded = recorded_study(folder)
    found = [name for name in TOP_FOLDERS if (folder / name).exists() and not (folder / name / STAMP).is_file()]
    if theirs is None and recorded is None and found:
        # Results from before studies were recorded (or with study.json deleted): kept, and said.
        actions.append(
            f"{results}/: held results of no recorded study (study.json); kept, and the folder recorded as "
            f"{_names(ours)}'s"
        )
    if recorded != ours:
        record = {"config_files": ours}  # no time: a clean run writes the same bytes
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(folder / STAMP) as tmp:
            tmp.write_text(json.dumps(record, indent=1) + "\n")
    return actions


def remove_study_results(folder: Path) -> int:
    """Delete what a study wrote in ``folder`` (its layout's top folders and its record),
    keeping every folder inside them that records a study of its own. Returns how many
    entries went."""
    removed = 0
    for name in (*TOP_FOLDERS, STAMP):
        removed += _remove_keeping_studies(folder / name)
    return removed


def _remove_keeping_studies(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        path.unlink()
        return 1
    if not path.is_dir():
        return 0
    if (path / STAMP).is_file():
        return 0  # another study's results folder
    if not any(STAMP in files for _, _, files in os.walk(path)):
        shutil.rmtree(path)
        return 1
    removed = sum(_remove_keeping_studies(child) for child in sorted(path.iterdir()))
    if not any(path.iterdir()):
        path.rmdir()
    return removed


def _names(files: Sequence[str]) -> str:
    return " + ".join(files)
