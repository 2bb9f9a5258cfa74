"""CUDA graphs over a KV-cache call's layers (``sinkscope.model.layer_graphs``): on the CPU,
their data flow (``RerunPieces``: static inputs, capture on the second sighting, replay order,
signatures) against the eager generation to the bit; on a GPU (``-m gpu``), real graphs."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from sinkscope.attention.settings import KernelSettings
from sinkscope.model import WanConfig, build_model
from sinkscope.model.layer_graphs import LayerGraphs, RerunPieces
from sinkscope.model.policies import new_policy

ROOT = Path(__file__).resolve().parent.parent
TINY = WanConfig(
    dim=48, ffn_dim=64, num_heads=4, num_layers=3, text_dim=16, text_len=8, freq_dim=16, latent_height=4, latent_width=6
)


def generation_hashes():
    spec = importlib.util.spec_from_file_location("generation_hashes", ROOT / "benchmarks" / "generation_hashes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# One case of each procedure and each way a call's inputs change: a sink policy, a prompt
# switch with LongLive's re-cache (new cross-attention K/V), Causal Forcing's first block of
# its own size (two signatures), an intervention's edited attention, Rolling Forcing's
# window (raw keys in its first calls only), Krea's recompute, LongLive 2.0's scene cuts.
CASES = (
    "self_forcing/sink",
    "switch/sink/re_cache=True",
    "causal_forcing/independent-first-frame",
    "edits/sink/logit_bias",
    "rolling_forcing",
    "krea_recompute/reencode",
    "longlive2/shots/plain",
)


@pytest.fixture(scope="module")
def hashes_module():
    return generation_hashes()


@pytest.mark.parametrize("name", CASES)
def test_replayed_layers_give_the_eager_video_and_tables_to_the_bit(hashes_module, name, capsys):
    case = hashes_module.CASES[name]
    eager = hashes_module.run_case(case)
    replayed = hashes_module.run_case(case, graphs=True)
    assert replayed == eager  # latents, every captured table, the calls, the options
    pieces = int(capsys.readouterr().out.split()[0])
    assert pieces > 0  # the graphs' path ran


def tiny_calls(model, calls: int, frames: int = 2, policy=None, start: int = 0):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, TINY.in_dim, frames, 4, 6, generator=g)
    context = torch.randn(1, 5, TINY.text_dim, generator=g)
    policy = policy or new_policy(
        model, "global", frame_seq_length=6, num_frames=8, local_attn_frames=-1, sink_frames=0
    )
    outputs = []
    with torch.no_grad():
        for step in range(calls):
            outputs.append(model(x, 900.0 - 100 * step, context, cache_policy=policy, start_frame=start))
    return outputs, policy


def test_a_signature_is_captured_on_its_second_call_and_replayed_after():
    model = build_model(TINY, seed=3)
    backend = RerunPieces()
    model.layer_graphs = LayerGraphs(backend)
    tiny_calls(model, 1)
    assert backend.captures == 0 and not model.layer_graphs.graphed  # the first call is eager
    tiny_calls(model, 3)
    # One piece more than layers, captured once; replayed on the second and third calls.
    assert backend.captures == TINY.num_layers + 1
    assert backend.replays == 3 * (TINY.num_layers + 1)
    assert len(model.layer_graphs.graphed) == 1


def test_a_cache_only_call_replays_up_to_the_last_layers_keys():
    model = build_model(TINY, seed=3)
    model.layer_graphs = LayerGraphs(RerunPieces())
    eager = build_model(TINY, seed=3)
    eager.kernels = KernelSettings(cuda_graphs=False)
    for m in (model, eager):
        _, policy = tiny_calls(m, 2)
        with torch.no_grad():
            assert m(torch.zeros(1, TINY.in_dim, 2, 4, 6), 0.0, cache_policy=policy, cache_only=True) is None
        m.cached = policy.cache.keys(TINY.num_layers - 1)
    assert model.layer_graphs.backend.replays == (TINY.num_layers + 1) + TINY.num_layers
    assert all(torch.equal(a, b) for a, b in zip(model.cached, eager.cached))


def test_new_parameters_shapes_or_settings_are_a_new_signature():
    model = build_model(TINY, seed=3)
    backend = RerunPieces()
    model.layer_graphs = LayerGraphs(backend)
    tiny_calls(model, 2)
    assert backend.captures == TINY.num_layers + 1
    # A parameter replaced (a LoRA merged into a copy, a dtype change) is read from elsewhere:
    # graphs captured on the old one would read the old memory.
    ffn = model.blocks[1].ffn[0]
    ffn.weight = nn.Parameter(ffn.weight.detach().clone(), requires_grad=False)
    tiny_calls(model, 1)
    assert backend.captures == TINY.num_layers + 1  # seen once: eager
    tiny_calls(model, 1)
    assert backend.captures == 2 * (TINY.num_layers + 1)
    model.kernels = KernelSettings(fused_gelu=False)
    tiny_calls(model, 2, frames=1)  # other settings and shapes: a third signature
    assert len(model.layer_graphs.graphed) == LayerGraphs.MAX_SIGNATURES  # the oldest dropped
    assert backend.captures == 3 * (TINY.num_layers + 1)
    model.kernels = KernelSettings(key_split=False)
    tiny_calls(model, 2, frames=1)  # a fourth: the second one dropped
    assert backend.captures == 4 * (TINY.num_layers + 1)
    # A dropped signature runs eagerly from then on: shapes that cycle do not capture every call.
    model.kernels = KernelSettings()
    replays = backend.replays
    tiny_calls(model, 3)
    assert backend.captures == 4 * (TINY.num_layers + 1) and backend.replays == replays
    model.layer_graphs.clear()
    assert not model.layer_graphs.graphed and not model.layer_graphs.dropped


def test_parameters_changed_in_place_are_read_by_the_replay():
    model = build_model(TINY, seed=3)
    model.layer_graphs = LayerGraphs(RerunPieces())
    reference = build_model(TINY, seed=4)
    reference.kernels = KernelSettings(cuda_graphs=False)
    tiny_calls(model, 2)
    model.load_state_dict(reference.state_dict())  # copies into the same tensors
    replayed, _ = tiny_calls(model, 3)
    eager, _ = tiny_calls(reference, 3)
    assert all(torch.equal(a, b) for a, b in zip(replayed, eager))


def test_graphs_apply_to_kv_cache_inference_calls_only(monkeypatch):
    graphs = LayerGraphs()  # CUDA graphs: never on a CPU tensor
    cuda = SimpleNamespace(is_cuda=True)
    policy = SimpleNamespace(wants_raw_keys=False)
    on = KernelSettings()
    with torch.no_grad():
        assert graphs.applies(cuda, policy, None, on)
        assert not graphs.applies(torch.zeros(1), policy, None, on)
        assert not graphs.applies(cuda, None, None, on)  # the full forward
        assert not graphs.applies(cuda, policy, torch.ones(1, dtype=torch.bool), on)  # a frame mask
        assert not graphs.applies(cuda, SimpleNamespace(wants_raw_keys=True), None, on)
        assert not graphs.applies(cuda, policy, None, KernelSettings(cuda_graphs=False))
        # Graphs change how the work is issued, not what is computed: on under both named settings.
        assert graphs.applies(cuda, policy, None, KernelSettings.named("reference"))
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        assert not graphs.applies(cuda, policy, None, on)
    monkeypatch.undo()
    assert not graphs.applies(cuda, policy, None, on)  # autograd on


def test_a_copied_model_starts_without_graphs():
    model = build_model(TINY, seed=3)
    model.layer_graphs = LayerGraphs(RerunPieces())
    tiny_calls(model, 2)
    copied = copy.deepcopy(model)
    assert copied.layer_graphs is not model.layer_graphs and not copied.layer_graphs.graphed
    assert "layer_graphs" not in "".join(model.state_dict())


# -- on a GPU ---------------------------------------------------------------------------------

SMALL_CUDA = WanConfig(
    dim=512,
    ffn_dim=1024,
    num_heads=4,
    num_layers=4,
    text_dim=64,
    text_len=16,
    freq_dim=64,
    latent_height=12,
    latent_width=16,
)


def cuda_generation(procedure: str, graphs: bool, compiled: bool, capture: bool):
    from sinkscope.generation.capture import FrameStatsCapture
    from sinkscope.generation.sampler import generate
    from sinkscope.options import GenerationOptions

    torch.manual_seed(0)
    model = build_model(SMALL_CUDA, seed=7, dtype=torch.bfloat16, device="cuda")
    model.kernels = KernelSettings(cuda_graphs=graphs)
    if compiled:
        model.compile_blocks(dynamic=False)
    generation = {"num_frames": 9}
    if procedure == "longlive2":
        generation = {
            "num_frames": 8,
            "procedure": "longlive2",
            "frames_per_block": 4,
            "denoising_steps": [999, 908, 713],
        }
    options = GenerationOptions.from_config(generation)
    context = torch.randn(1, 12, SMALL_CUDA.text_dim, generator=torch.Generator().manual_seed(2))
    observers, tables = [], None
    if capture:
        recorder = FrameStatsCapture(model, range(SMALL_CUDA.num_layers), frame_seq_length=48)
        with recorder:
            result = generate(model, context, options=options, seed=3, observers=[recorder])
        tables = recorder.layer_tables()
    else:
        result = generate(model, context, options=options, seed=3, observers=observers)
    return result.latents, tables, model.layer_graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "procedure, compiled, capture",
    [
        ("self_forcing", False, False),
        ("self_forcing", True, False),
        ("self_forcing", False, True),
        ("longlive2", False, False),
    ],
)
def test_cuda_graphs_give_the_eager_video_to_the_bit(procedure, compiled, capture):
    eager, eager_tables, _ = cuda_generation(procedure, False, compiled, capture)
    replayed, replayed_tables, graphs = cuda_generation(procedure, True, compiled, capture)
    assert graphs.graphed  # captured and replayed
    assert torch.equal(replayed, eager)
    if capture:
        for layer, tables in eager_tables.items():
            for kind, table in tables.items():
                assert table.equals(replayed_tables[layer][kind]), (layer, kind)
