"""Make the sinkscope package importable from a job's interpreter.

With `pip install -e .` (the README's setup) this does nothing. In a fresh conda
environment built from envs/*.yaml, the package source beside the workflow is used.
Snakemake puts this folder on sys.path for `script:` rules.
"""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("sinkscope") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
