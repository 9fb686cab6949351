"""`AnalyticRecorder`: records what ACU needs while an analytic head learns a stream of experiences."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.frozen import FrozenFeatureRecorder
from lightning_unlearn.core.undo import applied
from lightning_unlearn.functional import acu

_STATISTICS = ("R", "Q", "T", "W")


def require_statistic(value: Tensor | None, name: str) -> Tensor:
    """``value``, one of the :class:`AnalyticRecorder` statistics; ``ValueError`` naming it if none is recorded yet."""
    if value is None:
        raise ValueError(f"AnalyticRecorder has no {name} yet: fit the module with the recorder first")
    return value


class AnalyticRecorder(FrozenFeatureRecorder):
    """Accumulates ``R = sum f^T f`` and ``Q = sum f^T y`` (float64) and keeps the ridge head ([ACU] eq. 1-4).

    Two ways to name the model parts:

    * ``backbone="trunk", head="head"``: any ``LightningModule`` with a frozen submodule ``trunk``
      and an :class:`AnalyticHead` (or a plain ``nn.Linear``, with or without bias) ``head`` on its
      output. The recorder runs the backbone itself, in float64 and eval mode
      (:func:`~lightning_unlearn.models.float64_forward`); it puts the backbone in eval mode at fit
      start and refuses an experience during which the backbone's parameters or buffers changed
      (e.g. batch-norm statistics updated by a train-mode forward).
    * ``backbone=None`` (default): the module has ``features(x) -> (n, d_F)`` and an
      ``nn.Linear`` ``head``, e.g. :class:`~lightning_unlearn.models.AnalyticClassifier`; features a
      ``training_step`` returns as ``{"features": f}`` are reused.

    A head with a bias is solved on features with a constant 1 appended (``W`` then has
    ``d_F + 1`` rows, the last one the bias). No input is ever stored: after each experience the
    recorder solves eq. (3)/(4) for ``W`` and ``T`` and writes ``W`` into the head.

    Under DDP each rank accumulates the samples it sees and the ranks' sums are added once per
    experience (``gathers_inputs = False``); ids, labels and fingerprints are gathered.

    Forgetting (:class:`~lightning_unlearn.unlearners.acu.ACUUnlearner`) updates ``T`` in place by a
    rank-``k`` product and leaves ``R`` and ``Q`` to be brought up to date lazily: reading :attr:`T`,
    :attr:`R` or :attr:`Q` (or :meth:`state_dict`) applies the committed but not yet applied updates in
    place. The forgotten samples' feature rows and one-hot labels wait for that in memory only; nothing
    the library writes holds them.

    Args:
        ridge: the ridge regulariser, ``gamma`` of eq. (2).
        dtype: dtype of the statistics (float64 is what makes forgetting exact to ~1e-12).
        backbone: name of the frozen backbone submodule (see above), or ``None``.
        head: name of the head submodule.
        device: where the statistics live (default: the head's device; e.g. ``"cpu"`` to offload).
        fingerprint: see :class:`RecorderCallback`.

    Raises:
        ValueError: ``ridge`` is not positive.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import AnalyticClassifier, AnalyticRecorder, IndexedDataset
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))  # items (x, y, id)
        >>> model = AnalyticClassifier(torch.nn.Linear(4, 8), backbone_dim=8, num_classes=3)  # features: d_F = 8
        >>> recorder = AnalyticRecorder(ridge=1.0)
        >>> trainer = L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...                     enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(model, DataLoader(data, batch_size=8))
        >>> tuple(recorder.R.shape), tuple(recorder.Q.shape), recorder.R.dtype  # sum f^T f, sum f^T y
        ((8, 8), (8, 3), torch.float64)
        >>> torch.equal(model.head.weight.T, recorder.W)  # the ridge solution W, written into the head
        True
    """

    gathers_inputs = False
    solver_name = "ACU"

    def __init__(
        self,
        ridge: float = 1.0,
        dtype: torch.dtype = torch.float64,
        *,
        backbone: str | None = None,
        head: str = "head",
        device: str | torch.device | None = None,
        fingerprint: bool = True,
    ) -> None:
        super().__init__(dtype=dtype, backbone=backbone, head=head, device=device, fingerprint=fingerprint)
        if ridge <= 0:
            raise ValueError(f"AnalyticRecorder ridge must be positive, got {ridge}")
        self.ridge = float(ridge)
        self._R: Tensor | None = None  # sum f^T f, less the rows in _pending_rows
        self._Q: Tensor | None = None  # sum f^T y, less the rows in _pending_rows with their _pending_targets
        self._T: Tensor | None = None  # knowledge tracking matrix, eq. (4) then eq. (5), less _pending_T
        self.W: Tensor | None = None  # analytic head, eq. (3) then eq. (6)
        self._pending_rows: list[Tensor] = []  # features of forgotten samples not yet subtracted from _R and _Q
        self._pending_targets: list[Tensor] = []  # their one-hot labels, not yet subtracted from _Q
        self._pending_T: tuple[Tensor, Tensor] | None = None  # (FT, S) of eq. (5) not yet added to _T
        self._dR: Tensor | None = None  # this rank's staged sums
        self._dQ: Tensor | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(ridge=self.ridge)

    # -- statistics, brought up to date on read ---------------------------------------------------
    @property
    def R(self) -> Tensor | None:
        """``sum f^T f`` over the learned, not forgotten samples (reading it subtracts pending rows in place)."""
        self._subtract_pending_rows()
        return self._R

    @R.setter
    def R(self, value: Tensor | None) -> None:
        self._subtract_pending_rows()  # (Q's share of them stays right)
        self._R = value

    @property
    def Q(self) -> Tensor | None:
        """``sum f^T y`` over the learned, not forgotten samples (reading it subtracts pending rows in place)."""
        self._subtract_pending_rows()
        return self._Q

    @Q.setter
    def Q(self, value: Tensor | None) -> None:
        self._subtract_pending_rows()
        self._Q = value

    @property
    def T(self) -> Tensor | None:
        """Tracking matrix ``(R + gamma I)^{-1}`` (reading it applies a pending eq. (5) update in place)."""
        self._apply_pending_tracking_update()
        return self._T

    @T.setter
    def T(self, value: Tensor | None) -> None:
        self._T, self._pending_T = value, None

    def _subtract_pending_rows(self) -> None:
        if self._pending_rows:
            P, Y = torch.cat(self._pending_rows), torch.cat(self._pending_targets)
            require_statistic(self._R, "R").addmm_(P.T, P, alpha=-1)
            require_statistic(self._Q, "Q").addmm_(P.T, Y, alpha=-1)
            self._pending_rows, self._pending_targets = [], []

    def _apply_pending_tracking_update(self) -> None:
        if self._pending_T is not None:
            acu.apply_tracking_update(require_statistic(self._T, "T"), *self._pending_T)
            self._pending_T = None

    # -- recording ----------------------------------------------------------------------------------
    def begin_experience(self, module: nn.Module) -> None:
        linear = self.head_of(module)
        self.check_frozen(module)
        d_F = linear.in_features + (linear.bias is not None)
        d_C = linear.out_features
        device = self._stats_device(linear)
        if self._R is None:
            self.R = torch.zeros(d_F, d_F, dtype=self.dtype, device=device)
            self.Q = torch.zeros(d_F, d_C, dtype=self.dtype, device=device)
        else:
            Q = require_statistic(self.Q, "Q")
            if self._R.shape[0] != d_F or Q.shape[1] != d_C:
                raise ValueError(
                    f"module head is {d_F}x{d_C} (bias counted as a row) but the recorded statistics are "
                    f"{tuple(Q.shape)}"
                )
            self._to(device)
        super().begin_experience(module)

    def _to(self, device: torch.device) -> None:
        self.R, self.T = (v.to(device) if v is not None else None for v in (self.R, self.T))
        self.Q, self.W = (v.to(device) if v is not None else None for v in (self.Q, self.W))

    def _drop_staged(self) -> None:
        super()._drop_staged()
        self._dR = self._dQ = None

    summed_states = ("_dR", "_dQ")  # this rank's staged sum f^T f and sum f^T y, added over the ranks once

    def _zero_state(self, name: str) -> Tensor:
        return torch.zeros_like(require_statistic(self._R, "R") if name == "_dR" else require_statistic(self.Q, "Q"))

    def _staged_sums(self) -> tuple[Tensor, Tensor]:
        """The staged block's ``(dR, dQ)`` summed over the ranks (a collective call under DDP)."""
        sums = self.summed_staged()
        return sums["_dR"], sums["_dQ"]

    def _staged_state(self) -> dict[str, Any]:
        # every rank saves the sums over all ranks (Lightning builds a checkpoint on every rank)
        dR, dQ = self._staged_sums()
        return {**super()._staged_state(), "dR": dR, "dQ": dQ}

    def _load_staged_state(self, state: dict[str, Any]) -> None:
        # the saved sums cover every rank: one rank carries them on (the same summation order as uninterrupted)
        if state.get("dR") is not None and (self.trainer is None or self.trainer.global_rank == 0):
            self._dR, self._dQ = state["dR"].to(self._R), state["dQ"].to(self._R)
        super()._load_staged_state(state)

    def _record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        f = outputs.get("features") if isinstance(outputs, dict) and self.backbone is None else None
        F = self._augment(f, self.head_of(module)) if f is not None else self.features(module, x)
        Q = require_statistic(self.Q, "Q")
        Y = acu.one_hot(y.to(F.device), Q.shape[1], self.dtype)
        dR, dQ = self._dR, self._dQ
        if dR is None or dQ is None:
            dR, dQ = torch.zeros_like(require_statistic(self._R, "R")), torch.zeros_like(Q)
        self._dR, self._dQ = acu.accumulate(dR, dQ, F, Y)

    def _commit(self, module: nn.Module) -> None:
        self.check_unchanged(module)
        dR, dQ = self._staged_sums()
        R, Q = require_statistic(self.R, "R") + dR, require_statistic(self.Q, "Q") + dQ
        T, W = acu.ridge_solution(R, Q, self.ridge)
        self.R, self.Q, self.T, self.W = R, Q, T, W
        self.write_head(module)

    def write_head(self, module: nn.Module) -> None:
        """Copy ``W`` into the head (:meth:`write_weights`)."""
        self.write_weights(module, require_statistic(self.W, "W"))

    # -- forgetting ---------------------------------------------------------------------------------
    def apply_forget(self, ids: Tensor, change: Mapping[str, Any]) -> Callable[[], None]:
        """Commit an ACU request's statistics (the strategy marks the catalog); return its exact undo.

        ``change`` is either new ``R, Q, T, W`` (the re-solve path: replaced by reference, see
        :meth:`RecorderCallback.apply_forget`) or the Woodbury path's ``{"tracking_update": (FT, S),
        "forgotten_rows": F, "forgotten_targets": Y, "W": W}``: ``W`` (``d_F x d_C``) is replaced by
        reference, the ``d_F x d_F`` update of ``T`` is kept as its ``O(k d_F)`` factors and the rows
        ``F`` (with their one-hot labels ``Y``) as what ``R`` and ``Q`` lack, applied in place when
        :attr:`T`, :attr:`R` or :attr:`Q` is next read. The undo drops them, so it is exact (bit for
        bit). Were they applied before the undo, it takes them back by the inverse updates instead,
        exact up to a few ulps of rounding per entry.

        Raises:
            ValueError: ``change`` has other keys.
        """
        if "tracking_update" not in change:
            return super().apply_forget(ids, change)
        expected = {"tracking_update", "forgotten_rows", "forgotten_targets", "W"}
        if set(change) != expected:
            raise ValueError(f"an ACU Woodbury change has keys {sorted(expected)}, got {sorted(change)}")
        FT, S = change["tracking_update"]
        F, Y = change["forgotten_rows"], change["forgotten_targets"]
        self._apply_pending_tracking_update()  # an earlier committed update, if any, goes first
        if sum(len(P) for P in self._pending_rows) + len(F) > require_statistic(self._R, "R").shape[0]:
            self._subtract_pending_rows()  # hold at most d_F rows: no more memory than R itself
        old_W, old_rows, old_targets = self.W, self._pending_rows, self._pending_targets  # (no update of T held)
        rows, targets = [*old_rows, F], [*old_targets, Y]
        update = (FT, S)
        held = False  # set once all is held: from then on a read of T, R or Q may have applied it

        def undo() -> None:
            if held and self._pending_T is not update:  # applied in place by a read of T: take it back
                acu.apply_tracking_update(require_statistic(self._T, "T"), FT, S, alpha=-1)
            self._pending_T = None
            if held and self._pending_rows is not rows:  # subtracted from R and Q with the earlier rows: add back
                require_statistic(self._R, "R").addmm_(F.T, F)
                require_statistic(self._Q, "Q").addmm_(F.T, Y)
            else:
                self._pending_rows, self._pending_targets = old_rows, old_targets
            self.W = old_W

        def hold() -> None:
            nonlocal held
            self.W = change["W"]
            self._pending_rows, self._pending_targets = rows, targets
            self._pending_T = update
            held = True

        return applied(hold, undo)

    # -- state --------------------------------------------------------------------------------------
    def check_consistency(self) -> None:
        """Raise ``ValueError`` naming what fails if ``W != T Q`` or ``T (R + gamma I) != I`` (float64 tolerance)."""
        R, Q, T, W = (require_statistic(getattr(self, k), k) for k in _STATISTICS)  # reading R and T applies updates
        errors = acu.consistency_errors(R, Q, T, W, self.ridge)
        if errors:
            raise ValueError(f"AnalyticRecorder statistics are inconsistent: {'; '.join(errors)}")

    def state_dict(self) -> dict[str, Any]:
        stats = {k: getattr(self, k) for k in _STATISTICS}  # reading R and T applies pending updates
        return {
            **super().state_dict(),
            "ridge": self.ridge,
            **{k: v.clone() if v is not None else None for k, v in stats.items()},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the statistics after checking them.

        Raises:
            ValueError: statistics are missing, ``ridge`` differs, or they are inconsistent
                (``W != T Q``, ``T (R + gamma I) != I``: a tampered or corrupted state); nothing is changed.
        """
        # saved during the first fit, before its first commit: no solution W, T yet
        first_fit = state_dict.get("fit") is not None and not len((state_dict.get("catalog") or {}).get("ids", ()))
        needed = ("catalog", "R", "Q") if first_fit else ("catalog", *_STATISTICS)
        missing = [k for k in needed if state_dict.get(k) is None]
        if missing:
            raise ValueError(f"AnalyticRecorder state lacks recorded statistics {missing}")
        if float(state_dict["ridge"]) != self.ridge:
            raise ValueError(
                f"checkpoint was recorded with ridge={state_dict['ridge']}, this recorder has {self.ridge}"
            )
        stats: dict[str, Tensor | None] = {
            k: None if state_dict.get(k) is None else state_dict[k].to(self.dtype) for k in _STATISTICS
        }
        R, Q, T, W = (stats[k] for k in _STATISTICS)
        if not first_fit:
            cR, cQ, cT, cW = (require_statistic(stats[k], k) for k in _STATISTICS)  # all present: checked above
            errors = acu.consistency_errors(cR, cQ, cT, cW, self.ridge)
            if errors:
                raise ValueError(f"refusing AnalyticRecorder state: {'; '.join(errors)}")
        super().load_state_dict(state_dict)
        self.R, self.Q, self.T, self.W = (None if v is None else v.clone() for v in (R, Q, T, W))
