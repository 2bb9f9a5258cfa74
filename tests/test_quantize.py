"""Cache quantization formats (sinkscope.model.quantize) against float64 references written
here in numpy, independently of the module: nearest-value search on the E2M1 grid, E4M3
rounding from the exponent, per-row and per-block scales as docs/cache-quantization.md
states them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkscope.errors import ConfigError
from sinkscope.model.quantize import CACHE_FORMATS, cache_format, quantize_cache, round_e2m1, round_e4m3, smooth_keys

E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def ref_e2m1(y: np.ndarray) -> np.ndarray:
    """Nearest grid value by search; on a tie the even code (even index) wins; |y| > 6 -> 6."""
    a = np.minimum(np.abs(y), 6.0)
    dist = np.abs(a[..., None] - E2M1_GRID)
    nearest = dist == dist.min(-1, keepdims=True)
    # among the (one or two) nearest, prefer an even index: score 0 for even, 1 for odd
    score = np.where(nearest, np.arange(8) % 2, 2)
    return np.sign(y) * E2M1_GRID[score.argmin(-1)]


def ref_e4m3(y: np.ndarray) -> np.ndarray:
    """float8_e4m3fn: 3 mantissa bits, normal exponents from -6, ties to even, max 448."""
    a = np.minimum(np.abs(y), 448.0)
    with np.errstate(divide="ignore"):
        exponent = np.maximum(np.floor(np.log2(np.where(a > 0, a, 1.0))), -6.0)
    ulp = 2.0 ** (exponent - 3)
    return np.sign(y) * np.minimum(np.round(a / ulp) * ulp, 448.0)


def ref_rows(x: np.ndarray, qmax: float, rounding) -> np.ndarray:
    scale = np.abs(x).max(-1, keepdims=True) / qmax
    safe = np.where(scale == 0, 1.0, scale)
    return rounding(np.clip(x / safe, -qmax, qmax)) * safe


def ref_nvfp4_candidate(blocks: np.ndarray, g: float, target: float) -> np.ndarray:
    eff = ref_e4m3(np.abs(blocks).max(-1, keepdims=True) / target / g) * g
    return np.where(eff == 0, 0.0, ref_e2m1(blocks / np.where(eff == 0, 1.0, eff)) * eff)


def ref_nvfp4(x: np.ndarray, four_over_six: bool = False) -> np.ndarray:
    amax = np.abs(x).max()
    g = amax / (6.0 * (256.0 if four_over_six else 448.0)) if amax > 0 else 1.0
    blocks = x.reshape(*x.shape[:-1], -1, 16)
    six = ref_nvfp4_candidate(blocks, g, 6.0)
    if four_over_six:
        four = ref_nvfp4_candidate(blocks, g, 4.0)
        err4, err6 = ((four - blocks) ** 2).sum(-1, keepdims=True), ((six - blocks) ** 2).sum(-1, keepdims=True)
        six = np.where(err4 < err6, four, six)
    return six.reshape(x.shape)


REFERENCES = {
    "int8": lambda x: ref_rows(x, 127.0, np.round),
    "int4": lambda x: ref_rows(x, 7.0, np.round),
    "fp8_e4m3": lambda x: ref_rows(x, 448.0, ref_e4m3),
    "nvfp4": ref_nvfp4,
    "nvfp4_4over6": lambda x: ref_nvfp4(x, True),
}


def cache_like(seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    """[tokens, heads, head_dim] with rows of very different size, outliers, negatives, an
    all-zero row and an all-zero block of 16."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 3, 64, generator=g, dtype=torch.float64)
    x = x * torch.logspace(-3, 1, 5, dtype=torch.float64)[:, None, None]
    x[1, 2, 7] = 80.0
    x[3, 0, 40] = -35.0
    x[2, 1] = 0.0
    x[4, 2, 16:32] = 0.0
    return x.to(dtype)


def test_the_issue_formats_are_registered_with_their_bits():
    bits = {name: entry.bits for name, entry in CACHE_FORMATS.items()}
    assert {"int8": 8, "int4": 4, "fp8_e4m3": 8, "nvfp4": 4}.items() <= bits.items()
    assert set(REFERENCES) == set(CACHE_FORMATS)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_each_format_equals_its_float64_reference(name):
    x = cache_like()
    out = cache_format(name).roundtrip(x)
    assert out.dtype == torch.float64 and out.shape == x.shape
    np.testing.assert_array_equal(out.numpy(), REFERENCES[name](x.numpy()))
    assert not out.isnan().any() and (out[2, 1] == 0).all() and (out[4, 2, 16:32] == 0).all()


def test_e2m1_grid_maps_to_itself_and_ties_go_to_the_even_code():
    grid = torch.tensor(np.concatenate([E2M1_GRID, -E2M1_GRID]))
    assert torch.equal(round_e2m1(grid), grid)
    # a row holding the grid in a tensor whose amax is 6: the scales are exactly 1
    row = grid.reshape(1, 16)
    assert torch.equal(cache_format("nvfp4").roundtrip(row), row)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 6.5, 100.0])
    np.testing.assert_array_equal(round_e2m1(torch.tensor(ties)).numpy(), ref_e2m1(ties))
    values = np.random.default_rng(1).uniform(-8, 8, 500)
    np.testing.assert_array_equal(round_e2m1(torch.tensor(values)).numpy(), ref_e2m1(values))


def test_e4m3_rounding_matches_the_reference_down_to_subnormals():
    rng = np.random.default_rng(2)
    values = rng.choice([-1, 1], 2000) * 2.0 ** rng.uniform(-12, 9.5, 2000)
    values = np.concatenate([values, [0.0, 448.0, 464.0, 2.0**-9, 2.0**-10, 3 * 2.0**-10]])
    np.testing.assert_array_equal(round_e4m3(torch.tensor(values)).numpy(), ref_e4m3(values))


def test_error_bounds():
    x = cache_like(3)
    absmax = x.abs().amax(-1, keepdim=True)
    tiny = 1e-12 * absmax
    assert ((cache_format("int8").roundtrip(x) - x).abs() <= absmax / 254 + tiny).all()
    assert ((cache_format("int4").roundtrip(x) - x).abs() <= absmax / 14 + tiny).all()
    # fp8: half an ulp, 2^-4 of the value, or half the smallest subnormal step of the row's scale
    fp8 = (cache_format("fp8_e4m3").roundtrip(x) - x).abs()
    assert (fp8 <= torch.maximum(x.abs() / 16, absmax / 448 * 2.0**-10) + tiny).all()
    # nvfp4 on data without tiny blocks: at most half the top grid step (1 of 6) of a scale
    # that E4M3 rounded up by at most 2^-4
    y = torch.randn(8, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    block_max = y.reshape(8, 8, 16).abs().amax(-1, keepdim=True)
    err = (cache_format("nvfp4").roundtrip(y) - y).reshape(8, 8, 16).abs()
    assert (err <= block_max / 6 * (1 + 2.0**-4) + 1e-12).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_other_dtypes_keep_their_dtype_and_agree_with_float64(name, dtype):
    x = cache_like(5, dtype)
    out = cache_format(name).roundtrip(x)
    assert out.dtype == dtype and out.shape == x.shape and not out.isnan().any()
    assert mostly_equal(out, cache_format(name).roundtrip(x.double()))


def mostly_equal(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """The same values up to out's dtype's rounding; float32 arithmetic (against float64)
    may break a near-tie the other way, one grid step: a rare miss."""
    out, ref = out.double().cpu(), ref.double().cpu()
    noise = 2.0**-7 * ref.abs() + 1e-6 * ref.abs().amax(-1, keepdim=True)
    return bool(((out - ref).abs() <= noise).double().mean() >= 0.99)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_zeros_stay_zeros(name):
    for shape in [(2, 3, 32), (0, 3, 32)]:
        out = cache_format(name).roundtrip(torch.zeros(shape, dtype=torch.bfloat16))
        assert out.shape == shape and (out == 0).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_values_are_propagated_to_their_scale_group(bad):
    x = cache_like(6, torch.float32)
    x[0, 1, 5] = bad
    rows = cache_format("int8").roundtrip(x).isnan()
    assert rows[0, 1].all() and rows.sum() == 64
    assert cache_format("nvfp4").roundtrip(x).isnan().all()


def test_storage_bytes():
    int8, int4, fp8, nvfp4 = (cache_format(n) for n in ("int8", "int4", "fp8_e4m3", "nvfp4"))
    rows = 2 * 21 * 12  # batch, tokens, heads
    assert int8.storage_bytes((2, 21, 12, 128)) == rows * (128 + 4)
    assert fp8.storage_bytes((2, 21, 12, 128)) == rows * (128 + 4)
    assert int4.storage_bytes((2, 21, 12, 128)) == rows * (64 + 4)
    assert int4.storage_bytes((3, 7)) == 3 * (4 + 4)  # 7 values take 4 bytes a row
    # 4.5 bits a value plus one float32 per tensor: one LongLive block of 7040 tokens x 24 heads
    assert nvfp4.storage_bytes((7040 * 24, 128)) == 7040 * 24 * (64 + 8) + 4
    assert cache_format("nvfp4_4over6").storage_bytes((4, 32)) == nvfp4.storage_bytes((4, 32))


def test_unknown_names_and_shapes_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="'fp4'.*int8") as error:
        cache_format("fp4")
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="tensors 'kv'"):
        quantize_cache(torch.zeros(1, 16), torch.zeros(1, 16), "int8", "kv")
    with pytest.raises(ConfigError, match="head_dim divisible by 16, got 24"):
        cache_format("nvfp4").roundtrip(torch.ones(2, 24))
    with pytest.raises(TypeError):
        cache_format("int8").roundtrip(torch.ones(2, 4, dtype=torch.int32))


def test_quantize_cache_picks_tensors_and_smooths_keys():
    k, v = cache_like(7, torch.bfloat16), cache_like(8, torch.bfloat16)
    only_k = quantize_cache(k, v, "int4", "k")
    assert torch.equal(only_k[0], cache_format("int4").roundtrip(k)) and only_k[1] is v
    only_v = quantize_cache(k, v, "int4", "v")
    assert only_v[0] is k and torch.equal(only_v[1], cache_format("int4").roundtrip(v))
    smoothed, _ = quantize_cache(k, v, "nvfp4", "v", smooth=True)
    centred = k.double() - k.double().mean(-1, keepdim=True)
    assert torch.equal(smoothed, smooth_keys(k))
    assert ((smoothed.double() - centred).abs() <= 2.0**-7 * k.double().abs().amax(-1, keepdim=True)).all()
    both = quantize_cache(k, v, "nvfp4", "both", smooth=True)
    assert torch.equal(both[0], cache_format("nvfp4").roundtrip(smooth_keys(k)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_cuda_gives_the_cpu_values(name):
    x = cache_like(9, torch.float32)
    out = cache_format(name).roundtrip(x.cuda())
    assert out.is_cuda and out.dtype == x.dtype and torch.equal(out.cpu(), cache_format(name).roundtrip(x))
    grid = torch.tensor(np.concatenate([E2M1_GRID, -E2M1_GRID]), device="cuda").reshape(1, 16)
    assert torch.equal(cache_format("nvfp4").roundtrip(grid), grid)
