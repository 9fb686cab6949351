"""Certified forgetting of a softmax-regression head: a computed certificate ([derived]) and Newton removal [CR].

Both read only the retained features the :class:`~lightning_unlearn.callbacks.convex.SoftmaxHeadRecorder`
stores (never the data) and the noise-free head it keeps; the derivations are in ``docs/certified_head.md``.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor, nn

from lightning_unlearn.callbacks.convex import SoftmaxHeadRecorder
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.functional import convex
from lightning_unlearn.privacy import ReleaseConfig
from lightning_unlearn.privacy.analysis import check_privacy_parameters, gaussian_sigma
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo, Unlearner, UnlearningUpdate
from lightning_unlearn.unlearners.release import ReleasingUnlearner


def assumptions(recorder: SoftmaxHeadRecorder, gradient_norm: float, bound: float) -> list[str]:
    """The certificate's assumptions: strong convexity and the gradient tolerance (checked) and the features."""
    return [
        f"objective (1) is l2-strongly convex with l2 = {recorder.l2:g}: softmax cross-entropy + (l2/2)||W||^2 "
        "on every head weight (checked: the recorder solves exactly this objective and is the head's only writer)",
        f"||grad F|| = {gradient_norm:.3g} <= {bound:.3g} (checked: computed on the retained rows with its float64 "
        "rounding bound)",
        feature_assumption(recorder),
    ]


def feature_assumption(recorder: SoftmaxHeadRecorder) -> str:
    """What the certificate assumes of the features: nothing for raw inputs; for a backbone, that it never
    learned from samples that can be forgotten (checked frozen during the stream, its training data not)."""
    if recorder.backbone is None:
        return "features: the module's own (features method) or raw inputs, fixed"
    return (
        f"features: backbone {recorder.backbone!r} frozen during the stream (checked) and never trained on samples "
        "that can be forgotten (stated by the user, not checkable here)"
    )


class ResolveUnlearner(ReleasingUnlearner):
    """Forget by re-solving the head on the retained features, warm started, to a certified distance; release it
    with Gaussian noise calibrated on that distance ([derived], ``docs/certified_head.md``).

    The recorder's Newton solver (:func:`~lightning_unlearn.functional.convex.solve`) runs from the current
    noise-free head over the retained rows until the computed gradient norm (rounding bound included) is at most
    ``l2 * radius``; by strong convexity (eq. (2) of :mod:`~lightning_unlearn.functional.convex`) the result is
    within ``radius`` of the exact optimum on the retained data, the model a retrain from scratch would solve for.
    The published head is that result plus ``N(0, sigma^2 I)``, ``sigma`` calibrated by the analytic Gaussian
    mechanism ([AGM]) on the fixed sensitivity ``radius``: the release is (epsilon, delta)-indistinguishable from
    the exact retrain published with the same noise, and every release is accounted (composition over releases).
    ``radius`` is a setting, never a function of the data, so the noise reveals nothing about the request.

    Reads the recorder's retained features only; cost: a few Newton steps of Hessian-vector products over them.

    Args:
        module, recorder, ledger: see :class:`~lightning_unlearn.unlearners.base.Unlearner`.
        release: the noise, its calibration and accounting (:class:`~lightning_unlearn.privacy.ReleaseConfig`).

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import (AnalyticClassifier, ForgetRequest, IndexedDataset, ResolveUnlearner,
        ...                                SoftmaxHeadRecorder)
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))
        >>> model, recorder = AnalyticClassifier(torch.nn.Linear(4, 8), 8, num_classes=3), SoftmaxHeadRecorder(l2=0.1)
        >>> L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...           enable_progress_bar=False, enable_model_summary=False).fit(model, DataLoader(data, batch_size=8))
        >>> unlearn = ResolveUnlearner(model, recorder)  # default release: (1, 1e-5), noise from OS entropy
        >>> result = unlearn.forget(ForgetRequest.samples([3, 7]))  # reads the recorder's rows, no data
        >>> result.certificate.exact, result.certificate.certified, len(recorder.feature_rows)
        (False, True, 30)
        >>> print(result.certificate)
        resolve: (1, 1e-05) certified, sigma=0.000746, total epsilon 1 after 1 releases
    """

    method = "resolve"
    method_info = MethodInfo(
        guarantee="(epsilon, delta) [derived]: the head re-solved to within radius of the retained optimum, plus noise",
        assumptions="a frozen backbone; the L2-regularised softmax head is strongly convex (docs/certified_head.md)",
        cost="a few Newton steps of HVPs over the recorder's retained float64 features per request",
    )
    certified_noise = True

    def __init__(
        self,
        module: nn.Module,
        recorder: SoftmaxHeadRecorder,
        ledger: Ledger | None = None,
        *,
        release: ReleaseConfig | None = None,
    ) -> None:
        super().__init__(module, recorder, ledger, release=release)
        self.recorder: SoftmaxHeadRecorder = recorder

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec = self.recorder
        removal = rec.removal(ids)
        solution = rec.solve(removal.problem, rec.solved_head, removal.curvature, removal.sums)
        return self.release_head(ids, solution, rec.retained(removal, solution), removal.passes)

    def release_head(
        self, ids: Tensor, solution: convex.Solution, statistics: dict[str, Any], passes: int = 0
    ) -> UnlearningUpdate:
        """The update publishing the re-solved head ``solution`` (noised, accounted and certified on ``radius``) with
        the recorder's change ``statistics`` (:meth:`SoftmaxHeadRecorder.retained`), for forgetting ``ids``
        (``passes``: the passes over the rows spent before the solve, counted in ``extra["passes"]``)."""
        rec = self.recorder
        publication = self._release(rec.radius, solution.W.reshape(-1))
        fields = publication.certificate_fields()
        certificate = Certificate(
            method=self.method,
            exact=False,
            **fields,
            bounds={
                "sensitivity": rec.radius,
                "gradient_norm": solution.gradient_norm,
                "distance_bound": convex.distance_bound(solution.gradient_norm, rec.l2),
                "l2": rec.l2,
                **publication.sigma_bounds,
            },
            statement=(
                "[derived] ||W - W*|| <= ||grad F(W)||/l2 <= radius (l2-strong convexity, gradient computed with its "
                "rounding bound); Gaussian mechanism [AGM] on radius" + self.release.uncertified_note
            ),
            constants="bounded",
            recipe="checked",
            assumptions=assumptions(rec, solution.gradient_norm, rec.tolerance),
        )
        return UnlearningUpdate(
            certificate,
            weights=rec.head_weights(self.module, publication.weights.view_as(solution.W)),
            statistics=statistics,
            state=publication.state,
            extra={"n_forgotten": int(ids.numel()), **_solver_extra(solution), "passes": passes + solution.passes},
        )


class CertifiedRemovalUnlearner(Unlearner):
    """Newton removal with loss perturbation ([CR], Guo, Goldstein, Hannun, van der Maaten, ICML 2020), with the
    gradient residual computed exactly instead of bounded.

    The head was trained on ``L_b(w; D) = sum_i l(w; x_i) + (l2 n/2)||w||^2 + b^T w`` (the recorder's
    ``loss_perturbation``: ``b ~ N(0, beta^2 I)``, drawn once, secret). A request takes one Newton step on the
    retained data from the current head ([CR] Sec. 3.1, :func:`~lightning_unlearn.functional.convex.newton_step`)
    and computes the gradient residual ``||grad L_b(w^-; D')||`` exactly (sum form; rounding bound included). If
    it is at most the budget ``epsilon' = beta epsilon / c`` (``c = sqrt(2 ln(1.5/delta))``), [CR] Theorem 3
    makes the release (epsilon, delta)-certified removal; the published head carries no further noise. The
    residual of later requests includes that of earlier ones (it is the current exact gradient), which is how
    the budget accumulates across requests; when a step would exceed it, the head is re-solved on the retained
    data to the recorder's tolerance instead (the counterpart of [CR]'s retrain, ``extra["resolved"]``).

    The guarantee is per release ([CR] Definition 1: the current model against a retrain): all releases share
    one ``b``, so an observer of several releases is not covered, and releases are not composed; the
    certificate says so. The budget must exceed what the recorder's solver leaves (``n l2 radius``).

    Args:
        module, recorder, ledger: see :class:`~lightning_unlearn.unlearners.base.Unlearner`.
        epsilon, delta: the per-release target; with the recorder's ``loss_perturbation`` they fix the budget.

    Raises:
        ValueError: the recorder has no loss perturbation, or bad (epsilon, delta).
    """

    method = "certified_removal"
    method_info = MethodInfo(
        guarantee="(epsilon, delta) per release: one Newton step, its exact gradient residual within [CR] Thm. 3",
        assumptions="a frozen backbone; the head trained with a secret loss perturbation; releases not composed",
        cost="one Newton step (preconditioned CG of Hessian-vector products) over the retained features, or a re-solve",
        paper="CR",
    )

    def __init__(
        self,
        module: nn.Module,
        recorder: SoftmaxHeadRecorder,
        ledger: Ledger | None = None,
        *,
        epsilon: float = 1.0,
        delta: float = 1e-5,
    ) -> None:
        super().__init__(module, recorder, ledger)
        check_privacy_parameters(epsilon, delta)
        if recorder.loss_perturbation is None:
            raise ValueError(
                "certified_removal needs a head trained with loss perturbation: "
                "SoftmaxHeadRecorder(loss_perturbation=CertifiedRemovalUnlearner.perturbation_std(...))"
            )
        self.recorder: SoftmaxHeadRecorder = recorder
        self.epsilon, self.delta = float(epsilon), float(delta)
        self.residual_budget = residual_budget(recorder.loss_perturbation, self.epsilon, self.delta)

    @staticmethod
    def perturbation_std(residual: float, epsilon: float, delta: float) -> float:
        """``beta`` for a residual budget ``epsilon'`` at (epsilon, delta): [CR] Theorem 3's ``c epsilon'/epsilon``,
        or the analytic Gaussian mechanism's sigma for sensitivity ``epsilon'`` if larger (for epsilon > 1)."""
        check_privacy_parameters(epsilon, delta)
        return max(_c(delta) * residual / epsilon, gaussian_sigma(residual, epsilon, delta))

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec = self.recorder
        removal = rec.removal(ids)
        problem, curvature = removal.problem, removal.curvature
        # the linear solve's own residual is kept to a tenth of the budget (mean form: divided by n)
        tolerance = 0.1 * self.residual_budget / problem.count
        W, products = convex.newton_step(
            problem, rec.solved_head, tolerance=tolerance, curvature=curvature, sums=removal.sums
        )
        W = rec.broadcast_from_rank0(W)
        norm, sums = convex.certify(W, problem)
        resolved = norm * problem.count > self.residual_budget
        if resolved:
            solution = rec.solve(problem, W, curvature, sums)
            W, norm, products = solution.W, solution.gradient_norm, products + solution.hessian_products
            sums = solution.sums
        residual = norm * problem.count  # sum form of [CR]
        if residual > self.residual_budget:
            raise ValueError(
                f"certified_removal: the gradient residual {residual:.3g} of the re-solved head exceeds the budget "
                f"{self.residual_budget:.3g}: the recorder's tolerance n l2 radius is too large for this "
                "loss_perturbation; lower radius or raise loss_perturbation"
            )
        releases = int(self.history[-1].extra.get("release", 0)) + 1 if self.history else 1
        certificate = Certificate(
            method=self.method,
            exact=False,
            epsilon=self.epsilon,
            delta=self.delta,
            sigma=rec.loss_perturbation,
            bounds={"residual": residual, "residual_budget": self.residual_budget, "l2": rec.l2},
            statement=(
                "[CR] Theorem 3: loss perturbation b ~ N(0, beta^2 I) masks the exactly computed gradient residual "
                "<= budget; per release only (releases share b: not composed)"
            ),
            constants="bounded",
            recipe="checked",
            assumptions=assumptions(rec, residual / problem.count, self.residual_budget / problem.count),
            seeded=rec.seed is not None,
            accounting={"releases": releases, "composition": "none: one loss perturbation shared by every release"},
        )
        return UnlearningUpdate(
            certificate,
            weights=rec.head_weights(self.module, W),
            statistics=rec.retained(removal, convex.Solution(W, norm, 0, products, True, problem.passes, sums)),
            extra={
                "n_forgotten": int(ids.numel()),
                "resolved": resolved,
                "hessian_products": products,
                "passes": removal.passes + problem.passes,
                "release": releases,
            },
        )


def residual_budget(perturbation_std: float, epsilon: float, delta: float) -> float:
    """The largest gradient residual ``epsilon'`` that ``b ~ N(0, beta^2 I)`` masks at (epsilon, delta): the inverse
    of :meth:`CertifiedRemovalUnlearner.perturbation_std` (both [CR] Theorem 3's condition and [AGM]'s hold)."""
    unit = max(_c(delta) / epsilon, gaussian_sigma(1.0, epsilon, delta))
    return perturbation_std / unit


def _c(delta: float) -> float:
    """[CR] Theorem 3's ``c`` for ``delta = 1.5 exp(-c^2/2)``."""
    return math.sqrt(2 * math.log(1.5 / delta))


def _solver_extra(solution: convex.Solution) -> dict[str, Any]:
    return {"newton_steps": solution.newton_steps, "hessian_products": solution.hessian_products}
