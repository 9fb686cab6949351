"""`RecorderCallback`: the shared plumbing of every recording callback.

A recorder sees each training batch once, keyed by sample id, and stages what it records for
the current fit; the staged block is committed at the end of the fit's first epoch (the first
epoch *this* fit runs, so a fit resumed from a checkpoint records too, skipping the samples
its experience had already committed). A checkpoint saved during a fit carries the running fit
(its experience, first epoch and staged block), and ``Trainer.fit(ckpt_path=...)`` continues it:
resumed mid-epoch, it records exactly what the uninterrupted fit would have recorded if the
training loader resumes mid-epoch too (``state_dict``/``load_state_dict``, restored by
Lightning), and refuses otherwise. A checkpoint whose recorder of this class was created
with other settings is refused, naming them. Under DDP the recorders shard their work
(``gathers_inputs = False``: ACU, SAFE, [CCL], HF and the catalog-only recorder): per batch only ids,
labels and input fingerprints are gathered (the catalog is global, an id repeated by
``DistributedSampler`` padding is counted once, by the first rank holding it), each rank records
its own samples, and additive statistics are summed over the ranks once per experience through
``trainer.strategy`` collectives (states declared in :attr:`RecorderCallback.summed_states`, like
torchmetrics' states with ``dist_reduce_fx="sum"``, or :meth:`RecorderCallback.sum_over_ranks`); HF's
per-sample vectors stay on one rank each (see :class:`~lightning_unlearn.callbacks.TrajectoryRecorder`).
A recorder that sets ``gathers_inputs = True`` gets every rank's batch (inputs included) in :meth:`record`.
An exception during fit drops the staged block, so statistics only ever reflect whole experiences.

Ids come from where the batches say they are (:mod:`lightning_unlearn.contract`): in each recorded epoch a rank's
batches must not name one id for two different samples (another label or input fingerprint), or the samples would
be merged under one catalog row; such a batch is refused before its training step (a sample drawn twice, e.g. by a
sampler with replacement, is recorded once). The statistics are bound to the module they were recorded with
(:class:`~lightning_unlearn.core.binding.Binding`), checked wherever they meet a module, and a recorder that has
executed forget requests refuses to have its state replaced unless told so (:meth:`RecorderCallback.replacing`).
"""

from __future__ import annotations

import ast
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

import lightning as L
import torch
from torch import Tensor, nn

from lightning_unlearn.contract import BatchKeys, LossFn, resolve_loss_fn, unpack_batch
from lightning_unlearn.core.binding import Binding
from lightning_unlearn.core.catalog import SampleCatalog, fingerprints
from lightning_unlearn.core.digest import tensors_digest
from lightning_unlearn.core.state import UnlearningState
from lightning_unlearn.core.undo import replace_attributes
from lightning_unlearn.warnings import warn

_R = TypeVar("_R", bound="RecorderCallback")


class RecorderCallback(L.Callback):
    """Base class: sample catalog, experience bookkeeping, rank gathering and staging.

    Subclasses implement :meth:`_record` (stage one batch of new samples) and :meth:`_commit`
    (fold the staged block into the statistics), and extend :meth:`state_dict`.
    Set :attr:`experience` before a fit to name the experience it learns (``fit_stream`` does);
    otherwise fits are numbered 0, 1, 2, ...

    A strategy writes back through :meth:`apply_forget` only, once per request, with a change
    it computed beforehand; the recorder returns the undo of what it applied.

    Args:
        fingerprint: keep a 64-bit digest of each learned input, so that a forget request whose
            data is not what was learned under those ids is refused. Turn it off when the
            training inputs are randomly augmented (their bytes differ from epoch to epoch).
        batch_keys: the keys of dict batches (:class:`~lightning_unlearn.contract.BatchKeys`);
            strategies read batches with the keys of their recorder. Recorders whose constructor
            does not take it have the ``batch_keys`` attribute to set.
    """

    def __init__(self, fingerprint: bool = True, batch_keys: BatchKeys | None = None) -> None:
        self.catalog = SampleCatalog()
        self.fingerprint = fingerprint
        self.batch_keys = batch_keys
        #: the unlearner's state kept with the statistics (ledger anchor, accepted ledgers, privacy accountants, the
        #: run's lineage, ids pending erasure); saved in this recorder's checkpoint state
        self.unlearning_state = UnlearningState()
        self.experience: int | None = None
        # the Trainer of the last Lightning fit, held weakly (:attr:`trainer`)
        self._trainer_ref: weakref.ref[L.Trainer] | None = None
        self._fit_experience = 0
        self._first_epoch = 0
        self._staged_ids: list[Tensor] = []
        self._staged_labels: list[Tensor] = []
        self._staged_prints: list[Tensor] = []
        self._staged_seen: set[int] = set()
        #: rank and number of processes of the last Lightning fit (0 and 1 outside DDP)
        self.global_rank, self.world_size = 0, 1
        self._strategy: Any = None  # the DDP fit's ``trainer.strategy`` (its collectives), None in one process
        self._fitting = False  # inside a Lightning fit: state_dict carries the running fit
        self._resume: dict[str, Any] | None = None  # the running fit of a restored state, until on_train_start
        self._loader_state_saved = False  # the restored checkpoint holds the training loader's position
        #: what the statistics are bound to (:meth:`binding_of` the module they are recorded with, set at each
        #: experience's start and after each executed request); ``None`` before that, or from an older state
        self.binding: Binding | None = None
        self._binding_unchecked = False  # a state was loaded and not yet checked against a module
        self._replacing = False  # inside :meth:`replacing`
        self._epoch_ids: dict[int, tuple[int, int]] = {}  # this rank's ids of the recorded epoch: (label, print)
        self._ids_epoch: int | None = None  # the epoch of _epoch_ids
        self._checked_prints: tuple[Tensor, Tensor] | None = None  # (inputs, fingerprints) of the last checked batch
        self._loss_unchecked = False  # the running fit's first batch is still to check (checks_loss_on_first_batch)

    @property
    def trainer(self) -> L.Trainer | None:
        """The Trainer of the last Lightning fit while the user keeps it (executed requests are logged to its
        loggers), else ``None``. Held weakly: the Trainer holds this callback, so a strong reference would make a
        cycle that keeps a discarded recorder's tensors alive until the cycle collector runs, and
        ``copy.deepcopy`` of the recorder would copy the whole Trainer (module, loaders, callbacks) with it."""
        return None if self._trainer_ref is None else self._trainer_ref()

    # -- framework-neutral API (also used by the Avalanche plugin) -------------------------------
    def begin_experience(self, module: torch.nn.Module) -> None:
        """Start staging a new experience.

        Raises:
            ValueError: the recorded statistics are not bound to ``module`` (:meth:`check_binding`).
        """
        here = self.binding_of(module)
        if self.binding is not None and len(self.catalog):
            self._refuse_unbound(self.binding, here, "its statistics")
        self.binding, self._binding_unchecked = here, False
        if self.experience is not None:
            self._fit_experience = self.experience
        elif len(self.catalog):
            self._fit_experience = int(self.catalog.experiences.max()) + 1
        else:
            self._fit_experience = 0
        self._drop_staged()

    def record(self, module: torch.nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any = None) -> None:
        """Stage one (already rank-gathered) batch; repeated ids within the fit are skipped."""
        keep = self._unseen(ids)
        if not len(keep):
            return
        prints = self._prints(x, len(ids))[keep.cpu()]
        ids, y, x, outputs = ids[keep], y[keep], x[keep], _select(outputs, keep)
        self._record(module, x, y, ids, outputs)
        self._stage(ids, y, prints)

    def record_shard(
        self,
        module: torch.nn.Module,
        x: Tensor,
        y: Tensor,
        ids: Tensor,
        outputs: Any,
        gather: Callable[[Tensor], Tensor],
        rank: int,
    ) -> Tensor:
        """Stage one batch of which this rank holds its own rows only (DDP, ``gathers_inputs = False``).

        Ids, labels and fingerprints are gathered (``gather`` stacks every rank's tensor, rank-major; the
        ranks' batches have one size, as ``DistributedSampler`` makes them), so every rank stages the same
        samples; :meth:`_record` sees this rank's new rows only, and an id repeated by ``DistributedSampler``
        padding is recorded by the first rank (in rank-major order) that holds it. Returns the gathered ids.
        """
        prints = self._prints(x, len(ids))
        all_ids, all_y, all_prints = (gather(t) for t in (ids, y.long(), prints.to(ids.device)))
        keep = self._unseen(all_ids)
        if not len(keep):
            return all_ids
        n = len(ids)
        mine = keep[(keep >= rank * n) & (keep < (rank + 1) * n)] - rank * n
        if len(mine):
            self._record(module, x[mine], y[mine], ids[mine], _select(outputs, mine))
        self._stage(all_ids[keep], all_y[keep], all_prints[keep])
        return all_ids

    def _unseen(self, ids: Tensor) -> Tensor:
        """Positions of the ids not staged yet in this fit (first occurrence) nor committed by a resumed one.

        Raises ``ValueError`` for ids learned in an earlier experience.
        """
        first: dict[int, int] = {}
        for k, i in enumerate(ids.tolist()):
            if i not in self._staged_seen and i not in first:
                first[i] = k
        if not first:
            return torch.empty(0, dtype=torch.long, device=ids.device)
        keep = torch.tensor(list(first.values()), device=ids.device)
        known = torch.tensor([i in self.catalog for i in first], dtype=torch.bool, device=ids.device)
        if bool(known.any()):
            earlier = self.catalog.experiences_of(ids[keep][known].cpu()) != self._fit_experience
            if bool(earlier.any()):
                raise ValueError(
                    f"{type(self).__name__}: sample ids {ids[keep][known][earlier][:10].tolist()} were already learned "
                    "in an earlier experience; each sample may be learned once (give every sample a unique id)"
                )
            # a fit resumed from a checkpoint of this experience: those samples are already in
            keep = keep[~known]
        return keep

    def _prints(self, x: Any, n: int) -> Tensor:
        """The rows' input fingerprints (zeros without ``fingerprint``); those of the batch the id check just read
        are reused."""
        checked, self._checked_prints = self._checked_prints, None
        if checked is not None and checked[0] is x:
            return checked[1]
        if self.fingerprint and isinstance(x, Tensor):
            return fingerprints(x)
        return torch.zeros(n, dtype=torch.long)

    def check_batch_ids(self, x: Any, y: Tensor, ids: Tensor, epoch: int, source: Any = None) -> None:
        """Refuse a training batch that names one sample id for two different samples within one epoch of this rank.

        A repeated id whose label and input fingerprint (without ``fingerprint``: its label) are those of its first
        occurrence in the epoch is the same sample drawn again, and is accepted; ids repeated across ranks
        (``DistributedSampler`` padding) or across epochs are not seen here. Under DDP every rank refuses together.

        Args:
            x, y, ids: this rank's batch, as :func:`~lightning_unlearn.contract.unpack_batch` reads it.
            epoch: the training epoch (the ids seen are forgotten when it changes).
            source: the training dataset, named in the message when it is one of Avalanche's.

        Raises:
            ValueError: with the number of ids that name another sample than in their first occurrence, and what
                that points to (Avalanche's task labels read as ids). Nothing is staged from the batch.
        """
        if epoch != self._ids_epoch:
            self._ids_epoch, self._epoch_ids = epoch, {}
        prints = self._prints(x, len(ids))
        self._checked_prints = (x, prints) if isinstance(x, Tensor) else None
        rows = zip(ids.tolist(), y.long().tolist(), prints.tolist())
        clashes = []
        for i, label, fp in rows:
            first = self._epoch_ids.setdefault(i, (label, fp))
            if first[0] != label or (first[1] != fp and first[1] != 0 and fp != 0):
                clashes.append(i)
        total = len(clashes)
        if self._strategy is not None:
            total = int(self.sum_over_ranks(torch.tensor(total, device=self._strategy.root_device)))
        if total:
            self._epoch_ids, self._ids_epoch = {}, None
            ranks = self._strategy is not None
            raise ValueError(_repeated_ids_message(type(self).__name__, clashes, total, ids, source, ranks))

    def _stage(self, ids: Tensor, y: Tensor, prints: Tensor) -> None:
        self._staged_seen.update(ids.tolist())
        self._staged_ids.append(ids.cpu())
        self._staged_labels.append(y.detach().long().cpu())
        self._staged_prints.append(prints.cpu())

    def end_experience(self, module: torch.nn.Module) -> None:
        """Commit the staged block: register its samples and fold in its statistics."""
        if not self._staged_ids:
            return
        ids, labels, prints = (
            torch.cat(self._staged_ids),
            torch.cat(self._staged_labels),
            torch.cat(self._staged_prints),
        )
        self._commit(module)
        self.catalog.add(ids, labels, self._fit_experience, prints)
        self._drop_staged()

    def apply_forget(self, ids: Tensor, change: Mapping[str, Any]) -> Callable[[], None]:
        """Apply a strategy's computed change for forgetting ``ids``; return the undo.

        The default replaces statistics attributes by the new values in ``change`` (computed out
        of place by the strategy). Recorders whose statistics are updated in place (rows of a
        store) override it. Called by :meth:`Unlearner.forget` only, at its commit point, which
        marks the ids forgotten in the catalog itself (an undoable step of its own). An exception
        part-way (an interrupt included) undoes what was applied before it propagates.
        """
        unknown = [k for k in change if not hasattr(self, k)]
        if unknown:
            raise ValueError(f"{type(self).__name__} has no statistics named {unknown}")
        return replace_attributes(self, change)

    def erase_forgotten(self, ids: Tensor) -> None:
        """Overwrite what the recorder still holds of ``ids`` once their request is committed (its ledger
        entry written); recorders whose per-sample statistics are rows of a store override it, so that
        :meth:`apply_forget` need not copy those rows for its undo. The default holds nothing more.
        Erasing twice is harmless (:meth:`erase_pending` retries after a failure)."""

    def erase_pending(self) -> None:
        """Erase the rows of committed requests still pending erasure (``unlearning.unerased``: an earlier erasure
        failed), oldest first.

        Raises:
            OSError: the erasure failed again (e.g. the memory-mapped store cannot be written); the ids stay pending.
        """
        unerased = self.unlearning_state.unerased
        while unerased:
            self.erase_forgotten(unerased[0])
            unerased.pop(0)

    # -- Lightning hooks -------------------------------------------------------------------------
    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Refuse the checkpoint before this recorder's state is loaded from it (Lightning has restored the module's
        weights by then): another recorder's settings, statistics bound to another module (:meth:`check_binding`),
        or a state that would replace one that executed requests (:meth:`replacing`)."""
        states = checkpoint.get("callbacks") or {}
        self._check_settings(states, "the checkpoint")
        state = states.get(self.state_key)
        if isinstance(state, Mapping):
            self._refuse_replacing(state, f"restoring checkpoint {trainer.ckpt_path}")
            if state.get("binding") is not None:
                here = self.binding_of(pl_module)
                self._refuse_unbound(Binding.from_state(state["binding"]), here, "the checkpoint's statistics")
        fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
        self._loader_state_saved = bool((fit_loop.get("state_dict") or {}).get("combined_loader"))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trainer_ref = weakref.ref(trainer)
        self._ids_epoch, self._epoch_ids = None, {}
        self.global_rank, self.world_size = trainer.global_rank, trainer.world_size
        self._strategy = trainer.strategy if trainer.world_size > 1 else None
        resume, self._resume = self._resume, None
        done = trainer.fit_loop.epoch_loop.batch_progress.current.ready  # restored, not yet reset
        mid_epoch = trainer.fit_loop.restarting and 0 < done < trainer.num_training_batches
        staged = resume is not None and bool(resume["ids"].numel())
        if mid_epoch or (staged and self.records_every_epoch):
            where = f"epoch {trainer.current_epoch} after {done} batches"
            self._resume_fit(trainer, pl_module, resume, mid_epoch, where)
        else:
            if staged and resume is not None:  # its first epoch ended before the checkpoint, uncommitted when saved
                self._fit_experience = int(resume["experience"])
                self._restore_staged(resume)
                self.end_experience(pl_module)
            # a fresh fit, or one restored at an epoch end: it records the first epoch it runs
            self._first_epoch = trainer.current_epoch
            self.begin_experience(pl_module)
        self._fitting = True
        self._loss_unchecked = self.checks_loss_on_first_batch

    def _resume_fit(
        self, trainer: L.Trainer, module: L.LightningModule, resume: dict[str, Any] | None, mid_epoch: bool, where: str
    ) -> None:
        """Continue the fit a checkpoint was saved in; refuse what would lose samples."""
        name = type(self).__name__
        if resume is None or (self.experience is not None and self.experience != resume["experience"]):
            why = (
                "holds no record of this recorder's running fit"
                if resume is None
                else (f"was saved while learning experience {resume['experience']}, not experience {self.experience}")
            )
            raise ValueError(
                f"{name}: cannot resume from a checkpoint saved in {where}: it {why}, so the samples learned "
                "earlier in that fit would be lost; resume from a checkpoint saved at the end of a fit"
            )
        self.begin_experience(module)
        self._fit_experience, self._first_epoch = int(resume["experience"]), int(resume["first_epoch"])
        self._restore_staged(resume)
        records = self.records_every_epoch or trainer.current_epoch == self._first_epoch
        if mid_epoch and records and not (self._loader_state_saved and _resumable(trainer.train_dataloader)):
            raise ValueError(
                f"{name}: cannot resume from a checkpoint saved in {where}: the training DataLoader cannot "
                "resume mid-epoch (it would start the epoch over, so the samples of its remaining batches would "
                "be lost or seen twice); resume from a checkpoint saved at an epoch end, or train with a loader "
                "that has state_dict/load_state_dict (Lightning saves its position in the checkpoint)"
            )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Check the batch's sample ids (:meth:`check_batch_ids`) before its training step, in recorded epochs; then,
        on the fit's first batch, the module's training loss (:meth:`check_loss_once`)."""
        if trainer.current_epoch <= self._first_epoch or self.records_every_epoch:
            x, y, ids = unpack_batch(batch, self.batch_keys)
            source = getattr(trainer.train_dataloader, "dataset", None)
            self.check_batch_ids(x, y, ids, trainer.current_epoch, source)
        self.check_loss_once(trainer, pl_module, batch)

    def check_loss_once(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> None:
        """Once per fit, on its first batch, for a recorder that :attr:`checks_loss_on_first_batch`: refuse a module
        whose own training loss on ``batch`` is not :attr:`loss_fn` (plus :meth:`loss_penalty`), as
        :func:`~lightning_unlearn.contract.resolve_loss_fn` checks it.

        Raises:
            ValueError: the module's training loss is another one (the check is repeated on the next batch).
        """
        if not self._loss_unchecked:
            return
        penalty = self.loss_penalty(trainer)
        resolve_loss_fn(pl_module, self.loss_fn, batch, keys=self.batch_keys, penalty=penalty)
        self._loss_unchecked = False

    def loss_penalty(self, trainer: L.Trainer) -> Callable[[nn.Module], Tensor] | None:
        """The penalty the module adds to its own training loss on top of :attr:`loss_fn`, for
        :meth:`check_loss_once`: none here; recorders of a module trained with an ``in_loss``
        :class:`~lightning_unlearn.regularization.ProximalRegularizer` return its ``penalty``."""
        return None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.current_epoch > self._first_epoch and not self.records_every_epoch:
            return
        x, y, ids = unpack_batch(batch, self.batch_keys)
        if trainer.world_size > 1 and not self.gathers_inputs:
            self.record_shard(pl_module, x, y, ids, outputs, lambda t: gather_batch(pl_module, t), trainer.global_rank)
            return
        if trainer.world_size > 1:
            x, y, ids = (gather_batch(pl_module, t) for t in (x, y, ids))
            outputs = _gather_outputs(pl_module, outputs)
        self.record(pl_module, x, y, ids, outputs)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self._first_epoch and not self.records_every_epoch:
            self.end_experience(pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.end_experience(pl_module)
        self._fitting = False

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._drop_staged()
        self._fitting = False
        self._checked_prints = None

    # -- to implement ----------------------------------------------------------------------------
    #: recorders that follow the whole training trajectory (HF) see every epoch, not just the first
    records_every_epoch: bool = False
    #: whether the statistics are about the module's trainable parameters (a Hessian, a trajectory, task deltas): the
    #: binding then holds their names and shapes and a digest of the frozen ones (:meth:`binding_of`)
    records_parameters: bool = False
    #: under DDP, whether every rank records every sample (inputs gathered per batch); recorders whose
    #: statistics are sums over samples set it to False: each rank records the samples it holds
    #: (:meth:`record_shard`) and adds the ranks' sums once per experience with :meth:`sum_over_ranks`
    gathers_inputs: bool = True
    #: whether each fit's first batch checks that the module's own training loss is :attr:`loss_fn`
    #: (:meth:`check_loss_once`)
    checks_loss_on_first_batch: ClassVar[bool] = False
    #: the per-sample loss the statistics are about, in recorders that take one (``None``: cross-entropy)
    loss_fn: LossFn | None = None

    #: staged statistics that are sums over this rank's samples, declared with their reduction like torchmetrics'
    #: states (``add_state(name, dist_reduce_fx="sum")``): attributes holding a tensor, a tuple of tensors, or
    #: ``None`` (nothing recorded on this rank: :meth:`_zero_state`); :meth:`summed_staged` adds them over the
    #: ranks once, when the experience is committed (or a running fit saved)
    summed_states: ClassVar[tuple[str, ...]] = ()

    def summed_staged(self) -> dict[str, Any]:
        """The :attr:`summed_states` added over the ranks of a DDP fit, in ONE all-reduce of their concatenation
        (every rank must call it); this rank's own values in one process."""
        values = {
            n: getattr(self, n) if getattr(self, n) is not None else self._zero_state(n) for n in self.summed_states
        }
        if self._strategy is None:
            return values
        parts = [t for v in values.values() for t in (v if isinstance(v, tuple) else (v,))]
        device = self._strategy.root_device
        total = self.sum_over_ranks(torch.cat([t.reshape(-1).to(device) for t in parts]))
        sums = iter(t.view_as(part).to(part) for t, part in zip(total.split([p.numel() for p in parts]), parts))
        return {n: tuple(next(sums) for _ in v) if isinstance(v, tuple) else next(sums) for n, v in values.items()}

    def _zero_state(self, name: str) -> Any:
        """The value of the summed state ``name`` of a rank that has recorded nothing (zeros of its shape)."""
        raise NotImplementedError

    def sum_over_ranks(self, t: Tensor) -> Tensor:
        """``t`` summed over the ranks of the current DDP fit (``t`` itself otherwise); every rank must call it. The sum
        is taken on the collectives' device (CUDA's under NCCL, also for ``t`` offloaded to the CPU), returned on
        ``t``'s."""
        if self._strategy is None:
            return t
        return self._strategy.reduce(t.to(self._strategy.root_device), reduce_op="sum").to(t.device)

    def max_over_ranks(self, value: float) -> float:
        """The largest ``value`` over the ranks (a collective under DDP, ``value`` itself otherwise)."""
        if self._strategy is None:
            return value
        t = torch.tensor(value, dtype=torch.float64, device=self._strategy.root_device)
        return float(self._strategy.reduce(t, reduce_op=torch.distributed.ReduceOp.MAX))

    def gather_over_ranks(self, t: Tensor) -> Tensor:
        """Every rank's ``t`` concatenated along dim 0, rank-major (their lengths may differ); a collective
        under DDP, ``t`` itself otherwise."""
        if self._strategy is None:
            return t
        device = self._strategy.root_device
        sizes = _all_gather(self._strategy.all_gather, torch.tensor(len(t), device=device)).tolist()
        padded = t.new_zeros(max(sizes), *t.shape[1:]).to(device)
        padded[: len(t)] = t
        parts = _all_gather(self._strategy.all_gather, padded)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)]).to(t.device)

    def gather_to_rank0(self, t: Tensor) -> Tensor:
        """Every rank's ``t`` concatenated along dim 0 on rank 0 (rank-major, in CPU memory; their lengths may
        differ), this rank's ``t`` on the others: point-to-point sends to rank 0, so no other rank ever holds more
        than its own; a collective under DDP, ``t`` itself otherwise."""
        if self._strategy is None:
            return t
        device = self._strategy.root_device
        sizes = _all_gather(self._strategy.all_gather, torch.tensor(len(t), device=device)).tolist()
        if self.global_rank != 0:
            torch.distributed.send(t.detach().to(device).contiguous(), dst=0)
            return t
        parts = [t.detach().cpu()]
        for rank, size in enumerate(sizes[1:], start=1):
            buffer = t.new_empty(int(size), *t.shape[1:], device=device)
            torch.distributed.recv(buffer, src=rank)
            parts.append(buffer.cpu())
        return torch.cat(parts)

    def join_process_group(self) -> None:
        """Run this recorder's collectives over torch.distributed's default process group (its rank and world size),
        for an unlearner that executes requests outside a Trainer, e.g. in a ``torchrun`` script that loaded a
        checkpoint on every rank: every rank must then call each ``forget`` together. A Lightning fit replaces it
        by ``trainer.strategy`` at its start.

        Raises:
            RuntimeError: torch.distributed has no initialised default process group.
        """
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise RuntimeError("join_process_group needs torch.distributed.init_process_group(...) first")
        self.global_rank, self.world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        self._strategy = ProcessGroup() if self.world_size > 1 else None

    def broadcast_from_rank0(self, t: Tensor) -> Tensor:
        """Rank 0's ``t`` on every rank (same shape and dtype everywhere; a collective under DDP)."""
        if self._strategy is None:
            return t
        buffer = t.detach().to(self._strategy.root_device).contiguous()
        torch.distributed.broadcast(buffer, src=0)
        return buffer.to(t.device)

    # -- rows sharded over the ranks (recorders that keep per-sample rows: docs/scale.md) ---------------------------
    def _share(self, n: int) -> Tensor:
        """This process's share ``i % R == rank`` of ``n`` rows of a state that holds every rank's (``R``: the
        processes of the running fit, or of torch.distributed's default group, else 1)."""
        rank, world = self.global_rank, self.world_size
        if self.trainer is None and torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        return torch.arange(n) % world == rank

    def _row_shard(self) -> list[int]:
        """What a :meth:`state_dict` whose rows went through :meth:`gather_to_rank0` holds: ``[rank, R]`` on a rank
        other than 0 of a DDP run (its own rows only), ``[0, 1]`` otherwise (every row)."""
        return [self.global_rank, self.world_size] if self._strategy is not None and self.global_rank else [0, 1]

    def _refuse_row_shard(self, state: Mapping[str, Any]) -> None:
        """``ValueError`` for a state that holds one rank's rows only (:meth:`_row_shard`)."""
        rank, world = state.get("row_shard") or (0, 1)
        if world > 1:
            raise ValueError(
                f"refusing {type(self).__name__} state: it is rank {rank}'s part of a {world}-process state (its own "
                "rows only); load the state rank 0 saved (the checkpoint Lightning writes), which holds every row"
            )

    def _join_loaded_group(self) -> None:
        """Join torch.distributed's default process group (:meth:`join_process_group`) when a state is loaded under
        one outside a Lightning fit, so that the collectives over the sharded rows run over it."""
        if torch.distributed.is_available() and torch.distributed.is_initialized() and self._strategy is None:
            self.join_process_group()

    def _record(self, module: torch.nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        raise NotImplementedError

    def _commit(self, module: torch.nn.Module) -> None:
        raise NotImplementedError

    def _drop_staged(self) -> None:
        self._staged_ids, self._staged_labels, self._staged_prints, self._staged_seen = [], [], [], set()

    def _staged_state(self) -> dict[str, Any]:
        """The statistics of the staged block (saved with a running fit); subclasses with any extend it."""
        return {}

    def _load_staged_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`_staged_state` saved."""

    def _restore_staged(self, fit: dict[str, Any]) -> None:
        if fit["ids"].numel():
            self._staged_ids, self._staged_labels = [fit["ids"]], [fit["labels"]]
            self._staged_prints = [fit["fingerprints"]]
            self._staged_seen = set(fit["ids"].tolist())
        self._load_staged_state(fit)

    # -- binding ---------------------------------------------------------------------------------
    def binding_of(self, module: nn.Module) -> Binding:
        """What statistics recorded now with ``module`` are bound to: the sample-id field, and with
        :attr:`records_parameters` the names and shapes of its trainable parameters and a digest of its frozen ones
        (recorders of a frozen backbone override it)."""
        ids = (self.batch_keys or BatchKeys()).id_field()
        if not self.records_parameters:
            return Binding(None, "", (), ids)
        params = dict(module.named_parameters())
        frozen = {n: p for n, p in params.items() if not p.requires_grad}
        trainable = tuple(sorted((n, tuple(p.shape)) for n, p in params.items() if p.requires_grad))
        part = "the frozen parameters (requires_grad=False) of the module"
        return Binding(tensors_digest(frozen) if frozen else None, part, trainable, ids, "trainable parameters' shapes")

    def bind(self, module: nn.Module) -> None:
        """Bind the statistics to ``module`` (:meth:`binding_of`): at each experience's start, and after each executed
        request (which may change what they are bound to, e.g. a retrained backbone)."""
        self.binding, self._binding_unchecked = self.binding_of(module), False

    def check_binding(self, module: nn.Module, *, loaded_only: bool = False) -> None:
        """Refuse to use the recorded statistics beside a module they were not recorded with.

        Called where the module meets them: at each experience's start, and by an unlearner (at its construction and,
        for a state loaded since, before a request). Statistics of a state saved without a binding (older versions)
        are bound to ``module`` here.

        Args:
            module: the module the statistics are about to be used with.
            loaded_only: check only if a state was loaded since the last check.

        Raises:
            ValueError: naming each part that differs (:meth:`~lightning_unlearn.core.binding.Binding.differences`);
                nothing is changed.
        """
        if loaded_only and not self._binding_unchecked:
            return
        if not len(self.catalog):
            return
        if self.binding is None:  # a state saved without a binding: warned about when loaded
            self.bind(module)
            return
        self._refuse_unbound(self.binding, self.binding_of(module), "its statistics")
        self._binding_unchecked = False

    def _refuse_unbound(self, recorded: Binding, here: Binding, what: str) -> None:
        """``ValueError`` naming what differs if statistics (``what``) bound to ``recorded`` meet a module bound as
        ``here``."""
        differ = recorded.differences(here)
        if differ:
            raise ValueError(
                f"{type(self).__name__}: {what} were not recorded with this module: {'; '.join(differ)}. Use "
                "them beside the module (and batch_keys) they were recorded with, or record this module with a new "
                "recorder"
            )

    # -- state -----------------------------------------------------------------------------------
    @property
    def executed_requests(self) -> bool:
        """Whether this recorder's state has executed forget requests (samples forgotten, or a ledger anchored)."""
        return bool(self.catalog.forgotten.any()) or self.unlearning_state.ledger_anchor is not None

    @contextmanager
    def replacing(self) -> Iterator[None]:
        """Inside the block, a state may be loaded into this recorder although it has executed forget requests.

        Loading replaces its statistics, catalog and ledger anchor, so the next request continues the loaded run (and
        its ledger). Use it when that is meant; otherwise load into a new recorder with a new unlearner. Lightning
        loads callback states with one argument, ``load_state_dict(state)``, so the permission is given around the
        call that restores the checkpoint::

            with recorder.replacing():
                trainer.fit(model, train_loader, ckpt_path="experience=1.ckpt")

        :meth:`load_from_checkpoint` takes ``replace=True`` instead.
        """
        previous, self._replacing = self._replacing, True
        try:
            yield
        finally:
            self._replacing = previous

    def _refuse_replacing(self, state: Mapping[str, Any], what: str) -> None:
        """``ValueError`` if loading ``state`` (``what``) would undo or replace what this recorder's requests did
        (:meth:`_replaced_by`), outside :meth:`replacing`; inside it, erase the rows of requests still pending erasure
        first."""
        if self._replacing:
            self.erase_pending()
            return
        why = self._replaced_by(state) if self.executed_requests else None
        if why is None:
            return
        raise ValueError(
            f"{type(self).__name__} has executed forget requests ({int(self.catalog.forgotten.sum())} samples "
            f"forgotten, {self.unlearning_state.describe_anchor()}): {what} would replace its state with {why}, and "
            "the next "
            "request would continue this run's ledger from it. Load it into a new recorder (and unlearner), or "
            "replace on purpose: `with recorder.replacing(): ...` around the load (e.g. trainer.fit(..., "
            "ckpt_path=...)), or recorder.load_from_checkpoint(path, replace=True)"
        )

    def _replaced_by(self, state: Mapping[str, Any]) -> str | None:
        """What ``state`` is if loading it would lose what this recorder's requests did: another run's state, one at
        another point of the ledger, or one still holding samples they forgot; ``None`` for this run's state at this
        point (e.g. the checkpoint this recorder was restored from, restored again by a fit)."""
        saved = UnlearningState.from_state_dict(state)
        if saved.lineage != self.unlearning_state.lineage:  # (a state without one gets a new one)
            return "another run's state"
        if saved.ledger_anchor != self.unlearning_state.ledger_anchor:
            return f"one {saved.describe_anchor()}"
        catalog = state.get("catalog") or {}
        ids, forgotten = catalog.get("ids"), catalog.get("forgotten")
        theirs = (
            set(ids[forgotten.bool()].tolist()) if isinstance(ids, Tensor) and isinstance(forgotten, Tensor) else set()
        )
        lost = sorted(set(self.catalog.ids[self.catalog.forgotten].tolist()) - theirs)
        return f"one that still holds samples its requests forgot ({lost[:10]})" if lost else None

    def require_fitted(self) -> None:
        """Raise ``ValueError`` if nothing was recorded (before any fit, or a checkpoint without statistics)."""
        if len(self.catalog) == 0:
            raise ValueError(
                f"{type(self).__name__} has no recorded statistics: fit with it as a callback, "
                "or restore it from a checkpoint saved with it"
            )

    def state_dict(self) -> dict[str, Any]:
        self.erase_pending()  # a checkpoint never holds rows of forgotten samples
        state = {
            "catalog": self.catalog.state_dict(),
            **self.unlearning_state.state_dict(),  # its keys at the top level, as in earlier versions' checkpoints
            "binding": None if self.binding is None else self.binding.state_dict(),
        }
        if self._fitting:  # saved mid-fit (e.g. by ModelCheckpoint): the running fit, to resume it
            empty = torch.zeros(0, dtype=torch.long)
            state["fit"] = {
                "experience": self._fit_experience,
                "first_epoch": self._first_epoch,
                "ids": torch.cat(self._staged_ids) if self._staged_ids else empty,
                "labels": torch.cat(self._staged_labels) if self._staged_labels else empty,
                "fingerprints": torch.cat(self._staged_prints) if self._staged_prints else empty,
                **self._staged_state(),
            }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the catalog, ledger anchor and binding of a saved state.

        Raises:
            ValueError: this recorder has executed requests and the load is not inside :meth:`replacing`; the catalog
                or the binding is malformed. Nothing is changed.
        """
        self._refuse_replacing(state_dict, "loading a state")
        saved = state_dict.get("binding")
        binding = None if saved is None else Binding.from_state(saved)
        self.catalog.load_state_dict(state_dict["catalog"])
        if "binding" not in state_dict and len(self.catalog):
            warn(
                f"{type(self).__name__}: this state was saved without its binding (an older lightning-unlearn), so "
                "whether it was recorded with this module (frozen backbone, head shape, sample-id field) cannot be "
                "checked; it is bound to the module it is next used with: make sure that is the one it was recorded "
                "with, then save a new checkpoint (it holds the binding)"
            )
        self.binding, self._binding_unchecked = binding, True
        self.unlearning_state.load_state_dict(state_dict)
        self._resume = state_dict.get("fit")

    def _check_settings(self, states: Mapping[str, Any], where: str) -> None:
        """``ValueError`` if ``states`` (a checkpoint's callback states) hold a recorder of this class
        with other settings than this one (Lightning would drop its statistics with a warning)."""
        if self.state_key in states:
            return
        name = type(self).__qualname__
        ours = _settings(self.state_key, name) or {}
        for key in states:
            theirs = _settings(key, name) if isinstance(key, str) else None
            if theirs is None:
                continue
            differ = [
                f"{k}={theirs.get(k)!r} there, {ours.get(k)!r} here"
                for k in sorted(set(ours) | set(theirs))
                if ours.get(k) != theirs.get(k)
            ]
            raise ValueError(
                f"{where} holds the statistics of a {name} with other settings ({'; '.join(differ) or key}); "
                f"they cannot be used by this {name}: create it with the checkpoint's settings"
            )

    def load_from_checkpoint(self: _R, path: str | Path, *, replace: bool = False) -> _R:
        """Restore this recorder's statistics from a Lightning checkpoint file; returns the recorder
        (``rec = AnalyticRecorder(ridge=1.0).load_from_checkpoint(path)``). They are checked against the module when
        an unlearner or a fit first uses them (:meth:`check_binding`).

        Args:
            path: the checkpoint file.
            replace: replace the state of a recorder that has executed forget requests (see :meth:`replacing`).

        Raises:
            ValueError: the checkpoint was saved without this recorder, or with other settings; this recorder has
                executed requests and ``replace`` is not set. Nothing is changed.
        """
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        states = ckpt.get("callbacks", {})
        self._check_settings(states, f"checkpoint {path}")
        if self.state_key not in states:
            raise ValueError(
                f"checkpoint {path} holds no statistics of {self.state_key} "
                f"(it has: {sorted(states) or 'no callback state'}); save it with this recorder among the callbacks"
            )
        if not replace:
            self._refuse_replacing(states[self.state_key], f"loading checkpoint {path}")
        with self.replacing() if replace else nullcontext():
            self.load_state_dict(states[self.state_key])
        return self


class ProcessGroup:
    """The collectives of a Lightning ``trainer.strategy`` that recorders call (``reduce``, ``all_gather``,
    ``root_device``), over torch.distributed's default process group (:meth:`RecorderCallback.join_process_group`)."""

    @property
    def root_device(self) -> torch.device:
        """CUDA's current device under NCCL, the CPU otherwise."""
        nccl = torch.distributed.get_backend() == "nccl"
        return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    def reduce(self, t: Tensor, reduce_op: Any = "sum") -> Tensor:
        """``t`` reduced over the ranks (``"sum"`` or a ``torch.distributed.ReduceOp``), a new tensor."""
        op = torch.distributed.ReduceOp.SUM if reduce_op == "sum" else reduce_op
        out = t.clone()
        torch.distributed.all_reduce(out, op=op)
        return out

    def all_gather(self, t: Tensor) -> Tensor:
        """Every rank's ``t`` stacked along a new dim 0."""
        parts = [torch.empty_like(t) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(parts, t.contiguous())
        return torch.stack(parts)


def _settings(state_key: str, name: str) -> dict[str, Any] | None:
    """The settings in a ``state_key`` made by ``Callback._generate_state_key`` for class ``name``."""
    if not state_key.startswith(name + "{"):
        return None
    try:
        settings = ast.literal_eval(state_key[len(name) :])
    except (ValueError, SyntaxError):
        return {"state_key": state_key}
    return settings if isinstance(settings, dict) else {"state_key": state_key}


def _repeated_ids_message(name: str, clashes: list[int], total: int, ids: Tensor, source: Any, ranks: bool) -> str:
    """The refusal of a batch whose ids name other samples than their first occurrences (:meth:`check_batch_ids`)."""
    from_avalanche = type(source).__module__.split(".")[0] == "avalanche"
    one_value = len(ids) > 1 and bool((ids == ids[0]).all())
    where = f"e.g. {sorted(set(clashes))[:5]}" if clashes else "on other ranks"
    message = (
        f"{name}: {total} sample ids in this batch{' (all ranks)' if ranks else ''} were given to another sample "
        f"(another label or input) earlier in this epoch ({where}): sample ids must be unique within one experience, "
        "or samples would be merged under one id"
    )
    if from_avalanche or one_value:
        message += (
            f"; {'the training data is an Avalanche dataset and ' if from_avalanche else ''}the batch's ids "
            f"{'are all ' + str(int(ids[0])) if one_value else 'repeat'}: this looks like Avalanche's task labels "
            "(its items are (x, y, task)). The ids must come from the `sample_id` data attribute: build the data with "
            "lightning_unlearn.avalanche.with_sample_ids(dataset) or benchmark_with_sample_ids(...) and train with "
            "fit_stream or UnlearningPlugin (or on items_with_ids(dataset), which yields (x, y, sample_id, task))"
        )
    return message


def _resumable(loaders: Any) -> bool:
    """Whether every training loader can resume mid-epoch (Lightning saves and restores its position)."""
    if isinstance(loaders, Mapping):
        loaders = list(loaders.values())
    flat = list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]
    return all(callable(getattr(d, "state_dict", None)) and callable(getattr(d, "load_state_dict", None)) for d in flat)


#: torch 2.14 deprecates ``torch.distributed.nn.functional.all_gather`` (a FutureWarning at every call), which
#: Lightning 2.6.6, the newest, calls in every ``strategy.all_gather`` and ``LightningModule.all_gather``: nothing a
#: user of this library can change
_ALL_GATHER_DEPRECATED = r"torch\.distributed\.nn\.functional\.all_gather is deprecated"


def _all_gather(gather: Callable[[Tensor], Any], t: Tensor) -> Any:
    """``gather(t)`` (Lightning's ``all_gather`` of a strategy or module) without torch's deprecation warning about
    the function Lightning calls (:data:`_ALL_GATHER_DEPRECATED`; every other warning passes)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_ALL_GATHER_DEPRECATED, category=FutureWarning)
        return gather(t)


def gather_batch(module: L.LightningModule, t: Tensor) -> Tensor:
    """Every rank's ``t`` (of one shape on every rank, as ``DistributedSampler`` makes batches) concatenated along
    dim 0, rank-major: ``module.all_gather`` flattened (a collective: every rank must call it)."""
    g = cast(Tensor, _all_gather(module.all_gather, t))  # all_gather returns a tensor for a tensor
    return g.flatten(0, 1)


def _gather_outputs(module: L.LightningModule, outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return {k: gather_batch(module, v) if isinstance(v, Tensor) and v.ndim > 0 else v for k, v in outputs.items()}
    return outputs


def _select(outputs: Any, keep: Tensor) -> Any:
    if isinstance(outputs, dict):
        return {k: v[keep] if isinstance(v, Tensor) and v.ndim > 0 else v for k, v in outputs.items()}
    return outputs
