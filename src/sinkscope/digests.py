"""Content digests of Arrow columns: what every sinkscope Parquet file stores and every
full read verifies (``sinkscope.tables``).

Version 2 (``ContentDigests``) is fed a row group at a time, so a streaming writer and a
reader of the whole file compute the same digest; version 1 (``column_digests_v1``)
verifies files written before it.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa


def _type_name(type_: pa.DataType) -> str:
    """A column type as the digests name it: the same whether written or read back (a
    list's child is "item" in memory and "element" in a file; strings may be large)."""
    if pa.types.is_dictionary(type_):
        return _type_name(type_.value_type)
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        return f"list<{_type_name(type_.value_type)}>"
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "string"
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        return "binary"
    return str(type_)


class _ColumnDigest:
    """A version-2 digest of one column, fed chunk by chunk: sha256 over the type, the row
    count and the digests of three streams (null positions, value lengths, values), so
    the result does not depend on how the rows were chunked."""

    def __init__(self, type_: pa.DataType) -> None:
        self.type_name = _type_name(type_)
        self.rows = 0
        self.nulls, self.lengths, self.values = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()

    def update(self, array: pa.Array) -> None:
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        if array.null_count:
            self.nulls.update((np.flatnonzero(np.asarray(array.is_null())) + self.rows).astype(np.int64).tobytes())
        self.rows += len(array)
        self._values(array)

    def _values(self, array: pa.Array) -> None:
        type_ = array.type
        if (
            pa.types.is_string(type_)
            or pa.types.is_large_string(type_)
            or pa.types.is_binary(type_)
            or pa.types.is_large_binary(type_)
        ):
            array = array.cast(pa.large_binary())
            offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset : array.offset + len(array) + 1]
            self.lengths.update(np.diff(offsets).tobytes())
            data = array.buffers()[2]
            if data is not None:
                self.values.update(memoryview(data)[offsets[0] : offsets[-1]])
        elif pa.types.is_list(type_) or pa.types.is_large_list(type_):
            offsets = np.asarray(array.offsets).astype(np.int64)
            self.lengths.update(np.diff(offsets).tobytes())
            # The values of the rows (flatten: only the slice's, not a shared parent's).
            self._leaf(array.flatten())
        else:
            self._leaf(array)

    def _leaf(self, array: pa.Array) -> None:
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            raise ValueError(f"content digests of nested lists ({array.type}) are not supported")
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        if array.null_count:
            array = array.fill_null(0)
        if not pa.types.is_boolean(array.type) and array.type.bit_width % 8 == 0 and len(array):
            width = array.type.bit_width // 8  # the values buffer itself, no copy
            self.values.update(
                memoryview(array.buffers()[1])[array.offset * width : (array.offset + len(array)) * width]
            )
        elif len(array):
            self.values.update(np.ascontiguousarray(array.to_numpy(zero_copy_only=False)).tobytes())

    def hexdigest(self) -> str:
        digest = hashlib.sha256(b"sinkscope-content-v2\0" + self.type_name.encode() + b"\0")
        digest.update(self.rows.to_bytes(8, "little"))
        for part in (self.nulls, self.lengths, self.values):
            digest.update(part.digest())
        return digest.hexdigest()


class ContentDigests:
    """Version-2 content digests of a table's columns, fed a part (row group) at a time."""

    def __init__(self, schema: pa.Schema) -> None:
        self._columns = {field.name: _ColumnDigest(field.type) for field in schema}

    def update(self, table: pa.Table) -> None:
        for name, digest in self._columns.items():
            for chunk in table.column(name).chunks:
                digest.update(chunk)

    def hexdigests(self) -> dict[str, str]:
        return {name: digest.hexdigest() for name, digest in self._columns.items()}


def column_digests(table: pa.Table) -> dict[str, str]:
    """sha256 of each column's values (version 2), independent of chunking and of how the
    file stores them, so a writer and a reader compute the same digest."""
    digests = ContentDigests(table.schema)
    digests.update(table)
    return digests.hexdigests()


def column_digests_v1(table: pa.Table) -> dict[str, str]:
    """The version-1 digests (files written before version 2): one sha256 per column over
    type, length, null mask and values. A list column's type is named as it was written
    (child "item"), whatever name the reader gives its child."""
    digests = {}
    for name in table.column_names:
        column = table.column(name)
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        type_name = str(pa.list_(array.type.value_type)) if pa.types.is_list(array.type) else str(array.type)
        digest = hashlib.sha256(type_name.encode())
        digest.update(len(array).to_bytes(8, "little"))
        if array.null_count:
            digest.update(np.asarray(array.is_null()).tobytes())
        if pa.types.is_string(array.type) or pa.types.is_large_string(array.type) or pa.types.is_binary(array.type):
            array = array.cast(pa.large_binary())
            offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset : array.offset + len(array) + 1]
            data = array.buffers()[2]
            digest.update((offsets - offsets[0]).tobytes())
            if data is not None:
                digest.update(memoryview(data)[offsets[0] : offsets[-1]])
        elif pa.types.is_list(array.type):
            offsets = np.asarray(array.offsets)
            digest.update((offsets - offsets[0]).astype(np.int64).tobytes())
            digest.update(np.ascontiguousarray(array.flatten().to_numpy(zero_copy_only=False)).tobytes())
        elif not array.null_count and array.type.bit_width % 8 == 0 and not pa.types.is_boolean(array.type):
            width = array.type.bit_width // 8  # the values buffer itself, no copy
            digest.update(memoryview(array.buffers()[1])[array.offset * width : (array.offset + len(array)) * width])
        else:
            digest.update(np.ascontiguousarray(array.fill_null(0).to_numpy(zero_copy_only=False)).tobytes())
        digests[name] = digest.hexdigest()
    return digests
