"""Import of the attention caches that older extraction scripts wrote (``.pt``).

- ``importer``: ``import_cache`` (one cache -> frame_attention rows and metadata),
  ``import_to_parquet`` (as a verified table), ``peek_layers`` (a cache's layers).
- ``plan``: which layout a cache is and where each entry sits (``LegacyCacheError``).
- ``tokens``: token-level entries reduced to frame statistics, streaming.
- ``frames``: frame matrices turned into rows.
- ``rows``: the table's columns.

May import the model's loader, ``tables`` and the base modules.
"""

from sinkscope.legacy.importer import import_cache, import_to_parquet, peek_layers
from sinkscope.legacy.plan import LegacyCacheError

__all__ = ["LegacyCacheError", "import_cache", "import_to_parquet", "peek_layers"]
