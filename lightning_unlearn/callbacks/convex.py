"""`SoftmaxHeadRecorder`: keeps the retained features and solves a certified L2-regularised softmax head."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

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

    **What it stores**: the features (the frozen backbone's output, computed in float64 and stored as
    ``row_dtype``; with ``backbone=None`` and a module without ``features``, that is the flattened input itself), the
    label and the sample id of every learned, not forgotten sample (``n x p`` floats: 4,000 MNIST images on pixels
    are 25 MB in float64), and the noise-free head ``W``. All of it is in :meth:`state_dict`, so checkpoints carry
    it; forgotten samples' rows are removed at their request's commit and overwritten in memory. **What the
    unlearners read**: these retained features only, never the data
    (:class:`~lightning_unlearn.unlearners.convex.ResolveUnlearner`,
    :class:`~lightning_unlearn.unlearners.convex.CertifiedRemovalUnlearner`).

    **Under DDP the rows are sharded** (``docs/scale.md``): each rank keeps the rows of the samples it computed
    features for (about ``n/R`` of them) and nothing per row of the others; every sum over the rows of the solver
    (gradient, objective, Hessian-vector products, curvature) is this rank's sum all-reduced through
    ``trainer.strategy`` (one ``p x K`` all-reduce per product), so every rank runs the same Newton-CG and holds
    the same head (rank 0's is broadcast at the end). A request's ids are removed by the ranks that hold them;
    every rank must call ``forget`` together (as every rank runs the training loop): between experiences, or after
    a Trainer's fit in the same processes; outside a Trainer (e.g. a ``torchrun`` script), the state loaded on
    every rank joins torch.distributed's default process group (:meth:`join_process_group`). A checkpoint holds
    every row: :meth:`state_dict` gathers them on rank 0 (which Lightning writes); loading keeps the rows
    ``i % R == rank`` of the checkpoint's, so it reloads on any number of processes.

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
        row_dtype: how the feature rows are stored: ``torch.float64`` (default) or ``torch.float32`` (half the
            memory; the rows are the features rounded to float32, and every product promotes them to float64 block
            by block, so the arithmetic and its rounding bound stay float64's: the certificate is about the
            problem on the stored rows, as a retrain on them would solve it).

    Raises:
        ValueError: ``l2``, ``radius`` or ``loss_perturbation`` not positive; ``row_dtype`` neither float64 nor
            float32.

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
        row_dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__(backbone=backbone, head=head, device=device, fingerprint=fingerprint)
        if row_dtype not in (torch.float64, torch.float32):
            raise ValueError(f"SoftmaxHeadRecorder row_dtype must be torch.float64 or torch.float32, got {row_dtype}")
        self.row_dtype = row_dtype
        for name, value in (("l2", l2), ("radius", radius), ("loss_perturbation", loss_perturbation)):
            if value is not None and not value > 0:
                raise ValueError(f"SoftmaxHeadRecorder {name} must be positive, got {value}")
        self.l2, self.radius = float(l2), float(radius)
        self.loss_perturbation = None if loss_perturbation is None else float(loss_perturbation)
        self.seed = seed
        self.max_newton_steps = max_newton_steps
        # this rank's rows (all of them in one process)
        self.feature_rows: Tensor | None = None  # (n, p) row_dtype, one row per learned, not forgotten sample
        self.labels: Tensor | None = None  # (n,)
        self.row_ids: Tensor | None = None  # (n,) the sample id of each row
        self.W: Tensor | None = None  # (p, K) the noise-free solution
        self.perturbation: Tensor | None = None  # [CR]'s b (p, K), sum form
        self.solution: dict[str, Any] = {}  # gradient norm, Newton steps, products of the last solve
        self._curvature: convex.FeatureCurvature | None = None  # the preconditioner's basis (memory only)
        self._sums: convex.HeadSums | None = None  # the sums over the rows at W, downdated by requests (memory only)
        self._staged: list[tuple[Tensor, Tensor, Tensor]] = []
        self._replaced: list[Tensor] = []  # what a committed request left of the forgotten rows, until erased

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
        problem = self.problem_of(self.feature_rows, self.labels)
        return problem if keep is None else problem.restricted(keep)

    def problem_of(self, features: Tensor, labels: Tensor) -> convex.SoftmaxProblem:
        """Eq. (1) over this rank's ``features`` and ``labels`` and the other ranks' (a collective under DDP), solved
        in float64."""
        K = self.solved_head.shape[1]
        ranks = convex.RankSum(self.sum_over_ranks, self.world_size) if self._strategy is not None else None
        return convex.SoftmaxProblem(features, labels, K, self.l2, self.perturbation, ranks, self.dtype)

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

    @property
    def sums(self) -> convex.HeadSums:
        """The :class:`~lightning_unlearn.functional.convex.HeadSums` over the stored rows at the head (computed when
        missing, one pass; downdated by each request). Held in memory only."""
        if self._sums is None:
            self._sums = convex.HeadSums.at(self.solved_head, self.problem())
        return self._sums

    @sums.setter
    def sums(self, value: convex.HeadSums | None) -> None:
        self._sums = value

    def solve(
        self,
        problem: convex.SoftmaxProblem,
        start: Tensor,
        curvature: convex.FeatureCurvature | None = None,
        sums: convex.HeadSums | None = None,
    ) -> convex.Solution:
        """Solve ``problem`` from ``start`` (``sums``: the :class:`~lightning_unlearn.functional.convex.HeadSums` at
        ``start``, e.g. downdated) to :attr:`tolerance` (every rank the same; rank 0's result is kept).

        Raises:
            ValueError: the tolerance was not met within ``max_newton_steps`` (nothing is changed).
        """
        solution = convex.solve(
            problem, start, self.tolerance, curvature=curvature, sums=sums, max_newton_steps=self.max_newton_steps
        )
        if not solution.converged:
            raise ValueError(
                f"{self.solver_name}: the gradient norm is {solution.gradient_norm:.3g} after {solution.newton_steps} "
                f"Newton steps, above the tolerance l2 * radius = {self.tolerance:.3g}; raise max_newton_steps or "
                "radius (float64 rounding limits how small it can be)"
            )
        # every rank computed the same head from the same all-reduced sums; rank 0's bits are published
        return replace(solution, W=self.broadcast_from_rank0(solution.W))

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
        self._staged.append((F.to(self.row_dtype), y.detach().long().to(self._device()), ids.detach().cpu()))

    def _device(self) -> torch.device:
        return self.W.device if self.W is not None else torch.device("cpu")

    def _staged_rows(self, gather: bool) -> tuple[Tensor, Tensor, Tensor]:
        """The staged features, labels and ids (over every rank with ``gather``: a collective under DDP)."""
        p = self.solved_head.shape[0]
        if self._staged:
            F, y, ids = (torch.cat(parts) for parts in zip(*self._staged))
        else:
            F = torch.zeros(0, p, dtype=self.row_dtype, device=self._device())
            y, ids = torch.zeros(0, dtype=torch.long, device=self._device()), torch.zeros(0, dtype=torch.long)
        if gather:
            F, y, ids = self.gather_over_ranks(F), self.gather_over_ranks(y), self.gather_over_ranks(ids)
        return F, y, ids

    def _commit(self, module: nn.Module) -> None:
        self.check_unchanged(module)
        F, y, ids = self._staged_rows(gather=False)  # this rank's new rows: they stay here
        if self.feature_rows is not None and self.labels is not None and self.row_ids is not None:
            F, y, ids = torch.cat([self.feature_rows, F]), torch.cat([self.labels, y]), torch.cat([self.row_ids, ids])
        problem = self.problem_of(F, y)
        solution = self.solve(problem, self.solved_head)
        self.feature_rows, self.labels, self.row_ids, self.W = F, y, ids, solution.W
        self.curvature = convex.FeatureCurvature.at(solution.W, problem)
        self.sums = solution.sums
        self.solution = _summary(solution, problem.passes)
        self.write_weights(module, self.W)

    def _staged_state(self) -> dict[str, Any]:
        # every rank saves every rank's staged rows (Lightning builds a checkpoint on every rank)
        F, y, ids = self._staged_rows(gather=True)
        return {**super()._staged_state(), "staged_features": F, "staged_labels": y, "staged_row_ids": ids}

    def _load_staged_state(self, state: dict[str, Any]) -> None:
        # the saved rows cover every rank: each keeps its share (they are committed where they are)
        F = state.get("staged_features")
        if F is not None and len(F):
            mine = self._share(len(F))
            self._staged = [
                (
                    F[mine].to(self._device(), self.row_dtype),
                    state["staged_labels"][mine].to(self._device()),
                    state["staged_row_ids"][mine],
                )
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
        """A boolean mask of the stored rows (this rank's) that belong to ``ids``."""
        return torch.isin(self._row_ids(), ids.cpu())

    def removal(self, ids: Tensor) -> Removal:
        """What a request for ``ids`` starts from: the rows left on this rank, the problem over every rank's rows
        left, and the curvature and :attr:`sums` at the head downdated by the removed rows (read from those rows only;
        every rank calls it, each removing the rows it holds).

        Raises:
            ValueError: the ranks' rows do not hold each of ``ids`` exactly once (the rows and the catalog
                disagree); nothing is changed.
        """
        drop = self.rows_of(ids)
        found = int(self.sum_over_ranks(torch.tensor(float(drop.sum()), dtype=torch.float64, device=self._device())))
        if found != len(ids):
            raise ValueError(
                f"SoftmaxHeadRecorder holds {found} rows of the {len(ids)} samples of this request (over every rank): "
                "its rows and its catalog disagree"
            )
        full = self.problem()
        if self._curvature is None or self._sums is None:  # after a load: built on the rows (counted)
            self.curvature = convex.FeatureCurvature.at(self.solved_head, full)
            self.sums = convex.HeadSums.at(self.solved_head, full)
        curvature, sums = self.curvature.restricted(full, ~drop), self.sums.without(full, drop)
        return Removal(~drop, full.restricted(~drop), curvature, sums, full.passes)

    def retained(self, removal: Removal, solution: convex.Solution) -> dict[str, Any]:
        """The change a request commits: the rows ``removal.keep`` of the stored ones (``keep``: the feature rows are
        compacted in place at the commit, never copied), the new head with its sums, and the downdated curvature."""
        return {
            "keep": removal.keep,
            "labels": self._labels()[removal.keep],
            "row_ids": self._row_ids()[removal.keep],
            "W": solution.W,
            "curvature": removal.curvature,
            "sums": solution.sums,
        }

    def _row_ids(self) -> Tensor:
        if self.row_ids is None:
            raise ValueError("SoftmaxHeadRecorder has no features yet: fit the module with the recorder first")
        return self.row_ids

    def _labels(self) -> Tensor:
        if self.labels is None:
            raise ValueError("SoftmaxHeadRecorder has no features yet: fit the module with the recorder first")
        return self.labels

    def apply_forget(self, ids: Tensor, change: Mapping[str, Any]) -> Callable[[], None]:
        """Apply the strategy's change (forgotten rows removed); return the undo.

        With ``keep`` (a request's mask of the rows that stay) the feature rows are compacted in place, block by
        block, so a request never holds a second copy of them; the forgotten rows' contents are kept until
        :meth:`erase_forgotten` (for the undo), as is the tail of the storage. With new ``feature_rows`` (a re-solve on
        recomputed features) the replaced matrix is kept until then.
        """
        change = dict(change)
        keep = change.pop("keep", None)
        old = self.feature_rows
        if keep is None:
            undo = super().apply_forget(ids, change)
            self._replaced = [] if old is None else [old]
            return self._undoing(undo)
        F = cast(Tensor, old)
        drop = (~keep).nonzero().squeeze(1).to(F.device)
        kept = keep.nonzero().squeeze(1).to(F.device)
        removed = F[drop].clone()
        for start in range(0, len(kept), convex.BLOCK_ROWS):  # writes land at or before the rows still to read
            part = kept[start : start + convex.BLOCK_ROWS]
            F[start : start + len(part)] = F[part]
        self.feature_rows = F[: len(kept)]
        self._replaced = [F[len(kept) :], removed]

        def expand() -> None:
            for start in reversed(range(0, len(kept), convex.BLOCK_ROWS)):  # the compaction, backwards
                part = kept[start : start + convex.BLOCK_ROWS]
                F[part] = F[start : start + len(part)].clone()
            F[drop] = removed
            self.feature_rows = F

        try:
            undo = super().apply_forget(ids, change)
        except BaseException:
            expand()
            raise

        def undo_all() -> None:
            undo()
            expand()

        return self._undoing(undo_all)

    def _undoing(self, undo: Callable[[], None]) -> Callable[[], None]:
        def undo_all() -> None:
            self._replaced = []
            undo()

        return undo_all

    def erase_forgotten(self, ids: Tensor) -> None:
        """Overwrite with zeros what the last request left of the forgotten rows: the replaced feature matrix (it may
        be referenced elsewhere), or the copy kept for the undo and the storage's tail beyond the rows that stay."""
        replaced, self._replaced = self._replaced, []
        for t in replaced:
            t.zero_()

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The recorder's state with every rank's rows: under DDP they are gathered on rank 0 (a collective: Lightning
        builds the checkpoint on every rank and writes rank 0's); another rank's state holds its own rows only,
        marked ``row_shard = [rank, R]``, and is not loadable alone."""
        state = super().state_dict()
        rows = {k: None if getattr(self, k) is None else getattr(self, k).clone() for k in _STATISTICS}
        shard = [0, 1]
        if self._strategy is not None and self.feature_rows is not None:
            for k in ("feature_rows", "labels", "row_ids"):
                rows[k] = self.gather_to_rank0(cast(Tensor, rows[k]))
            shard = self._row_shard()
        return {
            **state,
            "l2": self.l2,
            "radius": self.radius,
            **rows,
            "row_shard": shard,
            "perturbation": None if self.perturbation is None else self.perturbation.clone(),
            "solution": dict(self.solution),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the stored rows and head after checking them.

        The state holds every row; under torch.distributed (a DDP fit restoring a checkpoint, or a process group of
        a script) each process keeps the rows ``i % R == rank`` and joins the group (:meth:`join_process_group`),
        whatever the number of processes that saved it.

        Raises:
            ValueError: ``l2`` or ``radius`` differ; the state is another rank's part of a DDP state; rows, labels and
                ids disagree in length, or with the checkpoint catalog's live samples and labels; or the stored head
                is not within ``radius`` of the optimum over the stored rows (its certified gradient norm is
                recomputed): a tampered or corrupted state. Nothing is changed.
        """
        for key in ("l2", "radius"):
            if float(state_dict[key]) != getattr(self, key):
                raise ValueError(
                    f"checkpoint was recorded with {key}={state_dict[key]}, this recorder has {getattr(self, key)}"
                )
        self._refuse_row_shard(state_dict)
        perturbation = state_dict.get("perturbation")
        values = _checked_rows(state_dict) if state_dict.get("W") is not None else None
        if values is not None:
            values["feature_rows"] = values["feature_rows"].to(self.row_dtype)
            problem = convex.SoftmaxProblem(
                values["feature_rows"], values["labels"], values["W"].shape[1], self.l2, perturbation, None, self.dtype
            )
            norm, _ = convex.certified_gradient_norm(values["W"].to(self.dtype), problem)
            if norm > self.tolerance:
                raise ValueError(
                    f"refusing SoftmaxHeadRecorder state: its head's gradient norm over its rows is {norm:.3g}, above "
                    f"l2 * radius = {self.tolerance:.3g} (a tampered or corrupted state)"
                )
        super().load_state_dict(state_dict)
        self._join_loaded_group()
        if values is not None:
            mine = self._share(len(values["row_ids"]))
            values.update({k: values[k][mine] for k in ("feature_rows", "labels", "row_ids")})
        for k in _STATISTICS:
            setattr(self, k, None if values is None else values[k].clone())
        self.curvature, self.sums = None, None
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


def _summary(solution: convex.Solution, passes: int) -> dict[str, Any]:
    return {
        "gradient_norm": solution.gradient_norm,
        "newton_steps": solution.newton_steps,
        "hessian_products": solution.hessian_products,
        "passes": passes,
    }


@dataclass(frozen=True)
class Removal:
    """What a request starts from (:meth:`SoftmaxHeadRecorder.removal`).

    Args:
        keep: the mask of this rank's rows that stay.
        problem: eq. (1) over the rows that stay (every rank's).
        curvature: the preconditioner's curvature, downdated.
        sums: the sums over the rows that stay at the current head, downdated (no pass).
        passes: passes spent building what was missing (the curvature or sums after a checkpoint was loaded).
    """

    keep: Tensor
    problem: convex.SoftmaxProblem
    curvature: convex.FeatureCurvature
    sums: convex.HeadSums
    passes: int
