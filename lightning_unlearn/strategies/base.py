"""`UnlearningStrategy`: the one interface every unlearning method implements.

Every method follows one contract, with one commit point:

1. ``forget`` checks the request and the data (nothing changes on a bad input);
2. the method's :meth:`UnlearningStrategy._compute` computes everything (new weights, the
   recorder's statistics change, its own state, the certificate) and touches nothing;
3. ``forget`` commits: the recorder applies the statistics change and marks the ids forgotten
   (:meth:`RecorderCallback.apply_forget`, the only way a strategy writes back), the module's
   touched tensors are swapped for their new values, the strategy's own state is replaced, and
   the ledger entry is appended. If any of these raises, everything already done is undone:
   parameters, buffers, statistics, catalog and ledger are as before and the request can be retried;
   once the entry is written, the recorder overwrites the rows it still holds of the forgotten
   samples (:meth:`RecorderCallback.erase_forgotten`), so rollback needs no copy of them;
4. the result's metrics go to the loggers of the Trainer the recorder last recorded with
   (:func:`lightning_unlearn.reporting.log_to_trainer`).

A ledger on disk can be ahead of the state it is used with: a process stopped between the ledger
write and the next checkpoint, and the run resumed from that earlier checkpoint. The module and the
statistics then still hold samples the ledger says are forgotten. ``forget`` refuses new requests
until :meth:`UnlearningStrategy.redo_pending` has executed those entries again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.core.catalog import SampleCatalog
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger, LedgerEntry, LedgerError
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.data import select_by_ids
from lightning_unlearn.modes import module_device
from lightning_unlearn.privacy.accountant import PrivacyAccountant
from lightning_unlearn.reporting import log_to_trainer

ForgetData = Dataset | DataLoader | None
Undo = Callable[[], None]


@dataclass
class UnlearningResult:
    """What one executed :class:`ForgetRequest` did."""

    request: ForgetRequest
    removed_ids: Tensor
    certificate: Certificate
    wall_time_s: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class UnlearningUpdate:
    """Everything one request changes, computed before anything is changed.

    Args:
        certificate: the guarantee of the new weights.
        weights: new values of the module's parameters and buffers, keyed by their
            ``state_dict`` name; only the entries given are touched (at commit time their
            tensors' data are swapped, not copied).
        statistics: the recorder's change, applied by :meth:`RecorderCallback.apply_forget`
            (for most recorders: new values of statistics attributes, by name).
        state: new values of the strategy's own attributes, by name.
        extra: method-specific numbers for the result and the ledger.
    """

    certificate: Certificate
    weights: Mapping[str, Tensor] = field(default_factory=dict)
    statistics: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def swap_weights(module: nn.Module, weights: Mapping[str, Tensor]) -> Undo:
    """Point the named parameters/buffers of ``module`` at new data; return the undo.

    Shapes are checked for all entries before any is swapped (``ValueError`` naming the first
    mismatch). The swap replaces each tensor's ``.data`` (no copy of the old values is made; the
    old data is kept by reference for the undo), so ``Parameter`` objects, optimizer references
    and hooks stay valid.
    """
    targets = dict(module.named_parameters()) | dict(module.named_buffers())
    unknown = [k for k in weights if k not in targets]
    if unknown:
        raise ValueError(f"update names tensors the module does not have: {unknown[:5]}")
    for k, new in weights.items():
        if tuple(new.shape) != tuple(targets[k].shape):
            raise ValueError(
                f"update for {k!r} has shape {tuple(new.shape)}, the module's is {tuple(targets[k].shape)}"
            )
    old = {k: targets[k].data for k in weights}

    def undo() -> None:
        for k, data in old.items():
            targets[k].data = data

    try:
        for k, new in weights.items():
            t = targets[k]
            t.data = new.detach().to(device=t.device, dtype=t.dtype)
    except BaseException:
        undo()  # a failure part-way leaves every tensor as it was
        raise
    return undo


def replace_attributes(obj: object, values: Mapping[str, Any]) -> Undo:
    """Set attributes of ``obj`` to new values (no copies); return the undo."""
    old = {k: getattr(obj, k) for k in values}
    for k, v in values.items():
        setattr(obj, k, v)

    def undo() -> None:
        for k, v in old.items():
            setattr(obj, k, v)

    return undo


class UnlearningStrategy(ABC):
    """Executes forget requests on a module in place, between experiences.

    ``forget`` resolves the request against the recorder's catalog (unknown ids, ids already
    forgotten, a class or experience never learned are ``ValueError``s), checks the data it was
    given, lets the method compute its :class:`UnlearningUpdate` and commits it all-or-nothing
    (see the module docstring).

    Subclasses set :attr:`method` (the registry name), :attr:`reads_data` and
    :attr:`needs_forget_data`, and implement :meth:`_compute`.

    Terms: in this library "strategy" alone means an unlearning strategy (this class). Lightning's
    ``Trainer(strategy=...)``/``trainer.strategy`` (how training is distributed, e.g. DDP) is
    called the *Lightning strategy*, and Avalanche's ``Naive``/``EWC``/``Replay`` (how a stream
    is learned) an *Avalanche strategy*; arguments holding an unlearning strategy next to either
    are named ``unlearning``.
    """

    method: ClassVar[str]
    #: whether ``forget`` reads ``data`` at all; a method that does not refuses it
    reads_data: ClassVar[bool] = False
    #: whether ``forget`` needs the samples to forget (their inputs), passed as ``data``
    needs_forget_data: ClassVar[bool] = False
    #: whether ``seed=`` seeds noise that carries a guarantee (the harness then leaves it unseeded)
    certified_noise: ClassVar[bool] = False
    #: the composed privacy loss of the models this strategy published (noise-adding strategies set it;
    #: a new accountant comes in ``UnlearningUpdate.state["accountant"]`` and is mirrored into the recorder)
    accountant: PrivacyAccountant | None = None

    def __init__(self, module: nn.Module, recorder: RecorderCallback, ledger: Ledger | None = None) -> None:
        self.module = module
        self.recorder = recorder
        self.ledger = ledger if ledger is not None else Ledger()
        self.history: list[UnlearningResult] = []

    @property
    def catalog(self) -> SampleCatalog:
        return self.recorder.catalog

    def forget(self, request: ForgetRequest, data: ForgetData = None) -> UnlearningResult:
        """Remove the influence of the samples ``request`` names.

        Args:
            request: what to forget.
            data: a dataset or loader yielding ``(x, y, sample_id, ...)`` batches (or dicts, see
                :mod:`lightning_unlearn.contract`) that contains the samples to forget
                (it may contain more; only the requested ids are used). Required by methods with
                ``needs_forget_data``, refused by methods that read no data.

        Raises:
            TypeError: ``request`` is not a :class:`ForgetRequest`.
            ValueError: the request names nothing learned, or samples already forgotten; the
                method needs ``data`` and none was given, or reads none and some was given; the
                data's labels or inputs differ from what was learned. Nothing is changed.
            LedgerError: the ledger records requests whose samples this state still holds (see
                :meth:`pending`); nothing is changed.
        """
        if not isinstance(request, ForgetRequest):
            raise TypeError(f"forget expects a ForgetRequest, got {type(request).__name__}")
        self.recorder.require_fitted()
        pending = self.pending()
        if pending:
            raise LedgerError(
                f"ledger {self.ledger.path} records requests {[e.seq for e in pending]} whose samples this module and "
                f"recorder still hold (ids {sorted(self.catalog.live(pending[0].removed_ids))[:10]} of entry "
                f"{pending[0].seq}): it was restored from a checkpoint saved before them; call redo_pending(data) "
                "to execute them again first"
            )
        ids = self.catalog.resolve(request)
        self._check_data(data)
        return self._execute(request, ids, data, {})

    def pending(self) -> list[LedgerEntry]:
        """The ledger's entries of this recorder's run (its ``lineage``) whose samples this state still holds
        (learned, not forgotten): executed after the checkpoint the module and recorder were restored from."""
        if not len(self.ledger):
            return []
        lineage = self.recorder.lineage
        return [e for e in self.ledger if e.extra.get("recorder") == lineage and self.catalog.live(e.removed_ids)]

    def redo_pending(self, data: ForgetData = None) -> list[UnlearningResult]:
        """Execute the :meth:`pending` entries again, in order, each appended to the ledger anew with
        ``extra["redo_of"]`` naming the entry it repeats.

        A method that draws noise draws it afresh: the redone model is a new release, and a model
        the stopped process published is not in the accountant restored from the checkpoint
        (:meth:`restore_accountant` counts it only when rebuilt from the ledger).

        Args:
            data: as for :meth:`forget`, holding the pending entries' samples.

        Raises:
            LedgerError: a pending entry was executed by another method, or forgot only part of what
                this state holds of it; nothing is changed for it and the entries after it.
        """
        self.recorder.require_fitted()
        self._check_data(data)
        done = []
        for entry in self.pending():
            if entry.method != self.method:
                raise LedgerError(
                    f"ledger entry {entry.seq} was executed by {entry.method!r}: redo it with that method's strategy"
                )
            if len(self.catalog.live(entry.removed_ids)) != len(entry.removed_ids):
                raise LedgerError(f"ledger entry {entry.seq}'s samples are only partly forgotten in this state")
            ids = torch.tensor(entry.removed_ids, dtype=torch.long)
            done.append(self._execute(entry.forget_request, ids, data, {"redo_of": entry.seq}))
        return done

    def _check_data(self, data: ForgetData) -> None:
        """``ValueError`` if ``data`` is missing for a method that needs it, given to a method that reads
        none, or not a dataset or loader."""
        if self.needs_forget_data and data is None:
            raise ValueError(f"{self.method} needs the samples to forget: pass data=<dataset yielding (x, y, id)>")
        if not self.reads_data and data is not None:
            raise ValueError(
                f"{self.method} does not read forget(data=...) (it forgets from what it was given at construction "
                "and the recorded statistics): do not pass data"
            )
        if data is not None and not isinstance(data, (Dataset, DataLoader)):
            raise ValueError(
                f"data must be a torch Dataset or DataLoader yielding sample ids, got {type(data).__name__}"
            )

    def _execute(
        self, request: ForgetRequest, ids: Tensor, data: ForgetData, extra: dict[str, Any]
    ) -> UnlearningResult:
        start = perf_counter()
        update = self._compute(ids, data)
        wall = perf_counter() - start
        result = UnlearningResult(request, ids, update.certificate, wall, {**update.extra, **extra})
        self._commit(result, update)
        self.history.append(result)
        log_to_trainer(self.recorder.trainer, result)
        return result

    def _commit(self, result: UnlearningResult, update: UnlearningUpdate) -> None:
        """Apply ``update`` and append the ledger entry, all or nothing."""
        undo: list[Undo] = []
        try:
            undo.append(self.recorder.apply_forget(result.removed_ids, update.statistics))
            undo.append(swap_weights(self.module, update.weights))
            undo.append(replace_attributes(self, update.state))
            self.ledger.append(result, self.module, recorder=self.recorder.lineage)
        except BaseException:
            for step in reversed(undo):
                step()
            raise
        self.recorder.erase_forgotten(result.removed_ids)
        self.recorder.ledger_anchor = self.ledger.anchor()
        self.mirror_accountant()

    def mirror_accountant(self) -> None:
        """Copy this method's accountant state into the recorder's (so that checkpoints keep it)."""
        if self.accountant is not None:
            self.recorder.privacy = {**(self.recorder.privacy or {}), self.method: self.accountant.state_dict()}

    def restore_accountant(self, mechanism: str = "pld") -> PrivacyAccountant:
        """The accountant of this method's earlier releases: from the recorder's state (a checkpoint),
        else rebuilt from the ledger's entries, else empty."""
        saved = (self.recorder.privacy or {}).get(self.method)
        if saved is not None:
            return PrivacyAccountant.from_state_dict(saved)
        return PrivacyAccountant.from_ledger(self.ledger, self.method, mechanism)

    @abstractmethod
    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        """Compute what forgetting ``ids`` changes, without changing anything."""

    # -- helpers for methods that read the samples to forget -------------------------------------
    def forget_samples(self, ids: Tensor, data: ForgetData) -> tuple[Tensor, Tensor]:
        """Inputs (on the module's device) and learned labels of exactly ``ids`` from ``data``, checked against
        what was learned.

        Raises:
            ValueError: ``data`` lacks some ids, or its labels or inputs (their fingerprints) differ
                from the ones recorded when the samples were learned; the ids are named.
        """
        if data is None:
            raise ValueError(f"{self.method} needs the samples to forget: pass data=<dataset yielding (x, y, id)>")
        x, y = select_by_ids(data, ids, keys=self.recorder.batch_keys)
        labels = self._labels_checked(ids, y)
        self.catalog.check_fingerprints(ids, x)
        return x.to(module_device(self.module)), labels

    def _labels_checked(self, ids: Tensor, y: Tensor) -> Tensor:
        """The catalog labels of ``ids``; ``ValueError`` if the given data's labels disagree."""
        labels = self.catalog.labels_of(ids)
        bad = (labels != torch.as_tensor(y).long().cpu()).nonzero().flatten()
        if bad.numel():
            raise ValueError(
                f"forget data labels differ from the learned labels for sample ids {ids[bad][:10].tolist()}"
            )
        return labels
