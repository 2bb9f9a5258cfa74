"""Import of the attention caches that older extraction scripts wrote (``.pt``).

``import_cache`` reads one cache into frame_attention rows, ``import_to_parquet`` writes
them as a verified table, ``peek_layers`` lists a cache's layers without loading it.
May import the model's loader, ``tables`` and the base modules.
"""

from sinkscope.legacy.importer import LegacyCacheError, import_cache, import_to_parquet, peek_layers

__all__ = ["LegacyCacheError", "import_cache", "import_to_parquet", "peek_layers"]
