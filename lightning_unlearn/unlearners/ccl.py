"""Certified unlearning in continual learning ([CCL]): Hessian-based (Alg. 2) and gradient-based (Alg. 1)."""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.ccl import CCLHessianRecorder, CCLRecorder
from lightning_unlearn.callbacks.optimality import TaskOptimality
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.core.refusal import ReleaseRefused
from lightning_unlearn.core.undo import replace_attributes, undoing
from lightning_unlearn.functional import autodiff, ccl
from lightning_unlearn.functional.bounds import ModelConstants, forgetting_chain, newton_chain
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.privacy import ReleaseConfig
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo, UnlearningUpdate, swap_weights
from lightning_unlearn.unlearners.release import ReleasingUnlearner
from lightning_unlearn.warnings import warn

#: the sensitivities the [CCL] strategies calibrate their noise on
BOUNDS = ("contraction", "paper")


def _is_linear(module: nn.Module) -> bool:
    layers = [m for m in module.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
    return len(layers) == 1 and isinstance(layers[0], nn.Linear)


#: the registry's assumptions of both [CCL] methods
TASKS_SOLVED = "strong convexity, proved constants, each task solved to a checked tolerance (TaskOptimality)"


class _ContinualCertified(ReleasingUnlearner):
    """Shared parts: task status of a request, Assumption 2.1 constants, publishing with noise.

    The module receives ``internal + N(0, sigma^2 I)`` (Alg. 1 lines 12-13, Alg. 2 lines 14-15), the internal
    (noise-free) model being :meth:`clean_parameters`; call :meth:`restore_internal` before the next experience
    (``fit_stream`` and ``UnlearningPlugin`` do). Constants come from ``constants`` (proved), ``lipschitz`` and
    ``smoothness`` (``"given"``), or the recorder's observed maxima (``"estimated"``: not certified); mu is the
    module's ``l2``. With ``optimality`` a certified release is refused unless every task was solved to its
    tolerance; without it the certificate is ``recipe="unchecked"`` (not certified). Sensitivity:
    ``bound="contraction"`` [derived] or ``bound="paper"`` (Theorem 4.1 / Prop. 5.1, to reproduce its table). What
    each rests on, and when the certificate is vacuous: ``docs/methods/ccl.md``, "Constants, recipe and
    sensitivity".

    Args:
        module: the trained module (its weights are replaced by the published model).
        recorder: the :class:`CCLRecorder` (or :class:`CCLHessianRecorder`) that watched every task.
        ledger: where executed requests are recorded.
        release: the noise, its calibration and accounting (:class:`~lightning_unlearn.privacy.ReleaseConfig`).
        constants, lipschitz, smoothness: Assumption 2.1's constants (see above).
        optimality: the :class:`TaskOptimality` callback that checked every task's solution.
        bound: ``"contraction"`` or ``"paper"`` (see above).

    Raises:
        ValueError: an unknown ``bound``, or both ``constants`` and ``lipschitz``/``smoothness``.
    """

    def __init__(
        self,
        module: nn.Module,
        recorder: CCLRecorder,
        ledger: Ledger | None = None,
        *,
        constants: ModelConstants | None = None,
        lipschitz: float | None = None,
        smoothness: float | None = None,
        optimality: TaskOptimality | None = None,
        release: ReleaseConfig | None = None,
        bound: str = "contraction",
    ) -> None:
        super().__init__(module, recorder, ledger, release=release)
        if constants is not None and (lipschitz, smoothness) != (None, None):
            raise ValueError("give either constants= or lipschitz=/smoothness=, not both")
        if bound not in BOUNDS:
            raise ValueError(f"{self.method} bound must be one of {BOUNDS}, got {bound!r}")
        self.bound = bound
        self.recorder: CCLRecorder = recorder
        self.model_constants, self.lipschitz, self.smoothness, self.optimality = (
            constants,
            lipschitz,
            smoothness,
            optimality,
        )
        self._internal: Tensor | None = None
        self._internal_end: Tensor | None = None

    def clean_parameters(self) -> Tensor:
        """The noise-free internal model after the last request (flat); the module's weights if none."""
        rec = self.recorder
        if self._internal is None or self._internal_end is None or not torch.equal(self._internal_end, rec.ends[-1]):
            return autodiff.flat_params(self.module)
        return self._internal.clone()

    def restore_internal(self) -> None:
        """Write the noise-free internal model into the module (before learning the next task)."""
        autodiff.set_flat_params(self.module, self.clean_parameters())

    def publish(self) -> Certificate:
        """Publish the internal model at a time without a request: once something is forgotten, [CCL] Alg. 1
        (lines 12-13) and Alg. 2 (lines 13-15) release ``w_t + N(0, sigma_t^2 I)`` at every time t, ``sigma_t``
        calibrated on the bound at t (which the tasks learned since the last request have decayed).

        The module receives the published model (:meth:`restore_internal` takes the internal one back). The
        release is accounted like a request's (:attr:`accountant` and the recorder's privacy state) but forgets
        nothing, so the ledger gets no entry. Returns the release's certificate.

        Raises:
            ValueError: nothing is forgotten yet (w_t is then published as it is), or as for a request's
                release (budget, constants, unsolved tasks); nothing is changed.
        """
        if not bool(self.catalog.forgotten.any()):
            raise ValueError(f"{self.method}: nothing is forgotten yet, so w_t is published as it is (no noise)")
        self.check_shapes()
        c, kind = self.constants()
        status = self.task_status(torch.zeros(0, dtype=torch.long))
        update = self._publish(self.clean_parameters(), status, c, kind, self.statement + "; published at t")
        with undoing() as undo:
            undo.append(swap_weights(self.module, update.weights))
            replace_attributes(self, update.state)
        self.mirror_accountant()
        return update.certificate

    #: what the certificate states (the algorithm and its bound)
    statement: ClassVar[str]

    @abstractmethod
    def _paper_bounds(self, status: list[ccl.TaskStatus], c: ccl.CLConstants) -> dict[str, float]:
        """The paper's sensitivity bound of the method for ``status`` and its terms."""

    @abstractmethod
    def _contraction_bound(self, status: list[ccl.TaskStatus], c: ModelConstants) -> float:
        """[derived] The contraction-based sensitivity of the method for ``status``."""

    def _bounds(self, status: list[ccl.TaskStatus], c: ccl.CLConstants) -> dict[str, float]:
        """Both sensitivities; ``bounds["sensitivity"]``, the one of :attr:`bound`, calibrates the noise."""
        paper = self._paper_bounds(status, c)
        contraction = self._contraction_bound(status, self.bound_constants(c))
        chosen = contraction if self.bound == "contraction" else paper["sensitivity"]
        return {
            **paper,
            "sensitivity": chosen,
            "paper_sensitivity": paper["sensitivity"],
            "contraction_sensitivity": contraction,
            "tolerance": self.tolerance(),
        }

    def _chain(self, status: list[ccl.TaskStatus]) -> tuple[list[int], list[int], list[float]]:
        """Task sizes, forgotten counts and between-task gaps, the inputs of the chain bounds."""
        return [s.n for s in status], [s.m for s in status], self.chain_gaps()

    def bound_constants(self, c: ccl.CLConstants) -> ModelConstants:
        """The constants of the contraction bounds: ``constants`` as given (with ``L_CE``, the ball and ``K`` of a
        closed form), else ``(M, L, mu)`` alone (``L`` then also bounds the data term's gradients)."""
        if self.model_constants is not None:
            return self.model_constants
        kind = "given" if self.lipschitz is not None and self.smoothness is not None else "estimated"
        return ModelConstants(
            smoothness=max(c.smoothness, c.strong_convexity),
            grad_bound=c.lipschitz,
            strong_convexity=c.strong_convexity,
            kind=kind,
        )

    def tolerance(self) -> float:
        """``tau``, the gradient residual every task is within: the :class:`TaskOptimality` tolerance (checked at
        release), else the largest residual the recorder measured (0 if it measured none): unchecked."""
        if self.optimality is not None:
            return self.optimality.tolerance
        measured: list[float] = getattr(self.recorder, "stationarity", None) or [0.0]
        return max(measured)

    def bound_problems(self, status: list[ccl.TaskStatus], c: ModelConstants) -> list[str | None]:
        """Why the contraction bound's assumptions may fail (``None`` entries: checked). Here: the gradient bound
        ``G`` at the anchor of a fully forgotten task, whose norm must lie in the ball ``||w|| <= Theta`` of the
        constants."""
        if c.param_bound is None:
            return []
        rec = self.recorder
        norms = [(i, float(rec.starts[i].norm())) for i, s in enumerate(status) if s.kind == "deleted"]
        out = [(i, v) for i, v in norms if v > c.param_bound * (1 + 1e-9)]
        if not out:
            return []
        i, v = out[0]
        return [
            (
                f"the anchor of forgotten task {i} has norm {v:.4g} > Theta = {c.param_bound:.4g}, outside the ball "
                "where G bounds the gradients (training continued from a noised model?)"
            )
        ]

    def assumptions(self, c: ModelConstants, problems: list[str]) -> list[str]:
        """What the certificate's bound rests on, one line each (see :class:`Certificate`)."""
        gaps = self.chain_gaps()
        lines = [c.describe()]
        if self.optimality is None:
            lines.append(
                f"UNCHECKED: every task solved to a gradient residual <= {self.tolerance():.3g} (no TaskOptimality)"
            )
        elif self.recipe_problem() is None:
            lines.append(
                f"checked: every task solved to a gradient residual <= {self.optimality.tolerance:g} (TaskOptimality)"
            )
        lines += [f"FAILS: {p}" for p in problems]
        if self.bound == "contraction":
            K = c.hessian_lipschitz
            form = "first order" if K is None else f"with Hessian-Lipschitz K = {K:.4g}"
            lines.append(f"bound: contraction on the chain of proximal tasks [derived] (docs/certificates.md), {form}")
        else:
            lines.append("bound: the paper's (" + self.statement.split(":")[0] + ")")
        lines += [
            "between-task changes measured from the recorded chain: largest ||start_i - end_(i-1)|| = "
            f"{max(gaps, default=0.0):.3g} (0 when learning continued from the internal model; earlier "
            "corrections or published noise otherwise: data-dependent)",
            "retrain compared with: the proximal recipe from w_0 = 0 on the tasks and samples left, each task "
            "solved exactly",
            "exact arithmetic: rounding is not in the bound",
        ]
        return lines

    def require_constants(self) -> tuple[float, float]:
        """``(L, M)``: bounded or given, or the recorder's estimates; ``ValueError`` if none (checkable before any
        training)."""
        rec = self.recorder
        if self.model_constants is not None:
            return self.model_constants.grad_bound, self.model_constants.smoothness
        L = self.lipschitz if self.lipschitz is not None else getattr(rec, "lipschitz", None)
        M = self.smoothness if self.smoothness is not None else getattr(rec, "smoothness", None)
        if L is None or M is None:
            raise ValueError(f"{self.method} needs lipschitz= and smoothness= (a CCLRecorder does not estimate them)")
        return float(L), float(M)

    def constants(self) -> tuple[ccl.CLConstants, str]:
        """Assumption 2.1's constants and their kind (``"bounded"``, ``"given"`` or ``"estimated"``)."""
        rec = self.recorder
        L, M = self.require_constants()
        if rec.l2 is None or rec.reg_lambda is None:
            raise ValueError(f"{self.method} has no recorded task yet: its constants need the fit's l2 and reg_lambda")
        if self.model_constants is not None:
            if not math.isclose(self.model_constants.strong_convexity, float(rec.l2), rel_tol=1e-9):
                raise ValueError(
                    f"constants are for mu = {self.model_constants.strong_convexity:g} but the recorded tasks used "
                    f"l2 = {rec.l2:g}"
                )
            kind = self.model_constants.kind
        else:
            kind = "given" if self.lipschitz is not None and self.smoothness is not None else "estimated"
        cc = ccl.CLConstants(
            lipschitz=float(L), smoothness=float(M), strong_convexity=float(rec.l2), reg_lambda=float(rec.reg_lambda)
        )
        return cc, kind

    def recipe_problem(self) -> str | None:
        """Why the recorded tasks do not meet [CCL]'s exact-solution condition (``None`` if they do or nothing
        checked it)."""
        return None if self.optimality is None else self.optimality.problem(len(self.recorder.ends))

    def check_shapes(self) -> None:
        """``ValueError`` if the module's parameters do not match the recorded task vectors."""
        d, recorded = autodiff.flat_params(self.module).numel(), self.recorder.ends[-1].numel()
        if d != recorded:
            raise ValueError(f"module has {d} trainable parameters but the recorded task vectors have {recorded}")

    def chain_gaps(self) -> list[float]:
        """``||start_i - end_{i-1}||`` per task (``end_{-1} = w_0 = 0``): what happened to the model between tasks."""
        rec = self.recorder
        previous = [torch.zeros_like(rec.ends[0])] + rec.ends[:-1]
        return [float((s - p).norm()) for s, p in zip(rec.starts, previous)]

    def task_status(self, ids: Tensor) -> list[ccl.TaskStatus]:
        """``(n_i, m_i)`` per recorded task once ``ids`` are forgotten too."""
        rec, cat = self.recorder, self.catalog
        requested = cat.experiences_of(ids) if ids.numel() else torch.zeros(0, dtype=torch.long)
        status = []
        for e, n in zip(rec.experience_ids, rec.sizes):
            m = int((cat.forgotten & (cat.experiences == e)).sum()) + int((requested == e).sum())
            status.append(ccl.TaskStatus(n=n, m=m))
        return status

    def _warn_assumptions(self, c: ccl.CLConstants) -> None:
        if c.strong_convexity == 0:
            warn("l2 = 0: mu = 0 so rho = 1 and the [CCL] bound does not decay (certificate vacuous)", stacklevel=5)
        if not _is_linear(self.module):
            warn(
                "non-linear network: Assumption 2.1 (strong convexity) fails, the [CCL] certificate is heuristic",
                stacklevel=5,
            )

    def _publish(
        self, internal: Tensor, status: list[ccl.TaskStatus], c: ccl.CLConstants, kind: str, statement: str
    ) -> UnlearningUpdate:
        """The update publishing ``internal`` with Gaussian noise calibrated on the sensitivity of ``status``
        (:meth:`_bounds`, [AGM]), accounted."""
        self._warn_assumptions(c)
        bc = self.bound_constants(c)
        checks = [self.recipe_problem()] + (self.bound_problems(status, bc) if self.bound == "contraction" else [])
        problems = [p for p in checks if p is not None]
        if problems and self.release.calibrated:
            raise ReleaseRefused(f"{self.method} refuses a certified release: {'; '.join(problems)}")
        bounds = self._bounds(status, c)
        published = self._release(bounds["sensitivity"], internal)
        bounds = {
            **bounds,
            **published.sigma_bounds,
            "lipschitz": c.lipschitz,
            "smoothness": c.smoothness,
            "strong_convexity": c.strong_convexity,
            "reg_lambda": c.reg_lambda,
        }
        certificate = Certificate(
            method=self.method,
            exact=False,
            **published.certificate_fields(),
            bounds=bounds,
            statement=statement + f" ({kind} constants)" + self.release.uncertified_note,
            constants=kind,
            recipe="unchecked" if self.optimality is None or problems else "checked",
            assumptions=self.assumptions(bc, problems),
        )
        return UnlearningUpdate(
            certificate,
            weights=autodiff.unflatten(published.weights, autodiff.param_spec(self.module)),
            state={"_internal": internal, "_internal_end": self.recorder.ends[-1], **published.state},
            extra={"noise_norm": published.noise_norm},
        )


class CCLGradientUnlearner(_ContinualCertified):
    """[CCL] Alg. 1 (natural forgetting, the gradient-based adaptation): weights unchanged, noise only.

    Stores nothing beyond the catalog and task sizes. ``sigma`` is the analytic Gaussian mechanism's
    ([AGM]) for sensitivity ``gamma^NF = sum_{s deleted} rho^{kappa_t(s)} L/lambda`` (Theorem 4.1, Eq. (9) with the
    conservative exponent), and for sample-level requests the [derived] partial-task
    injection ``2 m L / ((n - m)(mu + lambda))``, plus ``rho^kappa ||gap||`` for any
    change between tasks (training continued from a published, noised model; [derived]). The
    internal model is the last trained one, so its pre-noise weights are the original weights by design.
    """

    method = "ccl_gradient"
    method_info = MethodInfo(
        guarantee="(epsilon, delta): natural forgetting, noise only, gamma^NF ([CCL] Thm. 4.1)",
        assumptions=TASKS_SOLVED,
        cost="O(d) per request (noise); recording task sizes and end points",
        paper="CCL",
    )
    statement = "[CCL] Alg. 1 / Theorem 4.1: ||w_retrain - w_t|| <= gamma^NF; Gaussian mechanism"

    def _paper_bounds(self, status: list[ccl.TaskStatus], c: ccl.CLConstants) -> dict[str, float]:
        return ccl.sensitivity_natural_forgetting(status, c, self.chain_gaps())

    def _contraction_bound(self, status: list[ccl.TaskStatus], c: ModelConstants) -> float:
        """[derived] :func:`~lightning_unlearn.functional.bounds.forgetting_chain` at the last task."""
        rec = self.recorder
        return forgetting_chain(*self._chain(status), c, float(rec.reg_lambda or 0.0), self.tolerance())[-1]

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec = self.recorder
        self.check_shapes()
        c, kind = self.constants()
        internal = rec.ends[-1].clone()
        update = self._publish(internal, self.task_status(ids), c, kind, self.statement)
        update.extra["n_forgotten"] = int(ids.numel())
        return update


class CCLHessianUnlearner(_ContinualCertified):
    """[CCL] Alg. 2: the Newton-style correction of the corrected Eq. (13), then noise.

    The correction runs the linearised error recursion over all recorded tasks
    (:func:`ccl.hessian_correction`): kept tasks transport the error by
    ``P_i = (H_i + lambda I)^{-1} lambda``, deleted tasks add their ``Delta_i``, and partially
    deleted tasks (sample-level requests, [derived]) add the Newton step of their own
    solution, which needs ``sum_{u in U} grad l(end_i; u)``: from the recorder's stored per-sample
    gradients or from ``data`` (the samples to forget), kept per task as a running sum. Noise:
    ``gamma^H`` ([interp, derived], :func:`ccl.sensitivity_hessian`).
    """

    method = "ccl_hessian"
    method_info = MethodInfo(
        guarantee="(epsilon, delta): a Newton correction over the task chain plus noise on gamma^H ([CCL] Alg. 2)",
        assumptions=TASKS_SOLVED,
        cost=(
            "a solve with each recorded task Hessian per request (dense: O(d^3); factored, a linear head: conjugate "
            "gradients, O(n_i K d) per iteration); recording a Hessian per task"
        ),
        paper="CCL",
    )
    reads_data = True  # optional: the samples to forget, for sample-level requests without stored gradients
    statement = "[CCL] Alg. 2 / Prop. 5.1 (Lemma D.2 bound gamma^H): Newton correction + Gaussian mechanism"

    def __init__(
        self, module: nn.Module, recorder: CCLHessianRecorder, ledger: Ledger | None = None, **kwargs: Any
    ) -> None:
        if not isinstance(recorder, CCLHessianRecorder):
            raise ValueError(f"CCLHessianUnlearner needs a CCLHessianRecorder, got {type(recorder).__name__}")
        super().__init__(module, recorder, ledger, **kwargs)
        self.recorder: CCLHessianRecorder = recorder
        # per task: (its recorded Hessian, (floor, lambda), the solve): a dense Cholesky costs O(d^3), once per task
        self._solvers: dict[int, tuple[Any, tuple[float, float], Callable[[Tensor], Tensor]]] = {}

    def inverse_solver(self, i: int, c: ccl.CLConstants) -> Callable[[Tensor], Tensor]:
        """``(H_i + lambda I)^{-1}`` of recorded task ``i`` (:func:`ccl.inverse_solver`), factorised once per
        recorded Hessian and constants (a new fit or a loaded state records new Hessian tensors: factorised again); the
        strategy keeps each task's factor, as large as its dense Hessian (``d^2`` floats)."""
        H, key = self.recorder.hessians[i], (c.strong_convexity, c.reg_lambda)
        cached = self._solvers.get(i)
        if cached is None or cached[0] is not H or cached[1] != key:
            self._solvers[i] = cached = (H, key, ccl.inverse_solver(H, *key, self.recorder.shards))
        return cached[2]

    def _paper_bounds(self, status: list[ccl.TaskStatus], c: ccl.CLConstants) -> dict[str, float]:
        return ccl.sensitivity_hessian(status, c, self.chain_gaps())

    def bound_problems(self, status: list[ccl.TaskStatus], c: ModelConstants) -> list[str | None]:
        """The base checks, and the recorded Hessians' spectra within ``[mu, M]`` (the transports' first-order
        error; checked for diagonal and low-rank approximations, exact by the constants' proof otherwise: dense or
        factored)."""
        rec, M = self.recorder, c.smoothness
        tops = [
            float(H["values"].max()) if isinstance(H, dict) else float(H.max())
            for H in rec.hessians
            if not ccl.is_exact(H)
        ]
        bad = [v for v in tops if v > M * (1 + 1e-9)]
        spectrum = f"a recorded Hessian approximation has curvature {bad[0]:.4g} > M = {M:.4g}" if bad else None
        return [*super().bound_problems(status, c), spectrum]

    def _contraction_bound(self, status: list[ccl.TaskStatus], c: ModelConstants) -> float:
        """[derived] :func:`~lightning_unlearn.functional.bounds.newton_chain`; its second-order form needs the exact
        task Hessians (an approximate one keeps the first order, valid while its spectrum lies in ``[mu, M]``)."""
        rec = self.recorder
        if not all(ccl.is_exact(H) for H in rec.hessians):
            c = replace(c, hessian_lipschitz=None)
        return newton_chain(*self._chain(status), c, float(rec.reg_lambda or 0.0), self.tolerance())

    def _gradient_sums(self, ids: Tensor, data: ForgetData, status: list[ccl.TaskStatus]) -> list[Tensor | None]:
        """Running ``sum grad l(end_i; u)`` per partially deleted task, including ``ids``: from the stored gradients
        when the ranks hold each of ``ids`` (each rank adds its own, :meth:`CCLHessianRecorder.sample_gradient_sum`),
        else from ``data``."""
        rec = self.recorder
        sums: list[Tensor | None] = list(rec.forgotten_grad_sums)
        exps = self.catalog.experiences_of(ids)
        partial = [
            i for i, s in enumerate(status) if s.kind == "partial" and bool((exps == rec.experience_ids[i]).any())
        ]
        if not partial:
            return sums
        missing = rec.missing_sample_gradients(ids)
        if not missing:
            samples = None
        elif data is None:
            raise ValueError(
                "sample-level Hessian unlearning needs the samples to forget (data=...) or "
                f"CCLHessianRecorder(store_sample_gradients=True): no rank stores the gradients of ids {missing[:10]}"
            )
        else:
            samples = self.forget_samples(ids, data)
        for i in partial:
            mine = exps == rec.experience_ids[i]
            if samples is None:
                g = rec.sample_gradient_sum(ids[mine])
            else:
                x, y = samples
                theta = rec.ends[i].to(autodiff.flat_params(self.module))
                with eval_mode(self.module):
                    xm, ym = x[mine].to(theta.device), y[mine].to(theta.device)
                    g = autodiff.per_sample_grads(rec.module_loss(self.module), theta, xm, ym).sum(0)
            previous = sums[i]
            sums[i] = g if previous is None else previous + g
        return sums

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec = self.recorder
        self.check_shapes()
        c, kind = self.constants()
        status = self.task_status(ids)
        sums = self._gradient_sums(ids, data, status)
        solves = [None if s.kind == "deleted" else self.inverse_solver(i, c) for i, s in enumerate(status)]
        current = rec.ends[-1]
        e = ccl.hessian_correction(status, rec.starts, rec.ends, current, solves, sums, c.reg_lambda)  # Eq. (13)
        internal = current + e
        update = self._publish(internal, status, c, kind, self.statement)
        gone = set(ids.tolist())  # a forgotten sample's stored gradient is a per-sample statistic: erased
        kept = {u: g for u, g in rec.sample_grads.items() if u not in gone}
        update.statistics = {"forgotten_grad_sums": sums, "sample_grads": kept}
        update.extra.update({"n_forgotten": int(ids.numel()), "correction_norm": float(e.norm())})
        return update
