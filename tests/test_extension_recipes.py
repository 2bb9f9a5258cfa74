"""The recipes of docs/architecture.md "How to add", followed at test time, end to end.

Each toy is added exactly as the recipe says (its spec row, its registered code, its name
in the schema's enum) and removed again after: a cache policy with a key of its own, a
generation procedure that runs the existing policies, a weight format and a figure kind.
Each goes through the config check (``load_study`` on a config that names it), then
through what it is for: a tiny CPU generation, a weight load, a render.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from sinkscope.errors import ConfigError
from sinkscope.generation.common import PASS_DENOISE, CallInfo, FlowMatchSchedule, latents_to_device
from sinkscope.generation.hooks import CachePass, PromptSwitch
from sinkscope.generation.loop import Procedure, Run, video_blocks
from sinkscope.generation.procedures import register_procedure, unregister_procedure
from sinkscope.generation.sampler import generate
from sinkscope.model import WanConfig, build_model
from sinkscope.model.policies import POLICY_CLASSES, WindowPolicy, register_policy
from sinkscope.options import (
    CACHE_POLICY_TABLE,
    PROCEDURE_TABLE,
    CallKind,
    GenerationOptions,
    OptionSpec,
    PolicySpec,
    ProcedureSpec,
    procedures_running,
)
from sinkscope.pipeline.study import load_study
from sinkscope.schema import load_schema, resolve_ref

SMALL = WanConfig(
    dim=64, ffn_dim=64, num_heads=4, num_layers=2, text_dim=16, text_len=8, freq_dim=16, latent_height=4, latent_width=6
)
FSL = SMALL.frame_seq_length()


def allow_in_schema(monkeypatch, node: dict, name: str) -> None:
    """The schema step of a recipe: ``name`` added to the enum of ``node`` (in memory)."""
    monkeypatch.setitem(node, "enum", [name, *node["enum"]])


def generation_schema() -> dict:
    return resolve_ref(load_schema()["properties"]["generation"])["properties"]


def text() -> torch.Tensor:
    return torch.randn(1, 5, SMALL.text_dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


class Layouts:
    """Observer of layer 0: each call's key frames, by (block, pass, step)."""

    def __init__(self, model) -> None:
        self.info, self.keys = None, {}
        model.set_observer(0, self.observe)

    def begin_call(self, info) -> None:
        self.info = info

    def observe(self, q, k, v, layout, frame_bias=None):
        self.keys[(self.info.block, self.info.pass_, self.info.step)] = list(layout.key_frames)


# -- a cache policy: its spec row, its registered class, its name (and key) in the schema ----------

TOY_POLICY = PolicySpec(
    "toy_flush",
    {"local_attn_frames": 6, "sink_frames": 1, "budget_frames": 0, "recent_frames": 0},
    ("local_attn_frames", "sink_frames"),
    "a test's window that can empty itself",
    options=(OptionSpec("toy_flush", False),),
    needs_sink=True,
)


class ToyFlushPolicy(WindowPolicy):
    """FIFO after the sink; with ``toy_flush``, a block that overflows the window empties it:
    every frame after the sink is evicted."""

    name = "toy_flush"
    settings_keys = ("window_frames", "sink_frames")

    def __init__(self, cache, *, window_frames, sink_frames, rope=None, toy_flush=False) -> None:
        self.toy_flush = toy_flush
        super().__init__(cache, window_frames=window_frames, sink_frames=sink_frames, rope=rope)

    def start_block(self, start: int, frames: int) -> None:
        held, kept = self._held(), self.protected_frames
        if self.toy_flush and held + frames > self.window_frames:
            self.cache.evict(held - kept, after=kept)
        super().start_block(start, frames)


@pytest.fixture
def toy_policy(monkeypatch):
    monkeypatch.setitem(CACHE_POLICY_TABLE, TOY_POLICY.name, TOY_POLICY)
    register_policy(ToyFlushPolicy)
    schema = generation_schema()
    allow_in_schema(monkeypatch, schema["cache_policy"], TOY_POLICY.name)
    monkeypatch.setitem(schema, "toy_flush", {"type": "boolean", "default": False, "description": "toy_flush: empty"})
    yield
    POLICY_CLASSES.pop(TOY_POLICY.name)


def test_a_policy_is_its_spec_row_its_class_and_its_schema_name(toy_policy):
    config = {"generation": {"cache_policy": "toy_flush", "num_frames": 12, "toy_flush": True}}
    options = load_study(config, check_this_machine=False).options["demo"]
    assert (options.cache_policy, options.local_attn_frames, options.sink_frames) == ("toy_flush", 6, 1)
    assert options.option("toy_flush") is True and options.to_dict()["toy_flush"] is True
    assert "toy_flush" not in GenerationOptions.from_config({"cache_policy": "toy_flush"}).to_dict()
    # Its own key is checked there and refused under any other policy, in one line naming it.
    with pytest.raises(ConfigError, match="generation.toy_flush"):
        load_study({"generation": {"cache_policy": "toy_flush", "toy_flush": "maybe"}}, check_this_machine=False)
    with pytest.raises(ConfigError, match="generation.toy_flush: has no meaning for cache_policy 'window'"):
        load_study({"generation": {"cache_policy": "window", "toy_flush": True}}, check_this_machine=False)
    # Every procedure whose calls it takes runs it: Self-Forcing's blocks.
    assert procedures_running("toy_flush") == ("self_forcing",)

    # A tiny generation: block 2 (frames 6-8) overflows the window of 6: FIFO keeps the
    # sink and frames 4-5; the flush keeps the sink alone.
    model = build_model(SMALL, seed=3, dtype=torch.float64)
    seen = {}
    for flush in (False, True):
        layouts = Layouts(model)
        chosen = GenerationOptions.from_config({**config["generation"], "toy_flush": flush, "denoising_steps": [1000]})
        result = generate(model, text(), options=chosen, seed=0, observers=[layouts])
        assert len(result.calls) == chosen.num_calls and torch.isfinite(result.latents).all()
        seen[flush] = layouts.keys[(2, "denoise", 0)]
    assert seen == {False: [0, 4, 5, 6, 7, 8], True: [0, 6, 7, 8]}


# -- a generation procedure: its spec row, its declaration, its name in the schema -------------------

TOY_PROCEDURE = ProcedureSpec("toy_euler", "a test's sampler: Euler steps on the flow, then the cache pass")


class EulerSteps:
    """Euler's method on the shifted flow-matching schedule: x <- x + (sigma' - sigma) v, the
    last step to sigma = 0; no noise drawn between steps."""

    renoise_frames = 0

    def __init__(self, run: Run) -> None:
        options = run.options
        self.flow = FlowMatchSchedule(options.timestep_shift, options.num_train_timesteps)
        self.units = video_blocks(options)
        self.timesteps = self.flow.denoising_timesteps(options.denoising_steps, options.warp_denoising_step)

    def num_steps(self, block) -> int:
        return len(self.timesteps)

    def denoise(self, run: Run) -> list[torch.Tensor]:
        block = run.unit
        start, frames = block.start_frame, block.num_frames
        x = latents_to_device(run.noise.initial[start : start + frames], run.device, run.dtype)
        for step, t in enumerate(self.timesteps):
            run.announce(CallInfo(block.index, PASS_DENOISE, step, t, start, frames, block.last, run.segment))
            velocity = run.model(
                x,
                torch.full((1, frames), t, device=run.device),
                run.contexts[run.segment],
                cache_policy=run.policy,
                start_frame=start,
            )
            after = self.flow.sigma(self.timesteps[step + 1]) if step + 1 < len(self.timesteps) else 0.0
            x = x + (after - self.flow.sigma(t)) * velocity
        run.prediction = x
        return [x]


TOY_EULER = Procedure("toy_euler", EulerSteps, before_block=(PromptSwitch,), after_block=(CachePass,))


@pytest.fixture
def toy_procedure(monkeypatch):
    monkeypatch.setitem(PROCEDURE_TABLE, TOY_PROCEDURE.name, TOY_PROCEDURE)
    register_procedure(TOY_EULER)
    allow_in_schema(monkeypatch, generation_schema()["procedure"], TOY_PROCEDURE.name)
    yield
    unregister_procedure(TOY_PROCEDURE.name)


def test_a_procedure_is_its_spec_row_and_its_declaration_and_runs_every_policy_of_its_calls(toy_procedure):
    block_policies = [name for name in CACHE_POLICY_TABLE if "self_forcing" in procedures_running(name)]
    assert [name for name in CACHE_POLICY_TABLE if "toy_euler" in procedures_running(name)] == block_policies
    assert len(block_policies) == 9
    config = {"generation": {"procedure": "toy_euler", "cache_policy": "sink", "local_attn_frames": 6}}
    options = load_study(config, check_this_machine=False).options["demo"]
    assert (options.procedure, options.cache_policy, options.sink_frames) == ("toy_euler", "sink", 3)
    assert options.to_dict()["procedure"] == "toy_euler"
    with pytest.raises(ConfigError, match="'toy_euler' cannot run cache_policy 'rolling_forcing'"):
        load_study(
            {"generation": {"procedure": "toy_euler", "cache_policy": "rolling_forcing"}}, check_this_machine=False
        )
    assert CallKind.WINDOW not in TOY_PROCEDURE.calls

    # A tiny generation under an existing policy, with a prompt switch and its re-cache (the
    # hooks it shares with Self-Forcing): block 0 is Euler's method on the full forward of
    # its frames alone; the calls are what the spec counts, plus the re-cache.
    model = build_model(SMALL, seed=3, dtype=torch.float64)
    chosen = GenerationOptions.from_config(
        {"procedure": "toy_euler", "cache_policy": "window", "local_attn_frames": 6, "num_frames": 9}
    )
    other = torch.randn(1, 4, SMALL.text_dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    result = generate(model, [(0, text()), (6, other)], options=chosen, seed=0)
    assert len(result.calls) == chosen.calls([6]) == 3 * 5 + 1
    assert [c.pass_ for c in result.calls].count("recache") == 1
    flow = FlowMatchSchedule(chosen.timestep_shift)
    timesteps = flow.denoising_timesteps(chosen.denoising_steps, True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn((9, SMALL.in_dim, 4, 6), generator=g)[:3].permute(1, 0, 2, 3)[None].double()
    for step, t in enumerate(timesteps):
        velocity = model(x, torch.full((1, 3), t, dtype=torch.float64), text())
        after = flow.sigma(timesteps[step + 1]) if step + 1 < len(timesteps) else 0.0
        x = x + (after - flow.sigma(t)) * velocity
    torch.testing.assert_close(result.latents[:, :, :3], x, rtol=1e-10, atol=1e-10)


# -- a weight format: one registered class, its name in the schema ----------------------------------


def test_a_weight_format_is_one_registered_class(tmp_path, monkeypatch):
    from sinkscope.model.config import parameter_shapes
    from sinkscope.model.formats import WEIGHT_FORMATS, WeightFormat, register
    from sinkscope.model.loading import load_checkpoint
    from sinkscope.model.weightfiles import check_shapes

    monkeypatch.setattr("sinkscope.model.formats.WEIGHT_FORMATS", dict(WEIGHT_FORMATS))
    checkpoint = load_schema()["properties"]["checkpoints"]["additionalProperties"]["properties"]
    allow_in_schema(monkeypatch, checkpoint["format"], "npz")

    @register
    class NpzFormat(WeightFormat):
        name, summary = "npz", "numpy .npz of the state dict"

        def detect(self, path):
            return path.suffix == ".npz"

        def files(self, path):
            return [path]

        def check(self, path, config, options):
            with np.load(path) as arrays:
                check_shapes({k: arrays[k].shape for k in arrays.files}, parameter_shapes(config), str(path))

        def read(self, path, config, options):
            with np.load(path) as arrays:
                return {k: torch.from_numpy(arrays[k].copy()) for k in arrays.files}

    state = build_model("demo", seed=4).state_dict()
    np.savez(tmp_path / "w.npz", **{k: v.numpy() for k, v in state.items()})
    config = {"checkpoints": {"toy": {"model": "demo", "format": "npz", "weights": "w.npz"}}}
    study = load_study(config, base_dir=tmp_path, check_this_machine=False)
    resolved = study.checkpoints["toy"]
    assert resolved.format == "npz"
    model = load_checkpoint(resolved, device=torch.device("cpu"))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    np.savez(tmp_path / "short.npz", **{k: v.numpy() for k, v in list(state.items())[1:]})
    with pytest.raises(ConfigError, match="short.npz does not fit the model: 1 missing"):
        load_study(
            {"checkpoints": {"toy": {**config["checkpoints"]["toy"], "weights": "short.npz"}}}, base_dir=tmp_path
        )


# -- a figure kind: its registry entry and its drawing module ----------------------------------------


def draw_toy_mass(tables, *, source, options, ax=None, **_):
    """The drawing module's ``draw``: each key frame's mean softmax mass, as bars."""
    from sinkscope.figures.layout import new_figure

    frame = tables["frame_attention"]
    means = frame.groupby("key_frame", observed=True)["prob_mass"].mean()
    fig = new_figure(4, 3)
    axes = fig.add_subplot()
    axes.bar(means.index.astype(int), means.to_numpy(), gid="toy-bars")
    axes.set_title(f"{source}: mean mass a key frame")
    return fig


@pytest.fixture
def toy_figure(monkeypatch):
    from sinkscope.figures.registry import FIGURES, SOURCE, FigureKind

    monkeypatch.setitem(
        FIGURES, "toy_mass", FigureKind("toy_mass", SOURCE, ("frame_attention",), (), "each key frame's mean mass")
    )
    module = types.ModuleType("sinkscope.figures.toy_mass")
    module.draw = draw_toy_mass
    monkeypatch.setitem(sys.modules, "sinkscope.figures.toy_mass", module)


def test_a_figure_kind_is_its_entry_and_its_module(toy_figure, tmp_path):
    from sinkscope.figures.render import draw
    from sinkscope.figures.style import save_figure
    from sinkscope.generation.capture import FrameStatsCapture
    from sinkscope.plot import plot

    model = build_model(SMALL, seed=3)
    with FrameStatsCapture(model, [1], frame_seq_length=FSL, token_profiles="none") as capture:
        generate(
            model,
            text().float(),
            options=GenerationOptions(num_frames=6, denoising_steps=[1000]),
            seed=0,
            observers=[capture],
        )
    rows = capture.to_frame()
    fig = draw("toy_mass", rows, source="demo", options={})
    save_figure(fig, tmp_path / "toy.svg", tmp_path / "toy.png")
    # The plotting API draws it by name too (plot_<kind> functions are made when it is imported).
    assert plot("toy_mass", rows.assign(checkpoint="demo", variant="default"), source="demo").axes
    assert 'id="toy-bars' in (tmp_path / "toy.svg").read_text() and (tmp_path / "toy.png").stat().st_size > 0
