"""The import job: one ``legacy_caches:`` entry (an older ``.pt`` cache) -> frame_attention rows."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sinkscope.legacy.importer import import_to_parquet
from sinkscope.pipeline.jobs import provenance


def import_job(path: str | Path, output: str | Path, name: str, entry: Mapping[str, Any]) -> None:
    """The pipeline's import job: the cache at ``path`` as the source ``name``."""
    import_to_parquet(
        path,
        output,
        checkpoint=name,
        prompt_id=entry.get("prompt_id"),
        seed=int(entry.get("seed", 0)),
        allow_pickle=bool(entry.get("allow_pickle", False)),
        provenance=provenance("import_cache"),
    )
