"""Shared helpers: the repository root and a runner for the real Snakemake workflow."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEFILE = REPO / "Snakefile"


class Workflow:
    """The repository's Snakefile, run in a temporary working directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def write_config(self, config: dict) -> None:
        (self.directory / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def run(self, *args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
        command = [
            sys.executable,
            "-m",
            "snakemake",
            "--snakefile",
            str(SNAKEFILE),
            "--directory",
            str(self.directory),
            "--cores",
            "2",
            "--resources",
            "gpu=1",
            *args,
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=self.directory)
        if check and result.returncode != 0:
            raise AssertionError(
                f"snakemake {' '.join(args)} failed "
                f"({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
            )
        return result

    def planned_jobs(self, *args: str) -> dict[str, int]:
        """Rule -> job count of a dry run (empty when nothing is to be done)."""
        result = self.run("--dry-run", *args)
        text = result.stdout + result.stderr
        if "Nothing to be done" in text:
            return {}
        counts = {}
        table = text.split("Job stats:", 1)[1] if "Job stats:" in text else ""
        for line in table.splitlines()[3:]:
            match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
            if not match:
                break
            if match.group(1) != "total":
                counts[match.group(1)] = int(match.group(2))
        return counts

    def path(self, relative: str) -> Path:
        return self.directory / relative


@pytest.fixture
def workflow(tmp_path: Path) -> Workflow:
    return Workflow(tmp_path)


def pytest_collection_modifyitems(config, items):
    """Workflow and Slurm tests are slow: `pytest -m "not slow"` leaves them out."""
    for item in items:
        if item.get_closest_marker("workflow") or item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.slow)
