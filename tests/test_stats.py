"""The frame statistics against a float64 brute force on small random inputs."""

from __future__ import annotations

import pytest
import torch

from sinkscope.stats.attention import check_frame_layout, frame_attention_stats, triton_available


def brute_force(q, k, fsl, query_frames, key_frames, scale):
    """Materialize every score in float64, as the seed notebooks do, frame slice by slice."""
    q, k = q.double(), k.double()
    scores = torch.einsum("hqd,hkd->hqk", q, k) * scale
    probs = torch.softmax(scores, dim=-1)
    heads = q.shape[0]
    logit = torch.empty(heads, len(query_frames), len(key_frames), dtype=torch.float64)
    mass = torch.empty_like(logit)
    for a in range(len(query_frames)):
        for b in range(len(key_frames)):
            rows = slice(a * fsl, (a + 1) * fsl)
            cols = slice(b * fsl, (b + 1) * fsl)
            logit[:, a, b] = scores[:, rows, cols].mean(dim=(1, 2))
            mass[:, a, b] = probs[:, rows, cols].sum(dim=2).mean(dim=1)
    return logit, mass


def random_case(seed, *, heads, fsl, dim, query_frames, key_frames, dtype=torch.float32, offset=1.0):
    g = torch.Generator().manual_seed(seed)
    # Per-frame offsets make the frame means (and so logit_mean) clearly non-zero.
    q = torch.randn(heads, len(query_frames) * fsl, dim, generator=g)
    q += offset * torch.randn(heads, len(query_frames), 1, dim, generator=g).repeat_interleave(fsl, 1).flatten(1, 2)
    k = torch.randn(heads, len(key_frames) * fsl, dim, generator=g)
    k += offset * torch.randn(heads, len(key_frames), 1, dim, generator=g).repeat_interleave(fsl, 1).flatten(1, 2)
    return q.to(dtype), k.to(dtype)


CASES = [
    # (heads, fsl, dim, query frames, key frames): the last block of a global cache,
    # a first block, an independent first frame, a sliding window with 2 sink frames.
    (12, 7, 16, [6, 7, 8], list(range(9))),
    (2, 5, 8, [0, 1, 2], [0, 1, 2]),
    (3, 4, 6, [0], [0]),
    (4, 6, 16, [12, 13, 14], [0, 1, 8, 9, 10, 11, 12, 13, 14]),
    (1, 33, 32, [3, 4], [0, 3, 4]),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("seed", [0, 1])
def test_reference_matches_float64_brute_force(case, seed):
    heads, fsl, dim, qf, kf = CASES[case]
    q, k = random_case(seed * 17 + case, heads=heads, fsl=fsl, dim=dim, query_frames=qf, key_frames=kf)
    scale = dim**-0.5
    logit, mass = frame_attention_stats(q, k, frame_seq_length=fsl, query_frames=qf, key_frames=kf, backend="torch")
    ref_logit, ref_mass = brute_force(q, k, fsl, qf, kf, scale)
    assert logit.dtype == mass.dtype == torch.float32
    assert logit.shape == mass.shape == (heads, len(qf), len(kf))
    torch.testing.assert_close(logit.double(), ref_logit, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mass.double(), ref_mass, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(mass.sum(-1).double(), torch.ones(heads, len(qf), dtype=torch.float64), atol=1e-5, rtol=0)


def test_small_budget_streams_exactly():
    from sinkscope.stats.reference import prob_mass_chunked

    qf, kf = [4, 5], [0, 3, 4, 5]
    q, k = random_case(3, heads=3, fsl=9, dim=8, query_frames=qf, key_frames=kf)
    full = prob_mass_chunked(q, k, 9, 2, 4, 8**-0.5)
    # A budget of one query row at a time still gives the same numbers.
    tiny = prob_mass_chunked(q, k, 9, 2, 4, 8**-0.5, score_budget=1)
    torch.testing.assert_close(full, tiny)


def test_custom_scale_and_bf16_inputs():
    qf, kf = [2], [0, 1, 2]
    q, k = random_case(5, heads=2, fsl=8, dim=16, query_frames=qf, key_frames=kf, dtype=torch.bfloat16)
    logit, mass = frame_attention_stats(q, k, frame_seq_length=8, query_frames=qf, key_frames=kf, scale=0.3)
    ref_logit, ref_mass = brute_force(q, k, 8, qf, kf, 0.3)
    torch.testing.assert_close(logit.double(), ref_logit, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mass.double(), ref_mass, rtol=1e-5, atol=1e-7)


def test_strided_views_like_the_kv_cache():
    # The capture passes q[0].transpose(0, 1) of a [B, L, H, D] tensor: no copy needed.
    qf, kf = [1], [0, 1]
    q4 = torch.randn(1, 5, 3, 8)
    k4 = torch.randn(1, 10, 3, 8)
    q, k = q4[0].transpose(0, 1), k4[0].transpose(0, 1)
    logit, mass = frame_attention_stats(q, k, frame_seq_length=5, query_frames=qf, key_frames=kf)
    ref_logit, ref_mass = brute_force(q, k, 5, qf, kf, 8**-0.5)
    torch.testing.assert_close(logit.double(), ref_logit, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mass.double(), ref_mass, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "q_shape, k_shape, qf, kf, message",
    [
        ((2, 10, 4), (2, 15, 4), [0], [0, 1, 2], "q has 10 tokens"),
        ((2, 5, 4), (2, 14, 4), [0], [0, 1, 2], "k has 14 tokens"),
        ((2, 5, 4), (3, 15, 4), [0], [0, 1, 2], "differ in heads"),
        ((2, 5), (2, 15, 4), [0], [0, 1, 2], "must be \\[H, L, D\\]"),
        ((2, 5, 4), (2, 10, 4), [0], [1, 1], "repeat a frame"),
    ],
)
def test_bad_layouts_are_named(q_shape, k_shape, qf, kf, message):
    with pytest.raises(ValueError, match=message):
        check_frame_layout(torch.zeros(q_shape), torch.zeros(k_shape), 5, qf, kf)


def test_unknown_backend():
    q = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="unknown statistics backend"):
        frame_attention_stats(q, q, frame_seq_length=4, query_frames=[0], key_frames=[0], backend="cuda-magic")


# The Triton kernels in Triton's CPU interpreter: tests/test_stats_calls.py.


@pytest.mark.gpu
@pytest.mark.skipif(not triton_available(), reason="needs a CUDA device and triton")
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_path_matches_cpu_reference(case, dtype):
    heads, fsl, dim, qf, kf = CASES[case]
    q, k = random_case(case, heads=heads, fsl=fsl * 40, dim=max(dim, 16), query_frames=qf, key_frames=kf, dtype=dtype)
    cpu = frame_attention_stats(q, k, frame_seq_length=fsl * 40, query_frames=qf, key_frames=kf, backend="torch")
    gpu = frame_attention_stats(q.cuda(), k.cuda(), frame_seq_length=fsl * 40, query_frames=qf, key_frames=kf)
    for ref, got in zip(cpu, gpu):
        assert got.is_cuda
        torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=1e-5)


def test_inputs_must_share_dtype_and_device():
    q = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="differ in dtype or device"):
        frame_attention_stats(q, q.double(), frame_seq_length=4, query_frames=[0], key_frames=[0])


def test_triton_backend_refuses_cpu_tensors():
    q = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="triton backend needs CUDA tensors"):
        frame_attention_stats(q, q, frame_seq_length=4, query_frames=[0], key_frames=[0], backend="triton")
