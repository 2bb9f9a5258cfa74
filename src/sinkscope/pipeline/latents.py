"""A run's final latents, kept in its extraction folder so that pairing runs (the variant
effects, decoding the video) needs no GPU and no new generation.

``latents.safetensors``: one tensor ``latents``, float32, [C, F, H, W] (channels, latent
frames, height, width), its sha256 in the header's metadata. The sha256 is over the
tensor's bytes, the same bytes the extraction's ``latents_sha256`` (in every layer file's
metadata) digests, so the file and the rows name the same video. Written with a fixed
header layout (as prompt embeddings are): the same latents give the same bytes. Read
with numpy only (no torch).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np

from sinkscope.errors import DamagedFileError
from sinkscope.io import atomic_path

LATENTS_FILE = "latents.safetensors"
LATENTS_KEY = "latents"


def latents_sha256(latents: np.ndarray) -> str:
    """sha256 of the latents' float32 bytes in C order (the extraction's ``latents_sha256``)."""
    return hashlib.sha256(np.ascontiguousarray(latents, dtype=np.float32).tobytes()).hexdigest()


def write_latents(folder: str | Path, latents: np.ndarray) -> str:
    """Write ``latents`` ([C, F, H, W]) as ``folder/latents.safetensors``; returns its name
    in the folder."""
    array = np.ascontiguousarray(latents, dtype=np.float32)
    if array.ndim != 4:
        raise ValueError(f"latents are [C, F, H, W]; got shape {list(array.shape)}")
    data = array.tobytes()
    header = {
        "__metadata__": {"latents_sha256": latents_sha256(array), "layout": "C,F,H,W"},
        LATENTS_KEY: {"dtype": "F32", "shape": list(array.shape), "data_offsets": [0, len(data)]},
    }
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with atomic_path(Path(folder) / LATENTS_FILE) as tmp:
        tmp.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return LATENTS_FILE


def read_latents(path: str | Path, expected_sha256: str | None = None) -> np.ndarray:
    """The latents [C, F, H, W] float32 of a file written by ``write_latents`` (or of the
    extraction folder holding it), its bytes checked against the digest in its header
    and, when given, ``expected_sha256`` (the rows' ``latents_sha256``). A problem names
    the folder (the extraction job's output, rebuilt whole)."""
    path = Path(path)
    if path.is_dir():
        path = path / LATENTS_FILE
    if not path.is_file():
        raise DamagedFileError(
            path.parent,
            f"has no {LATENTS_FILE} (extracted by an older sinkscope: rerun its "
            "extraction, e.g. snakemake --forcerun extract_attention)",
        )
    raw = path.read_bytes()
    try:
        (length,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + length])
        entry = header[LATENTS_KEY]
        start, end = entry["data_offsets"]
        shape = [int(x) for x in entry["shape"]]
        if entry["dtype"] != "F32" or len(shape) != 4:
            raise ValueError(entry["dtype"])
    except (struct.error, ValueError, TypeError, KeyError):
        raise DamagedFileError(path.parent, f"{path.name} is damaged (its safetensors header)") from None
    body = raw[8 + length :]
    if start != 0 or len(body) != end or end != 4 * int(np.prod(shape)):
        raise DamagedFileError(
            path.parent, f"{path.name} is damaged (it holds {len(body)} bytes of data, its header says {end})"
        )
    digest = hashlib.sha256(body).hexdigest()
    if digest != (header.get("__metadata__") or {}).get("latents_sha256"):
        raise DamagedFileError(
            path.parent, f"{path.name} is damaged (its bytes do not match the digest written with them)"
        )
    if expected_sha256 is not None and digest != expected_sha256:
        raise DamagedFileError(
            path.parent, f"{path.name} holds other latents than the folder's rows name (latents_sha256)"
        )
    return np.frombuffer(body, dtype="<f4").reshape(shape).copy()
