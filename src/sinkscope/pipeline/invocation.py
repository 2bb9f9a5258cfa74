"""How Snakemake was invoked: run, dry run or inspection, and which executor (read from
its command line and profiles, since the Snakefile is parsed before Snakemake says)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

_INSPECT_FLAGS = (
    "--lint",
    "--report",
    "--list",
    "--summary",
    "--detailed-summary",
    "--dag",
    "--rulegraph",
    "--filegraph",
    "--d3dag",
    "--unlock",
    "--cleanup-metadata",
    "--list-changes",
    "--touch",
    "--delete-all-output",
    "--delete-temp-output",
    "--archive",
    "--containerize",
    "--export-cwl",
    "--generate-unit-tests",
)


def invocation_mode(argv: list[str]) -> str:
    """'run', 'dry-run' or 'inspect' (lint, report, graphs...), from Snakemake's command line.

    While the Snakefile is parsed, Snakemake does not yet say whether it will execute
    jobs; moving damaged results aside must happen only when it will.
    """
    for arg in argv[1:]:
        if arg in ("-n", "--dry-run", "--dryrun", "--just-print") or (
            arg.startswith("-") and not arg.startswith("--") and "n" in arg[1:] and arg[1:].isalpha()
        ):
            return "dry-run"
        if any(arg == flag or arg.startswith(flag + "-") or arg.startswith(flag + "=") for flag in _INSPECT_FLAGS):
            return "inspect"
    return "run"


# Inspections that write or delete results, or report them as this study's.
_RESULT_FLAGS = ("--touch", "--delete-all-output", "--delete-temp-output", "--report")


def acts_on_results(argv: list[str]) -> bool:
    """Whether this invocation runs or plans jobs, or an inspection that changes or reports
    the results (``--touch``, ``--delete-all-output``, ``--report`` ...): the ones that must
    not meet another study's results folder."""
    if invocation_mode(argv) != "inspect":
        return True
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv[1:] for flag in _RESULT_FLAGS)


LOCAL_EXECUTORS = ("local", "dryrun", "touch")


def requested_executor(argv: list[str], workflow_dir: str | Path, environ: Mapping[str, str] | None = None) -> str:
    """The executor Snakemake will use ('local' unless one is named), from its command
    line, else the workflow profile, else the user profile.

    Snakemake parses the Snakefile before it sets up the executor, so while parsing,
    ``workflow.local_exec`` is true even for ``--executor slurm``; checks of this
    machine (devices, memory) must not apply to jobs that run elsewhere.
    """
    environ = os.environ if environ is None else environ
    value = _argument(argv, ("--executor", "-e"))
    if value:
        return value
    profiles = [
        _argument(argv, ("--workflow-profile",)) or str(Path(workflow_dir, "profiles", "default")),
        _argument(argv, ("--profile",)) or environ.get("SNAKEMAKE_PROFILE"),
    ]
    for profile in profiles:
        if not profile or profile == "none":
            continue
        for folder in (
            Path(profile),
            Path.home() / ".config" / "snakemake" / profile,
            Path("/etc/xdg/snakemake", profile),
        ):
            for name in ("config.v8+.yaml", "config.yaml"):
                if (folder / name).is_file():
                    import yaml

                    try:
                        settings = yaml.safe_load((folder / name).read_text()) or {}
                    except (OSError, yaml.YAMLError):
                        settings = {}
                    if isinstance(settings, Mapping) and settings.get("executor"):
                        return str(settings["executor"])
                    break
            else:
                continue
            break
    return "local"


def _argument(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last of ``names`` on a command line (``--x v`` or ``--x=v``)."""
    found = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(name + "=") and name.startswith("--"):
                found = arg.split("=", 1)[1]
    return found


def forget_inventory(workdir: str | Path = ".") -> None:
    """Drop the file inventory a Snakemake dry run saves for the next run to reuse
    (``.snakemake/iocache/latest.pkl``): after results are moved aside it is stale."""
    Path(workdir, ".snakemake", "iocache", "latest.pkl").unlink(missing_ok=True)
