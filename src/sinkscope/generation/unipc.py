"""LongLive 2.0's few-step sampler: multistep UniPC on a flow-matching schedule.

LongLive 2.0 builds, for every chunk, Wan's ``FlowUniPCMultistepScheduler(1000, shift=1)``
and calls ``set_timesteps(num_steps, shift=5.0)``; the solver is order 2, ``bh2``,
data prediction (``predict_x0``), ``lower_order_final``, final sigma 0, no corrector
disabled, no thresholding. ``UniPCFlowSampler`` is that sampler, written from the
equations below (UniPC: Zhao et al., "UniPC: A Unified Predictor-Corrector Framework for
Fast Sampling of Diffusion Models", NeurIPS 2023), with one instance per chunk.

Schedule (``flow_unipc_schedule``), T = ``num_train_timesteps``, N = ``num_steps``, s = shift:

- the training table at shift 1 is sigma_j = 1 - a_j with a = linspace(1, 1/T, T) reversed,
  held in float32, so sigma_max = float32(1 - 1/T) (0.999 for T = 1000) and sigma_min = 0;
- u_k = sigma_max + k (sigma_min - sigma_max) / N, k = 0..N-1 (numpy's linspace, float64);
- sigma_k = s u_k / (1 + (s - 1) u_k) (float64), and sigma_N = 0 (final sigma "zero");
- the model's timestep is t_k = T sigma_k truncated to an integer (int64); the sigmas the
  update uses are float32(sigma_k). LongLive hands t_k to the model as float32.

For N = 4, s = 5, T = 1000 (the values LongLive's own file gives):

    k          0            1            2            3            4
    t_k        999          937          833          624          -
    sigma_k    0.99979985   0.93726546   0.83305538   0.62468737   0
    UniP order 1            2            2            1
    UniC order -            1            2            2

(N = 2, s = 5: t = 999, 833; sigma = 0.99979985, 0.83305538, 0; orders 1, 1.)

Flow matching in UniPC's terms: x_t = alpha_t x0 + sigma_t eps with alpha_t = 1 - sigma_t;
the half log-SNR is lambda_t = log alpha_t - log sigma_t (+inf at sigma = 0). The model
returns the velocity v = eps - x0, turned into the data prediction m = x - sigma v.

The update from sigma_s (step k, sample x_s, data predictions m_k, m_{k-1}, ...) to sigma_t
(= sigma_{k+1}), with h = lambda_t - lambda_s and, for data prediction, the variable
hh = -h; the "bh2" variant takes B(hh) = e^hh - 1 (``expm1``):

- UniP-p, the predictor (p = 1, 2):
      x_t = (sigma_t / sigma_s) x_s - alpha_t (e^hh - 1) m_k - alpha_t B(hh) rho_p D_1
  with r_1 = (lambda_{k-1} - lambda_s) / h and D_1 = (m_{k-1} - m_k) / r_1; order 1 has no
  last term, order 2 takes rho_p = 1/2 (UniPC's choice for p = 2 in place of solving its
  one-equation system).
- UniC-p, the corrector, run at the start of step k >= 1 once m_k (from the *uncorrected*
  x_k) is known, redoing the previous predictor with m_k added as the last point:
      x_k^c = (sigma_k / sigma_{k-1}) x_{k-1}^c - alpha_k (e^hh - 1) m_{k-1}
              - alpha_k B(hh) (rho_1 D_1 + rho_c (m_k - m_{k-1}))
  (h now from sigma_{k-1} to sigma_k, r_1 and D_1 from m_{k-2}); p is the order the
  previous predictor used. Order 1: rho_c = 1/2 and no D_1 term. Order 2: (rho_1, rho_c)
  solve  [1 1; r_1 1] rho = (g_1 / B(hh), 2 g_2 / B(hh)),  with g_1 = (e^hh - 1)/hh - 1 =
  hh phi_2(hh) and g_2 = g_1 / hh - 1/2 = hh phi_3(hh) (UniPC's order conditions,
  sum_m rho_m r_m^(i-1) = i! hh phi_(i+1)(hh) / B(hh)).
- Orders: step k's predictor uses p_k = min(order, N - k, k + 1): one point to start
  (warm-up), at most ``order``, and first order again on the last step
  (``lower_order_final``). The corrector at step k uses p_{k-1}.
- The last step goes to sigma = 0: lambda = +inf, e^hh - 1 = -1, so x_N = m_{N-1}: the
  output is the last call's data prediction, and the last corrector does not change it.

Precision follows LongLive's file so that the same inputs give the same bits: the sigmas
are float32; every scalar coefficient (logs, ``expm1``, ratios, the corrector's 2x2 solve)
is a 0-d float32 tensor on the CPU (the solve on the latents' device); rho is cast to
the latents' dtype; every tensor expression is evaluated in the latents' dtype, in
their order of operations.
"""

from __future__ import annotations

import torch

# LongLive 2.0's settings (its inference config and the scheduler it builds per chunk).
LONGLIVE2_STEPS = 4
LONGLIVE2_SHIFT = 5.0


def flow_unipc_schedule(
    num_steps: int, shift: float, num_train_timesteps: int = 1000
) -> tuple[torch.Tensor, torch.Tensor]:
    """(timesteps int64 [N], sigmas float32 [N+1]) of the schedule above; sigmas[N] = 0."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, not {num_steps}")
    if not shift > 0:
        raise ValueError(f"shift must be positive, not {shift}")
    # sigma_max as the float32 training table holds it; sigma_min is exactly 0.
    sigma_max = float(torch.tensor(1.0 - 1.0 / num_train_timesteps, dtype=torch.float32))
    sigma_min = 0.0
    # numpy's linspace rule (start + k * step, float64), without its end point.
    spacing = (sigma_min - sigma_max) / num_steps
    unshifted = [k * spacing + sigma_max for k in range(num_steps)]
    shifted = [shift * u / (1 + (shift - 1) * u) for u in unshifted]
    timesteps = torch.tensor([int(s * num_train_timesteps) for s in shifted], dtype=torch.int64)
    sigmas = torch.tensor([*shifted, 0.0], dtype=torch.float64).to(torch.float32)
    return timesteps, sigmas


def predictor_orders(num_steps: int, order: int = 2) -> tuple[int, ...]:
    """The UniP order of each step: warm-up from 1, at most ``order``, 1 on the last step."""
    return tuple(min(order, num_steps - k, k + 1) for k in range(num_steps))


class UniPCFlowSampler:
    """One chunk's UniPC flow sampler (LongLive 2.0's; see the module docstring).

    Call the model at ``timesteps[k]`` on the current sample, then ``step(velocity, x)``
    gives the sample at the next sigma; after ``num_steps`` steps it is the clean latent.
    The sampler keeps its own history (data predictions, the last sample, the last
    order): build a new one for each chunk, as LongLive does.
    """

    def __init__(
        self,
        num_steps: int = LONGLIVE2_STEPS,
        shift: float = LONGLIVE2_SHIFT,
        order: int = 2,
        num_train_timesteps: int = 1000,
    ) -> None:
        if order not in (1, 2):
            raise ValueError(f"UniPC order must be 1 or 2, not {order}")
        self.num_steps = int(num_steps)
        self.shift = float(shift)
        self.order = int(order)
        self.timesteps, self.sigmas = flow_unipc_schedule(self.num_steps, self.shift, num_train_timesteps)
        self.orders = predictor_orders(self.num_steps, self.order)
        self.step_index = 0
        self._predictions: list[torch.Tensor] = []  # m_k, oldest first, at most ``order``
        self._last_sample: torch.Tensor | None = None  # x_{k-1}^c, the last predictor's start
        self._last_order = 0

    @property
    def sigma(self) -> float:
        """The current sample's noise level, sigma_k."""
        return float(self.sigmas[self.step_index])

    def _alpha_sigma_lambda(self, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sigma = self.sigmas[k]
        alpha = 1 - sigma
        return alpha, sigma, torch.log(alpha) - torch.log(sigma)

    def step(self, model_output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The sample at sigma_{k+1} from the velocity the model gave at ``timesteps[k]`` on ``x``."""
        k = self.step_index
        if k >= self.num_steps:
            raise RuntimeError(f"UniPC sampler of {self.num_steps} steps already finished; build a new one per chunk")
        prediction = x - self.sigmas[k] * model_output  # m_k = x - sigma_k v, from the uncorrected x_k
        if k > 0:
            x = self._correct(prediction)
        self._predictions = [*self._predictions, prediction][-self.order :]
        order = self.orders[k]
        self._last_sample, self._last_order = x, order
        x_next = self._predict(x, order, k)
        self.step_index = k + 1
        return x_next

    def _predict(self, x: torch.Tensor, order: int, k: int) -> torch.Tensor:
        """UniP-p from sigma_k (``x``, m_k = the newest prediction) to sigma_{k+1}."""
        alpha_t, sigma_t, lambda_t = self._alpha_sigma_lambda(k + 1)
        _, sigma_s, lambda_s = self._alpha_sigma_lambda(k)
        h = lambda_t - lambda_s
        hh = -h
        phi = torch.expm1(hh)  # hh phi_1(hh) = e^hh - 1
        b_h = torch.expm1(hh)  # B(hh) of bh2
        m0 = self._predictions[-1]
        x_next = sigma_t / sigma_s * x - alpha_t * phi * m0
        if order == 2:
            _, _, lambda_1 = self._alpha_sigma_lambda(k - 1)
            r1 = (lambda_1 - lambda_s) / h
            d1 = (self._predictions[-2] - m0) / r1
            rho = torch.tensor(0.5, dtype=x.dtype, device=x.device)
            x_next = x_next - alpha_t * b_h * (rho * d1)
        return x_next.to(x.dtype)

    def _correct(self, prediction: torch.Tensor) -> torch.Tensor:
        """UniC-p: x_k^c from x_{k-1}^c, m_{k-1} (and m_{k-2}) and the new m_k."""
        k, order, x = self.step_index, self._last_order, self._last_sample
        assert x is not None
        alpha_t, sigma_t, lambda_t = self._alpha_sigma_lambda(k)
        _, sigma_s, lambda_s = self._alpha_sigma_lambda(k - 1)
        h = lambda_t - lambda_s
        hh = -h
        phi = torch.expm1(hh)
        b_h = torch.expm1(hh)
        m0 = self._predictions[-1]
        base = sigma_t / sigma_s * x - alpha_t * phi * m0
        change = prediction - m0
        if order == 1:
            rho_c = torch.tensor(0.5, dtype=x.dtype, device=x.device)
            correction = rho_c * change
        else:
            _, _, lambda_1 = self._alpha_sigma_lambda(k - 2)
            r1 = (lambda_1 - lambda_s) / h
            d1 = (self._predictions[-2] - m0) / r1
            g1 = phi / hh - 1  # hh phi_2(hh)
            g2 = g1 / hh - 0.5  # hh phi_3(hh)
            points = torch.stack([r1, torch.ones((), dtype=r1.dtype)]).to(x.device)
            system = torch.stack([points**0, points**1])
            rhs = torch.stack([g1 * 1 / b_h, g2 * 2 / b_h]).to(x.device)
            rho = torch.linalg.solve(system, rhs).to(x.dtype)
            correction = rho[0] * d1 + rho[1] * change
        return (base - alpha_t * b_h * correction).to(x.dtype)
