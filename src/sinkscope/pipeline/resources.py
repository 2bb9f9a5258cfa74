"""What a job needs and what the machine has: devices, memory, GPU slots (no torch).

The Snakefile checks a config against these before any job runs, so that a job that
cannot run (``device: cuda`` without a GPU, a latent grid that needs 60 GB) never
reaches Snakemake's delete-then-run. CUDA is asked through the driver library
directly (``libcuda``), which takes milliseconds; importing torch would take seconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO

from sinkscope.errors import ConfigError
from sinkscope.model.config import WanConfig
from sinkscope.options import GenerationOptions, procedure_spec

GIB = 2**30
# Where extraction jobs on one machine take their GPU (see acquire_gpu).
GPU_LOCK_DIR = ".snakemake/sinkscope/gpu-locks"


# -- devices -------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _libcuda():
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    if lib.cuInit(0) != 0:  # no driver, or no device visible (CUDA_VISIBLE_DEVICES="")
        return None
    return lib


def cuda_device_count() -> int:
    """Visible CUDA devices (CUDA_VISIBLE_DEVICES honoured), 0 without a driver."""
    lib = _libcuda()
    if lib is None:
        return 0
    count = ctypes.c_int(0)
    return count.value if lib.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0


def cuda_memory_bytes(index: int = 0) -> int | None:
    """Total memory of visible CUDA device ``index``, or None when unknown."""
    lib = _libcuda()
    if lib is None:
        return None
    device, total = ctypes.c_int(0), ctypes.c_size_t(0)
    if lib.cuDeviceGet(ctypes.byref(device), index) != 0:
        return None
    if lib.cuDeviceTotalMem_v2(ctypes.byref(total), device) != 0:
        return None
    return int(total.value)


def host_memory_bytes() -> int:
    """Physical memory, or the cgroup limit when one is set (containers, Slurm jobs)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def resolve_device(option: str, *, local: bool = True) -> str:
    """The device a job computes on: 'cpu', 'cuda' (any free GPU) or 'cuda:N'.

    ``auto`` is CUDA when a GPU is visible here, else the CPU. For cluster executors
    (``local=False``) nothing here says what the compute nodes have: ``auto`` means
    CUDA there (the Slurm profile gives extraction jobs a GPU; set ``device: cpu`` for
    CPU-only clusters), and the job checks that it got one.
    """
    if option == "auto":
        if not local:
            return "cuda"
        return "cuda" if cuda_device_count() else "cpu"
    if option.startswith("cuda") and local:
        visible = cuda_device_count()
        index = int(option.partition(":")[2] or 0)
        if not visible:
            raise ConfigError(f"config key device: {option!r} was asked for, but no CUDA device is visible here")
        if index >= visible:
            raise ConfigError(
                f"config key device: {option!r} was asked for, but only {visible} CUDA device(s) are visible"
            )
    return option


def default_dtype(device: str, dtype: str) -> str:
    """A checkpoint's compute dtype on ``device``: auto is bfloat16 on CUDA, float32 elsewhere."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


# -- GPU slots on one machine ------------------------------------------------------------------


def visible_gpu_ids() -> list[str]:
    """Names of the visible GPUs as the machine knows them (CUDA_VISIBLE_DEVICES entries)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [item.strip() for item in listed.split(",") if item.strip()]
    return [str(i) for i in range(cuda_device_count())]


def acquire_gpu(lock_dir: str | Path = GPU_LOCK_DIR, poll_seconds: float = 2.0) -> tuple[int, IO | None]:
    """Take a visible GPU that no other sinkscope job on this machine holds.

    Snakemake's ``--resources gpu=2`` only counts GPUs; it assigns none, so two jobs
    would both land on GPU 0. Each job holds an exclusive lock file per GPU for its
    lifetime (the lock goes with the process, also when it is killed). Returns the
    visible index and the open lock file (keep it open). With one visible GPU (Slurm
    gives each job its own) no lock is needed.
    """
    ids = visible_gpu_ids()
    if len(ids) <= 1:
        return 0, None
    Path(lock_dir).mkdir(parents=True, exist_ok=True)
    while True:
        for index, gpu in enumerate(ids):
            handle = open(Path(lock_dir) / f"gpu{gpu}.lock", "a")  # noqa: SIM115 - held while the job runs
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            return index, handle
        time.sleep(poll_seconds)


# -- memory ------------------------------------------------------------------------------------


def parameter_count(config: WanConfig) -> int:
    """Parameters of the Wan2.1 transformer of ``config`` (tested against the model)."""
    d, f = config.dim, config.ffn_dim
    patch = math.prod(config.patch_size)
    attention = 4 * (d * d + d) + (2 * d if config.qk_norm else 0)
    block = 2 * attention + f * d + f + f * d + d + 6 * d + (2 * d if config.cross_attn_norm else 0)
    embed = (config.in_dim * patch * d + d) + (config.text_dim * d + d + d * d + d)
    embed += (config.freq_dim * d + d + d * d + d) + (d * 6 * d + 6 * d)
    head = d * patch * config.out_dim + patch * config.out_dim + 2 * d
    return embed + config.num_layers * block + head


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes an extraction job holds on its device at its peak (an upper estimate)."""

    weights: int
    kv_cache: int
    activations: int
    statistics: int
    # The Wan VAE of a procedure that decodes and re-encodes frames (krea_recompute), else 0.
    vae: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.statistics + self.vae

    def describe(self) -> str:
        parts = [
            ("weights", self.weights),
            ("KV cache", self.kv_cache),
            ("activations", self.activations),
            ("statistics", self.statistics),
        ] + ([("VAE", self.vae)] if self.vae else [])
        return ", ".join(f"{name} {value / GIB:.2f}" for name, value in parts)


# The Wan2.1 VAE (Wan2.1_VAE.pth: 127M float32 parameters, 508 MB), kept in float32.
WAN_VAE_PARAMETERS = 127_000_000
# Its decoder's and encoder's working set (the causal convolutions' cached frames at every
# level, live activations, the allocator's share): float32 values per video pixel. Measured:
# the re-encode raised a 21-frame 480x832 generation's peak by 8.1 GiB on an H100, of which
# weights and decoded frames are 0.7 (benchmarks/krea_speed.py, docs/krea-realtime.md);
# this gives 8.0 + 0.7.
VAE_DECODE_VALUES_PER_PIXEL = 96 * 4 * 14
# Of a device's memory, the share ``auto_layers_per_job`` plans to fill (the CUDA context,
# the allocator's fragmentation and the kernels' workspaces take the rest).
AUTO_MEMORY_SHARE = 0.9


def vae_reencode_bytes(config: WanConfig, options: GenerationOptions) -> int:
    """Device bytes of Krea's re-encode (where the procedure runs the VAE: ``krea_recompute``
    with ``recompute_context: reencode`` past two blocks): the VAE, the largest piece its
    streaming decode returns at once (float32 video: the first push, every latent up to the
    first re-encoded one; then a block's latents) and the decoder's working set; 0 for every
    other run."""
    if not procedure_spec(options.procedure).needs_vae(options):
        return 0
    height = (options.latent_height or config.latent_height) * 8
    width = (options.latent_width or config.latent_width) * 8
    block, context = options.frames_per_block, options.local_attn_frames - options.frames_per_block
    first_push = min(2 * block - context + 1, options.num_frames)  # latents 0 .. the block-2 context's oldest
    video = 3 * (1 + 4 * max(first_push - 1, block)) * height * width * 4
    return WAN_VAE_PARAMETERS * 4 + video + VAE_DECODE_VALUES_PER_PIXEL * height * width * 4


def estimate_job_memory(
    config: WanConfig,
    options: GenerationOptions,
    dtype: str,
    *,
    captured_layers: int,
    switch_frames: Sequence[int] = (),
) -> MemoryEstimate:
    """Peak device memory of one extraction job (weights, KV cache, one layer's activations).

    The widest call sets the activations: a block, or the re-cache call at a prompt
    switch (``switch_frames``), which runs up to a whole window of frames at once. The
    statistics: every call's frame statistics and the last block's key-token profiles
    (float32, before encoding) of each captured layer, and the CPU reference's score chunk."""
    size = 4 if dtype == "float32" else 2
    fsl = config.frame_seq_length(options.latent_height, options.latent_width)
    block = options.largest_call_frames(switch_frames)
    kv_cache = config.num_layers * 2 * (options.kv_cache_frames * fsl + config.text_len) * config.dim * size
    tokens = block * fsl
    # Hidden states, q/k/v, attention output, the FFN's hidden layer, fp32 norm copies.
    activations = tokens * (12 * config.dim + 2 * config.ffn_dim) * 4
    # Per call and captured layer: frame statistics, plus the CPU reference's score chunk.
    frames = options.cache_frames
    statistics = captured_layers * options.calls(switch_frames) * config.num_heads * block * frames * 4 * 4 + 2**28
    # The last block's calls (its steps and one cache / recompute pass) with token profiles.
    last_calls = len(options.block_steps(len(options.block_sizes()) - 1)) + 1
    statistics += captured_layers * last_calls * config.num_heads * options.kv_cache_frames * fsl * 2 * 4
    return MemoryEstimate(
        parameter_count(config) * size, kv_cache, activations, statistics, vae_reencode_bytes(config, options)
    )


def auto_layers_per_job(
    config: WanConfig,
    options: GenerationOptions,
    dtype: str,
    *,
    layers: int,
    memory_bytes: int | None,
    switch_frames: Sequence[int] = (),
) -> int:
    """``layers_per_job: auto`` on a GPU: the most of ``layers`` one job captures within
    ``AUTO_MEMORY_SHARE`` of the device's ``memory_bytes`` (all of them when unknown), at
    least 1 (a job that does not fit with one layer is refused by the memory check)."""
    if memory_bytes is None:
        return max(1, layers)
    budget = memory_bytes * AUTO_MEMORY_SHARE
    fits = [
        n
        for n in range(1, layers + 1)
        if estimate_job_memory(config, options, dtype, captured_layers=n, switch_frames=switch_frames).total <= budget
    ]
    return max(fits, default=1)


def device_memory_bytes(device: str) -> int | None:
    """Memory of the device a job will use, as seen from here (None when unknown)."""
    if device.startswith("cuda"):
        return cuda_memory_bytes(int(device.partition(":")[2] or 0))
    return host_memory_bytes()
