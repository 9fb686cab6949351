"""`NewtonStepStrategy` ([NS]) and `InfinitesimalJackknifeStrategy` ([IJ]): [HF]'s Hessian-based baselines."""

from __future__ import annotations

import math
from abc import abstractmethod

from torch import Tensor, nn

from lightning_unlearn.callbacks.newton import HessianSumRecorder
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.functional import hf
from lightning_unlearn.functional import newton as nt
from lightning_unlearn.functional.bounds import ModelConstants
from lightning_unlearn.functional.certified import uncertified_note
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.strategies.base import ForgetData, UnlearningUpdate
from lightning_unlearn.strategies.release import ReleasingStrategy
from lightning_unlearn.warnings import warn


class _SecondOrderStrategy(ReleasingStrategy):
    """What [NS] and [IJ] share: every request recomputes the step from the trained model ``w`` for ALL the
    samples forgotten so far (``U``, ``m`` of them; [NS] Alg. 2 takes every deletion at once), then publishes
    ``internal + N(0, sigma^2 I)`` through :class:`~lightning_unlearn.strategies.release.ReleasingStrategy`
    (analytic Gaussian mechanism, [AGM], on the bound ``gamma`` of :mod:`lightning_unlearn.functional.newton`;
    [NS]'s classical ``gamma sqrt(2 ln(1.25/delta))/epsilon`` is reported as ``sigma_classical``; every release
    accounted). Needs the samples to forget (``data``): their gradients at ``w``.

    The running gradient sum ``G = sum_{u in U} grad l(w; u)`` is the strategy's own state, never written by
    the library (for a single sample it is that sample's gradient); a new strategy on a recorder whose
    samples were forgotten by another strategy refuses, since it cannot recover ``G``.

    Constants: ``constants`` (L = ``grad_bound``, beta = ``smoothness``, lambda = ``strong_convexity``, e.g.
    :func:`~lightning_unlearn.functional.bounds.module_constants`) and ``hessian_lipschitz`` M (e.g.
    :func:`~lightning_unlearn.functional.newton.hessian_lipschitz_bound`), else the recorder's estimates
    (largest per-sample gradient norm, top eigenvalue of the mean Hessian, lambda = ``l2``: ``"estimated"``,
    not certified). Without M the bound is infinite: only uncertified releases (``noise=False``,
    ``sigma_override``) are possible. Recipe: ``"checked"`` only if the recorded model was the minimiser
    (stationarity within the recorder's ``tolerance``) and ``m <= n/2``; otherwise a warning, and the
    certificate is not certified.

    Args:
        module: the trained module (its weights are replaced by the published model).
        recorder: the :class:`HessianSumRecorder` that watched the fit.
        ledger: where executed requests are recorded.
        epsilon, delta, noise, sigma_override, seed, budget, accountant: the release
            (:class:`~lightning_unlearn.strategies.release.ReleasingStrategy`).
        constants, hessian_lipschitz: [NS]'s constants (see above).

    Raises:
        ValueError: the recorder is not a :class:`HessianSumRecorder` of this method's ``form``, or bad
            privacy parameters.
    """

    form: str
    reads_data = True
    needs_forget_data = True
    epsilon: float
    delta: float

    def __init__(
        self,
        module: nn.Module,
        recorder: HessianSumRecorder,
        ledger: Ledger | None = None,
        *,
        epsilon: float = 1.0,
        delta: float = 1e-5,
        constants: ModelConstants | None = None,
        hessian_lipschitz: float | None = None,
        noise: bool = True,
        sigma_override: float | None = None,
        seed: int | None = None,
        budget: float | tuple[float, float] | None = None,
        accountant: str = "pld",
    ) -> None:
        if not isinstance(recorder, HessianSumRecorder) or recorder.form != self.form:
            got = getattr(recorder, "form", type(recorder).__name__)
            raise ValueError(f"{type(self).__name__} needs a HessianSumRecorder(form={self.form!r}), got {got!r}")
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
        if hessian_lipschitz is not None and not hessian_lipschitz >= 0:
            raise ValueError(f"hessian_lipschitz must be >= 0, got {hessian_lipschitz}")
        self.recorder: HessianSumRecorder = recorder
        self.model_constants, self.hessian_lipschitz = constants, hessian_lipschitz
        self._grad_sum: Tensor | None = None  # G over the samples this strategy forgot
        self._forgotten = 0

    def constants(self) -> ModelConstants:
        """L, beta, lambda and their kind (see the class docstring)."""
        rec = self.recorder
        if self.model_constants is not None:
            c = self.model_constants
            if rec.l2 is not None and not math.isclose(c.strong_convexity, rec.l2, rel_tol=1e-9):
                raise ValueError(
                    f"constants are for lambda = {c.strong_convexity:g} but the recorded fit used l2 = {rec.l2:g}"
                )
            return c
        lam = float(rec.l2 or 0.0)
        return ModelConstants(
            smoothness=max(rec.smoothness, lam), grad_bound=rec.grad_max, strong_convexity=lam, kind="estimated"
        )

    def clean_parameters(self) -> Tensor:
        """The noise-free internal model ``w + step(U)`` (flat) after the last request; the module's weights if none."""
        rec = self.recorder
        if self._grad_sum is None or rec.theta is None:
            return hf.flat_params(self.module)
        theta = rec.theta.to(self._grad_sum)
        return theta + self._step_for(self._grad_sum, self._forgotten, rec.matrix)[0]

    def _gradient_sum(self, ids: Tensor, data: ForgetData) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``G`` including ``ids``, the trained model ``w`` (flat, on the module's device and dtype) and the
        samples' inputs and labels (checked against what was learned)."""
        rec = self.recorder
        if rec.theta is None:
            raise ValueError(f"{type(rec).__name__} holds no trained model")
        flat = hf.flat_params(self.module)
        if flat.numel() != rec.theta.numel():
            raise ValueError(
                f"module has {flat.numel()} trainable parameters but the recorded Hessian is for {rec.theta.numel()}"
            )
        before = int(self.catalog.forgotten.sum())
        if before != self._forgotten:
            raise ValueError(
                f"{before} samples were forgotten without this {type(self).__name__} (e.g. before a checkpoint): "
                f"its step needs the sum of their gradients at the trained model, which is not kept"
            )
        theta = rec.theta.to(flat)
        x, y = (t.to(theta.device) for t in self.forget_samples(ids, data))
        with eval_mode(self.module):
            g = hf.per_sample_grads(rec.module_loss(self.module), theta, x, y)
        G = g.sum(0) if self._grad_sum is None else self._grad_sum + g.sum(0)
        return G, theta, x, y

    @abstractmethod
    def _step_for(self, G: Tensor, m: int, matrix: Tensor | None) -> tuple[Tensor, bool]:
        """The step from ``w`` for ``m`` forgotten samples with gradient sum ``G`` and the recorder's ``matrix``, and
        whether the damped Hessian it solves with is positive definite."""

    @abstractmethod
    def _bound(self, m: int, c: ModelConstants, M: float) -> dict[str, float]:
        """``gamma`` and its terms for ``m`` forgotten samples."""

    def _publish(self, ids: Tensor, G: Tensor, internal: Tensor, statement: str) -> UnlearningUpdate:
        rec, m = self.recorder, self._forgotten + int(ids.numel())
        c = self.constants()
        M = math.inf if self.hessian_lipschitz is None else float(self.hessian_lipschitz)
        bounds = self._bound(m, c, M)
        problems = []
        if rec.stationarity > rec.tolerance:
            problems.append(f"the recorded model is not the minimiser (||mean grad l|| = {rec.stationarity:.3g})")
        if 2 * m > rec.n:
            problems.append(f"m = {m} deletions exceed n/2 = {rec.n / 2:g} ([NS]'s lemma)")
        finite = math.isfinite(bounds["sensitivity"])
        if not finite and self.certified_release:
            why = "hessian_lipschitz is not given" if self.hessian_lipschitz is None else "; ".join(problems)
            raise ValueError(
                f"{self.method} noise bound is infinite ({why or f'lambda = {c.strong_convexity:g}'}): no certified "
                "release; pass hessian_lipschitz= and train a strongly convex loss (l2 > 0), or use noise=False or "
                "sigma_override"
            )
        if problems:
            warn(
                f"{self.method} outside its theorem: {'; '.join(problems)} (not repeated for later requests with "
                "the same failing assumptions)",
                stacklevel=5,
                cause=(f"{self.method} outside its theorem", rec.stationarity > rec.tolerance, 2 * m > rec.n),
            )
        published = self._release(bounds["sensitivity"], internal)
        bounds = {
            **bounds,
            **published.sigma_bounds,
            "lipschitz": c.grad_bound,
            "smoothness": c.smoothness,
            "strong_convexity": c.strong_convexity,
            "hessian_lipschitz": M,
            "damping": rec.damping,
            "stationarity": rec.stationarity,
            "deleted_total": float(m),
            "n": float(rec.n),
        }
        kind = c.kind if self.hessian_lipschitz is not None else "estimated"
        certificate = Certificate(
            method=self.method,
            exact=False,
            **published.certificate_fields(),
            bounds=bounds,
            statement=statement
            + f" ({kind} constants), analytic Gaussian mechanism"
            + uncertified_note(self.noise, self.sigma_override),
            constants=kind,
            recipe="unchecked" if problems else "checked",
        )
        return UnlearningUpdate(
            certificate,
            weights=hf.unflatten(published.weights, hf.param_spec(self.module)),
            state={"_grad_sum": G, "_forgotten": m, **published.state},
            extra={
                "n_forgotten": int(ids.numel()),
                "noise_norm": float(published.noise.norm()),
                "update_norm": float((internal - rec.theta.to(internal)).norm()) if rec.theta is not None else 0.0,
            },
        )


class NewtonStepStrategy(_SecondOrderStrategy):
    """[NS]: the damped Newton step of [HF] Eq. (15) on the retained samples' Hessian, then noise ([NS] Alg. 2).

    Per request the forgotten samples' Hessians at ``w`` are subtracted from the recorder's sum (the recorder
    then holds the retained samples' sum), and ``(1/(n-m) H_ret + c I)`` is factorised (``O(d^3)``). Noise:
    :func:`~lightning_unlearn.functional.newton.newton_sensitivity`. See :class:`_SecondOrderStrategy`.
    """

    method = "ns"
    form = "hessian"

    def _step_for(self, G: Tensor, m: int, matrix: Tensor | None) -> tuple[Tensor, bool]:
        if matrix is None:
            raise ValueError("NS has no recorded Hessian")
        return nt.newton_step(matrix.to(G), self.recorder.n - m, G, self.recorder.damping)

    def _bound(self, m: int, c: ModelConstants, M: float) -> dict[str, float]:
        return nt.newton_sensitivity(m, self.recorder.n, c.grad_bound, c.strong_convexity, M, self.recorder.damping)

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec = self.recorder
        G, theta, x, y = self._gradient_sum(ids, data)
        if rec.matrix is None:
            raise ValueError("NS has no recorded Hessian")
        with eval_mode(self.module):
            removed = nt.hessian_sum(rec.module_loss(self.module), theta, x, y, rec.chunk_size)
        retained = rec.matrix - removed.to(rec.matrix)  # a new tensor: the recorder's stays for rollback
        m = self._forgotten + int(ids.numel())
        step, definite = self._step_for(G, m, retained)
        if not definite:
            warn(
                f"NS: the damped mean Hessian (damping {rec.damping:g}) of the retained samples is indefinite (a "
                "non-convex loss): solved all the same, as [HF]'s runs do, with no guarantee",
                stacklevel=5,
            )
        internal = theta + step  # Eq. (15)
        update = self._publish(ids, G, internal, "[NS] Alg. 2 / [HF] Eq. (15): ||w_retrain - w_NS|| <= gamma")
        update.statistics = {"matrix": retained}
        return update


class InfinitesimalJackknifeStrategy(_SecondOrderStrategy):
    """[IJ]: ``w + 1/n (1/n sum_i H_i + c I)^{-1} G`` ([HF] Eq. (16)) with the recorder's precomputed inverse, then
    noise (:func:`~lightning_unlearn.functional.newton.jackknife_sensitivity`, [derived]). ``O(d^2)`` per request.
    See :class:`_SecondOrderStrategy`.
    """

    method = "ij"
    form = "inverse"

    def _step_for(self, G: Tensor, m: int, matrix: Tensor | None) -> tuple[Tensor, bool]:
        if matrix is None:
            raise ValueError("IJ has no recorded inverse Hessian")
        return nt.jackknife_step(matrix.to(G), self.recorder.n, G), True  # the recorder warned if it was indefinite

    def _bound(self, m: int, c: ModelConstants, M: float) -> dict[str, float]:
        rec = self.recorder
        return nt.jackknife_sensitivity(m, rec.n, c.grad_bound, c.smoothness, c.strong_convexity, M, rec.damping)

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        G, theta, _, _ = self._gradient_sum(ids, data)
        internal = theta + self._step_for(G, self._forgotten + int(ids.numel()), self.recorder.matrix)[0]  # Eq. (16)
        return self._publish(ids, G, internal, "[IJ] / [HF] Eq. (16): ||w_retrain - w_IJ|| <= gamma [derived]")
