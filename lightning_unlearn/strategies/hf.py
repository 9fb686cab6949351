"""`HFStrategy`: Hessian-free online certified unlearning (Qiao et al., Algorithm 1 Stage III)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.trajectory import TrajectoryRecorder
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.functional import hf
from lightning_unlearn.functional.certified import gaussian_sigma, uncertified_note
from lightning_unlearn.strategies.base import ForgetData, UnlearningStrategy, UnlearningUpdate


class HFStrategy(UnlearningStrategy):
    """Forget samples by vector addition ``w_bar = w + sum_{u in U} a^{-u}`` (Alg. 1 line 13, Theorem 1), then noise.

    Works per request in a stream (online: each request adds its vectors to the noise-free
    internal model) and in batches (one request with many ids); by Theorem 1 both give the same
    internal model. Reads no data. Each release publishes ``internal + N(0, sigma^2 I)`` with
    fresh noise, ``sigma = gamma sqrt(2 ln(1.25/delta)) / epsilon`` (analytic Gaussian mechanism
    for epsilon > 1), where the sensitivity ``gamma`` (``certificate.bounds["sensitivity"]``) is the
    sum over ALL samples deleted so far of the per-sample bound (sum form of Eq. (56),
    :func:`hf.per_sample_bound`; "m x per-sample bound" generalised to the samples' own terms). The constants are lambda = ``strong_convexity``
    (default: the module's ``l2``), M = ``smoothness`` and G = ``grad_bound`` (defaults: the
    recorder's observed maxima, which are estimates, not proofs). Caveats: the bound
    assumes Assumption 1 (strongly convex, e.g. L2-regularised logistic regression); the paper's
    Taylor-remainder step is heuristic; repeated releases compose and are not accounted for.

    The noise-free internal model is :meth:`clean_parameters`; if the recorder has taken SGD
    steps since the last request (a new experience was learned), the module's current weights
    become the internal model (the published, noised state then continues).

    Deletion capacity: Eq. (21) with its O-constant set to 1 (:func:`hf.deletion_capacity`), or
    ``max_deletions``. Exceeding it warns (``capacity="warn"``, documented: the guarantee is
    then outside the paper's capacity) or raises ``ValueError`` and changes nothing
    (``capacity="error"``).

    ``noise=False`` (pre-noise weights) or ``sigma_override`` (a fixed std, as the paper's
    ResNet experiments used) give an uncertified certificate (``epsilon=None``); the bound terms
    and the formula's sigma stay in ``bounds``.
    """

    method = "hf"

    def __init__(
        self,
        module: nn.Module,
        recorder: TrajectoryRecorder,
        ledger: Ledger | None = None,
        *,
        epsilon: float = 1.0,
        delta: float = 1e-5,
        strong_convexity: float | None = None,
        smoothness: float | None = None,
        grad_bound: float | None = None,
        noise: bool = True,
        sigma_override: float | None = None,
        capacity: str = "warn",
        max_deletions: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(module, recorder, ledger)
        if capacity not in ("warn", "error"):
            raise ValueError(f"capacity must be 'warn' or 'error', got {capacity!r}")
        gaussian_sigma(1.0, epsilon, delta)  # validates epsilon, delta
        self.recorder: TrajectoryRecorder = recorder
        self.epsilon, self.delta = float(epsilon), float(delta)
        self.strong_convexity, self.smoothness, self.grad_bound = strong_convexity, smoothness, grad_bound
        self.noise, self.capacity, self.max_deletions = noise, capacity, max_deletions
        self.sigma_override = sigma_override
        self.generator = generator
        self._internal: Tensor | None = None
        self._internal_step = -1

    def clean_parameters(self) -> Tensor:
        """The noise-free internal model ``w + sum a^{-u}`` (flat), before any published noise."""
        if self._internal is None or self._internal_step != self.recorder.n_steps:
            return hf.flat_params(self.module)
        return self._internal.clone()

    def bound_terms(self, rows: Tensor) -> dict[str, float]:
        """Per-sample bound terms (:func:`hf.per_sample_bound`) summed over ``rows``, and the constants used."""
        rec = self.recorder
        lrs = torch.tensor(rec.lrs, dtype=torch.float64)
        lam = float(rec.l2) if self.strong_convexity is None else self.strong_convexity
        M = rec.smoothness if self.smoothness is None else self.smoothness
        G = rec.grad_max if self.grad_bound is None else self.grad_bound
        rho = hf.contraction_factor(lrs, lam, M)
        occ_rows, occ_steps = rec.occurrences()
        sizes = torch.tensor(rec.batch_sizes)
        c1 = c2 = 0.0
        for r in rows.tolist():
            t1, t2 = hf.per_sample_bound(occ_steps[occ_rows == r], lrs, sizes, G, rho)
            c1, c2 = c1 + t1, c2 + t2
        return {"taylor_term": c1, "gradient_mismatch_term": c2, "sensitivity": c1 + c2, "rho": rho,
                "strong_convexity": lam, "smoothness": M, "grad_bound": G, "steps": float(rec.n_steps), "lr0": float(lrs[0])}

    def _check_capacity(self, m: int, bounds: dict[str, float], dim: int) -> float:
        cap = self.max_deletions
        if cap is None:
            cap = hf.deletion_capacity(self.epsilon, self.delta, bounds["lr0"], dim, bounds["rho"], int(bounds["steps"]))
        if m > cap:
            msg = f"HF deletion capacity exceeded: {m} deletions > capacity {cap:.3g} (Eq. (21), constant 1, or max_deletions)"
            if self.capacity == "error":
                raise ValueError(msg)
            warnings.warn(msg + "; the (epsilon, delta) statement is outside the paper's deletion capacity", stacklevel=4)
        return float(cap)

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec = self.recorder
        d = hf.flat_params(self.module).numel()
        if rec.A is None or rec.A.shape[1] != d:
            raise ValueError(f"module has {d} trainable parameters but the HF statistics have {None if rec.A is None else rec.A.shape[1]}")
        rows = rec.rows_for(ids)
        deleted = (~rec.active[: rec.n_rows]).nonzero().flatten()
        all_rows = torch.cat([deleted, rows])
        bounds = self.bound_terms(all_rows)
        bounds["capacity"] = self._check_capacity(int(all_rows.numel()), bounds, d)
        bounds["deleted_total"] = float(all_rows.numel())
        if bounds["rho"] >= 1:
            warnings.warn(f"HF contraction factor rho = {bounds['rho']:.4g} >= 1 (Lemma 3 needs eta < 2/(M + lambda) and lambda > 0): "
                          "the bound does not decay", stacklevel=4)
        certified = self.noise and self.sigma_override is None
        finite = math.isfinite(bounds["sensitivity"])
        if not finite and certified:
            raise ValueError(f"HF noise bound is infinite (rho = {bounds['rho']:.4g} over {rec.n_steps} steps): step size too large for M")
        sigma = gaussian_sigma(bounds["sensitivity"], self.epsilon, self.delta) if finite else math.inf
        internal = self.clean_parameters()
        update = rec.A[rows].to(internal).sum(0)  # a^{-U} = sum_u a^{-u} (Theorem 1)
        internal = internal + update  # Alg. 1 line 13
        std = sigma if self.sigma_override is None else self.sigma_override
        noise = std * torch.randn(internal.shape, generator=self.generator, dtype=internal.dtype) if self.noise else torch.zeros_like(internal)
        if not torch.isfinite(internal + noise).all():
            raise ValueError("HF update is not finite (diverged trajectory statistics?)")
        certificate = Certificate(
            method=self.method,
            exact=False,
            epsilon=self.epsilon if certified else None,
            delta=self.delta if certified else None,
            sigma=std if self.noise else None,
            bounds={**bounds, "sigma_formula": sigma},
            statement=(
                "HF Alg. 1 + Theorem 4: ||w_retrain - (w + a^{-U})|| <= gamma (sum form of Eq. (56), estimated "
                "constants), Gaussian mechanism" + uncertified_note(self.noise, self.sigma_override)
                + ("" if finite else f"; the bound is infinite (rho = {bounds['rho']:.4g} over {rec.n_steps} steps)")
            ),
        )
        return UnlearningUpdate(
            certificate,
            weights=hf.unflatten(internal + noise, hf.param_spec(self.module)),
            state={"_internal": internal, "_internal_step": rec.n_steps},
            extra={"n_forgotten": int(ids.numel()), "noise_norm": float(noise.norm()), "update_norm": float(update.norm())},
        )
