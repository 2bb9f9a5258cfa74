"""Writing an extraction's rows off the generation's critical path.

A 30-layer job captures 59 million token values a video; building and writing their
rows after the generation cost more than the generation itself. Here each call's
statistics go to the writer as they are made, and the rows are built and written while
the next calls run:

- ``BackgroundQueue``: worker threads, each with a bounded queue (the producer waits
  when a worker is behind, which bounds the memory held by results in flight); tasks
  with the same key run in order on the same worker; the first error is raised in the
  producer's thread (at its next ``submit`` or at ``close``). ``workers=0`` runs each
  task at once in the caller: what the CPU path does, so that tests are deterministic.
- ``ExtractionWriter``: the extraction job's files. On CUDA, a record's tensors are
  copied into pinned host memory by one non-blocking copy and a CUDA event is recorded;
  the writer thread waits on the event, builds the rows and appends them to its layer's
  files (``sinkscope.tables.TableWriter``: one row group per block, checksums and
  digests as the row groups go, provenance in the footer at the end). Nothing appears
  in the folder's final place until ``finish`` has checked and closed every file (the
  job swaps the folder in); any failure leaves no file behind.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from sinkscope.generation.capture import (
    KIND_COLUMNS,
    PASSES,
    CallRecord,
    concat_rows,
    record_rows,
    record_tensors,
)
from sinkscope.generation.common import PASS_CACHE
from sinkscope.naming import layer_file
from sinkscope.tables import (
    FRAME_ATTENTION_SCHEMA,
    QUERY_STATS_SCHEMA,
    TOKEN_PROFILES_SCHEMA,
    TableWriter,
)

_PASS_NAMES = pa.array(PASSES, pa.string())
SCHEMAS = {"frames": FRAME_ATTENTION_SCHEMA, "queries": QUERY_STATS_SCHEMA, "tokens": TOKEN_PROFILES_SCHEMA}
# Per worker: records waiting to be written. 4 x 30 layers' token records of a Wan call
# are about 400 MB of pinned memory at most; frame-only records are tiny.
QUEUE_SIZE = 4
MAX_WORKERS = 4

_STOP = object()


class BackgroundQueue:
    """Run tasks on ``workers`` threads, in order per key, at most ``maxsize`` waiting per
    worker (``submit`` blocks until there is room). ``workers=0``: each task runs at once
    in the caller. The first error of any task is raised in the caller by the next
    ``submit`` or by ``close``; the tasks still queued then are dropped."""

    def __init__(self, workers: int, maxsize: int = QUEUE_SIZE, name: str = "sinkscope-writer") -> None:
        if workers < 0 or maxsize < 1:
            raise ValueError(f"a background queue needs workers >= 0 and maxsize >= 1; got {workers} and {maxsize}")
        self.workers = workers
        self.busy_seconds = 0.0  # time spent in tasks, summed over the workers
        self.submit_seconds = 0.0  # time the caller spent in submit (waiting for room, or running inline)
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._queues: list[queue.Queue] = [queue.Queue(maxsize) for _ in range(workers)]
        self._threads = [
            threading.Thread(target=self._work, args=(q,), name=f"{name}-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, key: Hashable, task: Callable[..., Any], *args: Any) -> None:
        """Queue ``task(*args)`` behind the earlier tasks of ``key``."""
        began = time.perf_counter()
        try:
            self._raise()
            if self._closed:
                raise RuntimeError("submit to a closed background queue")
            if not self._queues:
                self._run(task, args)
                self._raise()
                return
            target = self._queues[hash(key) % len(self._queues)]
            while True:  # a worker that failed drains its queue: never wait forever
                try:
                    target.put((task, args), timeout=0.1)
                    return
                except queue.Full:
                    self._raise()
        finally:
            self.submit_seconds += time.perf_counter() - began

    def _run(self, task: Callable[..., Any], args: tuple) -> None:
        began = time.perf_counter()
        try:
            task(*args)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            with self._lock:
                if self._error is None:
                    self._error = error
        finally:
            with self._lock:
                self.busy_seconds += time.perf_counter() - began

    def _work(self, tasks: queue.Queue) -> None:
        while True:
            item = tasks.get()
            if item is _STOP:
                return
            if self._error is None:  # after a failure the rest is dropped
                self._run(*item)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    @property
    def failed(self) -> bool:
        return self._error is not None

    def close(self) -> None:
        """Wait for every queued task; raise the first error of any."""
        if not self._closed:
            self._closed = True
            for tasks in self._queues:
                tasks.put(_STOP)
            for thread in self._threads:
                thread.join()
        self._raise()

    def abandon(self) -> None:
        """Stop: queued tasks are dropped, running ones finish; no error is raised."""
        with self._lock:
            if self._error is None:
                self._error = _Abandoned("the background queue was abandoned")
        self._closed = True
        for tasks in self._queues:
            tasks.put(_STOP)
        for thread in self._threads:
            thread.join()


class _Abandoned(Exception):
    pass


class HostCopy:
    """A record's statistics on their way to the host: one flat float32 buffer (pinned,
    filled by a non-blocking copy on CUDA) and the event that says it is filled."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.shapes = {name: tuple(t.shape) for name, t in tensors.items()}
        flat = torch.cat([t.detach().float().flatten() for t in tensors.values()]) if tensors else torch.empty(0)
        self.event: torch.cuda.Event | None = None
        if flat.is_cuda:
            self.host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            self.host.copy_(flat, non_blocking=True)
            # The device buffer may be freed now: the caching allocator reuses it only for
            # work queued after the copy on this stream.
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = flat

    def arrays(self) -> dict[str, np.ndarray]:
        """The statistics as numpy arrays by name (waits for the copy)."""
        if self.event is not None:
            self.event.synchronize()
        flat = self.host.numpy()
        out, offset = {}, 0
        for name, shape in self.shapes.items():
            size = int(np.prod(shape))
            out[name] = flat[offset : offset + size].reshape(shape)
            offset += size
        return out


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, which a cluster's cgroup sets)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers(device: torch.device | str, layers: int) -> int:
    """Writer threads for a job: none on CPU (inline, deterministic), else up to 4."""
    return 0 if torch.device(device).type != "cuda" else max(1, min(MAX_WORKERS, layers))


class _LayerFiles:
    """One layer's files in the making: the rows of the blocks still receiving records
    (block -> kind -> row parts), the pass of the last record, a ``TableWriter`` per kind
    (opened with the first rows), the frame rows for the check."""

    def __init__(self) -> None:
        self.pending: dict[int, dict[str, list[dict[str, np.ndarray]]]] = {}
        self.last_pass: str | None = None
        self.writers: dict[str, TableWriter] = {}
        self.frames: list[dict[str, np.ndarray]] = []


class ExtractionWriter:
    """The files of one extraction job's folder (``folder``, built aside), written from
    the records of a generation as they come (``submit``, the capture's ``handoff``).

    Per layer: ``layer<L>.parquet`` (frame_attention), ``layer<L>.queries.parquet``
    (query_stats), ``layer<L>.tokens.parquet`` (token_profiles, when captured), one row
    group per block. ``finish`` checks each layer's rows (``check``, given the layer and
    its frame rows as a DataFrame) and closes the files with their metadata; ``abort``
    removes whatever was written. ``workers``: writer threads (0: inline, in the caller).
    """

    def __init__(
        self,
        folder: str | Path,
        layers: Sequence[int],
        *,
        frame_seq_length: int,
        run_columns: Mapping[str, Any],
        workers: int = 0,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.folder = Path(folder)
        self.layers = [int(layer) for layer in layers]
        self.frame_seq_length = frame_seq_length
        self.run_columns = dict(run_columns)
        self.queue = BackgroundQueue(workers, queue_size)
        self.handoff_seconds = 0.0  # the generation's time in submit: copies started, waits for room
        self.drain_seconds = 0.0  # in finish: waiting for the queued records and the last blocks to be written
        self.close_seconds = 0.0  # in finish after the drain: the checks, the files closed
        self._files = {layer: _LayerFiles() for layer in self.layers}
        self._places = {layer: place for place, layer in enumerate(self.layers)}
        self._flush_busy_seconds = 0.0  # finish's threads writing the last blocks
        self._closed = False

    # -- from the generation's thread

    def submit(self, record: CallRecord) -> None:
        """Hand one call's record over (called by the capture, in the generation's thread)."""
        began = time.perf_counter()
        if record.layer not in self._places:
            raise ValueError(f"a record of layer {record.layer}, which the writer of {self.folder} does not write")
        copy = HostCopy(record_tensors(record, self.frame_seq_length))
        # The record without its device tensors: the writer needs only the call and layout.
        light = CallRecord(record.layer, record.call, record.layout, None)  # type: ignore[arg-type]
        # Keyed by the layer's place in the job, not its number: layers 0, 4, 8, ... would all
        # land on one of 4 threads.
        self.queue.submit(self._places[record.layer], self._consume, light, copy)
        self.handoff_seconds += time.perf_counter() - began

    # -- on the writer's threads

    def _consume(self, record: CallRecord, copy: HostCopy) -> None:
        files = self._files[record.layer]
        block = int(record.call.block)
        # Every procedure ends a model call's blocks with cache updates, and the call after
        # one begins at its oldest block still in work: every block before it is done.
        # (Self-Forcing: block b's cache pass, then block b + 1. Rolling Forcing: a window's
        # blocks interleave, and a window ends with its first block's cache update.)
        if files.last_pass == PASS_CACHE:
            self._flush(record.layer, files, before=block)
        files.last_pass = record.call.pass_
        # The frame statistics are copied out: rows kept until the block's row group would
        # otherwise hold views of (and keep alive) the whole pinned buffer, token values too.
        arrays = {
            name: values if name.startswith("token_") else values.copy() for name, values in copy.arrays().items()
        }
        pending = files.pending.setdefault(block, {kind: [] for kind in SCHEMAS})
        for kind, rows in record_rows(record, arrays).items():
            if rows is not None:
                pending[kind].append(rows)

    def _flush(self, layer: int, files: _LayerFiles, before: int | None = None) -> None:
        """Write one layer's pending blocks (those before block ``before``; None: all), in
        block order, each as one row group per file."""
        for block in sorted(b for b in files.pending if before is None or b < before):
            for kind, parts in files.pending.pop(block).items():
                if not parts:
                    continue
                rows = concat_rows(parts, KIND_COLUMNS[kind])
                if kind == "frames":
                    files.frames.append(rows)
                writer = files.writers.get(kind)
                if writer is None:
                    writer = files.writers[kind] = TableWriter(layer_file(self.folder, layer, kind), SCHEMAS[kind])
                writer.write(self._arrow_columns(rows))

    def _arrow_columns(self, rows: dict[str, np.ndarray]) -> dict[str, Any]:
        """The rows with ``pass`` and the constant run columns as Arrow arrays, built in
        Arrow (no pandas objects: the writers share the GIL with the generation)."""
        n = len(rows["layer"])
        columns: dict[str, Any] = dict(rows)
        columns["pass"] = _PASS_NAMES.take(pa.array(rows["pass"]))
        for name, value in self.run_columns.items():
            columns[name] = pa.repeat(value if isinstance(value, str) else int(value), n)
        return columns

    # -- at the end

    def finish(
        self,
        metadata: Mapping[str, Any],
        check: Callable[[int, pd.DataFrame], None] | None = None,
    ) -> tuple[list[str], dict[str, int]]:
        """Wait for the queued records, write the last blocks, check each layer's frame rows
        and close every file with ``metadata`` (plus ``layer``). Returns the files written
        (names in the folder) and their row counts. On any error nothing is left behind."""
        if self._closed:
            raise RuntimeError(f"the writer of {self.folder} has already finished")
        try:
            began = time.perf_counter()
            self.queue.close()  # every record consumed
            # The last block of every layer is still pending, and it holds the token
            # profiles, most of a video's bytes: the layers are written in parallel, a
            # thread per layer up to the cores this process may use (Parquet's compression
            # and the digests' hashing release the GIL). On four threads this took 2.3 s
            # after a 30-layer LongLive 2.0 generation on an H100's 16-core host.
            flushes = BackgroundQueue(min(len(self.layers), usable_cores()) if self.queue.workers else 0)
            for layer, place in self._places.items():
                flushes.submit(place, self._flush, layer, self._files[layer])
            flushes.close()
            self._flush_busy_seconds = flushes.busy_seconds
            self.drain_seconds = time.perf_counter() - began
            written, counts = [], {}
            for layer in self.layers:
                files = self._files[layer]
                if check is not None:
                    frames = concat_rows(files.frames, KIND_COLUMNS["frames"]) if files.frames else None
                    table = pd.DataFrame(frames) if frames is not None else pd.DataFrame(columns=KIND_COLUMNS["frames"])
                    if len(table):
                        table["pass"] = pd.Categorical.from_codes(table["pass"], categories=list(PASSES))
                    check(layer, table)
                for kind in SCHEMAS:
                    writer = files.writers.pop(kind, None)
                    if writer is None:
                        continue
                    writer.close({**metadata, "layer": layer})
                    written.append(writer.path.name)
                    counts[writer.path.name] = writer.rows
            self._closed = True
            self.close_seconds = time.perf_counter() - began - self.drain_seconds
            return written, counts
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Stop the threads and remove every file begun or written (the folder stays)."""
        self.queue.abandon()
        for layer, files in self._files.items():
            for writer in files.writers.values():
                writer.abort()
            files.writers.clear()
            for kind in SCHEMAS:
                Path(layer_file(self.folder, layer, kind)).unlink(missing_ok=True)
        self._closed = True

    @property
    def timings(self) -> dict[str, float]:
        """Seconds: the generation's time handing records over, and the writers' busy time
        (waits for copies included; ``drain_seconds`` and ``close_seconds`` are finish's)."""
        return {
            "handoff_seconds": self.handoff_seconds,
            "writer_busy_seconds": self.queue.busy_seconds + self._flush_busy_seconds,
        }
