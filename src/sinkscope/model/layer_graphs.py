"""CUDA graphs over a KV-cache call's layers: the work between attention cores, captured
once and replayed (``KernelSettings.cuda_graphs``, config ``capture.cuda_graphs``, default on).

Why: a layer's work around its attention core is some 20 kernel launches from Python, and
where the host issues them slower than the GPU runs them (a slow or shared host: the lent
H200s' GPU sat idle 3-39% of the 1.3B's 21-frame generation), the GPU waits. A graph issues
a piece's launches in one. Measured (docs/performance.md): the same speed on a fast idle
host, 1.12x on a slower one, 2x with twice as many busy processes as cores.

What is captured and what stays eager. A call's layers are cut at their attention cores.
Piece 0 is layer 0's attention inputs (``WanAttentionBlock.step_functions[0]``: norm1, the
q/k/v projections, their norms, RoPE); piece i, for 1 <= i < N, is layer i-1's attention
outputs (output projection and gate, cross-attention, FFN) then layer i's inputs; piece N
is the last layer's outputs. The attention core stays eager, as in a call without graphs:
the cache policy stores the block's keys and hands back the keys the softmax sees, the
observers and edits see the call, the key split is planned from its lengths. So does the
rest of the call (patch and time embeddings, the RoPE table, the head): a few launches.

When. A call's pieces are captured the second time their signature is seen (the first
call runs eagerly: it builds Triton's and Inductor's kernels for those shapes and warms
cuBLAS) and replayed from then on. The signature is what the captured launches depend on
beyond the values of the tensors they read: shapes and dtypes, the kernel settings, the
step functions (compiled or not), and where every layer's parameters live. The call's
inputs are copied into the tensors the graphs read: the residual stream entering layer 0,
e0, the RoPE table, each attention output in turn, and the text's cross-attention K/V
when they change (a prompt switch, a new video). A replay runs the eager call's kernels on
the same data, so the video is the same to the bit (a GPU test checks it).

Where graphs do not apply the call runs eagerly, as before: a full forward (no cache
policy), a frame mask, a call whose policy wants the keys before RoPE, autograd, and
compiling. Memory: each captured signature keeps its pieces' outputs (the residual stream
and q, k, v of every layer: 1.7 GiB for the 1.3B's 3-frame blocks, 4.8 GiB for LongLive
2.0's chunks of 8); at most ``LayerGraphs.MAX_SIGNATURES`` signatures are kept, and a
signature dropped for a newer one runs eagerly from then on (calls that cycle through more
shapes would otherwise capture on every call). ``capture.cuda_graphs: false`` turns them off.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from sinkscope.attention.settings import KernelSettings

Pair = tuple[torch.Tensor, torch.Tensor]
Outputs = tuple[torch.Tensor, ...]
# The cache policy of a call, as the attention cores take it (``sinkscope.model.wan.CachePolicyCalls``;
# named loosely here: the model module imports this one).
CachePolicy = Any


class GraphedModel(Protocol):
    """What the graphs read of a model (``sinkscope.model.wan.WanModel``): its layers, each with
    ``step_functions`` and ``self_attn.core``, and its kernel settings."""

    blocks: nn.ModuleList
    kernels: KernelSettings


class GraphBackend(Protocol):
    """How pieces are captured and replayed: ``CudaGraphs``, or ``RerunPieces`` (CPU tests)."""

    def applies_to(self, x: torch.Tensor) -> bool: ...

    def new_pool(self, device: torch.device) -> None: ...

    def warm_up(self, work: Callable[[], Outputs]) -> None: ...

    def capture(self, work: Callable[[], Outputs]) -> tuple[Callable[[], None], Outputs]: ...


class CudaGraphs:
    """CUDA graphs, captured on a side stream of their device, one memory pool a signature.

    ``torch.cuda.graph`` is not used: it synchronizes, collects garbage and empties the
    allocator's cache at every capture, N + 1 times a signature.
    """

    def __init__(self) -> None:
        self.streams: dict[torch.device, torch.cuda.Stream] = {}
        self.device: torch.device | None = None
        self.pool = None

    def applies_to(self, x: torch.Tensor) -> bool:
        return x.is_cuda

    def new_pool(self, device: torch.device) -> None:
        """A signature's graphs share a pool of their own (replayed in the order captured)."""
        self.device = device
        if device not in self.streams:
            self.streams[device] = torch.cuda.Stream(device)
        self.pool = torch.cuda.graph_pool_handle()

    def warm_up(self, work: Callable[[], Outputs]) -> None:
        # cuBLAS's workspace for the capture stream is made here, not during a capture.
        stream = self.streams[self.device]
        with torch.cuda.device(self.device):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                work()
            torch.cuda.current_stream().wait_stream(stream)

    def capture(self, work: Callable[[], Outputs]) -> tuple[Callable[[], None], Outputs]:
        graph, stream = torch.cuda.CUDAGraph(), self.streams[self.device]
        with torch.cuda.device(self.device):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                graph.capture_begin(pool=self.pool)
                try:
                    outputs = work()
                finally:
                    graph.capture_end()
            torch.cuda.current_stream().wait_stream(stream)
        return graph.replay, outputs


class RerunPieces:
    """A graph's data flow without CUDA: a replay runs the piece again on the same input
    tensors and copies its results into the outputs of the first run. The CPU tests drive
    the capture, the copies into static inputs and the replay order with it."""

    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0

    def applies_to(self, x: torch.Tensor) -> bool:
        return True

    def new_pool(self, device: torch.device) -> None:
        pass

    def warm_up(self, work: Callable[[], Outputs]) -> None:
        work()

    def capture(self, work: Callable[[], Outputs]) -> tuple[Callable[[], None], Outputs]:
        self.captures += 1
        outputs = tuple(t.clone() for t in work())

        def replay() -> None:
            self.replays += 1
            for static, fresh in zip(outputs, work()):
                static.copy_(fresh)

        return replay, outputs


class GraphedLayers:
    """One signature's captured pieces and the static tensors they read and write."""

    def __init__(
        self,
        model: GraphedModel,
        x: torch.Tensor,
        e0: torch.Tensor,
        rope: torch.Tensor,
        cross: Sequence[Pair],
        backend: GraphBackend,
    ) -> None:
        kernels = model.kernels
        self.blocks = list(model.blocks)
        # The inputs the pieces read, in place; run() copies each call's values in.
        self.x, self.e0, self.rope = x.clone(), e0.clone(), rope.clone()
        # Each layer's attention output, in turn; contiguous, as the attention cores return it
        # (x itself may be a transposed view of the patch embedding).
        self.attention = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self.cross = [(k.clone(), v.clone()) for k, v in cross]
        self.cross_source = list(cross)

        def inputs(index: int, residual: torch.Tensor) -> Outputs:
            before = self.blocks[index].step_functions[0]
            return before(self.blocks[index], residual, self.e0, self.rope, True, kernels.fused_norms)

        def piece(index: int, residual: torch.Tensor) -> Callable[[], Outputs]:
            """Piece ``index`` (module docstring) of a residual stream entering layer index-1."""
            if index == 0:
                return lambda: inputs(0, residual)

            def work() -> Outputs:
                block = self.blocks[index - 1]
                after = block.step_functions[1]
                k, v = self.cross[index - 1]
                out = after(block, residual, self.attention, self.e0, k, v, kernels.fused_gelu, kernels.fused_norms)
                return (out, *inputs(index, out)) if index < len(self.blocks) else (out,)

            return work

        backend.new_pool(x.device)
        backend.warm_up(piece(0, self.x))
        backend.warm_up(piece(1, self.x))
        self.replays: list[Callable[[], None]] = []
        self.outputs: list[Outputs] = []
        residual = self.x
        for index in range(len(self.blocks) + 1):
            replay, outputs = backend.capture(piece(index, residual))
            self.replays.append(replay)
            self.outputs.append(outputs)
            residual = outputs[0] if index > 0 else residual

    def run(
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        rope: torch.Tensor,
        cross: Sequence[Pair],
        cache_policy: CachePolicy,
        kernels: KernelSettings,
        cache_only: bool,
    ) -> torch.Tensor | None:
        """The layers of one KV-cache call (``WanModel.forward``'s loop): the residual stream
        leaving the last layer, or None for a ``cache_only`` call (the last layer stops once
        its keys are stored)."""
        self.x.copy_(x)
        self.e0.copy_(e0)
        self.rope.copy_(rope)
        if any(new is not old for new, old in zip(cross, self.cross_source)):
            for (k, v), (new_k, new_v) in zip(self.cross, cross):
                k.copy_(new_k)
                v.copy_(new_v)
            self.cross_source = list(cross)
        last = len(self.blocks) - 1
        for index, block in enumerate(self.blocks):
            self.replays[index]()
            q, k, v = self.outputs[index][-3:]
            attention = block.self_attn.core(
                q, k, v, cache_policy, kernels=kernels, keys_only=cache_only and index == last
            )
            if attention is None:
                return None
            self.attention.copy_(attention)
        self.replays[-1]()
        return self.outputs[-1][0]


class LayerGraphs:
    """A model's captured layer graphs, by signature (module docstring); ``WanModel.layer_graphs``.

    Not part of the state dict; ``backend`` is ``CudaGraphs`` unless a test gives another.
    """

    MAX_SIGNATURES = 2

    def __init__(self, backend: GraphBackend | None = None) -> None:
        self.backend: GraphBackend = backend if backend is not None else CudaGraphs()
        self.graphed: OrderedDict[tuple, GraphedLayers] = OrderedDict()
        self.seen: OrderedDict[tuple, int] = OrderedDict()
        # Signatures whose graphs were dropped for newer ones: they run eagerly from then on,
        # so that calls cycling through more shapes than are kept do not capture every call.
        self.dropped: OrderedDict[tuple, None] = OrderedDict()

    def clear(self) -> None:
        """Drop every captured graph (and the memory its outputs hold) and what was seen."""
        self.graphed.clear()
        self.seen.clear()
        self.dropped.clear()

    def __deepcopy__(self, memo: dict) -> LayerGraphs:
        # Graphs belong to the parameters they were captured on: a copy starts with none.
        return LayerGraphs(self.backend if isinstance(self.backend, RerunPieces) else None)

    def applies(
        self,
        x: torch.Tensor,
        cache_policy: CachePolicy | None,
        attn_mask: torch.Tensor | None,
        kernels: KernelSettings,
    ) -> bool:
        """Whether this call's layers may replay graphs (module docstring)."""
        return (
            kernels.cuda_graphs
            and cache_policy is not None
            and attn_mask is None
            and not cache_policy.wants_raw_keys
            and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and self.backend.applies_to(x)
        )

    def for_call(
        self, model: GraphedModel, x: torch.Tensor, e0: torch.Tensor, rope: torch.Tensor, cross: Sequence[Pair]
    ) -> GraphedLayers | None:
        """This call's graphs: captured now on its signature's second sighting, None on its
        first (the call runs eagerly)."""
        key = signature(model, x, e0, rope, cross)
        graphed = self.graphed.get(key)
        if graphed is not None:
            self.graphed.move_to_end(key)
            return graphed
        if key in self.dropped:
            return None
        self.seen[key] = self.seen.pop(key, 0) + 1
        while len(self.seen) > 4 * self.MAX_SIGNATURES:
            self.seen.popitem(last=False)
        if self.seen[key] < 2:
            return None
        while len(self.graphed) >= self.MAX_SIGNATURES:
            self.dropped[self.graphed.popitem(last=False)[0]] = None
        while len(self.dropped) > 16 * self.MAX_SIGNATURES:
            self.dropped.popitem(last=False)
        graphed = self.graphed[key] = GraphedLayers(model, x, e0, rope, cross, self.backend)
        return graphed


def signature(
    model: GraphedModel, x: torch.Tensor, e0: torch.Tensor, rope: torch.Tensor, cross: Sequence[Pair]
) -> tuple:
    """What a call's captured launches depend on beyond the values they read (module docstring)."""
    tensors = (x, e0, rope, *cross[0])
    return (
        tuple((tuple(t.shape), t.dtype, t.device) for t in tensors),
        model.kernels,
        tuple((id(block.step_functions[0]), id(block.step_functions[1])) for block in model.blocks),
        tuple(t.data_ptr() for block in model.blocks for t in (*block.parameters(), *block.buffers())),
    )
