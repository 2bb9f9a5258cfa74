"""Which kernels the model's own computation runs (config ``capture.kernels``), as a value.

A :class:`KernelSettings` is a field of the model (``WanModel.kernels``) that its forward
hands to every layer, so a call computes what its model was given and nothing that an
earlier job in the process set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sinkscope.attention.flash4 import check_attention_kernel

KERNEL_CHOICES = ("fast", "reference")


@dataclass(frozen=True)
class KernelSettings:
    """``key_split``: a cached attention call whose query tiles would leave the GPU's last
    wave part-empty splits its keys and merges the parts (``sinkscope.attention.split``);
    ``fused_gelu``: the FFN applies its GELU in the matrix product's epilogue
    (``sinkscope.model.wan.feed_forward``); ``fused_norms``: an eager block's norms, modulations,
    gates and RoPE run as four Triton kernels (``sinkscope.model.block_kernels``). Each acts on
    CUDA in fp16 / bf16 only. ``cuda_graphs`` (config ``capture.cuda_graphs``, apart from the
    named settings: it changes how the work is issued, not what is computed): a KV-cache call's
    layers replay CUDA graphs of the work between their attention cores
    (``sinkscope.model.layer_graphs``; CUDA only). ``attention_kernel`` (config
    ``capture.attention_kernel``, also apart from the named settings): ``auto``, ``cudnn`` or
    ``flash4``, the kernel of the model's attention calls (``sinkscope.attention.flash4``)."""

    key_split: bool = True
    fused_gelu: bool = True
    fused_norms: bool = True
    cuda_graphs: bool = True
    attention_kernel: str = "auto"

    def __post_init__(self) -> None:
        check_attention_kernel(self.attention_kernel)

    @classmethod
    def named(cls, name: str) -> KernelSettings:
        """``fast`` (all on) or ``reference`` (all off: Self-Forcing's own kernels); CUDA graphs
        on and the attention kernel ``auto`` in both."""
        if name not in KERNEL_CHOICES:
            raise ValueError(f"capture.kernels {name!r} is not one of {', '.join(KERNEL_CHOICES)}")
        fast = name == "fast"
        return cls(key_split=fast, fused_gelu=fast, fused_norms=fast)

    @classmethod
    def from_capture(cls, capture: Mapping[str, Any]) -> KernelSettings:
        """A job's settings from its ``capture`` params: ``kernels`` (default fast),
        ``cuda_graphs`` (default true) and ``attention_kernel`` (default auto)."""
        return dataclasses.replace(
            cls.named(capture.get("kernels", "fast")),
            cuda_graphs=capture.get("cuda_graphs", True),
            attention_kernel=capture.get("attention_kernel", "auto"),
        )

    @property
    def attention_call(self) -> dict[str, Any]:
        """The keyword arguments of the model's attention calls (``cached_attention``,
        ``balanced_attention``, ``edited_attention``): its key split and its kernel."""
        return {"split": self.key_split, "kernel": self.attention_kernel}

    @property
    def name(self) -> str:
        """The config's name of these settings (``cuda_graphs`` and ``attention_kernel`` aside),
        or ``custom`` for a mix."""
        flags = {self.key_split, self.fused_gelu, self.fused_norms}
        if len(flags) == 1:
            return KERNEL_CHOICES[0] if self.key_split else KERNEL_CHOICES[1]
        return "custom"


FAST_KERNELS = KernelSettings()
