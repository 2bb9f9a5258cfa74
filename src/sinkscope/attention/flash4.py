"""FlashAttention-4's Hopper / Blackwell forward as the model's attention kernel, where installed.

``flash-attn-4`` (``flash_attn.cute``: kernels written in NVIDIA's CuTe DSL, JIT-compiled on
first use and kept in its on-disk cache, which this module turns on) is an optional
dependency (``pip install 'sinkscope[flash4]'``). On an H200 its forward runs the 1.3B's last
block 1.16-1.21x and LongLive 2.0's last chunk 1.09x as fast as cuDNN's, the 1.3B's 21-frame
generation 1.08-1.09x (docs/performance.md, "FlashAttention-4 as the attention kernel"), and
it returns the log-sum-exp that the key split's merge and the ``exact`` capture route need.

Which kernel a call runs (``KernelSettings.attention_kernel``, config
``capture.attention_kernel``):

- ``auto``: FlashAttention-4 where ``flash4_unsupported`` finds no reason against it (it
  imports and its first call runs, a CUDA device of compute capability 9.x or 10.x, fp16 /
  bf16, equal head sizes, multiples of 8 up to 256), else cuDNN;
- ``cudnn``: cuDNN's attention (PyTorch's flash attention where cuDNN is missing), as before
  FlashAttention-4 existed here; pin it to reproduce earlier videos to the bit;
- ``flash4``: FlashAttention-4, and a one-line error where it does not apply.

The two kernels round differently, so a video depends on which one ran (the relative L2
difference of the final latents of a 21-frame generation, random weights: about 1%); the
manifest records the kernel of each job (``attention_kernel``). The forward is deterministic
(no split over keys on SM90), so one kernel gives one video.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from functools import lru_cache

import torch

from sinkscope.errors import SinkscopeError

ATTENTION_KERNELS = ("auto", "cudnn", "flash4")
# Compute capabilities FlashAttention-4's forward is written for: Hopper (9.x), Blackwell (10.x).
FLASH4_MAJORS = (9, 10)
FLASH4_MAX_HEAD_DIM = 256
# Its kernels load rows of the head dimension in 16-byte pieces (8 fp16 / bf16 values).
FLASH4_HEAD_DIM_MULTIPLE = 8
log = logging.getLogger("sinkscope")


def check_attention_kernel(kernel: str) -> str:
    if kernel not in ATTENTION_KERNELS:
        raise SinkscopeError(f"capture.attention_kernel {kernel!r} is not one of {', '.join(ATTENTION_KERNELS)}")
    return kernel


@lru_cache(maxsize=1)
def _import_flash4() -> tuple[Callable | None, str]:
    """(FlashAttention-4's forward function, "") or (None, why it does not import)."""
    # FlashAttention-4 compiles its kernels at a process's first call (1.9 s on an H200); its own
    # on-disk cache (file-locked, keyed by its source files) lets every later job load them.
    # Read when flash_attn.cute is first imported; FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=0 turns it off.
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    try:
        from flash_attn.cute.interface import _flash_attn_fwd
    except ImportError:
        return None, "flash-attn-4 is not installed (pip install 'sinkscope[flash4]')"
    except Exception as error:  # noqa: BLE001 - a broken install (CUDA libraries, a stale flash_attn): say so
        return None, f"flash-attn-4 does not import: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
    # The CuTe DSL warns at every compile that FlashAttention-4's own optional argument is
    # not a JIT argument (flash-attn-4 4.0.0b36): harmless, and noise in every job's log.
    warnings.filterwarnings("ignore", message="Argument aux_data", category=UserWarning)
    return _flash_attn_fwd, ""


def flash4_forward() -> Callable | None:
    """FlashAttention-4's forward function, or None where ``flash-attn-4`` does not import
    (imported once: the CuTe DSL takes about a second to load)."""
    return _import_flash4()[0]


@lru_cache(maxsize=32)
def _first_call_fails(index: int, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why a first small FlashAttention-4 call fails on this device, dtype and head size (its
    JIT compile, a driver too old for CUDA 13), or None where it runs. Once per process and
    kind of call: the compile it does is the one the model's first call would do."""
    try:
        with torch.cuda.device(index):
            probe = torch.zeros(1, 128, 1, head_dim, device="cuda", dtype=dtype)
            flash4_forward()(probe, probe, probe, softmax_scale=head_dim**-0.5, return_lse=True)
            torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - any failure means: do not use it
        return f"its first call failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
    return None


@lru_cache(maxsize=16)
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def flash4_unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why FlashAttention-4 can not run this call (q, k, v [N, H, L, D]), or None where it can."""
    if not q.is_cuda:
        return f"it runs on CUDA, not {q.device.type}"
    if q.dtype not in (torch.float16, torch.bfloat16) or not q.dtype == k.dtype == v.dtype:
        return f"it computes in fp16 / bf16 alike, not {q.dtype}, {k.dtype}, {v.dtype}"
    dim = q.shape[-1]
    if not (dim == k.shape[-1] == v.shape[-1] <= FLASH4_MAX_HEAD_DIM and dim % FLASH4_HEAD_DIM_MULTIPLE == 0):
        return (
            f"head sizes {dim}, {k.shape[-1]}, {v.shape[-1]} are not equal multiples of "
            f"{FLASH4_HEAD_DIM_MULTIPLE} up to {FLASH4_MAX_HEAD_DIM}"
        )
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    major = _capability_major(index)
    if major not in FLASH4_MAJORS:
        return f"it is written for compute capability 9.x and 10.x, not {major}.x"
    forward, why = _import_flash4()
    if forward is None:
        return why
    return _first_call_fails(index, q.dtype, dim)


def uses_flash4(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a call with ``kernel`` (``ATTENTION_KERNELS``) runs FlashAttention-4; raises
    where ``flash4`` was asked for and can not run."""
    if kernel == "cudnn":
        return False
    why = flash4_unsupported(q, k, v)
    if kernel == "flash4" and why is not None:
        raise SinkscopeError(f"capture.attention_kernel flash4 can not run here: {why}")
    if why is not None and why.startswith("its first call failed"):
        _say_once(f"capture.attention_kernel auto: FlashAttention-4 is installed but {why}; cuDNN runs instead")
    return why is None


@lru_cache(maxsize=8)
def _say_once(message: str) -> None:
    log.warning(message)


def flash4_attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [N, H, Lq, D] (a view of [N, Lq, H, D]), natural log-sum-exp [N, H, Lq] fp32)
    of q, k, v [N, H, L, D] views of the model's [N, L, H, D] tensors, FlashAttention-4's
    forward. Queries shared by a zero batch stride (a key split's parts) are read in place.
    FlashAttention-4 launches on the current device, so a call on another one switches to it."""
    args = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    if q.device.index is not None and q.device.index != torch.cuda.current_device():
        with torch.cuda.device(q.device):
            out, lse = flash4_forward()(*args, softmax_scale=scale, return_lse=True)[:2]
    else:
        out, lse = flash4_forward()(*args, softmax_scale=scale, return_lse=True)[:2]
    return out.transpose(1, 2), lse


def resolved_attention_kernel(kernel: str, device: torch.device | str, dtype: torch.dtype, head_dim: int) -> str:
    """The kernel a call of this device, dtype and head size runs under ``kernel``: ``flash4``
    or ``cudnn`` on CUDA in fp16 / bf16, ``sdpa`` elsewhere (PyTorch's own); for manifests."""
    device = torch.device(device)
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        if check_attention_kernel(kernel) == "flash4":
            raise SinkscopeError(
                "capture.attention_kernel flash4 can not run here: "
                f"it runs on CUDA in fp16 / bf16, not {device.type} {dtype}"
            )
        return "sdpa"
    probe = torch.empty(1, 1, 1, head_dim, device=device, dtype=dtype)
    return "flash4" if uses_flash4(check_attention_kernel(kernel), probe, probe, probe) else "cudnn"


__all__ = [
    "ATTENTION_KERNELS",
    "check_attention_kernel",
    "flash4_attention_with_lse",
    "flash4_forward",
    "flash4_unsupported",
    "resolved_attention_kernel",
    "uses_flash4",
]
