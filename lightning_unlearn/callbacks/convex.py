"""`SoftmaxHeadRecorder`: keeps the retained features and solves a certified L2-regularised softmax head."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.frozen import FrozenFeatureRecorder
from lightning_unlearn.functional import convex
from lightning_unlearn.privacy.noise import gaussian_noise

_STATISTICS = ("feature_rows", "labels", "row_ids", "W")


class SoftmaxHeadRecorder(FrozenFeatureRecorder):
    """Learns an L2-regularised softmax-regression head on frozen features, to a certified gradient tolerance.

    The head is solved by the recorder, not by the optimizer: at the end of each experience it minimises
    eq. (1) of :mod:`lightning_unlearn.functional.convex` over every learned, not forgotten sample (warm
    started from the previous solution) until ``||grad F|| <= l2 * radius`` (computed, rounding included), so
    the head is within ``radius`` (L2) of the exact optimum (eq. (2)), and writes it into the module's head.
    Your ``training_step`` and optimizer train whatever else the module has (nothing, for a frozen backbone).
    A head with a bias is solved on features with a constant 1 appended; the bias is regularised like the
    other weights (strong convexity needs it).

    **What it stores**: the float64 features (the frozen backbone's output; with ``backbone=None`` and a
    module without ``features``, that is the flattened input itself), the label and the sample id of every
    learned, not forgotten sample (``n x p`` floats: 4,000 MNIST images on pixels are 25 MB), and the
    noise-free head ``W``. All of it is in :meth:`state_dict`, so checkpoints carry it; forgotten samples'
    rows are removed at their request's commit and overwritten in memory. **What the unlearners
    read**: these retained features only, never the data
    (:class:`~lightning_unlearn.unlearners.convex.ResolveUnlearner`,
    :class:`~lightning_unlearn.unlearners.convex.CertifiedRemovalUnlearner`).

    Under DDP each rank computes the features of its own samples; they are gathered once per experience so
    that every rank holds all rows and solves the same problem (rank 0's solution is broadcast).

    Args:
        l2: the ridge coefficient ``l2`` of eq. (1), the strong-convexity modulus of the certificate.
        radius: the certified L2 distance of every solved head to the exact optimum (the solver's gradient
            tolerance is ``l2 * radius``); a release's noise is calibrated on it, so it trades noise against
            solver work. The default keeps the noise of an ``epsilon = 1, delta = 1e-5`` release at std ``7.5e-4``.
        loss_perturbation: the std ``beta`` of [CR]'s loss perturbation ``b ~ N(0, beta^2 I)`` (sum form,
            Sec. 3.2), drawn once at the first fit from the OS entropy source and kept secret in the state;
            needed by :class:`~lightning_unlearn.unlearners.convex.CertifiedRemovalUnlearner` only
            (``CertifiedRemovalUnlearner.perturbation_std`` gives it for a target).
        seed: seed of the loss perturbation (experiments only: whoever knows it can remove ``b``).
        backbone, head, device, fingerprint: see :class:`~lightning_unlearn.callbacks.frozen.FrozenFeatureRecorder`.
        max_newton_steps: Newton iterations allowed per solve before it is refused.

    Raises:
        ValueError: ``l2``, ``radius`` or ``loss_perturbation`` not positive.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import AnalyticClassifier, IndexedDataset, SoftmaxHeadRecorder
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))  # items (x, y, id)
        >>> model = AnalyticClassifier(torch.nn.Linear(4, 8), backbone_dim=8, num_classes=3)  # frozen, features d = 8
        >>> recorder = SoftmaxHeadRecorder(l2=0.1)
        >>> trainer = L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...                     enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(model, DataLoader(data, batch_size=8))
        >>> tuple(recorder.feature_rows.shape), recorder.row_ids[:4].tolist()  # one float64 row per sample
        ((32, 8), [0, 1, 2, 3])
        >>> recorder.solution["gradient_norm"] <= recorder.tolerance  # the head W is within radius of the optimum
        True
    """

    gathers_inputs = False
    solver_name = "the certified softmax head"
    inputs_as_features = True

    def __init__(
        self,
        l2: float,
        *,
        radius: float = 2e-4,
        loss_perturbation: float | None = None,
        seed: int | None = None,
        backbone: str | None = None,
        head: str = "head",
        device: str | torch.device | None = None,
        fingerprint: bool = True,
        max_newton_steps: int = 100,
    ) -> None:
        super().__init__(backbone=backbone, head=head, device=device, fingerprint=fingerprint)
        for name, value in (("l2", l2), ("radius", radius), ("loss_perturbation", loss_perturbation)):
            if value is not None and not value > 0:
                raise ValueError(f"SoftmaxHeadRecorder {name} must be positive, got {value}")
        self.l2, self.radius = float(l2), float(radius)
        self.loss_perturbation = None if loss_perturbation is None else float(loss_perturbation)
        self.seed = seed
        self.max_newton_steps = max_newton_steps
        self.feature_rows: Tensor | None = None  # (n, p) float64, one row per learned, not forgotten sample
        self.labels: Tensor | None = None  # (n,)
        self.row_ids: Tensor | None = None  # (n,) the sample id of each row
        self.W: Tensor | None = None  # (p, K) the noise-free solution
        self.perturbation: Tensor | None = None  # [CR]'s b (p, K), sum form
        self.solution: dict[str, Any] = {}  # gradient norm, Newton steps, products of the last solve
        self._curvature: convex.FeatureCurvature | None = None  # the preconditioner's basis (memory only)
        self._staged: list[tuple[Tensor, Tensor, Tensor]] = []
        self._replaced: Tensor | None = None  # the features a committed request replaced, until erased

    @property
    def state_key(self) -> str:
        return self._generate_state_key(l2=self.l2, radius=self.radius, loss_perturbation=self.loss_perturbation)

    @property
    def tolerance(self) -> float:
        """The solver's gradient-norm target ``l2 * radius`` (eq. (2))."""
        return self.l2 * self.radius

    # -- the problem ------------------------------------------------------------------------------------
    def problem(self, keep: Tensor | None = None) -> convex.SoftmaxProblem:
        """Eq. (1) over the stored rows (``keep``: a boolean mask of the rows to keep).

        Raises:
            ValueError: nothing is recorded yet.
        """
        if self.feature_rows is None or self.labels is None or self.W is None:
            raise ValueError("SoftmaxHeadRecorder has no features yet: fit the module with the recorder first")
        problem = convex.SoftmaxProblem(self.feature_rows, self.labels, self.W.shape[1], self.l2, self.perturbation)
        return problem if keep is None else problem.restricted(keep)

    @property
    def curvature(self) -> convex.FeatureCurvature:
        """The preconditioner's feature curvature over the stored rows (built at the head when missing, e.g. after
        a checkpoint is loaded; downdated by each request; rebuilt at each experience). Held in memory only."""
        if self._curvature is None:
            self._curvature = convex.FeatureCurvature.at(self.solved_head, self.problem())
        return self._curvature

    @curvature.setter
    def curvature(self, value: convex.FeatureCurvature | None) -> None:
        self._curvature = value

    def solve(
        self, problem: convex.SoftmaxProblem, start: Tensor, curvature: convex.FeatureCurvature | None = None
    ) -> convex.Solution:
        """Solve ``problem`` from ``start`` to :attr:`tolerance` (every rank the same; rank 0's result is kept).

        Raises:
            ValueError: the tolerance was not met within ``max_newton_steps`` (nothing is changed).
        """
        solution = convex.solve(
            problem, start, self.tolerance, curvature=curvature, max_newton_steps=self.max_newton_steps
        )
        if not solution.converged:
            raise ValueError(
                f"{self.solver_name}: the gradient norm is {solution.gradient_norm:.3g} after {solution.newton_steps} "
                f"Newton steps, above the tolerance l2 * radius = {self.tolerance:.3g}; raise max_newton_steps or "
                "radius (float64 rounding limits how small it can be)"
            )
        W = self.broadcast_from_rank0(solution.W)
        return convex.Solution(W, solution.gradient_norm, solution.newton_steps, solution.hessian_products, True)

    # -- recording ---------------------------------------------------------------------------------------
    def begin_experience(self, module: nn.Module) -> None:
        linear = self.head_of(module)
        self.check_frozen(module)
        p, K = linear.in_features + (linear.bias is not None), linear.out_features
        if K < 2:
            raise ValueError(f"{self.solver_name} needs a head with at least 2 outputs (softmax), got {K}")
        device = self._stats_device(linear)
        if self.W is None:
            self.W = torch.zeros(p, K, dtype=self.dtype, device=device)
        elif tuple(self.W.shape) != (p, K):
            raise ValueError(
                f"module head is {p}x{K} (bias counted as a row) but the recorded head is {tuple(self.W.shape)}"
            )
        if self.loss_perturbation is not None and self.perturbation is None:
            self.perturbation = gaussian_noise((p, K), self.loss_perturbation, self.dtype, self.seed, 0).to(device)
        super().begin_experience(module)

    def _drop_staged(self) -> None:
        super()._drop_staged()
        self._staged = []

    def _record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        f = outputs.get("features") if isinstance(outputs, dict) and self.backbone is None else None
        F = self._augment(f, self.head_of(module)) if f is not None else self.features(module, x)
        self._staged.append((F, y.detach().long().to(self._device()), ids.detach().cpu()))

    def _device(self) -> torch.device:
        return self.W.device if self.W is not None else torch.device("cpu")

    def _staged_rows(self, gather: bool) -> tuple[Tensor, Tensor, Tensor]:
        """The staged features, labels and ids (over every rank with ``gather``: a collective under DDP)."""
        p = self.solved_head.shape[0]
        if self._staged:
            F, y, ids = (torch.cat(parts) for parts in zip(*self._staged))
        else:
            F = torch.zeros(0, p, dtype=self.dtype, device=self._device())
            y, ids = torch.zeros(0, dtype=torch.long, device=self._device()), torch.zeros(0, dtype=torch.long)
        if gather:
            F, y, ids = self.gather_over_ranks(F), self.gather_over_ranks(y), self.gather_over_ranks(ids)
        return F, y, ids

    def _commit(self, module: nn.Module) -> None:
        self.check_unchanged(module)
        F, y, ids = self._staged_rows(gather=True)
        if self.feature_rows is not None and self.labels is not None and self.row_ids is not None:
            F, y, ids = torch.cat([self.feature_rows, F]), torch.cat([self.labels, y]), torch.cat([self.row_ids, ids])
        problem = convex.SoftmaxProblem(F, y, self.solved_head.shape[1], self.l2, self.perturbation)
        solution = self.solve(problem, self.solved_head)
        self.feature_rows, self.labels, self.row_ids, self.W = F, y, ids, solution.W
        self.curvature = convex.FeatureCurvature.at(solution.W, problem)
        self.solution = _summary(solution)
        self.write_weights(module, self.W)

    def _staged_state(self) -> dict[str, Any]:
        # every rank saves every rank's staged rows (Lightning builds a checkpoint on every rank)
        F, y, ids = self._staged_rows(gather=True)
        return {**super()._staged_state(), "staged_features": F, "staged_labels": y, "staged_row_ids": ids}

    def _load_staged_state(self, state: dict[str, Any]) -> None:
        # the saved rows cover every rank: rank 0 carries them on (they are gathered again at the commit)
        F = state.get("staged_features")
        if F is not None and len(F) and (self.trainer is None or self.trainer.global_rank == 0):
            self._staged = [
                (F.to(self._device(), self.dtype), state["staged_labels"].to(self._device()), state["staged_row_ids"])
            ]
        super()._load_staged_state(state)

    @property
    def solved_head(self) -> Tensor:
        """The noise-free head ``W`` (``(p, K)``); ``ValueError`` before any fit."""
        if self.W is None:
            raise ValueError("SoftmaxHeadRecorder has no head yet: fit the module with the recorder first")
        return self.W

    # -- forgetting -----------------------------------------------------------------------------------------
    def rows_of(self, ids: Tensor) -> Tensor:
        """A boolean mask of the stored rows that belong to ``ids``."""
        return torch.isin(self._row_ids(), ids.cpu())

    def retained(self, keep: Tensor, W: Tensor, curvature: convex.FeatureCurvature) -> dict[str, Any]:
        """The change a request commits: the rows ``keep`` (a boolean mask) of the stored ones, the new head and
        the downdated curvature."""
        problem = self.problem(keep)
        return {
            "feature_rows": problem.features,
            "labels": problem.labels,
            "row_ids": self._row_ids()[keep],
            "W": W,
            "curvature": curvature,
        }

    def _row_ids(self) -> Tensor:
        if self.row_ids is None:
            raise ValueError("SoftmaxHeadRecorder has no features yet: fit the module with the recorder first")
        return self.row_ids

    def apply_forget(self, ids: Tensor, change: Mapping[str, Any]) -> Callable[[], None]:
        """Replace the stored rows, labels, ids and ``W`` by the strategy's (forgotten rows removed); return the undo.

        The replaced feature matrix is kept until :meth:`erase_forgotten` overwrites its rows of ``ids``.
        """
        old = self.feature_rows
        undo = super().apply_forget(ids, change)
        self._replaced = old

        def undo_all() -> None:
            self._replaced = None
            undo()

        return undo_all

    def erase_forgotten(self, ids: Tensor) -> None:
        """Overwrite the forgotten rows of the replaced feature matrix with zeros (it may be referenced elsewhere)."""
        old, self._replaced = self._replaced, None
        if old is not None and self.row_ids is not None:
            # the old matrix's rows were the current rows plus the forgotten ones; zero all of it: nothing in it
            # is needed any more
            old.zero_()

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "l2": self.l2,
            "radius": self.radius,
            **{k: None if getattr(self, k) is None else getattr(self, k).clone() for k in _STATISTICS},
            "perturbation": None if self.perturbation is None else self.perturbation.clone(),
            "solution": dict(self.solution),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the stored rows and head after checking them.

        Raises:
            ValueError: ``l2`` or ``radius`` differ; rows, labels and ids disagree in length, or with the
                checkpoint catalog's live samples and labels; or the stored head is not within ``radius`` of the
                optimum over the stored rows (its certified gradient norm is recomputed): a tampered or
                corrupted state. Nothing is changed.
        """
        for key in ("l2", "radius"):
            if float(state_dict[key]) != getattr(self, key):
                raise ValueError(
                    f"checkpoint was recorded with {key}={state_dict[key]}, this recorder has {getattr(self, key)}"
                )
        perturbation = state_dict.get("perturbation")
        values = _checked_rows(state_dict) if state_dict.get("W") is not None else None
        if values is not None:
            problem = convex.SoftmaxProblem(
                values["feature_rows"].to(self.dtype), values["labels"], values["W"].shape[1], self.l2, perturbation
            )
            norm, _ = convex.certified_gradient_norm(values["W"].to(self.dtype), problem)
            if norm > self.tolerance:
                raise ValueError(
                    f"refusing SoftmaxHeadRecorder state: its head's gradient norm over its rows is {norm:.3g}, above "
                    f"l2 * radius = {self.tolerance:.3g} (a tampered or corrupted state)"
                )
        super().load_state_dict(state_dict)
        for k in _STATISTICS:
            setattr(self, k, None if values is None else values[k].clone())
        self.curvature = None
        self.perturbation = None if perturbation is None else perturbation.clone()
        self.solution = dict(state_dict.get("solution") or {})


def _checked_rows(state: Mapping[str, Any]) -> dict[str, Tensor]:
    """The stored rows, labels, ids and head of ``state``; ``ValueError`` unless all are there and the rows are
    exactly the state catalog's live samples, with their labels."""
    missing = [k for k in _STATISTICS if not isinstance(state.get(k), Tensor)]
    if missing:
        raise ValueError(f"SoftmaxHeadRecorder state lacks {missing}")
    values: dict[str, Tensor] = {k: state[k] for k in _STATISTICS}
    F, y, ids, catalog = values["feature_rows"], values["labels"], values["row_ids"], state["catalog"]
    if not len(F) == len(y) == len(ids):
        raise ValueError(f"SoftmaxHeadRecorder state has {len(F)} rows, {len(y)} labels and {len(ids)} ids")
    live = ~catalog["forgotten"].bool()
    expected = dict(zip(catalog["ids"][live].tolist(), catalog["labels"][live].tolist()))
    stored = dict(zip(ids.tolist(), y.tolist()))
    if len(stored) != len(ids) or stored != expected:
        raise ValueError(
            "refusing SoftmaxHeadRecorder state: its rows are not exactly the catalog's live samples with their "
            f"labels ({len(stored)} rows, {len(expected)} live samples)"
        )
    return values


def _summary(solution: convex.Solution) -> dict[str, Any]:
    return {
        "gradient_norm": solution.gradient_norm,
        "newton_steps": solution.newton_steps,
        "hessian_products": solution.hessian_products,
    }
