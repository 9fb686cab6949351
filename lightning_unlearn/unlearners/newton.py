"""`NewtonStepUnlearner` ([NS]) and `InfinitesimalJackknifeUnlearner` ([IJ]): [HF]'s Hessian-based baselines."""

from __future__ import annotations

import math
from abc import abstractmethod

from torch import Tensor, nn

from lightning_unlearn.callbacks.newton import HessianSumRecorder
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.core.refusal import ReleaseRefused
from lightning_unlearn.functional import autodiff, newton
from lightning_unlearn.functional.bounds import ModelConstants
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.privacy import ReleaseConfig
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo, UnlearningUpdate
from lightning_unlearn.unlearners.release import ReleasingUnlearner
from lightning_unlearn.warnings import warn

#: the registry's assumptions of [NS] and [IJ]
SECOND_ORDER = (
    "the exact minimiser (checked), strong convexity, proved constants incl. the Hessian-Lipschitz M, m <= n/2"
)


class _SecondOrderUnlearner(ReleasingUnlearner):
    """What [NS] and [IJ] share: every request recomputes the step from the trained model ``w`` for ALL the
    samples forgotten so far (``U``, ``m`` of them; [NS] Alg. 2 takes every deletion at once), then publishes
    ``internal + N(0, sigma^2 I)`` through :class:`~lightning_unlearn.unlearners.release.ReleasingUnlearner`
    (analytic Gaussian mechanism, [AGM], on the bound ``gamma`` of :mod:`lightning_unlearn.functional.newton`;
    [NS]'s classical ``gamma sqrt(2 ln(1.25/delta))/epsilon`` is reported as ``sigma_classical``; every release
    accounted). Needs the samples to forget (``data``): their gradients at ``w``.

    The running gradient sum ``G = sum_{u in U} grad l(w; u)`` and the last step are the strategy's own state,
    never written by the library (for a single sample ``G`` is that sample's gradient); a new strategy on a
    recorder whose samples were forgotten by another strategy refuses, since it cannot recover ``G``.

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
        constants, hessian_lipschitz: [NS]'s constants (see above).
        release: the noise, its calibration and accounting (:class:`~lightning_unlearn.privacy.ReleaseConfig`).

    Raises:
        ValueError: the recorder is not a :class:`HessianSumRecorder` of this method's ``form``, or a negative
            ``hessian_lipschitz``.
    """

    form: str
    reads_data = True
    needs_forget_data = True

    def __init__(
        self,
        module: nn.Module,
        recorder: HessianSumRecorder,
        ledger: Ledger | None = None,
        *,
        constants: ModelConstants | None = None,
        hessian_lipschitz: float | None = None,
        release: ReleaseConfig | None = None,
    ) -> None:
        if not isinstance(recorder, HessianSumRecorder) or recorder.form != self.form:
            got = getattr(recorder, "form", type(recorder).__name__)
            raise ValueError(f"{type(self).__name__} needs a HessianSumRecorder(form={self.form!r}), got {got!r}")
        super().__init__(module, recorder, ledger, release=release)
        if hessian_lipschitz is not None and not hessian_lipschitz >= 0:
            raise ValueError(f"hessian_lipschitz must be >= 0, got {hessian_lipschitz}")
        self.recorder: HessianSumRecorder = recorder
        self.model_constants, self.hessian_lipschitz = constants, hessian_lipschitz
        self._grad_sum: Tensor | None = None  # G over the samples this strategy forgot
        self._step: Tensor | None = None  # the step from w for them: the noise-free model is w + step
        self._spare: Tensor | None = None  # [NS]: the recorder's previous matrix, reused for the next one
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
        if self._step is None or rec.theta is None:
            return autodiff.flat_params(self.module)
        return rec.theta.to(self._step) + self._step

    def _gradient_sum(self, ids: Tensor, data: ForgetData) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``G`` including ``ids``, the trained model ``w`` (flat, on the module's device and dtype) and the
        samples' inputs and labels (checked against what was learned)."""
        rec = self.recorder
        if rec.theta is None:
            raise ValueError(f"{type(rec).__name__} holds no trained model")
        flat = autodiff.flat_params(self.module)
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
            g = autodiff.per_sample_grads(rec.module_loss(self.module), theta, x, y)
        G = g.sum(0) if self._grad_sum is None else self._grad_sum + g.sum(0)
        return G, theta, x, y

    @abstractmethod
    def _bound(self, m: int, c: ModelConstants, M: float) -> dict[str, float]:
        """``gamma`` and its terms for ``m`` forgotten samples."""

    def _publish(self, ids: Tensor, G: Tensor, step: Tensor, statement: str) -> UnlearningUpdate:
        rec, m = self.recorder, self._forgotten + int(ids.numel())
        if rec.theta is None:
            raise ValueError(f"{type(rec).__name__} holds no trained model")
        internal = rec.theta.to(step) + step  # Eqs. (15), (16)
        c = self.constants()
        M = math.inf if self.hessian_lipschitz is None else float(self.hessian_lipschitz)
        bounds = self._bound(m, c, M)
        problems = []
        if rec.stationarity > rec.tolerance:
            problems.append(f"the recorded model is not the minimiser (||mean grad l|| = {rec.stationarity:.3g})")
        if 2 * m > rec.n:
            problems.append(f"m = {m} deletions exceed n/2 = {rec.n / 2:g} ([NS]'s lemma)")
        finite = math.isfinite(bounds["sensitivity"])
        if not finite and self.release.calibrated:
            why = "hessian_lipschitz is not given" if self.hessian_lipschitz is None else "; ".join(problems)
            raise ReleaseRefused(
                f"{self.method} noise bound is infinite ({why or f'lambda = {c.strong_convexity:g}'}): no certified "
                "release; pass hessian_lipschitz= and train a strongly convex loss (l2 > 0), or release without noise "
                "(ReleaseConfig(noise=False)) or with a fixed sigma_override"
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
            statement=statement + f" ({kind} constants), analytic Gaussian mechanism" + self.release.uncertified_note,
            constants=kind,
            recipe="unchecked" if problems else "checked",
        )
        return UnlearningUpdate(
            certificate,
            weights=autodiff.unflatten(published.weights, autodiff.param_spec(self.module)),
            state={"_grad_sum": G, "_step": step, "_forgotten": m, **published.state},
            extra={
                "n_forgotten": int(ids.numel()),
                "noise_norm": published.noise_norm,
                "update_norm": float(step.norm()),
            },
        )


class NewtonStepUnlearner(_SecondOrderUnlearner):
    """[NS]: the damped Newton step of [HF] Eq. (15) on the retained samples' Hessian, then noise ([NS] Alg. 2).

    Per request the forgotten samples' Hessians at ``w`` are subtracted from the recorder's sum (the recorder
    then holds the retained samples' sum; ``O(k K d^2)`` for a linear head; written into the recorder's matrix
    before the last request, which the strategy keeps as a scratch buffer, so a request allocates no ``d x d``
    tensor), and ``(H_ret + c (n-m) I) s = G`` is
    solved by conjugate gradients preconditioned with the recorder's damped inverse of the full sum, from the
    previous request's step (``O(d^2)`` per iteration; a factorisation, ``O(d^3)``, without it:
    :func:`~lightning_unlearn.functional.newton.newton_step`). ``extra["cg_iterations"]`` reports the
    iterations (0: factorised). Noise: :func:`~lightning_unlearn.functional.newton.newton_sensitivity`. See
    :class:`_SecondOrderUnlearner`.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import (ForgetRequest, HessianSumRecorder, IndexedDataset, NewtonStepUnlearner,
        ...                                SupervisedClassifier)
        >>> from lightning_unlearn.functional.bounds import module_constants
        >>> from lightning_unlearn.functional.newton import hessian_lipschitz_bound
        >>> x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        >>> data = IndexedDataset(TensorDataset(x, (x[:, 0] > 0).long()))
        >>> model, recorder = SupervisedClassifier(torch.nn.Linear(4, 2), lr=0.5, l2=0.1), HessianSumRecorder()
        >>> constants = module_constants(model, [x])  # L, beta, lambda of the ridge-regularised linear model
        >>> L.Trainer(max_epochs=100, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...           enable_progress_bar=False, enable_model_summary=False).fit(model, DataLoader(data, batch_size=64))
        >>> M = hessian_lipschitz_bound(float(x.norm(dim=1).max()))
        >>> unlearn = NewtonStepUnlearner(model, recorder, constants=constants, hessian_lipschitz=M)
        >>> weights = float(torch.cat([p.detach().flatten() for p in model.parameters()]).norm())  # before release
        >>> certificate = unlearn.forget(ForgetRequest.samples([3]), data=data).certificate
        >>> certificate.certified, certificate.constants  # the theorem's constants, bounded, not estimated
        (True, 'bounded')
        >>> certificate.sigma > 100 * weights
        True

    The last line is [NS]'s worst-case bound at work: its noise is far above the weights (``docs/methods/ns.md``).
    """

    method = "ns"
    method_info = MethodInfo(
        guarantee=(
            "(epsilon, delta): a damped Newton step on the retained Hessian plus noise ([HF] Eq. (15), [NS] Alg. 2)"
        ),
        assumptions=SECOND_ORDER,
        cost="an O(d^3) factorisation per request; recording the dense d x d Hessian (d HVPs over the data)",
        paper="NS",
    )
    form = "hessian"

    def _bound(self, m: int, c: ModelConstants, M: float) -> dict[str, float]:
        return newton.newton_sensitivity(m, self.recorder.n, c.grad_bound, c.strong_convexity, M, self.recorder.damping)

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec = self.recorder
        G, theta, x, y = self._gradient_sum(ids, data)
        if rec.matrix is None:
            raise ValueError("NS has no recorded Hessian")
        loss, base = rec.module_loss(self.module), rec.matrix
        with eval_mode(self.module):  # the retained sum, a new tensor: the recorder's stays for rollback
            if (base.dtype, base.device) == (theta.dtype, theta.device):
                spare = self._spare
                if spare is None or spare is base or spare.shape != base.shape or spare.dtype != base.dtype:
                    spare = None
                retained = newton.hessian_sum(loss, theta, x, y, rec.chunk_size, base=base, sign=-1.0, out=spare)
            else:
                retained = base - newton.hessian_sum(loss, theta, x, y, rec.chunk_size).to(base)
        m = self._forgotten + int(ids.numel())
        norm = rec.n * rec.smoothness if rec.smoothness > 0 else None  # ||H_ret|| <= ||H|| for a convex loss
        solve = newton.newton_step(retained, rec.n - m, G, rec.damping, rec.preconditioner, self._step, norm)
        if solve.definite is False:
            warn(
                f"NS: the damped mean Hessian (damping {rec.damping:g}) of the retained samples is indefinite (a "
                "non-convex loss): solved all the same, as [HF]'s runs do, with no guarantee",
                stacklevel=5,
            )
        update = self._publish(ids, G, solve.step, "[NS] Alg. 2 / [HF] Eq. (15): ||w_retrain - w_NS|| <= gamma")
        update.statistics = {"matrix": retained}
        update.state = {**update.state, "_spare": base}  # after the commit the recorder no longer holds it
        update.extra["cg_iterations"] = solve.iterations
        return update


class InfinitesimalJackknifeUnlearner(_SecondOrderUnlearner):
    """[IJ]: ``w + 1/n (1/n sum_i H_i + c I)^{-1} G`` ([HF] Eq. (16)) with the recorder's precomputed inverse, then
    noise (:func:`~lightning_unlearn.functional.newton.jackknife_sensitivity`, [derived]). ``O(d^2)`` per request.
    See :class:`_SecondOrderUnlearner`.
    """

    method = "ij"
    method_info = MethodInfo(
        guarantee="(epsilon, delta): an infinitesimal-jackknife step plus noise ([HF] Eq. (16))",
        assumptions=SECOND_ORDER,
        cost="O(k d^2) per request; recording the dense d x d inverse Hessian (one O(d^3) inversion)",
        paper="IJ",
    )
    form = "inverse"

    def _bound(self, m: int, c: ModelConstants, M: float) -> dict[str, float]:
        rec = self.recorder
        return newton.jackknife_sensitivity(m, rec.n, c.grad_bound, c.smoothness, c.strong_convexity, M, rec.damping)

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        G, _, _, _ = self._gradient_sum(ids, data)
        if self.recorder.matrix is None:
            raise ValueError("IJ has no recorded inverse Hessian")
        step = newton.jackknife_step(self.recorder.matrix, self.recorder.n, G)  # the recorder warned if indefinite
        return self._publish(ids, G, step, "[IJ] / [HF] Eq. (16): ||w_retrain - w_IJ|| <= gamma [derived]")
