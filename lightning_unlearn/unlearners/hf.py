"""`HFUnlearner`: Hessian-free online certified unlearning ([HF] Algorithm 1 Stage III)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.hf import TrajectoryRecorder
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.core.refusal import ReleaseRefused
from lightning_unlearn.functional import autodiff, hf
from lightning_unlearn.functional.bounds import ModelConstants, SGDBound, contraction_condition, sgd_bound
from lightning_unlearn.privacy import ReleaseConfig
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo, UnlearningUpdate
from lightning_unlearn.unlearners.release import ReleasingUnlearner
from lightning_unlearn.warnings import warn

#: the sensitivities :class:`HFUnlearner` calibrates its noise on
BOUNDS = ("contraction", "paper")


@dataclass(frozen=True, eq=False)
class TrajectoryTerms:
    """What the noise bound needs from one recorded trajectory under one set of constants, computed once.

    Args:
        lrs: the recorder's step-size list itself (its identity marks the trajectory: a new fit appends to
            it, loading a state replaces it).
        steps, rows: the trajectory's length and tracked rows when computed.
        constants: Assumption 1's constants used.
        lr_tensor, batch_sizes: the step sizes (float64) and batch sizes.
        lr_max: the largest step size.
        rho, q: Lemma 3's contraction factor and the step-size ratio of :func:`hf.per_sample_bound`.
        taylor: the per-sample Taylor term ``C_1`` (the same for every sample, Eq. (53)).
        problem: why the step sizes break the theorem (:func:`contraction_condition`),
            or ``None``.
        occ_steps, occ_start: occurrence steps grouped by row: row ``r``'s are
            ``occ_steps[occ_start[r]:occ_start[r + 1]]``.
    """

    lrs: list[float]
    steps: int
    rows: int
    constants: ModelConstants
    lr_tensor: Tensor
    batch_sizes: Tensor
    lr_max: float
    rho: float
    q: float
    taylor: float
    problem: str | None
    occ_steps: Tensor
    occ_start: Tensor

    @classmethod
    def of(cls, rec: TrajectoryRecorder, c: ModelConstants) -> TrajectoryTerms:
        lrs = torch.tensor(rec.lrs, dtype=torch.float64)
        rho = hf.contraction_factor(lrs, c.strong_convexity, c.smoothness)
        q = hf.step_ratio(lrs)
        occ_rows, occ_steps = rec.occurrences()
        order = torch.sort(occ_rows, stable=True).indices
        counts = torch.bincount(occ_rows, minlength=rec.n_rows)
        start = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        return cls(
            lrs=rec.lrs,
            steps=rec.n_steps,
            rows=rec.n_rows,
            constants=c,
            lr_tensor=lrs,
            batch_sizes=torch.tensor(rec.batch_sizes),
            lr_max=float(lrs.max()),
            rho=rho,
            q=q,
            taylor=hf.taylor_term(lrs, c.grad_bound, rho, q),
            problem=contraction_condition(lrs, c),
            occ_steps=occ_steps[order],
            occ_start=start,
        )

    def current(self, rec: TrajectoryRecorder, c: ModelConstants) -> bool:
        """Whether these terms are still those of ``rec``'s trajectory under ``c``."""
        return self.lrs is rec.lrs and (self.steps, self.rows) == (rec.n_steps, rec.n_rows) and self.constants == c

    def mismatch(self, rows: Tensor) -> float:
        """``C_2`` (Eq. (54)) summed over ``rows``' occurrences, in ``O(len(rows) + their occurrences)``."""
        lo, hi = self.occ_start[rows], self.occ_start[rows + 1]
        counts = hi - lo
        offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        steps = self.occ_steps[torch.repeat_interleave(lo, counts) + offsets]
        return hf.mismatch_term(steps, self.lr_tensor, self.batch_sizes, self.constants.grad_bound, self.rho, self.q)


@dataclass(frozen=True, eq=False)
class DeletionBound:
    """The running sum form of Eq. (56): the per-sample bound terms summed over every sample deleted so far.

    Part of :class:`HFUnlearner`'s state (committed and rolled back with each request); valid for the
    ``terms`` it was summed under and while ``deleted`` equals the recorder's count of deleted rows.
    """

    terms: TrajectoryTerms
    deleted: int
    taylor: float
    mismatch: float

    def add(self, rows: Tensor) -> DeletionBound:
        """The bound with ``rows`` deleted too: only their terms are added."""
        m = int(rows.numel())
        taylor = self.taylor + (m * self.terms.taylor if m else 0.0)
        return DeletionBound(self.terms, self.deleted + m, taylor, self.mismatch + self.terms.mismatch(rows))


class HFUnlearner(ReleasingUnlearner):
    """Forget samples by vector addition ``w_bar = w + sum_{u in U} a^{-u}`` ([HF] Alg. 1 line 13, Theorem 1),
    then publish ``w_bar + N(0, sigma^2 I)``: (epsilon, delta)-certified, reading no data.

    Online requests and one batched request give the same noise-free internal model (:meth:`clean_parameters`;
    after a new experience is learned, the module's current weights). ``sigma`` is calibrated by the analytic
    Gaussian mechanism ([AGM]) on ``gamma``, a bound on ``||w_retrain - (w + a^{-U})||`` for ALL samples deleted so
    far, ``w_retrain`` [HF]'s retrain (Eqs. (4)-(5): same initialisation and batches, the forgotten samples left
    out); noise from the OS entropy source; the certificate reports the total (epsilon, delta) of all releases.
    A certified release needs proved constants and every recorded step size ``eta <= 2/(M + lambda)``,
    ``lambda > 0`` (uncertified releases warn instead); the certificate's ``assumptions`` list everything the bound
    rests on. Derivation: docs/methods/hf.md and docs/certificates.md.

    Args:
        module: the trained module (its weights are replaced by the published model).
        recorder: the :class:`TrajectoryRecorder` that watched the fit.
        ledger: where executed requests are recorded (``None``: an in-memory
            :class:`~lightning_unlearn.core.ledger.Ledger`).
        constants: Assumption 1's constants, e.g.
            :func:`~lightning_unlearn.functional.bounds.module_constants` (proved for a linear model).
        strong_convexity, smoothness, grad_bound: lambda (default: the recorder's ``l2``), M and G instead of
            ``constants``; M and G asserted (``"given"``), else the recorder's observed maxima (``"estimated"``: not
            certified).
        capacity: past the deletion capacity, ``"warn"`` (default) or ``"error"`` (``ValueError``, nothing changes).
        max_deletions: the deletion capacity (checked with either bound); ``None``: [HF] Eq. (21) with its
            O-constant 1, checked with ``bound="paper"`` only.
        bound: ``"contraction"`` (default, [derived]: ``min(D_T + A_T, E_T)`` of
            :func:`~lightning_unlearn.functional.bounds.sgd_bound`, not growing with the steps) or ``"paper"``
            (the sum form of [HF] Eq. (56), to reproduce the paper's tables).
        release: the noise, its calibration, seed and budget (:class:`~lightning_unlearn.privacy.ReleaseConfig`; a
            release past the budget is refused, nothing changes).

    Raises:
        ValueError: ``capacity`` not ``"warn"``/``"error"``, an unknown ``bound``, or both ``constants`` and
            individual constants given. At ``forget``: :class:`~lightning_unlearn.core.refusal.ReleaseRefused` (a
            ``ValueError``; nothing changes) for a certified release whose step sizes break the condition (naming
            lr, M, lambda and a step size that satisfies it) or whose observed gradients exceed G; ``ValueError``
            for ``constants`` of another lambda than the recorded ``l2``, or past the capacity with ``"error"``.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import (ForgetRequest, HFUnlearner, IndexedDataset, ReleaseConfig,
        ...                                SupervisedClassifier, TrajectoryRecorder)
        >>> from lightning_unlearn.functional.bounds import module_constants
        >>> _ = torch.manual_seed(0)
        >>> x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
        >>> model = SupervisedClassifier(torch.nn.Linear(4, 2), lr=0.1, l2=0.5)
        >>> constants = module_constants(model, [x])  # proved M, G, lambda; before training
        >>> recorder = TrajectoryRecorder()
        >>> L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...           enable_progress_bar=False, enable_model_summary=False,
        ...           ).fit(model, DataLoader(IndexedDataset(TensorDataset(x, y)), batch_size=8))
        >>> unlearn = HFUnlearner(model, recorder, constants=constants, release=ReleaseConfig(epsilon=1.0))
        >>> certificate = unlearn.forget(ForgetRequest.samples([0, 1])).certificate
        >>> certificate.epsilon, certificate.constants, certificate.recipe  # proved constants, step sizes checked
        (1.0, 'bounded', 'checked')
        >>> certificate.bounds["sensitivity"] <= certificate.bounds["paper_sensitivity"]
        True
    """

    method = "hf"
    method_info = MethodInfo(
        guarantee="(epsilon, delta): w + sum a_u plus Gaussian noise calibrated on gamma ([HF] Eq. (56))",
        assumptions="strong convexity (Assumption 1), proved constants, plain SGD with every lr <= 2/(M + lambda)",
        cost="O(k d) per request (vector sums and noise); recording one HVP per tracked sample and step",
        paper="HF",
    )

    def __init__(
        self,
        module: nn.Module,
        recorder: TrajectoryRecorder,
        ledger: Ledger | None = None,
        *,
        constants: ModelConstants | None = None,
        strong_convexity: float | None = None,
        smoothness: float | None = None,
        grad_bound: float | None = None,
        capacity: str = "warn",
        max_deletions: int | None = None,
        bound: str = "contraction",
        release: ReleaseConfig | None = None,
    ) -> None:
        super().__init__(module, recorder, ledger, release=release)
        if capacity not in ("warn", "error"):
            raise ValueError(f"capacity must be 'warn' or 'error', got {capacity!r}")
        if bound not in BOUNDS:
            raise ValueError(f"HF bound must be one of {BOUNDS}, got {bound!r}")
        self.bound = bound
        if constants is not None and (smoothness, grad_bound, strong_convexity) != (None, None, None):
            raise ValueError("give either constants= or smoothness=/grad_bound=/strong_convexity=, not both")
        self.recorder: TrajectoryRecorder = recorder
        self.model_constants = constants
        self.strong_convexity, self.smoothness, self.grad_bound = strong_convexity, smoothness, grad_bound
        self.capacity, self.max_deletions = capacity, max_deletions
        self._internal: Tensor | None = None
        self._internal_step = -1
        self._bound: DeletionBound | None = None
        self._terms: TrajectoryTerms | None = None  # a cache of what the recorder's trajectory determines
        self._trained_after_release = False  # the trajectory continued from a published model (sticky)

    def clean_parameters(self) -> Tensor:
        """The noise-free internal model ``w + sum a^{-u}`` (flat), before any published noise."""
        return self._clean().clone()

    def _clean(self) -> Tensor:
        if self._internal is None or self._internal_step != self.recorder.n_steps:
            return autodiff.flat_params(self.module)
        return self._internal

    def trajectory_terms(self, c: ModelConstants) -> TrajectoryTerms:
        """The recorder's :class:`TrajectoryTerms` under ``c`` (computed once per trajectory)."""
        if self._terms is None or not self._terms.current(self.recorder, c):
            self._terms = TrajectoryTerms.of(self.recorder, c)
        return self._terms

    def deletion_bound(self, rows: Tensor, c: ModelConstants) -> DeletionBound:
        """The running bound once ``rows`` are deleted too: the state's sum plus their terms, or (for a new
        strategy or a changed trajectory) the sum over every deleted row of the recorder plus theirs."""
        rec, terms = self.recorder, self.trajectory_terms(c)
        deleted = ~rec.active[: rec.n_rows]
        bound = self._bound
        if bound is None or bound.terms is not terms or bound.deleted != int(deleted.sum()):
            bound = DeletionBound(terms, 0, 0.0, 0.0).add(deleted.nonzero().flatten())
        return bound.add(rows)

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

    def _check_capacity(self, m: int, bounds: dict[str, float], dim: int) -> float:
        cap = (
            float(self.max_deletions)
            if self.max_deletions is not None
            else hf.deletion_capacity(*self.release.target(), bounds["lr0"], dim, bounds["rho"], int(bounds["steps"]))
        )
        if m > cap and (self.bound == "paper" or self.max_deletions is not None):
            msg = (
                f"HF deletion capacity exceeded: {m} deletions > capacity {cap:.3g} "
                "(Eq. (21), constant 1, or max_deletions)"
            )
            if self.capacity == "error":
                raise ValueError(msg)
            warn(
                msg + "; the (epsilon, delta) statement is outside the paper's deletion capacity (not repeated for "
                "later deletions beyond this capacity)",
                stacklevel=5,
                cause=("hf deletion capacity", cap),
            )
        return float(cap)

    def released_before(self) -> bool:
        """Whether the learned trajectory may have continued from a published model after earlier deletions (the
        contraction bound then covers the jumps, :func:`~lightning_unlearn.functional.bounds.sgd_bound`): known
        False only while this strategy executed every earlier deletion with no SGD step since."""
        rec = self.recorder
        if not bool((~rec.active[: rec.n_rows]).any()):
            return False
        return self._trained_after_release or self._internal is None or self._internal_step != rec.n_steps

    def contraction_bound(self, rows: Tensor, c: ModelConstants, released_before: bool) -> SGDBound:
        """[derived] :func:`~lightning_unlearn.functional.bounds.sgd_bound` of the recorded trajectory for every row
        deleted so far and ``rows``: each step's count of them is read from the recorded occurrences."""
        rec = self.recorder
        deleted = ~rec.active[: rec.n_rows]
        deleted[rows] = True
        occ_rows, occ_steps = rec.occurrences()
        removed = torch.bincount(occ_steps[deleted[occ_rows]], minlength=rec.n_steps)
        lrs = torch.tensor(rec.lrs, dtype=torch.float64)
        return sgd_bound(lrs, torch.tensor(rec.batch_sizes), removed, c, released_before=released_before)

    def _assumptions(self, c: ModelConstants, problems: list[str], released_before: bool) -> list[str]:
        rec = self.recorder
        lines = [c.describe()]
        lr_max = max(rec.lrs)
        if contraction_condition(torch.tensor(rec.lrs), c) is None:
            lines.append(f"checked: every recorded step size <= 2/(M + lambda) = {c.max_lr:.4g} (largest {lr_max:.4g})")
        lines += [f"FAILS: {p}" for p in problems]
        if not any(p.startswith("observed") for p in problems):
            lines.append(
                f"checked: the largest per-sample gradient norm observed along the trajectory, {rec.grad_max:.4g}, "
                f"is <= G = {c.grad_bound:.4g}"
            )
        if self.bound == "contraction":
            form = (
                "first order only (no Hessian-Lipschitz constant)"
                if c.hessian_lipschitz is None
                else f"second order with Hessian-Lipschitz K = {c.hessian_lipschitz:.4g}"
            )
            lines.append(f"bound: contraction [derived] (docs/certificates.md), min(D_T + A_T, E_T), E_T {form}")
            if released_before:
                lines.append(
                    "training continued after an earlier release (or this strategy did not see the earlier "
                    "deletions): the bound covers the published model's jumps [derived]"
                )
        else:
            lines.append("bound: [HF] sum form of Eq. (56), resting on the paper's Taylor-remainder step (Eq. (53))")
        lines += [
            "retrain compared with: [HF] Eqs. (4)-(5), the same initialisation and batch order with the forgotten "
            "samples left out, each step's sum still divided by the original batch size",
            f"exact arithmetic: the recorder's rounding ({rec.dtype}) is not in the bound",
        ]
        return lines

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec, spec = self.recorder, autodiff.param_spec(self.module)
        d = sum(math.prod(shape) for _, shape in spec)
        if rec.A is None or rec.A.shape[1] != d:
            raise ValueError(
                f"module has {d} trainable parameters but the HF statistics have "
                f"{None if rec.A is None else rec.A.shape[1]}"
            )
        rows = rec.rows_for(ids)
        c = self.constants()
        terms = self.trajectory_terms(c)
        problems = [] if terms.problem is None else [terms.problem]
        if rec.grad_max > c.grad_bound * (1 + 1e-6):
            problems.append(
                f"observed per-sample gradient norm {rec.grad_max:.4g} > G = {c.grad_bound:.4g}: the trajectory left "
                "the ball where the constants hold (e.g. training continued from a noised model)"
            )
        if problems and self.release.calibrated:
            raise ReleaseRefused(f"HF refuses a certified release: {'; '.join(problems)}")
        if problems:
            warn(f"HF recipe outside the theorem ({'; '.join(problems)}); the release is not certified", stacklevel=5)
        released_before = self.released_before()
        bound = self.deletion_bound(rows, c)
        contraction = self.contraction_bound(rows, c, released_before)
        paper = bound.taylor + bound.mismatch
        bounds = {
            "sensitivity": contraction.sensitivity if self.bound == "contraction" else paper,
            "paper_sensitivity": paper,
            "taylor_term": bound.taylor,
            "gradient_mismatch_term": bound.mismatch,
            "contraction_sensitivity": contraction.sensitivity,
            "divergence": contraction.divergence,
            "approximation": contraction.approximation,
            "second_order": contraction.second_order,
            "rho": terms.rho,
            "strong_convexity": c.strong_convexity,
            "smoothness": c.smoothness,
            "grad_bound": c.grad_bound,
            "steps": float(terms.steps),
            "lr0": float(rec.lrs[0]),
            "lr_max": terms.lr_max,
        }
        bounds["capacity"] = self._check_capacity(bound.deleted, bounds, d)
        bounds["deleted_total"] = float(bound.deleted)
        finite = math.isfinite(bounds["sensitivity"])
        if not finite and self.release.calibrated:
            raise ValueError(
                f"HF noise bound is infinite (rho = {bounds['rho']:.4g} over {rec.n_steps} steps): step size too "
                "large for M"
            )
        clean = self._clean()
        update = rec.row_sum(rows, clean)  # a^{-U} = sum_u a^{-u} (Theorem 1; a collective under DDP)
        internal = clean + update  # Alg. 1 line 13 (a new tensor: the old internal model stays for rollback)
        published = self._release(bounds["sensitivity"], internal)
        how = (
            "contraction bound [derived]: gamma = min(D_T + A_T, E_T)"
            if self.bound == "contraction"
            else "Theorem 4, gamma the sum form of Eq. (56)"
        )
        certificate = Certificate(
            method=self.method,
            exact=False,
            **published.certificate_fields(),
            bounds={**bounds, **published.sigma_bounds},
            statement=(
                f"HF Alg. 1 + {how}: ||w_retrain - (w + a^{{-U}})|| <= gamma ({c.kind} constants), "
                "analytic Gaussian mechanism"
                + self.release.uncertified_note
                + ("" if finite else f"; the bound is infinite (rho = {bounds['rho']:.4g} over {rec.n_steps} steps)")
            ),
            constants=c.kind,
            recipe="checked" if not problems else "unchecked",
            assumptions=self._assumptions(c, problems, released_before),
        )
        return UnlearningUpdate(
            certificate,
            weights=autodiff.unflatten(published.weights, autodiff.param_spec(self.module)),
            state={
                "_internal": internal,
                "_internal_step": rec.n_steps,
                "_bound": bound,
                "_trained_after_release": released_before,
                **published.state,
            },
            extra={
                "n_forgotten": int(ids.numel()),
                "noise_norm": published.noise_norm,
                "update_norm": float(update.norm()),
            },
        )
