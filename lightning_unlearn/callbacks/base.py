"""`RecorderCallback`: the shared plumbing of every recording callback.

A recorder sees each training batch once, keyed by sample id, and stages what it records for
the current fit; the staged block is committed at the end of the fit's first epoch (the first
epoch *this* fit runs, so a fit resumed from a checkpoint records too, skipping the samples
its experience had already committed). Under DDP
every rank all-gathers each batch, so all ranks hold the same statistics, and ids repeated by
``DistributedSampler`` padding are counted once. An exception during fit drops the staged block,
so statistics only ever reflect whole experiences.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor

from lightning_unlearn.contract import BatchKeys, unpack_batch
from lightning_unlearn.core.catalog import SampleCatalog, fingerprints
from lightning_unlearn.reporting import continue_log_step


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
        #: ``{"count", "head"}`` of the ledger after the last request (verify a ledger against a checkpoint)
        self.ledger_anchor: dict[str, Any] | None = None
        self.experience: int | None = None
        #: the Trainer of the last Lightning fit: executed requests are logged to its loggers
        self.trainer: L.Trainer | None = None
        self._fit_experience = 0
        self._first_epoch = 0
        self._staged_ids: list[Tensor] = []
        self._staged_labels: list[Tensor] = []
        self._staged_prints: list[Tensor] = []
        self._staged_seen: set[int] = set()

    # -- framework-neutral API (also used by the Avalanche plugin) -------------------------------
    def begin_experience(self, module: torch.nn.Module) -> None:
        """Start staging a new experience."""
        if self.experience is not None:
            self._fit_experience = self.experience
        elif len(self.catalog):
            self._fit_experience = int(self.catalog.experiences.max()) + 1
        else:
            self._fit_experience = 0
        self._drop_staged()

    def record(self, module: torch.nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any = None) -> None:
        """Stage one (already rank-gathered) batch; repeated ids within the fit are skipped."""
        fresh = [k for k, i in enumerate(ids.tolist()) if i not in self._staged_seen]
        if not fresh:
            return
        keep = torch.tensor(fresh, device=ids.device)
        ids, y, x = ids[keep], y[keep], x[keep]
        known = torch.tensor([i in self.catalog for i in ids.tolist()], dtype=torch.bool, device=ids.device)
        if bool(known.any()):
            earlier = self.catalog.experiences_of(ids[known].cpu()) != self._fit_experience
            if bool(earlier.any()):
                raise ValueError(
                    f"{type(self).__name__}: sample ids {ids[known][earlier][:10].tolist()} were already learned "
                    "in an earlier experience; each sample may be learned once (give every sample a unique id)"
                )
            # a fit resumed from a checkpoint of this experience: those samples are already in
            keep = (~known).nonzero().flatten()
            ids, y, x, outputs = ids[keep], y[keep], x[keep], _select(outputs, keep)
            if not len(ids):
                return
        self._record(module, x, y, ids, _select(outputs, keep))
        self._staged_seen.update(ids.tolist())
        self._staged_ids.append(ids.cpu())
        self._staged_labels.append(y.detach().long().cpu())
        if self.fingerprint and isinstance(x, Tensor):
            self._staged_prints.append(fingerprints(x))
        else:
            self._staged_prints.append(torch.zeros(len(ids), dtype=torch.long))

    def end_experience(self, module: torch.nn.Module) -> None:
        """Commit the staged block: register its samples and fold in its statistics."""
        if not self._staged_ids:
            return
        ids, labels, prints = torch.cat(self._staged_ids), torch.cat(self._staged_labels), torch.cat(self._staged_prints)
        self._commit(module)
        self.catalog.add(ids, labels, self._fit_experience, prints)
        self._drop_staged()

    def apply_forget(self, ids: Tensor, change: Mapping[str, Any]) -> Callable[[], None]:
        """Apply a strategy's computed change for forgetting ``ids``, mark them forgotten; return the undo.

        The default replaces statistics attributes by the new values in ``change`` (computed out
        of place by the strategy). Recorders whose statistics are updated in place (rows of a
        store) override it. Called by :meth:`UnlearningStrategy.forget` only, at its commit point.
        """
        unknown = [k for k in change if not hasattr(self, k)]
        if unknown:
            raise ValueError(f"{type(self).__name__} has no statistics named {unknown}")
        old = {k: getattr(self, k) for k in change}
        prints = self.catalog.mark_forgotten(ids)
        for k, v in change.items():
            setattr(self, k, v)

        def undo() -> None:
            for k, v in old.items():
                setattr(self, k, v)
            self.catalog.unmark_forgotten(ids, prints)

        return undo

    # -- Lightning hooks -------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after checkpoint restore: a resumed fit starts at a later epoch and records from there
        self._first_epoch = trainer.current_epoch
        continue_log_step(self.trainer, trainer)
        self.trainer = trainer
        self.begin_experience(pl_module)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.current_epoch > self._first_epoch and not self.records_every_epoch:
            return
        x, y, ids = unpack_batch(batch, self.batch_keys)
        if trainer.world_size > 1:
            x, y, ids = (_gather(pl_module, t) for t in (x, y, ids))
            outputs = _gather_outputs(pl_module, outputs)
        self.record(pl_module, x, y, ids, outputs)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self._first_epoch and not self.records_every_epoch:
            self.end_experience(pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.end_experience(pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._drop_staged()

    # -- to implement ----------------------------------------------------------------------------
    #: recorders that follow the whole training trajectory (HF) see every epoch, not just the first
    records_every_epoch: bool = False

    def _record(self, module: torch.nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        raise NotImplementedError

    def _commit(self, module: torch.nn.Module) -> None:
        raise NotImplementedError

    def _drop_staged(self) -> None:
        self._staged_ids, self._staged_labels, self._staged_prints, self._staged_seen = [], [], [], set()

    # -- state -----------------------------------------------------------------------------------
    def require_fitted(self) -> None:
        """Raise ``ValueError`` if nothing was recorded (before any fit, or a checkpoint without statistics)."""
        if len(self.catalog) == 0:
            raise ValueError(
                f"{type(self).__name__} has no recorded statistics: fit with it as a callback, "
                "or restore it from a checkpoint saved with it"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"catalog": self.catalog.state_dict(), "ledger_anchor": self.ledger_anchor}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.catalog.load_state_dict(state_dict["catalog"])
        self.ledger_anchor = state_dict.get("ledger_anchor")

    def load_from_checkpoint(self, path: str | Path) -> None:
        """Restore this recorder's statistics from a Lightning checkpoint file.

        Raises ``ValueError`` if the checkpoint was saved without this recorder.
        """
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        states = ckpt.get("callbacks", {})
        if self.state_key not in states:
            raise ValueError(
                f"checkpoint {path} holds no statistics of {self.state_key} "
                f"(it has: {sorted(states) or 'no callback state'}); save it with this recorder among the callbacks"
            )
        self.load_state_dict(states[self.state_key])


def _gather(module: L.LightningModule, t: Tensor) -> Tensor:
    g = module.all_gather(t)
    return g.flatten(0, 1)


def _gather_outputs(module: L.LightningModule, outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return {k: _gather(module, v) if isinstance(v, Tensor) and v.ndim > 0 else v for k, v in outputs.items()}
    return outputs


def _select(outputs: Any, keep: Tensor) -> Any:
    if isinstance(outputs, dict):
        return {k: v[keep] if isinstance(v, Tensor) and v.ndim > 0 else v for k, v in outputs.items()}
    return outputs
