"""`HFStrategy`: Hessian-free online certified unlearning ([HF] Algorithm 1 Stage III)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.trajectory import TrajectoryRecorder
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.functional import hf
from lightning_unlearn.functional.bounds import ModelConstants
from lightning_unlearn.functional.certified import uncertified_note
from lightning_unlearn.strategies.base import ForgetData, UnlearningUpdate
from lightning_unlearn.strategies.release import ReleasingStrategy
from lightning_unlearn.warnings import warn


def check_step_sizes(lrs: Tensor, constants: ModelConstants) -> str | None:
    """``None`` if every recorded step size satisfies ``eta <= 2/(M + lambda)`` with ``lambda > 0`` ([HF]
    Lemma 3 / Theorem 6: contraction ``rho < 1``), else the reason, naming lr, M and lambda."""
    lam, M = constants.strong_convexity, constants.smoothness
    if lam <= 0:
        return f"strong convexity lambda = {lam:g} (the ridge l2) must be positive ([HF] Assumption 1)"
    lr = float(lrs.max())
    if lr > constants.max_lr:
        return (
            f"step size lr = {lr:.4g} exceeds 2/(M + lambda) = {constants.max_lr:.4g} (M = {M:.4g}, lambda = "
            f"{lam:.4g}; "
            "[HF] Lemma 3 needs it for rho < 1): train with a smaller lr (see "
            "lightning_unlearn.privacy.recipe.propose_recipe)"
        )
    return None


class HFStrategy(ReleasingStrategy):
    """Forget samples by vector addition ``w_bar = w + sum_{u in U} a^{-u}`` (Alg. 1 line 13, Theorem 1), then noise.

    Works per request in a stream (online: each request adds its vectors to the noise-free
    internal model) and in batches (one request with many ids); by Theorem 1 both give the same
    internal model. Reads no data. Each release publishes ``internal + N(0, sigma^2 I)`` with
    fresh noise from the OS entropy source (``seed`` for experiments only: the certificate is then
    marked seeded, not private), calibrated by the analytic Gaussian mechanism ([AGM]) on
    ``gamma = sum over ALL samples deleted so far of the per-sample bound`` (sum form of Eq. (56),
    :func:`hf.per_sample_bound`). Every release is recorded in :attr:`accountant`; the certificate
    reports the total (epsilon, delta) of all releases so far, and ``budget`` refuses a release
    that would exceed it (nothing changes).

    Constants (Assumption 1): ``constants`` (e.g. :func:`~lightning_unlearn.functional.bounds.module_constants`,
    proved bounds for a linear model), or ``smoothness`` M and ``grad_bound`` G asserted by the
    caller (``"given"``), else the recorder's observed maxima (``"estimated"``: the certificate is
    then not certified). lambda is ``strong_convexity`` (default: the recorder's ``l2``).

    Recipe guard: a certified release requires every recorded step size (what the Trainer's
    optimizer and scheduler actually used) to satisfy ``eta <= 2/(M + lambda)`` with ``lambda > 0``
    (:func:`check_step_sizes`); otherwise ``forget`` raises ``ValueError`` naming lr, M and lambda.
    Uncertified releases (``noise=False``, ``sigma_override``) only warn.

    The noise-free internal model is :meth:`clean_parameters`; if the recorder has taken SGD
    steps since the last request (a new experience was learned), the module's current weights
    become the internal model (the published, noised state then continues).

    Deletion capacity: Eq. (21) with its O-constant set to 1 (:func:`hf.deletion_capacity`), or
    ``max_deletions``. Exceeding it warns (``capacity="warn"``) or raises ``ValueError`` and changes
    nothing (``capacity="error"``). The paper's Taylor-remainder step (Eq. (53)) is its own argument.

    Args:
        module: the trained module (its weights are replaced by the published model).
        recorder: the :class:`TrajectoryRecorder` that watched the fit.
        ledger: where executed requests are recorded.
        epsilon, delta, noise, sigma_override, seed, budget, accountant: the release
            (:class:`~lightning_unlearn.strategies.release.ReleasingStrategy`).
        constants, strong_convexity, smoothness, grad_bound: Assumption 1's constants (see above).
        capacity, max_deletions: the deletion capacity check (see above).

    Raises:
        ValueError: bad privacy parameters, ``capacity`` not ``"warn"``/``"error"``, or both
            ``constants`` and individual constants given.
    """

    method = "hf"
    epsilon: float
    delta: float

    def __init__(
        self,
        module: nn.Module,
        recorder: TrajectoryRecorder,
        ledger: Ledger | None = None,
        *,
        epsilon: float = 1.0,
        delta: float = 1e-5,
        constants: ModelConstants | None = None,
        strong_convexity: float | None = None,
        smoothness: float | None = None,
        grad_bound: float | None = None,
        noise: bool = True,
        sigma_override: float | None = None,
        capacity: str = "warn",
        max_deletions: int | None = None,
        seed: int | None = None,
        budget: float | tuple[float, float] | None = None,
        accountant: str = "pld",
    ) -> None:
        super().__init__(
            module,
            recorder,
            ledger,
            epsilon=epsilon,
            delta=delta,
            noise=noise,
            sigma_override=sigma_override,
            seed=seed,
            budget=budget,
            accountant=accountant,
        )
        if capacity not in ("warn", "error"):
            raise ValueError(f"capacity must be 'warn' or 'error', got {capacity!r}")
        if constants is not None and (smoothness, grad_bound, strong_convexity) != (None, None, None):
            raise ValueError("give either constants= or smoothness=/grad_bound=/strong_convexity=, not both")
        self.recorder: TrajectoryRecorder = recorder
        self.model_constants = constants
        self.strong_convexity, self.smoothness, self.grad_bound = strong_convexity, smoothness, grad_bound
        self.capacity, self.max_deletions = capacity, max_deletions
        self._internal: Tensor | None = None
        self._internal_step = -1

    def clean_parameters(self) -> Tensor:
        """The noise-free internal model ``w + sum a^{-u}`` (flat), before any published noise."""
        if self._internal is None or self._internal_step != self.recorder.n_steps:
            return hf.flat_params(self.module)
        return self._internal.clone()

    def constants(self) -> ModelConstants:
        """Assumption 1's (M, G, lambda) and their kind (see the class docstring)."""
        rec = self.recorder
        if self.model_constants is not None:
            c = self.model_constants
            if rec.l2 is not None and not math.isclose(c.strong_convexity, rec.l2, rel_tol=1e-9):
                raise ValueError(
                    f"constants are for lambda = {c.strong_convexity:g} but the recorded trajectory used l2 = "
                    f"{rec.l2:g}"
                )
            return c
        lam = float(rec.l2 or 0.0) if self.strong_convexity is None else float(self.strong_convexity)
        M = rec.smoothness if self.smoothness is None else self.smoothness
        G = rec.grad_max if self.grad_bound is None else self.grad_bound
        kind = "given" if self.smoothness is not None and self.grad_bound is not None else "estimated"
        return ModelConstants(smoothness=max(float(M), lam), grad_bound=float(G), strong_convexity=lam, kind=kind)

    def bound_terms(self, rows: Tensor, c: ModelConstants) -> dict[str, float]:
        """Per-sample bound terms (:func:`hf.per_sample_bound`) summed over ``rows``, and the constants used."""
        rec = self.recorder
        lrs = torch.tensor(rec.lrs, dtype=torch.float64)
        lam, M, G = c.strong_convexity, c.smoothness, c.grad_bound
        rho = hf.contraction_factor(lrs, lam, M)
        occ_rows, occ_steps = rec.occurrences()
        sizes = torch.tensor(rec.batch_sizes)
        c1 = c2 = 0.0
        for r in rows.tolist():
            t1, t2 = hf.per_sample_bound(occ_steps[occ_rows == r], lrs, sizes, G, rho)
            c1, c2 = c1 + t1, c2 + t2
        return {
            "taylor_term": c1,
            "gradient_mismatch_term": c2,
            "sensitivity": c1 + c2,
            "rho": rho,
            "strong_convexity": lam,
            "smoothness": M,
            "grad_bound": G,
            "steps": float(rec.n_steps),
            "lr0": float(lrs[0]),
            "lr_max": float(lrs.max()),
        }

    def _check_capacity(self, m: int, bounds: dict[str, float], dim: int) -> float:
        cap = (
            float(self.max_deletions)
            if self.max_deletions is not None
            else hf.deletion_capacity(self.epsilon, self.delta, bounds["lr0"], dim, bounds["rho"], int(bounds["steps"]))
        )
        if m > cap:
            msg = (
                f"HF deletion capacity exceeded: {m} deletions > capacity {cap:.3g} "
                "(Eq. (21), constant 1, or max_deletions)"
            )
            if self.capacity == "error":
                raise ValueError(msg)
            warn(msg + "; the (epsilon, delta) statement is outside the paper's deletion capacity", stacklevel=5)
        return float(cap)

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec = self.recorder
        d = hf.flat_params(self.module).numel()
        if rec.A is None or rec.A.shape[1] != d:
            raise ValueError(
                f"module has {d} trainable parameters but the HF statistics have "
                f"{None if rec.A is None else rec.A.shape[1]}"
            )
        rows = rec.rows_for(ids)
        deleted = (~rec.active[: rec.n_rows]).nonzero().flatten()
        all_rows = torch.cat([deleted, rows])
        c = self.constants()
        problem = check_step_sizes(torch.tensor(rec.lrs, dtype=torch.float64), c)
        if problem is not None and self.certified_release:
            raise ValueError(f"HF refuses a certified release: {problem}")
        if problem is not None:
            warn(f"HF recipe outside the theorem ({problem}); the release is not certified anyway", stacklevel=5)
        bounds = self.bound_terms(all_rows, c)
        bounds["capacity"] = self._check_capacity(int(all_rows.numel()), bounds, d)
        bounds["deleted_total"] = float(all_rows.numel())
        finite = math.isfinite(bounds["sensitivity"])
        if not finite and self.certified_release:
            raise ValueError(
                f"HF noise bound is infinite (rho = {bounds['rho']:.4g} over {rec.n_steps} steps): step size too "
                "large for M"
            )
        internal = self.clean_parameters()
        update = rec.row_sum(rows, internal)  # a^{-U} = sum_u a^{-u} (Theorem 1; a collective under DDP)
        internal = internal + update  # Alg. 1 line 13
        published = self._release(bounds["sensitivity"], internal)
        certificate = Certificate(
            method=self.method,
            exact=False,
            **published.certificate_fields(),
            bounds={**bounds, **published.sigma_bounds},
            statement=(
                f"HF Alg. 1 + Theorem 4: ||w_retrain - (w + a^{{-U}})|| <= gamma (sum form of Eq. (56), {c.kind} "
                "constants), "
                "analytic Gaussian mechanism"
                + uncertified_note(self.noise, self.sigma_override)
                + ("" if finite else f"; the bound is infinite (rho = {bounds['rho']:.4g} over {rec.n_steps} steps)")
            ),
            constants=c.kind,
            recipe="checked" if problem is None else "unchecked",
        )
        return UnlearningUpdate(
            certificate,
            weights=hf.unflatten(published.weights, hf.param_spec(self.module)),
            state={"_internal": internal, "_internal_step": rec.n_steps, **published.state},
            extra={
                "n_forgotten": int(ids.numel()),
                "noise_norm": float(published.noise.norm()),
                "update_norm": float(update.norm()),
            },
        )
