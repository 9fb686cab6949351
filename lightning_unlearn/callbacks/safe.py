"""`SAFERecorder`: records during fit what SAFE ([SAFE]) keeps instead of the training data."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import lightning as L
import torch
from torch import Tensor, nn

from lightning_unlearn import contract
from lightning_unlearn.callbacks.base import RecorderCallback, gather_batch
from lightning_unlearn.data import unpack_batch
from lightning_unlearn.functional import safe
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.progress import progress
from lightning_unlearn.regularization import ProximalRegularizer

_STATE = (
    "V",
    "counts",
    "s1",
    "s2",
    "ref_counts",
    "ref_mean",
    "ref_cov",
    "w0",
    "buffers0",
    "grad_sum",
    "loss_sum",
    "n_anchor",
    "forget_ids",
    "rounds",
    "cumulative_surrogate",
)


class Anchor(NamedTuple):
    """What a fit's anchor pass recorded (:meth:`SAFERecorder.require_anchor` returns it once present)."""

    V: Tensor  # the projection of Eq. (21)
    w0: dict[str, Tensor]  # the anchor weights of Eq. (27)
    ref_counts: Tensor  # the t = 0 reference (n_0, mu_0, Sigma_0) of Eq. (20)-(24)
    ref_mean: Tensor
    ref_cov: Tensor


class SAFERecorder(RecorderCallback):
    """The statistics of Algorithm 1's inputs ([SAFE] Sec. 3.2), recorded during fit; no retained data is kept.

    During the first epoch, per class ``c``: the count ``n(c)`` and the sums of ``u`` and ``u u^T`` of the random
    projection ``u = V^T vec(x)`` (Eq. (21)). At the end of the fit, at the final weights ``w_0`` (the anchor of every
    round, Eq. (27)), one pass over the training loader: ``sum grad_w l(f(x; w_0), y)`` and ``sum l`` (Eq. (12),
    float64, eval mode), and a copy of ``w_0``; the class statistics then are the ``t = 0`` reference of Eq.
    (20)-(24). :class:`SAFEUnlearner` subtracts each request's samples from them. ``l`` is the module's per-sample
    prediction loss, checked on the first batch against its training loss. What a second fit re-anchors, the device
    and the DDP sums: ``docs/methods/safe.md``, "Recording".

    Args:
        num_classes: number of classes ``C`` (labels must lie in ``[0, C)``).
        proj_dim: dimension ``k`` of the projection ``V`` (not given in the paper; [interp] 16).
        ridge: covariance regulariser, relative to ``trace(Sigma)/k`` ([interp]; not in the paper).
        seed: seed of ``V``.
        loss_fn: ``loss_fn(outputs, targets) -> (n,)`` per-sample prediction loss (default: cross-entropy).
        offload: keep the statistics on the CPU instead of the module's device.

    Raises:
        ValueError: bad sizes; at fit start, a training loss that is not ``mean loss_fn`` (+ penalty).

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import IndexedDataset, SAFERecorder, SupervisedClassifier
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))
        >>> model, recorder = SupervisedClassifier(torch.nn.Linear(4, 3)), SAFERecorder(num_classes=3, proj_dim=2)
        >>> L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...           enable_progress_bar=False, enable_model_summary=False).fit(model, DataLoader(data, batch_size=8))
        >>> int(recorder.counts.sum()), tuple(recorder.ref_cov.shape)  # n(c) summed; Sigma_0 per class, k x k
        (32, (3, 2, 2))
        >>> recorder.n_anchor, sorted(recorder.grad_sum)  # |D_0| and the anchor's gradient sum, per parameter
        (32, ['net.bias', 'net.weight'])
    """

    gathers_inputs = False
    records_parameters = True
    checks_loss_on_first_batch = True

    def __init__(
        self,
        num_classes: int,
        proj_dim: int = 16,
        ridge: float = 1e-4,
        seed: int = 0,
        loss_fn: contract.LossFn | None = None,
        offload: bool = False,
    ) -> None:
        super().__init__()
        if num_classes < 2 or proj_dim < 1 or ridge < 0:
            raise ValueError(
                f"SAFERecorder needs num_classes >= 2, proj_dim >= 1, ridge >= 0; got {num_classes}, "
                f"{proj_dim}, {ridge}"
            )
        self.num_classes, self.proj_dim, self.ridge, self.seed = (
            int(num_classes),
            int(proj_dim),
            float(ridge),
            int(seed),
        )
        self.loss_fn: contract.LossFn = loss_fn or contract.per_sample_cross_entropy
        self.offload = offload
        self.V: Tensor | None = None
        self.counts = torch.zeros(self.num_classes, dtype=torch.float64)
        self.s1 = torch.zeros(self.num_classes, self.proj_dim, dtype=torch.float64)
        self.s2 = torch.zeros(self.num_classes, self.proj_dim, self.proj_dim, dtype=torch.float64)
        self.ref_counts: Tensor | None = None
        self.ref_mean: Tensor | None = None
        self.ref_cov: Tensor | None = None
        self.w0: dict[str, Tensor] | None = None
        self.buffers0: dict[str, Tensor] = {}
        self.grad_sum: dict[str, Tensor] = {}  # sum over retained samples of grad l(w_0) (Eq. (15) as a sum)
        self.loss_sum = torch.zeros((), dtype=torch.float64)  # sum over retained samples of l(w_0)
        self.n_anchor = 0  # |D_0|
        # ids of F_1..F_t (never their inputs: a forgotten sample's data is kept nowhere)
        self.forget_ids = torch.empty(0, dtype=torch.long)
        self.rounds = 0
        self.cumulative_surrogate = 0.0
        self._staged: tuple[Tensor, Tensor, Tensor] | None = None
        self._V_device: Tensor | None = None  # V on the device of the batches (class sums are taken there)
        self._prior: tuple[dict[str, Tensor], Tensor] = ({}, torch.zeros((), dtype=torch.float64))
        self._anchor_key: tuple[int, int] | None = None  # (experience, global step) of the last anchor pass

    @property
    def state_key(self) -> str:
        return self._generate_state_key(num_classes=self.num_classes, proj_dim=self.proj_dim, seed=self.seed)

    # -- derived quantities ------------------------------------------------------------------------
    @property
    def n_retained(self) -> int:
        """``|D_t|``: learned samples not yet forgotten."""
        return int(self.counts.sum())

    @property
    def param_names(self) -> list[str]:
        return list(self.w0) if self.w0 is not None else []

    def moments(self, counts: Tensor, s1: Tensor, s2: Tensor) -> tuple[Tensor, Tensor]:
        return safe.class_moments(counts, s1, s2, self.ridge)

    def require_anchor(self) -> Anchor:
        """The anchor ``w_0`` and its statistics; ``ValueError`` unless a fit has recorded them."""
        self.require_fitted()
        V, w0, counts, mean, cov = self.V, self.w0, self.ref_counts, self.ref_mean, self.ref_cov
        if V is None or w0 is None or counts is None or mean is None or cov is None:
            raise ValueError("SAFERecorder has no anchor: the fit ended before its final gradient pass")
        return Anchor(V, w0, counts, mean, cov)

    # -- recording -------------------------------------------------------------------------------
    def loss_penalty(self, trainer: L.Trainer) -> Callable[[nn.Module], Tensor] | None:
        """The penalty of the first ``in_loss`` :class:`ProximalRegularizer` among the trainer's callbacks, if any."""
        regs = [c for c in trainer.callbacks if isinstance(c, ProximalRegularizer) and c.in_loss]  # type: ignore[attr-defined]
        return regs[0].penalty if regs else None

    def _home(self, module: nn.Module) -> torch.device:
        """Where the statistics live: the module's device, or the CPU with ``offload``."""
        param = next(module.parameters(), None)
        return torch.device("cpu") if self.offload or param is None else param.device

    def begin_experience(self, module: nn.Module) -> None:
        super().begin_experience(module)
        home = self._home(module)
        self.counts, self.s1, self.s2 = self.counts.to(home), self.s1.to(home), self.s2.to(home)
        if self._anchor_key is None or self._anchor_key[0] != self._fit_experience:
            self._prior = ({k: v.clone() for k, v in self.grad_sum.items()}, self.loss_sum.clone())

    def _drop_staged(self) -> None:
        super()._drop_staged()
        self._staged = None

    def _record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        if y.min() < 0 or y.max() >= self.num_classes:
            raise ValueError(
                f"SAFERecorder(num_classes={self.num_classes}) got labels outside [0, {self.num_classes}): "
                f"{y.unique().tolist()[:10]}"
            )
        p = x[0].numel()
        if self.V is None:
            g = torch.Generator().manual_seed(self.seed)
            self.V = torch.randn(p, self.proj_dim, generator=g, dtype=torch.float64)
        elif self.V.shape[0] != p:
            raise ValueError(f"inputs have {p} features but the recorded projection V expects {self.V.shape[0]}")
        if self._V_device is None or self._V_device.device != x.device:
            self._V_device = self.V.to(x.device)
        n, s1, s2 = safe.class_sums(
            safe.project(x.detach(), self._V_device), y, self.num_classes
        )  # on the batch's device
        if self._staged is not None:
            n, s1, s2 = n + self._staged[0], s1 + self._staged[1], s2 + self._staged[2]
        self._staged = (n, s1, s2)

    summed_states = ("_staged",)  # this rank's staged class sums (n, sum u, sum u u^T), added over the ranks once

    def _zero_state(self, name: str) -> tuple[Tensor, Tensor, Tensor]:
        return torch.zeros_like(self.counts), torch.zeros_like(self.s1), torch.zeros_like(self.s2)

    def _staged_sums(self) -> tuple[Tensor, Tensor, Tensor]:
        """The staged class sums added over the ranks (one collective under DDP), moved to the statistics' device
        once."""
        n, s1, s2 = self.summed_staged()["_staged"]
        return n.to(self.counts.device), s1.to(self.counts.device), s2.to(self.counts.device)

    def _commit(self, module: nn.Module) -> None:
        if self._staged is None and self._strategy is None:
            raise RuntimeError("SAFERecorder: samples were staged without their class sums")
        n, s1, s2 = self._staged_sums()
        self.counts, self.s1, self.s2 = self.counts + n, self.s1 + s1, self.s2 + s2

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        last = (
            trainer.max_epochs is not None
            and trainer.max_epochs >= 0
            and trainer.current_epoch + 1 >= trainer.max_epochs
        )
        if last or trainer.should_stop:
            self.anchor(trainer, pl_module)  # before ModelCheckpoint (Lightning runs it last) saves

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if self._anchor_key != (self._fit_experience, trainer.global_step):
            self.anchor(trainer, pl_module)

    def anchor(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        """Anchor at the end of a Lightning fit: one pass over the trainer's training loader (under DDP each rank
        passes over its own batches; their ids are gathered to count a padded repeat once)."""

        loader = trainer.train_dataloader
        if loader is None:
            raise ValueError("SAFERecorder anchors on the trainer's training loader, but the trainer has none")

        def batches() -> Iterator[tuple[Tensor, Tensor, Tensor]]:
            for batch in loader:
                yield tuple(t.to(module.device) for t in unpack_batch(batch, self.batch_keys))  # type: ignore[misc]

        gather = (lambda t: gather_batch(module, t)) if trainer.world_size > 1 else None
        self.anchor_on(module, batches(), trainer.global_step, gather)

    def anchor_on(
        self,
        module: nn.Module,
        batches: Iterable[tuple[Tensor, Tensor, Tensor]],
        step: int,
        gather: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        """Take the module's weights as ``w_0`` and sum ``grad l`` and ``l`` at ``w_0`` over this fit's samples.

        Framework-neutral (the Avalanche plugin calls it after each experience): ``batches`` yields
        ``(x, y, ids)`` covering the experience's samples (others and repeats are skipped), on the
        module's device; ``step`` is the training step count the anchor belongs to. Under DDP ``gather``
        stacks every rank's ids of a batch (rank-major): each rank sums its own rows, then the sums are added.
        """
        if not len(self.catalog):
            return
        names = [n for n, p in module.named_parameters() if p.requires_grad]
        params = {n: p.detach() for n, p in module.named_parameters() if p.requires_grad}
        buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
        grads = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}  # on the module's device
        loss = torch.zeros((), dtype=torch.float64, device=next(iter(params.values())).device)
        seen: set[int] = set()
        with eval_mode(module):  # BN statistics must not move
            for x, y, ids in progress(batches, desc="SAFE anchor pass", unit="batch"):
                if gather is None:
                    keep = self._fit_rows(ids, seen)
                else:  # positions in the gathered batch; this rank's own are rank * n ... (rank + 1) * n - 1
                    start = self.global_rank * len(ids)
                    keep = self._fit_rows(gather(ids), seen)
                    keep = keep[(keep >= start) & (keep < start + len(ids))] - start
                if keep.numel():
                    g, value = safe.summed_loss_grad(module, params, buffers, x[keep], y[keep], self.loss_fn)
                    for n in names:
                        grads[n] += g[n].detach().double()
                    loss += value.double()
        if gather is not None:  # the ranks' sums added, in one collective
            flat = self.sum_over_ranks(torch.cat([*(grads[n].reshape(-1) for n in names), loss.reshape(1)]))
            parts = flat.split([grads[n].numel() for n in names] + [1])
            grads = {n: part.view_as(grads[n]) for n, part in zip(names, parts)}
            loss = parts[-1][0]
        prior_grads, prior_loss = self._prior
        home = self._home(module)
        self.grad_sum = {
            n: grads[n].to(home) + prior_grads[n].to(home) if n in prior_grads else grads[n].to(home) for n in names
        }
        self.loss_sum = loss.to(home) + prior_loss.to(home)
        self.w0 = {n: p.detach().to(home, copy=True) for n, p in params.items()}
        self.buffers0 = {n: b.to(home) for n, b in buffers.items()}
        self.ref_counts = self.counts.clone()
        self.ref_mean, self.ref_cov = self.moments(self.counts, self.s1, self.s2)
        self.n_anchor = self.n_retained
        self.forget_ids = torch.empty(0, dtype=torch.long)
        self.rounds, self.cumulative_surrogate = 0, 0.0
        self._anchor_key = (self._fit_experience, step)

    def _fit_rows(self, ids: Tensor, seen: set[int]) -> Tensor:
        """Rows of a batch holding samples learned in this fit, not forgotten, not seen yet in the pass."""
        cand = [k for k, i in enumerate(ids.tolist()) if i not in seen and i in self.catalog]
        if not cand:
            return torch.empty(0, dtype=torch.long, device=ids.device)
        rows = self.catalog.rows(ids[cand].cpu())
        ok = (self.catalog.experiences[rows] == self._fit_experience) & ~self.catalog.forgotten[rows]
        keep = [k for k, good in zip(cand, ok.tolist()) if good]
        seen.update(ids[keep].tolist())
        return torch.tensor(keep, dtype=torch.long, device=ids.device)

    # -- one round (computed by SAFEUnlearner) ----------------------------------------------
    def round_change(
        self, x: Tensor, y: Tensor, ids: Tensor, grad_sum: dict[str, Tensor], loss_sum: Tensor, surrogate: float
    ) -> dict[str, Any]:
        """The statistics after removing ``F_t`` (Eq. (15), Eq. (22)-(23)), for :meth:`apply_forget`.

        Only the ids of ``F_t`` are kept (for the sum over ``F_1..F_t`` of Eq. (25)), never its inputs.
        """
        V, home = self.require_anchor().V.to(x.device), self.counts.device
        counts, s1, s2 = safe.remove_samples(self.counts, self.s1, self.s2, safe.project(x, V), y)
        return {
            "counts": counts,
            "s1": s1,
            "s2": s2,
            "grad_sum": {n: g.to(home) for n, g in grad_sum.items()},
            "loss_sum": loss_sum.to(home),
            "forget_ids": torch.cat([self.forget_ids, ids]),
            "rounds": self.rounds + 1,
            "cumulative_surrogate": self.cumulative_surrogate + surrogate,
        }

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in _STATE}
        state = {
            k: (
                {n: t.clone() for n, t in v.items()}
                if isinstance(v, dict)
                else v.clone()
                if isinstance(v, Tensor)
                else v
            )
            for k, v in state.items()
        }
        return {
            **super().state_dict(),
            **state,
            "num_classes": self.num_classes,
            "proj_dim": self.proj_dim,
            "ridge": self.ridge,
            "anchor_key": list(self._anchor_key) if self._anchor_key else None,
        }

    def _staged_state(self) -> dict[str, Any]:
        # every rank saves the sums over all ranks (Lightning builds a checkpoint on every rank)
        return {"staged": self._staged_sums() if self._staged_ids else None, "prior": self._prior}

    def _load_staged_state(self, state: dict[str, Any]) -> None:
        staged = state.get("staged")
        # the saved sums cover every rank: one rank carries them on
        mine = self.trainer is None or self.trainer.global_rank == 0
        self._staged = None if staged is None or not mine else tuple(staged)
        if state.get("prior") is not None:
            self._prior = (dict(state["prior"][0]), state["prior"][1])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # saved during the first fit, before its anchor: no anchor statistics yet
        first_fit = state_dict.get("fit") is not None and not len((state_dict.get("catalog") or {}).get("ids", ()))
        needed = ("catalog",) if first_fit else ("catalog", "V", "w0", "ref_counts")
        missing = [k for k in needed if state_dict.get(k) is None]
        if missing:
            raise ValueError(f"SAFERecorder state lacks recorded statistics {missing}")
        ours = (self.num_classes, self.proj_dim, self.ridge)
        theirs = (state_dict["num_classes"], state_dict["proj_dim"], state_dict["ridge"])
        if tuple(theirs) != ours:
            raise ValueError(
                f"checkpoint was recorded with (num_classes, proj_dim, ridge)={theirs}, this recorder has {ours}"
            )
        super().load_state_dict(state_dict)
        for k in _STATE:
            v = state_dict[k]
            setattr(
                self,
                k,
                {n: t.clone() for n, t in v.items()}
                if isinstance(v, dict)
                else v.clone()
                if isinstance(v, Tensor)
                else v,
            )
        self._anchor_key = tuple(state_dict["anchor_key"]) if state_dict.get("anchor_key") else None
