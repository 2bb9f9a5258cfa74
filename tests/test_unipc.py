"""LongLive 2.0's UniPC flow sampler (``sinkscope.generation.unipc``) against references:
the schedule from its formulas, a float64 UniPC written here from the paper's update rule,
diffusers' ``UniPCMultistepScheduler`` set up for flow prediction, and an exact flow."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from sinkscope.generation.unipc import UniPCFlowSampler, flow_unipc_schedule, predictor_orders


def reference_schedule(num_steps: int, shift: float, train: int = 1000) -> tuple[list[int], list[float]]:
    """Wan's flow UniPC schedule from its formulas, in numpy."""
    table = 1.0 - np.linspace(1, 1 / train, train)[::-1]  # the shift-1 training sigmas
    sigma_max, sigma_min = float(np.float32(table[0])), float(np.float32(table[-1]))
    u = np.linspace(sigma_max, sigma_min, num_steps + 1)[:-1]
    sigmas = shift * u / (1 + (shift - 1) * u)
    return [int(t) for t in np.trunc(sigmas * train)], [float(s) for s in np.float32([*sigmas, 0.0])]


def linear_velocity(dim: int, seed: int):
    """A toy velocity model: a fixed random linear map of x, scaled by the timestep, plus a bias (float64)."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(dim, dim, generator=g, dtype=torch.float64) / math.sqrt(4 * dim)
    bias = torch.randn(dim, generator=g, dtype=torch.float64)

    def model(x: torch.Tensor, timestep: float) -> torch.Tensor:
        return ((x.double() @ weight) * (0.5 + timestep / 1000) + bias).to(x.dtype)

    return model


def reference_unipc(
    model, x: torch.Tensor, timesteps: list[int], sigmas: list[float], order: int = 2
) -> list[torch.Tensor]:
    """UniPC-p with B(h) = e^h - 1, data prediction, in float64, from the paper's equations.

    Written with e^{-h} = sigma_t alpha_s / (alpha_t sigma_s) so that sigma_t = 0 needs no
    special case, and the corrector's 2x2 system solved by Cramer's rule. Returns the
    sample after every step.
    """
    n = len(timesteps)
    alpha = [1 - s for s in sigmas]
    lam = [math.log(a) - math.log(s) if s > 0 else math.inf for a, s in zip(alpha, sigmas)]

    def update(x_s, preds, s, p, new=None):
        """From sigma_s to sigma_{s+1} on the data predictions preds[..s] (and the new point)."""
        t = s + 1
        e_minus_h = sigmas[t] * alpha[s] / (alpha[t] * sigmas[s])
        b_h = e_minus_h - 1  # B(-h), the data-prediction form of e^h - 1
        out = sigmas[t] / sigmas[s] * x_s + alpha[t] * (1 - e_minus_h) * preds[s]
        if p == 2:
            h = lam[t] - lam[s]
            r1 = (lam[s - 1] - lam[s]) / h
            d1 = (preds[s - 1] - preds[s]) / r1
        if new is None:
            if p == 2:
                out = out - alpha[t] * b_h * 0.5 * d1
            return out
        if p == 1:
            return out - alpha[t] * b_h * 0.5 * (new - preds[s])
        z = -(lam[t] - lam[s])
        b1 = (math.exp(z) - 1 - z) / z / b_h  # 1! z phi_2(z) / B
        b2 = 2 * (math.exp(z) - 1 - z - z * z / 2) / (z * z) / b_h  # 2! z phi_3(z) / B
        rho1, rho_c = (b1 - b2) / (1 - r1), (b2 - r1 * b1) / (1 - r1)
        return out - alpha[t] * b_h * (rho1 * d1 + rho_c * (new - preds[s]))

    x = x.double()
    preds, samples = [], []
    last_x, last_p = None, 0
    for k in range(n):
        m = x - sigmas[k] * model(x, float(timesteps[k])).double()
        if k > 0:
            x = update(last_x, preds, k - 1, last_p, new=m)
        preds.append(m)
        p = min(order, n - k, k + 1)
        last_x, last_p = x, p
        x = update(x, preds, k, p)
        samples.append(x)
    return samples


@pytest.mark.parametrize("num_steps", [4, 2])
def test_the_schedule_is_wans_flow_unipc_schedule(num_steps):
    timesteps, sigmas = flow_unipc_schedule(num_steps, 5.0)
    ref_t, ref_s = reference_schedule(num_steps, 5.0)
    assert timesteps.dtype == torch.int64 and sigmas.dtype == torch.float32
    assert timesteps.tolist() == ref_t
    assert sigmas.tolist() == ref_s
    assert predictor_orders(num_steps) == ((1, 2, 2, 1) if num_steps == 4 else (1, 1))


def test_the_schedule_matches_the_values_longlive2s_own_scheduler_gives():
    # docs/longlive2.md, "The sampler": what set_timesteps(4, shift=5.0) of their file gives.
    timesteps, sigmas = flow_unipc_schedule(4, 5.0)
    assert timesteps.tolist() == [999, 937, 833, 624]
    assert torch.allclose(
        sigmas, torch.tensor([0.99979985, 0.93726546, 0.83305538, 0.62468737, 0.0]), rtol=0, atol=5e-8
    )


@pytest.mark.parametrize("num_steps, order", [(4, 2), (2, 2), (6, 2), (4, 1)])
def test_sampling_matches_a_float64_unipc_from_the_paper(num_steps, order):
    model = linear_velocity(24, seed=num_steps)
    noise = torch.randn(2, 3, 24, generator=torch.Generator().manual_seed(7))
    timesteps, sigmas = flow_unipc_schedule(num_steps, 5.0)
    expected = reference_unipc(model, noise, timesteps.tolist(), sigmas.tolist(), order)
    for dtype, tol in ((torch.float64, 2e-7), (torch.float32, 1e-6)):
        sampler = UniPCFlowSampler(num_steps, 5.0, order=order)
        x = noise.to(dtype)
        for k, t in enumerate(sampler.timesteps.tolist()):
            x = sampler.step(model(x, float(t)), x)
            assert x.dtype == dtype
            scale = expected[k].abs().max()
            assert (x.double() - expected[k]).abs().max() <= tol * scale, (dtype, k)


def _diffusers_flow_unipc(num_steps: int, shift: float):
    diffusers = pytest.importorskip("diffusers")
    scheduler_class = diffusers.UniPCMultistepScheduler
    if (
        "use_flow_sigmas" not in inspect.signature(scheduler_class.__init__).parameters
        or "sigmas" not in inspect.signature(scheduler_class.set_timesteps).parameters
    ):
        pytest.skip(f"diffusers {diffusers.__version__}'s UniPCMultistepScheduler has no flow sigmas")
    scheduler = scheduler_class(
        num_train_timesteps=1000,
        solver_order=2,
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=shift,
        predict_x0=True,
        solver_type="bh2",
        lower_order_final=True,
        final_sigmas_type="zero",
    )
    # diffusers' own flow sigmas start from linspace(1, 1/T); Wan's start from the training
    # table's float32(1 - 1/T) down to 0: hand it those, unshifted (it applies flow_shift).
    sigma_max = float(np.float32(1 - 1 / 1000))
    scheduler.set_timesteps(sigmas=np.linspace(sigma_max, 0.0, num_steps + 1)[:-1])
    return scheduler


@pytest.mark.parametrize("num_steps", [4, 2, 5])
def test_sampling_equals_diffusers_unipc_for_flow_prediction(num_steps):
    scheduler = _diffusers_flow_unipc(num_steps, 5.0)
    sampler = UniPCFlowSampler(num_steps, 5.0)
    assert torch.equal(scheduler.timesteps, sampler.timesteps)
    assert torch.equal(scheduler.sigmas, sampler.sigmas)
    model = linear_velocity(16, seed=3)
    ours = theirs = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(1))
    for t in scheduler.timesteps:
        velocity = model(theirs, float(t))
        theirs = scheduler.step(velocity, t, theirs, return_dict=False)[0]
        ours = sampler.step(velocity, ours)
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("num_steps", [4, 2])
def test_an_exact_velocity_lands_on_x0(num_steps):
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(2, 8, 6, generator=g, dtype=torch.float64)
    noise = torch.randn(2, 8, 6, generator=g, dtype=torch.float64)
    sampler = UniPCFlowSampler(num_steps, 5.0)
    sigmas = sampler.sigmas.double()
    x = (1 - sigmas[0]) * x0 + sigmas[0] * noise
    for k in range(num_steps):
        x = sampler.step(noise - x0, x)  # v = noise - x0 holds everywhere on the path
        on_path = (1 - sigmas[k + 1]) * x0 + sigmas[k + 1] * noise
        torch.testing.assert_close(x, on_path, rtol=0, atol=1e-6)
    assert sampler.sigma == 0.0
    torch.testing.assert_close(x, x0, rtol=0, atol=1e-6)


def test_a_sampler_serves_one_chunk_and_rejects_bad_settings():
    sampler = UniPCFlowSampler(2, 5.0)
    x = torch.zeros(3)
    for _ in range(2):
        x = sampler.step(torch.ones(3), x)
    with pytest.raises(RuntimeError, match="already finished"):
        sampler.step(torch.ones(3), x)
    with pytest.raises(ValueError, match="order"):
        UniPCFlowSampler(4, 5.0, order=3)
    with pytest.raises(ValueError, match="num_steps"):
        UniPCFlowSampler(0, 5.0)
