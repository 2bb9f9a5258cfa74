"""Results are byte-identical across two clean runs of the same code and inputs: the
extraction folder (per-layer files and manifest) and the prompt embedding (timings go
to the job log; mtimes beside the manifest, in a hidden file that is not a result)."""

from __future__ import annotations

import pytest
from conftest import Workflow


@pytest.mark.workflow
def test_two_clean_runs_write_the_same_bytes(tmp_path):
    runs = []
    for name in ("first", "second"):
        workflow = Workflow(tmp_path / name)
        workflow.directory.mkdir()
        workflow.write_config({"layers": [0, 1], "layers_per_job": 2, "generation": {"num_frames": 3}})
        workflow.run("--until", "extract_attention")
        results = workflow.directory / "results"
        files = {
            path.relative_to(results): path.read_bytes()
            for path in results.rglob("*")
            if path.is_file()
            and not path.name.startswith(".")
            and "logs" not in path.parts
            and "benchmarks" not in path.parts
        }
        runs.append(files)
    first, second = runs
    assert any(path.name == "manifest.json" for path in first) and any(path.suffix == ".safetensors" for path in first)
    assert any(path.name.endswith(".tokens.parquet") for path in first)
    assert first.keys() == second.keys()
    assert [path for path in first if first[path] != second[path]] == []
