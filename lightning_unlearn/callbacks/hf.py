"""`TrajectoryRecorder`: HF's per-sample statistic vectors, updated along the SGD trajectory during fit."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from lightning_unlearn import contract
from lightning_unlearn.callbacks.base import RecorderCallback, gather_batch
from lightning_unlearn.core.undo import applied
from lightning_unlearn.data import unpack_batch
from lightning_unlearn.functional import autodiff, hf
from lightning_unlearn.regularization import ProximalRegularizer
from lightning_unlearn.store import RowStore
from lightning_unlearn.warnings import warn

_STATE_KEYS = (
    "catalog",
    "A",
    "row_ids",
    "active",
    "lrs",
    "batch_sizes",
    "occ_rows",
    "occ_steps",
    "grad_max",
    "smoothness",
    "l2",
)


class TrajectoryRecorder(RecorderCallback):
    """Keeps, for every tracked training sample ``u``, [HF]'s approximator ``a^{-u}`` (Eq. (10)-(11)), so that
    ``w + a^{-u}`` approximates the model retrained without ``u`` (same initialisation and batch order).

    Before every SGD step, at ``w_t``, it updates every live vector with the step's actual learning rate, batch
    and mean batch Hessian ``H_t`` (about one Hessian-vector product per tracked sample per step)::

        a_u <- (I - eta_t H_t) a_u + 1[u in B_t] (eta_t / |B_t|) grad l(w_t; u)

    over the whole trajectory of all experiences, never reset; deleted samples' vectors are zeroed. It needs plain
    SGD (``weight_decay`` is the ridge ``l2``), a training loss equal to ``mean loss_fn``, no Dropout in training
    mode; BatchNorm running buffers are not forgotten (a warning). Memory: ``n_tracked * d * bytes(dtype)``.
    Outside Lightning: :meth:`check_optimizer`, :meth:`begin_experience`, :meth:`before_step` before every
    optimizer step, :meth:`end_experience`. Derivation, cost, float16 error, DDP sharding, checkpoints:
    docs/methods/hf.md.

    Args:
        dtype: storage dtype of the vectors (float32 or float16; float64 for verification).
        store: ``"memory"`` or ``"mmap"`` (a new memory-mapped file; checkpoints reference it by its digest).
        path: file of the memory map (``store="mmap"``; under DDP suffixed ``.rank<r>``).
        capacity: rows to allocate for ``store="mmap"``.
        track: sample ids to keep vectors for (``None``: all).
        hessian: ``"hvp"``, ``"dense"`` or ``"auto"`` (dense when ``d <= 2048`` and there are more vectors than
            parameters).
        chunk_size: vectors per batched HVP call and per-sample gradients per ``vmap`` chunk; ``None``: as many
            as fit in ``hf.HVP_MEMORY`` bytes, measured on the first step of each fit.
        power_iters: power-iteration steps per SGD step estimating ``M = ||H_t||`` (warm-started).
        row_block: vectors processed at a time (peak memory ``row_block * d`` besides the store).
        loss_fn: ``loss_fn(outputs, targets) -> (n,)`` per-sample loss (default: cross-entropy).
        offload: keep the vectors of an in-memory store on the CPU instead of the module's device.

    Raises:
        ValueError: at construction, an unknown ``dtype``, ``store`` or ``hessian``, or ``store="mmap"`` without
            ``path`` and ``capacity``; at fit start, an optimizer other than plain SGD, gradient accumulation or
            clipping, a ``ProximalRegularizer``, Dropout in training mode, or a loss other than ``mean loss_fn``
            (first batch); during fit, a vector leaving ``dtype``'s range (naming its sample); on load, a DDP
            state saved with ``store="memory"``.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import IndexedDataset, SupervisedClassifier, TrajectoryRecorder
        >>> _ = torch.manual_seed(0)
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,))))
        >>> model = SupervisedClassifier(torch.nn.Linear(4, 2), lr=0.1, l2=0.5)  # plain SGD, weight_decay=l2
        >>> recorder = TrajectoryRecorder(track=range(8))  # vectors for samples 0-7 only
        >>> trainer = L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...                     enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(model, DataLoader(data, batch_size=8))
        >>> recorder.n_steps, recorder.n_rows, recorder.A.shape[1], recorder.l2  # 4 steps, 8 vectors of d = 10
        (4, 8, 10, 0.5)
        >>> TrajectoryRecorder(store="mmap")
        Traceback (most recent call last):
        ...
        ValueError: store='mmap' needs a file path and a capacity (maximum number of tracked samples)
    """

    records_every_epoch = True
    records_parameters = True
    checks_loss_on_first_batch = True
    gathers_inputs = False  # under DDP: ids, labels and fingerprints only; vectors sharded (docs/methods/hf.md)

    def __init__(
        self,
        dtype: torch.dtype = torch.float32,
        store: str = "memory",
        path: str | Path | None = None,
        capacity: int | None = None,
        track: Collection[int] | None = None,
        hessian: str = "auto",
        chunk_size: int | None = None,
        power_iters: int = 1,
        row_block: int = 4096,
        loss_fn: contract.LossFn | None = None,
        offload: bool = False,
    ) -> None:
        super().__init__()
        if dtype not in (torch.float16, torch.float32, torch.float64):
            raise ValueError(f"TrajectoryRecorder dtype must be float16, float32 or float64, got {dtype}")
        if store not in ("memory", "mmap"):
            raise ValueError(f"store must be 'memory' or 'mmap', got {store!r}")
        if store == "mmap" and (path is None or not capacity):
            raise ValueError("store='mmap' needs a file path and a capacity (maximum number of tracked samples)")
        if hessian not in ("auto", "hvp", "dense"):
            raise ValueError(f"hessian must be 'auto', 'hvp' or 'dense', got {hessian!r}")
        self.dtype, self.store, self.path, self.capacity = dtype, store, path, capacity
        self.track = None if track is None else {int(i) for i in track}
        self.hessian, self.chunk_size, self.power_iters, self.row_block = hessian, chunk_size, power_iters, row_block
        self.loss_fn: contract.LossFn = loss_fn or contract.per_sample_cross_entropy
        self.offload = offload
        self._rows: RowStore | None = None  # (rows allocated, d) approximators (this rank's, under DDP)
        self.n_rows = 0  # tracked samples (all ranks')
        self.owner = torch.zeros(0, dtype=torch.long)  # rank holding each row's vector (all 0 in one process)
        self._slot = torch.zeros(0, dtype=torch.long)  # each row's index in this rank's store (-1: another rank's)
        self.n_local = 0  # vectors held by this rank
        self._shards = 1  # ranks the vectors are spread over (the world size of the fits that recorded them)
        self.row_of: dict[int, int] = {}
        self.row_ids: list[int] = []
        self.active = torch.zeros(0, dtype=torch.bool)
        self.lrs: list[float] = []
        self.batch_sizes: list[int] = []
        self._occ_rows: list[Tensor] = []
        self._occ_steps: list[Tensor] = []
        self.grad_max = 0.0  # observed max ||grad l(w_t; u)|| over tracked u (estimate of G, Lemma 2)
        self.smoothness = 0.0  # observed max ||H_t|| (estimate of M, Assumption 1)
        self.l2: float | None = None
        self._eig: Tensor | None = None
        self._chunk: int | None = None  # rows per HVP call in this fit (chunk_size, or measured at its first step)
        self._in_fit = False
        self._steps_before_fit = 0  # steps recorded before the running fit
        self._interrupted = False
        self._optimizer_l2: float | None = None  # weight_decay of the optimizer of the running fit
        self._check_module = False

    @property
    def state_key(self) -> str:
        return self._generate_state_key(dtype=str(self.dtype), track=None if self.track is None else len(self.track))

    @property
    def A(self) -> Tensor | None:
        """The ``(rows allocated, d)`` approximators (row ``row_of[id]`` belongs to sample ``id``)."""
        return None if self._rows is None else self._rows.data

    def _store(self) -> RowStore:
        """The row store; ``RuntimeError`` if none is open (no sample tracked yet, or :meth:`close` ran)."""
        if self._rows is None:
            raise RuntimeError("TrajectoryRecorder has no open statistics store (nothing tracked, or closed)")
        return self._rows

    def close(self) -> None:
        """Release the store (flush and unlock a memory-mapped file); the recorder holds no statistics after it."""
        if self._rows is not None:
            self._rows.close()
            self._rows = None

    @property
    def n_steps(self) -> int:
        return len(self.lrs)

    def memory_bytes(self) -> int:
        """Bytes of the vectors this rank stores: ``n_tracked * d * itemsize`` (under DDP about ``1 / world_size``
        of it)."""
        return 0 if self.A is None else self.n_local * self.A.shape[1] * self.A.element_size()

    # -- checks -------------------------------------------------------------------------------------
    @staticmethod
    def check_module(module: nn.Module) -> None:
        """``ValueError`` naming Dropout layers in training mode (a random loss has no Hessian to follow); a
        warning naming BatchNorm layers in training mode (their running buffers see every sample)."""
        bad = [n for n, m in module.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.training]
        if bad:
            raise ValueError(
                f"HF needs a deterministic step objective: Dropout layers {bad[:5]} are in training mode "
                "(remove them, or call .eval() on them before fit and keep them there in the module's train())"
            )
        norms = [
            n
            for n, m in module.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats
        ]
        if norms:
            warn(
                f"BatchNorm layers {norms[:5]} train with batch statistics: HF follows the batch loss, but their "
                "running buffers are averaged over every sample, forgotten ones included, and HF's update does not "
                "change them; recompute them on retained data (or keep BatchNorm in eval mode) before publishing"
            )

    def check_optimizer(self, optimizer: torch.optim.Optimizer, module: nn.Module | None = None) -> None:
        """Read the ridge ``l2`` (``weight_decay``) of a plain SGD optimizer (:func:`contract.require_plain_sgd`)."""
        self._optimizer_l2 = contract.require_plain_sgd([optimizer], module, "TrajectoryRecorder (HF)").weight_decay

    def check_trainer(self, trainer: L.Trainer, module: nn.Module) -> None:
        """:meth:`check_optimizer` on the Trainer's one optimizer; no accumulation, clipping or proximal regulariser."""
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"HF follows plain SGD: need one torch.optim.SGD, the Trainer has {len(trainer.optimizers)} optimizers"
            )
        self.check_optimizer(trainer.optimizers[0], module)
        if trainer.accumulate_grad_batches != 1 or trainer.gradient_clip_val:
            raise ValueError("HF follows plain SGD: no gradient accumulation or clipping")
        if any(isinstance(c, ProximalRegularizer) for c in trainer.callbacks):  # type: ignore[attr-defined]
            raise ValueError(
                "TrajectoryRecorder follows mean loss_fn + (l2/2)||theta||^2; a ProximalRegularizer is not supported"
            )

    def require_fitted(self) -> None:
        super().require_fitted()
        if self._interrupted:
            raise ValueError("TrajectoryRecorder statistics are invalid: a fit was interrupted mid-trajectory")

    # -- framework-neutral API ------------------------------------------------------------------------
    def begin_experience(self, module: nn.Module) -> None:
        """Check the optimizer's ``l2`` against the recorded trajectory (call :meth:`check_optimizer` first), start
        staging."""
        l2 = self._optimizer_l2
        if l2 is None:
            raise ValueError(
                "TrajectoryRecorder reads l2 from the optimizer: call check_optimizer(optimizer) before "
                "begin_experience"
            )
        if self.l2 is not None and l2 != self.l2:
            raise ValueError(
                f"the optimizer's weight_decay={l2} differs from the l2={self.l2} of the recorded trajectory"
            )
        self.l2 = l2
        super().begin_experience(module)
        if self._rows is not None and not self._rows.mapped and not self.offload:
            self._rows.data = self._rows.data.to(autodiff.flat_params(module).device)
        self._in_fit, self._check_module, self._chunk = True, True, self.chunk_size
        self._steps_before_fit = self.n_steps

    def before_step(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, lr: float) -> None:
        """At ``w_t``, before the optimizer step with learning rate ``lr`` on this (rank-gathered) batch:
        register its new samples and apply one recursion step (Eq. (10)) to every live vector."""
        if self._check_module:  # the first step of an experience: the modes the training loop set
            self.check_module(module)
            self._check_module = False
        super().record(module, x, y, ids)
        self._step(module, x, y, ids, lr)

    # -- Lightning hooks ----------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check_trainer(trainer, pl_module)
        super().on_train_start(trainer, pl_module)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        x, y, ids = unpack_batch(batch, self.batch_keys)
        lr = float(trainer.optimizers[0].param_groups[0]["lr"])
        if self.n_rows and self._shards != trainer.world_size:
            raise ValueError(
                f"TrajectoryRecorder vectors were recorded over {self._shards} process(es); they cannot continue "
                f"on {trainer.world_size}"
            )
        self._shards = trainer.world_size
        if trainer.world_size == 1:
            self.before_step(pl_module, x, y, ids, lr)
            return
        if self._check_module:
            self.check_module(pl_module)
            self._check_module = False
        all_ids = self.record_shard(
            pl_module, x, y, ids, None, lambda t: gather_batch(pl_module, t), trainer.global_rank
        )
        self._step_sharded(pl_module, x.detach(), y.detach(), ids, all_ids, lr)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Nothing: the recursion step ran before the optimizer step."""

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._in_fit = False

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        if self._in_fit and self.n_steps > self._steps_before_fit:  # stopped after some of its steps
            self._interrupted = True
        self._in_fit = False

    def record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any = None) -> None:
        raise ValueError(
            "TrajectoryRecorder must see w_t before every SGD step: use it as a Lightning callback, or call "
            "before_step(module, x, y, ids, lr) before each optimizer step (UnlearningPlugin does), not record after it"
        )

    # -- recording ----------------------------------------------------------------------------------
    def _record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        if self._strategy is not None:
            return  # DDP: the rows are allocated by _step_sharded from the gathered ids
        new = [i for i in ids.tolist() if (self.track is None or i in self.track) and i not in self.row_of]
        if new:
            theta = autodiff.flat_params(module)
            self._allocate(new, theta.numel(), torch.device("cpu") if self.offload else theta.device)

    def _allocate(
        self, new_ids: list[int], dim: int, device: torch.device | None = None, owners: list[int] | None = None
    ) -> None:
        """Rows for ``new_ids``; this rank stores the vectors of those ``owners`` names it for (all without)."""
        if self._rows is None:
            self._rows = self._new_store(dim, device)
        if self._rows.data.shape[1] != dim:
            have = self._rows.data.shape[1]
            raise ValueError(f"module has {dim} trainable parameters but the recorded vectors have {have}")
        owner = torch.tensor(owners if owners is not None else [self.global_rank] * len(new_ids), dtype=torch.long)
        mine = owner == self.global_rank
        self._rows.reserve(self.n_local + int(mine.sum()))
        slot = torch.full((len(new_ids),), -1, dtype=torch.long)
        slot[mine] = torch.arange(self.n_local, self.n_local + int(mine.sum()))
        for i in new_ids:
            self.row_of[i] = self.n_rows
            self.row_ids.append(i)
            self.n_rows += 1
        self.n_local += int(mine.sum())
        self.owner, self._slot = torch.cat([self.owner, owner]), torch.cat([self._slot, slot])
        self.active = torch.cat([self.active, torch.ones(len(new_ids), dtype=torch.bool)])

    def _new_store(self, dim: int, device: torch.device | None = None) -> RowStore:
        if self.store == "mmap":
            return RowStore.create(self._store_path(), self.capacity, dim, self.dtype)  # type: ignore[arg-type]
        # no more rows than tracked samples (64 rows of a ResNet-18 are 2.9 GB in float32)
        rows = 64 if self.track is None else max(1, min(64, len(self.track)))
        return RowStore.memory(dim, self.dtype, rows=rows, device=device)

    def _store_path(self) -> str:
        """The memory-mapped file: ``path``, under DDP suffixed ``.rank<r>`` (each rank maps its own)."""
        return str(self.path) if self._shards == 1 else f"{self.path}.rank{self.global_rank}"

    def _commit(self, module: nn.Module) -> None:
        """Nothing to fold in: the vectors were updated in place at every step."""

    def _step(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, lr: float) -> None:
        """One recursion step at ``w_t`` (Eq. (10); :func:`hf.propagate`) on all live vectors, ``row_block``
        rows at a time (bounded memory for a memory-mapped store), accumulated in the parameters' dtype."""
        theta = autodiff.flat_params(module)
        step = hf.StepObjective(
            autodiff.ModuleLoss(module, float(self.l2 or 0.0), self.loss_fn), theta, x, y, self._chunk_for(module, x, y)
        )
        live = self.active.nonzero().flatten()
        rows, in_batch = self._live_rows(ids)
        grads = step.sample_grads(in_batch.nonzero().flatten().to(x.device))
        times_h = self._hessian_operator(step, live.numel())
        position = torch.full((max(self.n_rows, 1),), -1, dtype=torch.long)
        probe = self._power_start(theta) if self.power_iters else None
        first_hv: list[Tensor] = []

        def rows_h(A: Tensor) -> Tensor:
            if probe is None or first_hv:
                return times_h(A)
            AH = times_h(torch.cat([A, probe[None].to(A)]))  # the power iteration's first HVP rides along
            first_hv.append(AH[-1])
            return AH[:-1]

        for block in live.split(self.row_block) if live.numel() else ():
            store = self._store().data
            position[block] = torch.arange(block.numel())
            mine = position[rows] >= 0
            new = hf.propagate(
                store[block].to(theta.device), rows_h, lr, len(ids), position[rows][mine], grads[mine.to(grads.device)]
            )
            stored = new.to(store)
            if not bool(stored.isfinite().all()):
                bad = [self.row_ids[r] for r in block[~stored.isfinite().all(1).cpu()].tolist()]
                raise ValueError(
                    f"HF vectors of sample ids {bad[:10]} leave the range of {self.dtype} at step {self.n_steps}"
                )
            store[block] = stored
            position[block] = -1
        self._update_estimates(lambda v: step.hvp(v[None])[0], theta, grads, probe, first_hv[0] if first_hv else None)
        self._occ_rows.append(rows)
        self._occ_steps.append(torch.full((rows.numel(),), self.n_steps, dtype=torch.long))
        self.lrs.append(lr)
        self.batch_sizes.append(len(ids))

    def _step_sharded(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, all_ids: Tensor, lr: float) -> None:
        """One DDP recursion step on this rank's local batch (the scheme of docs/methods/hf.md): rows of new
        samples allocated on their owners, then for each owner's blocks of live vectors a broadcast from the
        owner, this rank's bracket, and a sum reduction back to the owner. ``all_ids`` are every rank's ids of
        the step, rank-major (the ranks' batches have one size)."""
        W, me = self.world_size, self.global_rank
        theta = autodiff.flat_params(module)
        new: dict[int, int] = {}  # id -> owner: the first rank (in rank order) whose batch holds it
        for k, i in enumerate(all_ids.tolist()):
            if (self.track is None or i in self.track) and i not in self.row_of and i not in new:
                new[i] = k // len(ids)
        if new or self._rows is None:
            device = torch.device("cpu") if self.offload else theta.device
            self._allocate(list(new), theta.numel(), device, list(new.values()))
        step = hf.StepObjective(
            autodiff.ModuleLoss(module, float(self.l2 or 0.0), self.loss_fn), theta, x, y, self._chunk_for(module, x, y)
        )  # this rank's local batch
        live = self.active.nonzero().flatten()
        rows, in_batch = self._live_rows(ids.cpu())  # this rank's occurrences with a live vector
        grads = step.sample_grads(in_batch.nonzero().flatten().to(x.device))
        times_h = self._hessian_operator(step, live.numel())
        position = torch.full((max(self.n_rows, 1),), -1, dtype=torch.long)
        for owner in range(W):
            for block in live[self.owner[live] == owner].split(self.row_block):
                store = self._store().data
                slots = self._slot[block]
                A = store[slots].to(theta) if owner == me else theta.new_empty(block.numel(), theta.numel())
                torch.distributed.broadcast(A, src=owner)
                position[block] = torch.arange(block.numel())
                mine = position[rows] >= 0
                bracket = hf.rank_bracket(
                    A, times_h, lr, W, len(ids), position[rows][mine], grads[mine.to(grads.device)]
                )
                torch.distributed.reduce(bracket, dst=owner)
                position[block] = -1
                if owner != me:
                    continue
                stored = (A + bracket).to(store)
                if not bool(stored.isfinite().all()):
                    bad = [self.row_ids[r] for r in block[~stored.isfinite().all(1).cpu()].tolist()]
                    raise ValueError(
                        f"HF vectors of sample ids {bad[:10]} leave the range of {self.dtype} at step {self.n_steps}"
                    )
                store[slots] = stored

        def global_h(v: Tensor) -> Tensor:  # H_t v with H_t = (1/W) sum_r H_{B_r}
            return self.sum_over_ranks(step.hvp(v[None])[0] / W)

        self._update_estimates(global_h, theta, grads, self._power_start(theta) if self.power_iters else None, None)
        self.grad_max = self.max_over_ranks(self.grad_max)
        occurrences, _ = self._live_rows(all_ids.cpu())
        self._occ_rows.append(occurrences)
        self._occ_steps.append(torch.full((occurrences.numel(),), self.n_steps, dtype=torch.long))
        self.lrs.append(lr)
        self.batch_sizes.append(len(all_ids))

    def _chunk_for(self, module: nn.Module, x: Tensor, y: Tensor) -> int:
        """Rows per HVP call: ``chunk_size``, or :func:`~lightning_unlearn.functional.hf.hvp_chunk` measured on this
        fit's first step."""
        if self._chunk is None:
            loss = autodiff.ModuleLoss(module, float(self.l2 or 0.0), self.loss_fn)
            self._chunk = hf.hvp_chunk(loss, autodiff.flat_params(module), x, y)
        return self._chunk

    def _live_rows(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Rows of the batch elements that have a live vector (one per occurrence), and their mask in the batch."""
        rows = torch.tensor([self.row_of.get(i, -1) for i in ids.tolist()], dtype=torch.long)
        in_batch = rows >= 0
        in_batch[in_batch.clone()] = self.active[rows[in_batch]]
        return rows[in_batch], in_batch

    def _hessian_operator(self, step: hf.StepObjective, n_live: int) -> Callable[[Tensor], Tensor]:
        """``A -> A H_t``: batched HVPs through the step's graph, or one dense Hessian (small ``d``, many rows)."""
        d = step.theta.numel()
        if self.hessian == "dense" or (self.hessian == "auto" and d <= 2048 and n_live > d):
            H = step.hessian()
            return lambda A: A.to(H) @ H
        return step.hvp

    def _power_start(self, theta: Tensor) -> Tensor:
        """The unit start vector of this step's power iteration (warm: the previous step's eigenvector estimate)."""
        start = self._eig.to(theta) if self._eig is not None else torch.ones_like(theta)
        return start / start.norm().clamp_min(1e-30)

    def _update_estimates(
        self,
        apply_h: Callable[[Tensor], Tensor],
        theta: Tensor,
        grads: Tensor,
        probe: Tensor | None,
        first_hv: Tensor | None,
    ) -> None:
        """Running maxima of ``||H_t||`` (warm-started power iteration from ``probe``, whose first product
        ``first_hv`` may have been computed with the recursion's HVPs; M) and ``||grad l(w_t; u)||`` (G)."""
        if probe is not None:
            if first_hv is None:
                first_hv = apply_h(probe)
            value = float(first_hv.norm())
            self._eig = first_hv / max(value, 1e-30)
            if self.power_iters > 1:
                value, self._eig = autodiff.top_eigenvalue(apply_h, self._eig, self.power_iters - 1)
            self.smoothness = max(self.smoothness, value)
        if grads.numel():
            self.grad_max = max(self.grad_max, float(grads.norm(dim=1).max()))

    # -- access for the strategy ----------------------------------------------------------------------
    def rows_for(self, ids: Tensor) -> Tensor:
        """Rows of ``ids``; ``ValueError`` for ids without a live vector (untracked or deleted)."""
        missing = [i for i in ids.tolist() if i not in self.row_of]
        if missing:
            raise ValueError(f"no HF statistics for sample ids {missing[:10]} (not tracked by this TrajectoryRecorder)")
        rows = torch.tensor([self.row_of[i] for i in ids.tolist()], dtype=torch.long)
        dead = rows[~self.active[rows]]
        if dead.numel():
            raise ValueError(
                f"HF statistics of sample ids {[self.row_ids[r] for r in dead.tolist()][:10]} were already deleted"
            )
        return rows

    def _owned_slots(self, rows: Tensor) -> Tensor:
        """This rank's store indices of those of ``rows`` whose vectors it holds (all of them in one process)."""
        slots = self._slot[rows]
        return slots[slots >= 0]

    def row_sum(self, rows: Tensor, like: Tensor) -> Tensor:
        """``a^{-U} = sum_{u in rows} a^{-u}`` (Theorem 1) in ``like``'s dtype and device. Under DDP a collective:
        each rank adds the vectors it holds and an all-reduce gives every rank the total (every rank must call
        it with the same rows)."""
        if self._shards == 1:
            return autodiff.sum_rows(self._store().data, rows, like)
        if self._strategy is None or self.world_size != self._shards:
            raise ValueError(
                f"TrajectoryRecorder vectors are spread over {self._shards} DDP processes: forget requests must "
                "be executed by all of them together, after the DDP fit (every rank calls forget with the same ids)"
            )
        part = autodiff.sum_rows(self._store().data, self._owned_slots(rows), like).clone()
        return self.sum_over_ranks(part.to(self._strategy.root_device)).to(like.device)

    def occurrences(self) -> tuple[Tensor, Tensor]:
        """``(rows, steps)``: every step at which each tracked sample was in the batch."""
        if not self._occ_rows:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        return torch.cat(self._occ_rows), torch.cat(self._occ_steps)

    def apply_forget(self, ids: Tensor, change: Mapping[str, Any]) -> Callable[[], None]:
        """Mark the vectors of ``ids`` deleted (the strategy marks the ids forgotten); the undo marks them live again.
        The rows themselves are overwritten with zeros by :meth:`erase_forgotten` once the request is
        committed (Alg. 1 line 13: "Delete unlearning statistics"), so no copy of them is kept for the
        undo. ``change`` holds no statistics (HF's update lives in the module's weights)."""
        if change:
            raise ValueError(f"TrajectoryRecorder.apply_forget takes no statistics change, got {sorted(change)}")
        rows = self.rows_for(ids)

        def delete() -> None:
            self.active[rows] = False

        def undo() -> None:
            self.active[rows] = True

        return applied(delete, undo)

    def erase_forgotten(self, ids: Tensor) -> None:
        """Overwrite the committed request's rows with zeros (written through to a memory-mapped file);
        under DDP each rank erases the vectors it holds."""
        rows = torch.tensor([self.row_of[i] for i in ids.tolist()], dtype=torch.long)  # checked by apply_forget
        self._store().erase(self._owned_slots(rows))

    # -- state ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self.erase_pending()  # before the rows (or their digest) are taken: no row of a forgotten sample is saved
        rows, steps = self.occurrences()
        # the vectors (in-memory store), or the store file's reference and digest (memory-mapped)
        A = None if self._rows is None else self._rows.state_dict(self.n_local)
        if self._shards > 1:  # every rank's file reference (a collective), or None for in-memory shards
            refs: list[Any] = [None] * self._shards
            torch.distributed.all_gather_object(refs, A if isinstance(A, dict) else None)
            A = {"shards": refs} if all(isinstance(r, dict) for r in refs) else None
        return {
            **super().state_dict(),
            "A": A,
            "shards": self._shards,
            "owner": self.owner.clone(),
            "row_ids": torch.tensor(self.row_ids, dtype=torch.long),
            "active": self.active.clone(),
            "lrs": torch.tensor(self.lrs, dtype=torch.float64),
            "batch_sizes": torch.tensor(self.batch_sizes, dtype=torch.long),
            "occ_rows": rows,
            "occ_steps": steps,
            "grad_max": self.grad_max,
            "smoothness": self.smoothness,
            "l2": self.l2,
            "interrupted": self._interrupted,
            "eig": self._eig,  # warm start of the power iteration (M), so that a resumed fit estimates alike
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._refuse_replacing(state_dict, "loading a state")  # before the store is replaced
        shards, rank = int(state_dict.get("shards", 1)), 0
        missing = [k for k in _STATE_KEYS if state_dict.get(k) is None and (k != "A" or shards == 1)]
        if missing:
            raise ValueError(f"TrajectoryRecorder state lacks recorded statistics {missing}")
        A: Tensor | dict[str, Any] = state_dict["A"]
        if shards != 1:
            A, rank = self._own_shard(state_dict, shards)
        n = state_dict["row_ids"].numel()
        owner = state_dict["owner"] if shards != 1 else torch.zeros(n, dtype=torch.long)
        local = int(A["rows"]) if isinstance(A, dict) else A.shape[0]
        if local != int((owner == rank).sum()) or owner.numel() != n or state_dict["active"].numel() != n:
            raise ValueError(f"inconsistent TrajectoryRecorder state: {local} vectors here, {n} ids")
        self.global_rank, self.world_size, self._shards = rank, shards, shards
        self._load_store(A)
        super().load_state_dict(state_dict)
        fit = self._resume
        if fit is not None and fit["ids"].numel():
            # saved mid-fit: the running experience's samples already have their vectors in A (a complete
            # trajectory prefix), so they are learned; a resumed fit skips them
            self.catalog.add(fit["ids"], fit["labels"], int(fit["experience"]), fit["fingerprints"])
            self._resume = {**fit, **{k: fit[k][:0] for k in ("ids", "labels", "fingerprints")}}
        self.n_rows, self.row_ids, self.n_local = n, state_dict["row_ids"].tolist(), local
        mine = owner == rank  # slots follow the row order of each rank's own rows (as _allocate gives them)
        self.owner, self._slot = owner.clone(), torch.where(mine, mine.long().cumsum(0) - 1, -1)
        self.row_of = {i: k for k, i in enumerate(self.row_ids)}
        self.active = state_dict["active"].clone().bool()
        self.lrs = state_dict["lrs"].tolist()
        self.batch_sizes = state_dict["batch_sizes"].tolist()
        self._occ_rows, self._occ_steps = [state_dict["occ_rows"].clone()], [state_dict["occ_steps"].clone()]
        self.grad_max, self.smoothness, self.l2 = (
            float(state_dict["grad_max"]),
            float(state_dict["smoothness"]),
            float(state_dict["l2"]),
        )
        self._interrupted = bool(state_dict.get("interrupted", False))
        self._eig = state_dict.get("eig")

    @staticmethod
    def _own_shard(state_dict: dict[str, Any], shards: int) -> tuple[dict[str, Any], int]:
        """This process's store reference in a state saved under DDP, and its rank.

        Raises:
            ValueError: the state holds no file references (in-memory shards), or this process is not one of a
                DDP run of the same size.
        """
        A = state_dict.get("A")
        if not (isinstance(A, dict) and "shards" in A):
            raise ValueError(
                f"TrajectoryRecorder state was saved by a DDP fit over {shards} processes with store='memory': each "
                "rank's vectors were in its own memory and the checkpoint holds none of them; record with "
                "store='mmap' (each rank's file is referenced with its digest) to restore a DDP trajectory"
            )
        dist = torch.distributed
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world != shards:
            raise ValueError(
                f"TrajectoryRecorder state holds vectors spread over {shards} DDP processes; restore it in a DDP "
                f"run of {shards} processes (this one has {world})"
            )
        return A["shards"][dist.get_rank()], dist.get_rank()

    def _load_store(self, saved: Tensor | dict[str, Any]) -> None:
        """Open the vectors of a state: the referenced store file itself if this recorder's ``path``
        names it, otherwise a new store of this recorder's kind holding a copy of its rows."""
        if isinstance(saved, dict):
            if str(saved["dtype"]) != str(self.dtype):
                raise ValueError(
                    f"the referenced store holds {saved['dtype']} vectors, this recorder has dtype={self.dtype}"
                )
            same = self.store == "mmap" and Path(self._store_path()).absolute() == Path(saved["path"])
            if same and self.capacity != int(saved["capacity"]):
                raise ValueError(
                    f"the store file {saved['path']} holds {saved['capacity']} rows, "
                    f"this recorder has capacity={self.capacity}"
                )
            if same and self._rows is not None:
                self.close()  # this recorder's own file: reopen it under the checkpoint's digest
            source = RowStore.attach(saved)
            if same:
                self._rows = source
                return
            rows, dim, values = int(saved["rows"]), int(saved["dim"]), source.data
        else:
            source, (rows, dim), values = None, saved.shape, saved
        if self.store == "mmap" and (self.capacity or 0) < rows:
            raise ValueError(f"TrajectoryRecorder capacity={self.capacity} is smaller than the {rows} recorded vectors")
        self.close()
        store = self._new_store(dim)
        store.reserve(rows)
        store.data[:rows] = values[:rows].to(self.dtype)
        store.flush()
        if source is not None:
            source.close()
        self._rows = store
