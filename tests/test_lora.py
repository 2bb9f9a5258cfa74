"""LoRA adapters on checkpoints (``lora:``): merged exactly as PEFT computes them, checked
without torch at config time, refused in one line when they do not fit, and part of the
checkpoint's digest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO
from fakes import TINY, tiny_state, write_self_forcing_pt, write_wan_folder
from safetensors.torch import save_file
from test_loading import spec

from sinkscope.errors import ConfigError, WeightsError
from sinkscope.model import build_model
from sinkscope.model.checkpoints import CheckpointSpec, resolve_checkpoint
from sinkscope.model.loading import load_checkpoint, load_transformer
from sinkscope.model.lora import linear_shapes

# Every Linear inside the attention blocks, by full name, as LongLive's configure_lora_for_model
# picks them: self_attn.{q,k,v,o}, cross_attn.{q,k,v,o}, ffn.0 and ffn.2.
BLOCK_LINEARS = [
    f"blocks.{i}.{name}"
    for i in range(TINY.num_layers)
    for name in [*(f"{a}.{p}" for a in ("self_attn", "cross_attn") for p in "qkvo"), "ffn.0", "ffn.2"]
]


def sample_inputs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(1, TINY.in_dim, 3, 4, 6, generator=g)
    context = torch.randn(1, TINY.text_len, TINY.text_dim, generator=g)
    return latents.to(dtype), torch.tensor([700.0]), context.to(dtype)


def forward(model, dtype=torch.float32):
    with torch.no_grad():
        return model(*sample_inputs(dtype))


@pytest.fixture
def base_state():
    return tiny_state(seed=1)


@pytest.fixture
def release(tmp_path):
    """The Wan release folder: config.json (and the text encoder's place) for the .pt's model config."""
    return write_wan_folder(tmp_path / "wan_models" / "Wan2.1-T2V-1.3B", tiny_state(seed=9))


@pytest.fixture
def generator(tmp_path, base_state):
    """LongLive's longlive_base.pt: Self-Forcing's layout, the weights under 'generator'."""
    return write_self_forcing_pt(tmp_path / "longlive_models" / "longlive_base.pt", base_state)


def peft_model(state, seed=0, **lora_config):
    """The base weights wrapped by PEFT itself, with random A and B (PEFT starts B at zero)."""
    peft = pytest.importorskip("peft", reason="peft (the test extra) checks the merge against PEFT's own LoRA layers")
    model = build_model(TINY, seed=None)
    model.load_state_dict(state)
    config = {"r": 4, "lora_alpha": 8, "target_modules": BLOCK_LINEARS, **lora_config}
    wrapped = peft.get_peft_model(model, peft.LoraConfig(**config))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                param.copy_(0.2 * torch.randn(param.shape, generator=g))
    return wrapped.eval()


def save_adapter(wrapped, where: Path, layout: str) -> Path:
    """The adapter as PEFT's folder, as LongLive's lora.pt (generator_lora), as a bare .pt
    state dict, or as a .safetensors file of the same keys."""
    from peft import get_peft_model_state_dict

    where.parent.mkdir(parents=True, exist_ok=True)
    if layout == "peft":
        wrapped.save_pretrained(where)
        return where
    state = {k: v.detach().clone().contiguous() for k, v in get_peft_model_state_dict(wrapped).items()}
    if layout == "longlive":
        # LongLive's trainer saves the critic's adapter beside the generator's.
        torch.save({"generator_lora": state, "critic_lora": {"x.lora_A.weight": torch.zeros(1, 1)}, "step": 3}, where)
    elif layout == "top_level":
        torch.save(state, where)
    else:
        save_file(state, str(where))
    return where


def one_line_refusal(error: pytest.ExceptionInfo, *names: str) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    for name in names:
        assert name in message, (name, message)
    return message


# -- (a) the merge equals PEFT's forward ---------------------------------------------------------

LAYOUTS = {"peft": "adapter", "longlive": "lora.pt", "top_level": "lora_state.pt", "safetensors": "lora.safetensors"}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_merged_adapter_matches_peft(tmp_path, base_state, release, generator, layout):
    wrapped = peft_model(base_state)
    path = save_adapter(wrapped, tmp_path / "longlive_models" / LAYOUTS[layout], layout)
    if layout == "peft":
        assert {p.name for p in path.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
        lora = str(path.relative_to(tmp_path))
    else:
        # A file does not say alpha: the config does (scale 8 / 4 = 2).
        lora = {"path": str(path.relative_to(tmp_path)), "alpha": 8}
    entry = spec(weights="longlive_models/longlive_base.pt", base=str(release), ema=False, lora=lora)
    resolved = resolve_checkpoint(entry, base_dir=tmp_path)
    assert resolved.lora is not None and len(resolved.lora.modules) == len(BLOCK_LINEARS) == 20
    assert set(resolved.lora.scales().values()) == {2.0}

    # The pipeline's path, in float32: equal to PEFT's unmerged forward up to rounding.
    ours = load_checkpoint(resolved, device=torch.device("cpu"))
    expected = forward(wrapped)
    torch.testing.assert_close(forward(ours), expected, rtol=2e-5, atol=2e-6)
    # ... and the adapter matters: without it the output is another.
    plain = load_transformer(generator, model=TINY, ema=False)
    assert (forward(plain) - expected).abs().max() > 1e-2

    # In float64 the merge and PEFT's forward agree to float64 rounding.
    exact = load_transformer(generator, model=TINY, ema=False, dtype=torch.float64, lora=resolved.lora)
    assert exact.dtype == torch.float64
    torch.testing.assert_close(
        forward(exact, torch.float64), forward(wrapped.double(), torch.float64), rtol=1e-10, atol=1e-12
    )


def test_merged_weights_are_w_plus_scale_b_a_cast_once(tmp_path, base_state, release, generator):
    wrapped = peft_model(base_state, seed=3)
    path = save_adapter(wrapped, tmp_path / "lora.pt", "longlive")
    resolved = resolve_checkpoint(spec(weights=str(generator), base=str(release), ema=False, lora=str(path)), tmp_path)
    assert {m.scale for m in resolved.lora.modules} == {1.0}  # alpha defaults to the rank, LongLive's 256 / 256
    merged = load_transformer(generator, model=TINY, ema=False, dtype="bfloat16", lora=resolved.lora).state_dict()
    adapters = {k: v for k, v in wrapped.state_dict().items() if "lora_" in k}
    for name in ("blocks.0.self_attn.q", "blocks.1.ffn.0", "blocks.1.cross_attn.o"):
        a = adapters[f"base_model.model.{name}.lora_A.default.weight"]
        b = adapters[f"base_model.model.{name}.lora_B.default.weight"]
        expected = (base_state[f"{name}.weight"].float() + b.float() @ a.float()).to(torch.bfloat16)
        assert torch.equal(merged[f"{name}.weight"], expected), name
    # Modules without an adapter keep their weights.
    assert torch.equal(merged["head.head.weight"], base_state["head.head.weight"].to(torch.bfloat16))


def test_an_alpha_whose_merge_is_not_finite_is_refused_naming_it(tmp_path, base_state, release, generator):
    from sinkscope.errors import WeightsError

    wrapped = peft_model(base_state, seed=3)
    path = save_adapter(wrapped, tmp_path / "lora.pt", "longlive")
    entry = spec(weights=str(generator), base=str(release), ema=False, lora={"path": str(path), "alpha": 1e300})
    resolved = resolve_checkpoint(entry, tmp_path)
    with pytest.raises(WeightsError) as error:
        load_transformer(generator, model=TINY, ema=False, dtype="bfloat16", lora=resolved.lora)
    one_line_refusal(error, str(path), "alpha 1e+300", "not finite in bfloat16")


# -- (b) rsLoRA, rank_pattern and alpha_pattern -------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"use_rslora": True},
        {"rank_pattern": {"ffn.2": 2, "blocks.1.self_attn.q": 6}, "alpha_pattern": {"cross_attn.v": 3, "ffn.0": 5}},
        {"use_rslora": True, "rank_pattern": {"self_attn.k": 3}, "alpha_pattern": {"blocks.0.ffn.0": 7}},
    ],
    ids=["rslora", "patterns", "rslora+patterns"],
)
def test_peft_folder_scales_follow_its_config(tmp_path, base_state, release, generator, options):
    wrapped = peft_model(base_state, seed=5, **options)
    folder = save_adapter(wrapped, tmp_path / "adapter", "peft")
    resolved = resolve_checkpoint(
        spec(weights=str(generator), base=str(release), ema=False, lora=str(folder)), tmp_path
    )
    peft_scaling = {
        name.removeprefix("base_model.model."): module.scaling["default"]
        for name, module in wrapped.named_modules()
        if hasattr(module, "scaling")
    }
    assert resolved.lora.scales() == pytest.approx(peft_scaling, rel=1e-12)
    assert len(set(peft_scaling.values())) > 1 or options == {"use_rslora": True}
    exact = load_transformer(generator, model=TINY, ema=False, dtype=torch.float64, lora=resolved.lora)
    torch.testing.assert_close(
        forward(exact, torch.float64), forward(wrapped.double(), torch.float64), rtol=1e-10, atol=1e-12
    )


def test_diffusers_names_and_wrapper_prefixes_map_onto_the_model(tmp_path, release, generator):
    g = torch.Generator().manual_seed(0)
    d = TINY.dim
    state = {
        "transformer.blocks.0.attn1.to_q.lora_A.weight": torch.randn(2, d, generator=g),
        "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.randn(d, 2, generator=g),
        "transformer.blocks.1.ffn.net.0.proj.lora_A.weight": torch.randn(2, d, generator=g),
        "transformer.blocks.1.ffn.net.0.proj.lora_B.weight": torch.randn(TINY.ffn_dim, 2, generator=g),
    }
    save_file(state, str(tmp_path / "diffusers_lora.safetensors"))
    resolved = resolve_checkpoint(
        spec(weights=str(generator), base=str(release), ema=False, lora="diffusers_lora.safetensors"), tmp_path
    )
    assert [m.module for m in resolved.lora.modules] == ["blocks.0.self_attn.q", "blocks.1.ffn.0"]


def test_the_torch_free_linear_list_is_the_models():
    model = build_model(TINY, seed=0)
    found = {name: tuple(m.weight.shape) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert linear_shapes(TINY) == found
    assert set(BLOCK_LINEARS) <= set(found)


# -- (c) bad adapters are refused in one line naming the file and the key -------------------------


def _lora_tensors(module: str, rank: int = 2, shape_a=None, shape_b=None) -> dict[str, torch.Tensor]:
    out_features, in_features = linear_shapes(TINY).get(module, (TINY.dim, TINY.dim))
    return {
        f"base_model.model.{module}.lora_A.weight": torch.zeros(shape_a or (rank, in_features)),
        f"base_model.model.{module}.lora_B.weight": torch.zeros(shape_b or (out_features, rank)),
    }


def _key(module: str, part: str = "A") -> str:
    return f"base_model.model.{module}.lora_{part}.weight"


# case -> (what lora.pt holds, the config's lora entry, the key the refusal names)
BAD_ADAPTERS = {
    "no_such_module": (_lora_tensors("blocks.7.self_attn.q"), "lora.pt", _key("blocks.7.self_attn.q")),
    "not_a_linear": (_lora_tensors("blocks.0.self_attn.norm_q"), "lora.pt", _key("blocks.0.self_attn.norm_q")),
    "wrong_shape_a": (_lora_tensors("blocks.1.ffn.2", shape_a=(2, TINY.dim)), "lora.pt", _key("blocks.1.ffn.2")),
    "wrong_shape_b": (_lora_tensors("blocks.1.ffn.0", shape_b=(TINY.dim, 2)), "lora.pt", _key("blocks.1.ffn.0", "B")),
    "unpaired": ({_key("blocks.0.cross_attn.k"): torch.zeros(2, TINY.dim)}, "lora.pt", _key("blocks.0.cross_attn.k")),
    "rank_differs": (
        _lora_tensors("blocks.0.self_attn.v", rank=3),
        {"path": "lora.pt", "rank": 256},
        _key("blocks.0.self_attn.v"),
    ),
    "not_lora": (tiny_state(seed=2), "lora.pt", "patch_embedding.weight"),  # a generator state dict
    "text_file": ("not a checkpoint", "lora.pt", "lora.pt"),
    "missing": (None, "gone.pt", "gone.pt"),
}


@pytest.mark.parametrize("case", sorted(BAD_ADAPTERS))
def test_bad_adapters_are_refused_naming_file_and_key(tmp_path, release, generator, case):
    content, lora, key = BAD_ADAPTERS[case]
    if isinstance(content, str):
        (tmp_path / "lora.pt").write_text(content)
    elif content is not None:
        torch.save({"generator_lora": content}, tmp_path / "lora.pt")
    entry = spec(weights=str(generator), base=str(release), ema=False, lora=lora)
    with pytest.raises(ConfigError) as error:
        resolve_checkpoint(entry, base_dir=tmp_path)
    file = "gone.pt" if case == "missing" else str(tmp_path / "lora.pt")
    one_line_refusal(error, "config key checkpoints.real.lora: ", file, key)


def test_a_legacy_format_adapter_is_checked_and_merged_as_a_zip_one(tmp_path, release, generator):
    g = torch.Generator().manual_seed(0)
    tensors = {k: 0.1 * torch.randn(v.shape, generator=g) for k, v in _lora_tensors("blocks.0.self_attn.q").items()}
    merged = []
    for name, legacy in (("zip.pt", False), ("legacy.pt", True)):
        torch.save({"generator_lora": tensors}, tmp_path / name, _use_new_zipfile_serialization=not legacy)
        resolved = resolve_checkpoint(spec(weights=str(generator), base=str(release), ema=False, lora=name), tmp_path)
        assert [m.module for m in resolved.lora.modules] == ["blocks.0.self_attn.q"]
        merged.append(load_checkpoint(resolved, device=torch.device("cpu")).state_dict())
    assert (tmp_path / "legacy.pt").read_bytes()[:1] == b"\x80"
    assert all(torch.equal(merged[0][k], merged[1][k]) for k in merged[0])
    assert not torch.equal(
        merged[0]["blocks.0.self_attn.q.weight"],
        load_checkpoint(
            resolve_checkpoint(spec(weights=str(generator), base=str(release), ema=False), tmp_path),
            device=torch.device("cpu"),
        ).state_dict()["blocks.0.self_attn.q.weight"],
    )


def test_the_base_generator_given_as_adapter_is_refused(tmp_path, release, generator):
    entry = spec(weights=str(generator), base=str(release), ema=False, lora=str(generator))
    with pytest.raises(ConfigError) as error:
        resolve_checkpoint(entry, base_dir=tmp_path)
    one_line_refusal(error, str(generator), "'generator_lora'", "generator, critic")


def test_an_adapter_replaced_after_the_check_is_refused_at_load(tmp_path, base_state, release, generator):
    path = save_adapter(peft_model(base_state), tmp_path / "lora.pt", "longlive")
    resolved = resolve_checkpoint(spec(weights=str(generator), base=str(release), ema=False, lora="lora.pt"), tmp_path)
    save_adapter(peft_model(base_state, r=2), path, "longlive")
    with pytest.raises(WeightsError, match=r"lora.pt: key 'base_model.model.blocks.0.*.lora_A.weight' no longer fits"):
        load_checkpoint(resolved, device=torch.device("cpu"))


def test_bad_peft_folders_are_refused(tmp_path, base_state, release, generator):
    folder = save_adapter(peft_model(base_state), tmp_path / "adapter", "peft")
    config_path = folder / "adapter_config.json"
    config = json.loads(config_path.read_text())
    entry = spec(weights=str(generator), base=str(release), ema=False, lora={"path": "adapter", "alpha": 16})
    with pytest.raises(ConfigError) as error:
        resolve_checkpoint(entry, base_dir=tmp_path)
    one_line_refusal(error, "adapter_config.json", "'lora_alpha'", "lora.alpha")
    for key, value in (("peft_type", "LOHA"), ("use_dora", True), ("r", 5)):
        config_path.write_text(json.dumps({**config, key: value}))
        with pytest.raises(ConfigError) as error:
            resolve_checkpoint(spec(weights=str(generator), base=str(release), ema=False, lora="adapter"), tmp_path)
        one_line_refusal(error, str(folder), "lora_A.weight" if key == "r" else repr(key))
    (folder / "adapter_model.safetensors").unlink()
    with pytest.raises(ConfigError) as error:
        resolve_checkpoint(spec(weights=str(generator), base=str(release), ema=False, lora="adapter"), tmp_path)
    one_line_refusal(error, str(folder), "adapter_model.safetensors")


def test_the_demo_format_and_bad_entries_refuse_lora(tmp_path):
    with pytest.raises(ConfigError, match="format 'demo' takes no lora adapter"):
        resolve_checkpoint(spec(model="demo", format="demo", lora="x.pt"), tmp_path)
    with pytest.raises(ConfigError, match=r"checkpoints.real.lora: unknown keys \['scale'\]"):
        spec(lora={"path": "x.pt", "scale": 2})
    from sinkscope.pipeline.config import normalize_config

    with pytest.raises(ConfigError, match="unknown config key 'scale' in checkpoints.d.lora"):
        normalize_config({"checkpoints": {"d": {"model": "demo", "format": "demo", "lora": {"path": "x", "scale": 2}}}})


def test_an_entry_keeps_one_form_and_its_params_without_lora():
    assert spec(lora="x.pt").to_dict() == spec(lora={"path": "x.pt"}).to_dict()
    assert spec(lora="x.pt").to_dict()["lora"] == {"path": "x.pt", "rank": None, "alpha": None}
    # A job's params carry the entry; entries without an adapter keep the params they had.
    assert "lora" not in spec().to_dict()
    assert CheckpointSpec(**spec(lora={"path": "x.pt", "alpha": 4}).to_dict()) == spec(
        lora={"path": "x.pt", "alpha": 4}
    )


# -- (d) the config check imports no torch ---------------------------------------------------------------------


def test_config_check_of_adapters_imports_no_torch(tmp_path, base_state, release, generator):
    wrapped = peft_model(base_state)
    save_adapter(wrapped, tmp_path / "longlive_models" / "lora.pt", "longlive")
    save_adapter(wrapped, tmp_path / "adapter", "peft")
    torch.save({"generator_lora": _lora_tensors("blocks.9.ffn.0")}, tmp_path / "bad.pt")
    checkpoints = {
        "longlive": {
            "weights": str(generator),
            "base": str(release),
            "ema": False,
            "lora": {"path": "longlive_models/lora.pt", "alpha": 8},
        },
        "peft": {"weights": str(generator), "base": str(release), "ema": False, "lora": "adapter"},
    }
    code = f"""
import sys
from pathlib import Path
from sinkscope.errors import ConfigError, WeightsError
from sinkscope.pipeline.config import checked_config
base = Path({str(tmp_path)!r})
config, resolved = checked_config(
    {{"checkpoints": {checkpoints!r}, "layers": [0, 1], "figures": {{"heads": ["L1H1"]}}}}, base
)
print(sorted(resolved), resolved["longlive"].lora.summary(), resolved["peft"].lora.summary())
bad = {{
    "checkpoints": {{"bad": {{**{checkpoints["longlive"]!r}, "lora": "bad.pt"}}}},
    "layers": [0],
    "figures": {{"heads": ["L1H1"]}},
}}
try:
    checked_config(bad, base)
except ConfigError as exc:
    print(exc)
assert "torch" not in sys.modules, "torch was imported"
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "['longlive', 'peft'] 20 Linear layers, rank 4, scale 2 20 Linear layers, rank 4, scale 2", lines
    assert lines[1].startswith("invalid config: config key checkpoints.bad.lora: ") and "bad.pt" in lines[1]
    assert "'base_model.model.blocks.9.ffn.0.lora_A.weight' adapts 'blocks.9.ffn.0'" in lines[1]


# -- (e) the digest covers the adapter and its scale -------------------------------------------------


def test_digest_changes_with_the_adapter_and_its_scale(tmp_path, base_state, release, generator):
    cache = tmp_path / "digests.json"
    path = save_adapter(peft_model(base_state, seed=1), tmp_path / "lora.pt", "longlive")

    def digest(lora=None):
        entry = spec(weights=str(generator), base=str(release), ema=False, lora=lora)
        return resolve_checkpoint(entry, base_dir=tmp_path).digest(cache=cache)

    plain, first = digest(), digest("lora.pt")
    assert len(first) == 64 and first != plain
    # Without an adapter the digest is the weights' alone, as before adapters existed.
    from sinkscope.model.checkpoints import files_digest

    assert plain == files_digest([generator])
    path.touch()  # a touch is no change
    assert digest("lora.pt") == first
    assert digest({"path": "lora.pt", "alpha": 8}) not in (first, plain)  # another scale
    save_adapter(peft_model(base_state, seed=2), path, "longlive")  # new bytes
    assert digest("lora.pt") not in (first, plain)


# -- the example config ---------------------------------------------------------------------------------


def test_the_longlive_example_config_checks_once_its_files_exist(tmp_path, base_state):
    import yaml

    from sinkscope.pipeline.config import normalize_config

    example = yaml.safe_load((REPO / "configs" / "longlive.yaml").read_text())
    with pytest.raises(ConfigError) as error:
        normalize_config(example, base_dir=tmp_path)
    # Every missing file at once, one line each: the weights, the Wan release folder, the adapter.
    assert [line.split(" (looked at")[0] for line in error.value.problems] == [
        "config key checkpoints.longlive: weights 'longlive_models/models/longlive_base.pt' do not exist",
        "config key checkpoints.longlive: base folder 'wan_models/Wan2.1-T2V-1.3B' does not exist",
        "config key checkpoints.longlive.lora: adapter 'longlive_models/models/lora.pt' does not exist",
    ]
    # The same files with the tiny model's weights, where the example says they lie.
    write_wan_folder(tmp_path / "wan_models" / "Wan2.1-T2V-1.3B", tiny_state(seed=9))
    write_self_forcing_pt(tmp_path / "longlive_models" / "models" / "longlive_base.pt", base_state)
    save_adapter(peft_model(base_state), tmp_path / "longlive_models" / "models" / "lora.pt", "longlive")
    tiny = {**example, "layers": [0, 1], "figures": {"heads": ["L1H1", "L2H4"]}}
    config = normalize_config(tiny, base_dir=tmp_path)
    assert config["checkpoints"]["longlive"]["lora"] == "longlive_models/models/lora.pt"
    assert config["generation"]["cache_policy"] == "sink" and config["generation"]["sink_frames"] == 3
    resolved = resolve_checkpoint(CheckpointSpec.from_config("longlive", config["checkpoints"]["longlive"]), tmp_path)
    assert resolved.format == "self_forcing" and resolved.lora.summary() == "20 Linear layers, rank 4, scale 1"
