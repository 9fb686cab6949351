"""`Unlearner`: the one interface every unlearning method implements.

Every method follows one contract, with one commit point, in the order of a database's write-ahead
log (the ledger entry is the durable record; everything after it is derived from it):

1. ``forget`` checks the ledger file against the recorder's anchor (the checkpoint's ``ledger_anchor``:
   a dropped, emptied, deleted, rewritten or replaced ledger, an entry repeating an execution, or an entry
   after the anchor that is not this run's to redo is a :class:`LedgerError` before anything runs;
   :meth:`Unlearner.accept_ledger` and :meth:`Unlearner.rollback_ledger` are the operator's logged ways out),
   erases what an earlier request left unerased, and checks the request and the data (nothing changes on a
   bad input);
2. the method's :meth:`Unlearner._compute` computes everything (new weights, the
   recorder's statistics change, its own state, the certificate) and touches nothing;
3. ``forget`` commits with Ctrl-C and SIGTERM held until it is done
   (:func:`~lightning_unlearn.core.interrupts.deferred_interrupts`); each step hands over its undo before
   (the catalog) or as (the others) it changes anything: the catalog marks the ids forgotten, the recorder
   applies the statistics change (:meth:`RecorderCallback.apply_forget`, the only way a strategy writes
   back), the module's touched tensors are swapped for their new values, the strategy's own state is
   replaced, and the ledger entry is written and ``fsync``-ed: the commit point. If any of these raises,
   everything already done is undone: parameters, buffers, statistics, catalog and ledger file are as
   before and the request can be retried;
4. after the commit point the derived state follows, the steps that cannot fail first: the recorder's
   ledger anchor, its copy of the accountant, the strategy's history; then the recorder overwrites the
   rows it still holds of the forgotten samples (:meth:`RecorderCallback.erase_forgotten`, so rollback
   needs no copy of them). An erasure that fails (a memory-mapped store that cannot be written) leaves
   the ids in ``recorder.unlearning_state.unerased``: they are erased before the next request, ``redo_pending``
   or ``state_dict`` (which saves nothing until they are), and the caller gets an
   :class:`ErasurePendingError` holding the executed request's result;
5. the result's metrics go to the loggers of the Trainer the recorder last recorded with
   (:func:`lightning_unlearn.reporting.log_to_trainer`).

A ledger on disk can be ahead of the state it is used with: a process stopped between the ledger
write and the next checkpoint, and the run resumed from that earlier checkpoint. The module and the
statistics then still hold samples the ledger says are forgotten. ``forget`` refuses new requests
until :meth:`Unlearner.redo_pending` has executed those entries again. Any other entry after the anchor
is refused, naming it, until the operator confirms it (:meth:`Unlearner.accept_ledger`) or cuts it
(:meth:`Unlearner.rollback_ledger`): an entry of another run (``lineage``: another run's ledger, or a
recorder given another run's state), unless the ledger is ``shared``, and an entry of this run whose samples
this state has already forgotten (a repeated execution).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.core.catalog import SampleCatalog
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.interrupts import deferred_interrupts
from lightning_unlearn.core.ledger import (
    EMPTY_ANCHOR,
    Ledger,
    LedgerEntry,
    LedgerError,
    LedgerReport,
    utc_timestamp,
)
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.core.result import UnlearningResult
from lightning_unlearn.core.undo import Undo, applied, replace_attributes, undoing
from lightning_unlearn.data import select_by_ids
from lightning_unlearn.modes import module_device
from lightning_unlearn.privacy.accountant import PrivacyAccountant, Release
from lightning_unlearn.reporting import log_to_trainer

__all__ = [
    "ErasurePendingError",
    "ForgetData",
    "MethodInfo",
    "UnlearningResult",
    "Unlearner",
    "UnlearningUpdate",
    "replace_attributes",
    "swap_weights",
]

_log = logging.getLogger("lightning_unlearn.ledger")

ForgetData = Dataset | DataLoader | None


class ErasurePendingError(RuntimeError):
    """A request was executed and recorded in the ledger, but the recorder could not erase the rows it still holds
    of the forgotten samples yet (they stay in ``recorder.unlearning_state.unerased`` and are erased later).

    Attributes:
        result: the executed request's :class:`UnlearningResult` (as ``forget`` would have returned it).
    """

    def __init__(self, message: str, result: UnlearningResult) -> None:
        super().__init__(message)
        self.result = result


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

    def change() -> None:
        for k, new in weights.items():
            t = targets[k]
            t.data = new.detach().to(device=t.device, dtype=t.dtype)

    def undo() -> None:
        for k, data in old.items():
            targets[k].data = data

    return applied(change, undo)  # a failure part-way leaves every tensor as it was


@dataclass(frozen=True)
class MethodInfo:
    """A method's registry entry (what ``lightning-unlearn methods`` prints), declared beside its unlearner class.

    Args:
        guarantee: what a request's certificate promises, citing the theorem (one line).
        assumptions: what the guarantee (or the method) rests on (one line).
        cost: the cost of a request, and of recording (one line).
        paper: the reference key(s) of ``docs/references.md``, comma-separated (``""``: none).
        fixed: the constructor options the key fixes (``salun`` is
            :class:`~lightning_unlearn.unlearners.rbm.RBMUnlearner` with ``masking="forget"``).
    """

    guarantee: str
    assumptions: str
    cost: str
    paper: str = ""
    fixed: Mapping[str, Any] = field(default_factory=dict)


class Unlearner(ABC):
    """Executes forget requests on a module in place, between experiences.

    ``forget`` resolves the request against the recorder's catalog (unknown ids, ids already
    forgotten, a class or experience never learned are ``ValueError``s), checks the data it was
    given, lets the method compute its :class:`UnlearningUpdate` and commits it all-or-nothing
    (see the module docstring).

    The recorder's statistics must have been recorded with ``module`` (its frozen backbone, head shape and
    sample-id field: :meth:`RecorderCallback.check_binding`, a ``ValueError`` naming what differs otherwise).

    Subclasses set :attr:`method` (the method's key: its registry name, its modules' name, its docs page) and
    :attr:`method_info` (its registry entry), :attr:`reads_data` and :attr:`needs_forget_data`, and implement
    :meth:`_compute`.

    Terms: in this library "strategy" alone means an unlearner (this class). Lightning's
    ``Trainer(strategy=...)``/``trainer.strategy`` (how training is distributed, e.g. DDP) is
    called the *Lightning strategy*, and Avalanche's ``Naive``/``EWC``/``Replay`` (how a stream
    is learned) an *Avalanche strategy*; arguments holding an unlearner next to either
    are named ``unlearning``.
    """

    method: ClassVar[str]
    #: the registry entry of :attr:`method`: its guarantee, assumptions and cost
    method_info: ClassVar[MethodInfo]
    #: whether ``forget`` reads ``data`` at all; a method that does not refuses it
    reads_data: ClassVar[bool] = False
    #: whether ``forget`` needs the samples to forget (their inputs), passed as ``data``
    needs_forget_data: ClassVar[bool] = False
    #: whether ``seed=`` seeds noise that carries a guarantee (the harness then leaves it unseeded)
    certified_noise: ClassVar[bool] = False
    #: the composed privacy loss of the models this strategy published (noise-adding strategies set it;
    #: a new accountant comes in ``UnlearningUpdate.state["accountant"]`` and is mirrored into the recorder)
    accountant: PrivacyAccountant | None = None

    @classmethod
    def registry_entries(cls) -> dict[str, MethodInfo]:
        """The keys the class is registered under, each with its entry: ``{method: method_info}`` (a class whose key
        an option chooses, :class:`~lightning_unlearn.unlearners.rbm.RBMUnlearner`, lists each key; a class without
        a ``method_info``, e.g. a user's, none)."""
        return {cls.method: cls.method_info} if hasattr(cls, "method_info") else {}

    def __init__(self, module: nn.Module, recorder: RecorderCallback, ledger: Ledger | None = None) -> None:
        recorder.check_binding(module)  # its statistics were recorded with this module (ValueError otherwise)
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
                data's labels or inputs differ from what was learned; a state loaded into the recorder
                since was not recorded with this module (:meth:`RecorderCallback.check_binding`). Nothing is changed.
            ReleaseRefused: (a ``ValueError``) a certified release whose assumptions fail, or that would exceed
                the privacy budget, naming why. Nothing is changed.
            LedgerError: the ledger file does not match the recorder's anchor or holds entries after it that are
                not this run's to redo (:meth:`check_ledger`), or it records requests whose samples this state still
                holds (see :meth:`pending`); nothing is changed.
            OSError: rows an earlier request left unerased still cannot be erased; nothing is changed.
            ErasurePendingError: the request was executed and recorded, but erasing its rows failed (see the
                module docstring); its ``result`` is the executed request's.
        """
        if not isinstance(request, ForgetRequest):
            raise TypeError(f"forget expects a ForgetRequest, got {type(request).__name__}")
        self.recorder.require_fitted()
        self.recorder.check_binding(self.module, loaded_only=True)  # a state loaded since: recorded with this module?
        self.check_ledger()
        self.recorder.erase_pending()
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

    def check_ledger(self) -> LedgerReport | None:
        """Verify the ledger file against the recorder's anchor (the ``ledger_anchor`` of the checkpoint it was
        restored from, or of its last request; a recorder without one executed nothing on a ledger file: every
        entry is after its anchor); under DDP every rank takes part and all refuse together.

        Returns:
            the :class:`~lightning_unlearn.core.ledger.LedgerReport`, or ``None`` for an in-memory ledger (it
            records nothing durable: it is neither checked against the anchor nor written into it).

        Raises:
            LedgerError: naming the mismatch: the file lost anchored entries (dropped, emptied, deleted), holds
                another entry where the anchor's head should be (rewritten, or another run's ledger), its
                chain is broken or downgraded, an entry repeats an execution of its run, or an entry after the
                anchor is another run's (the ledger not ``shared``) or forgets samples this state has already
                forgotten. :meth:`accept_ledger` overrides a mismatch an operator can explain;
                :meth:`rollback_ledger` cuts the entries after the anchor.
        """
        if self.ledger.path is None:
            return None
        report: LedgerReport | None = None
        failure: LedgerError | None = None
        try:
            report = self.ledger.verify(self.recorder.unlearning_state.ledger_anchor or EMPTY_ANCHOR)
            self._check_beyond_anchor(report)
        except LedgerError as err:
            failure = err
        if self.recorder.max_over_ranks(float(failure is not None)) > 0:
            raise failure if failure is not None else LedgerError("the ledger check failed on another rank")
        return report

    def _check_beyond_anchor(self, report: LedgerReport) -> None:
        """``LedgerError`` naming the first entry after the anchor that is neither this run's to redo (its samples
        all still learned here: :meth:`pending`) nor a rollback record of this run, nor, in a ``shared`` ledger,
        another run's."""
        lineage, count = self.recorder.unlearning_state.lineage, report.count - len(report.beyond_anchor)
        remedy = "accept_ledger(reason) adopts the entries after the anchor, rollback_ledger(reason) cuts them"
        for e in report.beyond_anchor:
            where = f"ledger {report.path} {e.summary()}, written after the recorder's anchor ({count} entries),"
            if e.lineage != lineage:
                if self.ledger.shared:
                    continue
                raise LedgerError(
                    f"{where} is another run's (this recorder's lineage is {lineage}: another run's ledger, or this "
                    "recorder restored from another run's state; a ledger written by several runs at once is opened "
                    f"with Ledger(path, shared=True)); {remedy}"
                )
            live = set(self.catalog.live(e.removed_ids))
            done = [i for i in e.removed_ids if i not in live]
            if done:
                raise LedgerError(
                    f"{where} forgets sample ids {done[:10]} this state does not hold (already forgotten, or never "
                    f"learned): not a request of this run it has yet to execute (a repeated execution?); {remedy}"
                )

    def accept_ledger(self, reason: str) -> LedgerReport:
        """Adopt this strategy's ledger file although it does not match the recorder's anchor, or holds entries after
        it that are not this run's to redo: the operator's override, for a mismatch they can explain (a ledger
        restored from a backup, a new ledger for a resumed run, another run's entries known to be right).

        The ledger's own chain must still be intact and no entry may repeat an execution (that is never overridden:
        :meth:`rollback_ledger` cuts such an entry). The override is logged (the ``lightning_unlearn.ledger``
        logger, at WARNING) and kept in the recorder's state (``ledger_overrides``, so in every later checkpoint):
        when, which file, the anchor replaced, the one adopted, and ``reason``.

        Raises:
            ValueError: no reason given, or the ledger is in memory (nothing to accept).
            LedgerError: the ledger's chain is broken or downgraded, or an entry repeats an execution of its run.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("accept_ledger needs the operator's reason (a non-empty string), which is logged and kept")
        if self.ledger.path is None:
            raise ValueError("an in-memory ledger is never checked against the recorder's anchor: nothing to accept")
        report = self.ledger.verify()
        record = {
            "time": utc_timestamp(),
            "path": report.path,
            "replaced_anchor": self.recorder.unlearning_state.ledger_anchor,
            "accepted_anchor": self.ledger.anchor(),
            "reason": reason,
        }
        _log.warning(
            "ledger %s accepted by the operator in place of the recorder's anchor %s (now %d entries, head %s): %s",
            report.path,
            record["replaced_anchor"],
            report.count,
            report.head[:16],
            reason,
        )
        self.recorder.unlearning_state.ledger_overrides.append(record)
        self.recorder.unlearning_state.ledger_anchor = self.ledger.anchor()
        return report

    def pending(self) -> list[LedgerEntry]:
        """The ledger's entries of this recorder's run (its ``lineage``) whose samples this state still holds
        (learned, not forgotten): executed after the checkpoint the module and recorder were restored from. A redo
        of such an entry (a run stopped again before its next checkpoint) is the same request, not listed again."""
        if not len(self.ledger):
            return []
        lineage = self.recorder.unlearning_state.lineage
        ours = [e for e in self.ledger if e.lineage == lineage and self.catalog.live(e.removed_ids)]
        seqs = {e.seq for e in ours}
        return [e for e in ours if e.extra.get("redo_of") not in seqs]

    def redo_pending(self, data: ForgetData = None) -> list[UnlearningResult]:
        """Execute the :meth:`pending` entries again, in order, each appended to the ledger anew with
        ``extra["redo_of"]`` naming the entry it repeats.

        A method that draws noise draws it afresh: the redone model is a new release. The model the
        stopped process released (its entry is durable, so it may have been seen) is counted too: its
        release, read from the entry's certificate, joins the accountant restored from the checkpoint
        before the redo's own, so the composed epsilon never understates what was published.

        Args:
            data: as for :meth:`forget`, holding the pending entries' samples.

        Raises:
            LedgerError: the ledger does not match the recorder's anchor (:meth:`check_ledger`); a pending entry
                was executed by another method, or forgot only part of what this state holds of it; nothing is
                changed for it and the entries after it.
            OSError: rows an earlier request left unerased still cannot be erased; nothing is changed.
        """
        self.recorder.require_fitted()
        self.recorder.check_binding(self.module, loaded_only=True)
        self.check_ledger()
        self.recorder.erase_pending()
        self._check_data(data)
        done = []
        for entry in self.pending():
            if entry.method_key != self.method:
                raise LedgerError(
                    f"ledger entry {entry.seq} was executed by {entry.method!r}: redo it with that method's strategy"
                )
            if len(self.catalog.live(entry.removed_ids)) != len(entry.removed_ids):
                raise LedgerError(f"ledger entry {entry.seq}'s samples are only partly forgotten in this state")
            ids = torch.tensor(entry.removed_ids, dtype=torch.long)
            accountant = self.accountant
            self.accountant = self._with_release_of(entry)  # committed with the redo
            counted = self.accountant
            try:
                done.append(self._execute(entry.forget_request, ids, data, {"redo_of": entry.seq}))
            except BaseException:
                if self.accountant is counted:  # not committed (an ErasurePendingError is: keep its accountant)
                    self.accountant = accountant
                raise
        return done

    def rollback_ledger(self, reason: str) -> LedgerEntry:
        """Cut the ledger's entries after the recorder's anchor: the operator's alternative to :meth:`redo_pending`
        and :meth:`accept_ledger` for entries that should not be there (a repeated execution, another run's).

        :meth:`Ledger.rollback` replaces them, atomically and durably, by one entry recording the cut (each entry's
        number, hash, lineage, method, timestamp, request and release; ``reason``; the digest of the weights this
        state holds); the recorder's anchor moves onto it, and the rollback is logged (``lightning_unlearn.ledger``,
        WARNING). A cut entry of this run and method whose samples this state still holds (a stopped run's request,
        :meth:`pending`) may have been published: its release stays counted in the accountant; to execute its
        request, submit it again.

        Returns:
            the entry recording the rollback.

        Raises:
            ValueError: no reason given, the ledger is in memory, or it has no entry after the anchor.
            LedgerError: the ledger's chain is broken, or it does not hold the recorder's anchor (truncated or
                replaced: :meth:`accept_ledger` is the way out then).
        """
        anchor = self.recorder.unlearning_state.ledger_anchor or EMPTY_ANCHOR
        with deferred_interrupts():  # the file, the anchor and the accountant change together
            cut = self.ledger.rollback(anchor, reason, self.module, recorder=self.recorder.unlearning_state.lineage)
            record, self.recorder.unlearning_state.ledger_anchor = self.ledger[-1], self.ledger.anchor()
            for entry in cut:
                stopped = entry.lineage == self.recorder.unlearning_state.lineage and entry.method_key == self.method
                if stopped and len(self.catalog.live(entry.removed_ids)) == len(entry.removed_ids):
                    self.accountant = self._with_release_of(entry)
            self.mirror_accountant()
        _log.warning(
            "ledger %s rolled back by the operator to the recorder's anchor of %d entries, cutting entries %s "
            "(lineages %s), recorded as entry %d: %s",
            self.ledger.path,
            int(anchor["count"]),
            [e.seq for e in cut],
            sorted({str(e.lineage) for e in cut}),
            record.seq,
            reason,
        )
        return record

    def _with_release_of(self, entry: LedgerEntry) -> PrivacyAccountant | None:
        """This strategy's accountant with ``entry``'s release (read from its certificate) counted too."""
        release = entry.certificate.get("accounting", {}).get("release")
        if self.accountant is None or release is None:
            return self.accountant
        return self.accountant.with_release(Release(**release))

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
        unerased = self._commit(result, update)
        log_to_trainer(self.recorder.trainer, result)
        if unerased is not None:
            raise ErasurePendingError(
                f"the {self.method} request was executed and recorded (ledger entry {len(self.ledger) - 1}), but "
                f"erasing what {type(self.recorder).__name__} still holds of its samples failed ({unerased!r}): "
                "they are erased before the next request, redo_pending() or state_dict() (which saves nothing "
                "until then); recorder.erase_pending() retries now",
                result,
            ) from unerased
        return result

    def _commit(self, result: UnlearningResult, update: UnlearningUpdate) -> Exception | None:
        """Apply ``update`` and append the ledger entry, all or nothing; then the state derived from the entry
        (see the module docstring). Returns the erasure's failure, if any (the request is executed all the same)."""
        ids = result.removed_ids
        with deferred_interrupts():
            with undoing() as undo:
                undo.append(self.catalog.restorer(ids))  # the undo first: marking may be cut short
                self.catalog.mark_forgotten(ids)
                undo.append(self.recorder.apply_forget(ids, update.statistics))
                undo.append(swap_weights(self.module, update.weights))
                undo.append(replace_attributes(self, update.state))
                self.ledger.append(result, self.module, recorder=self.recorder.unlearning_state.lineage)
            # committed: the entry is durable; what follows derives from it, and only the erasure can fail
            if self.ledger.path is not None:
                self.recorder.unlearning_state.ledger_anchor = self.ledger.anchor()
            self.mirror_accountant()
            self.recorder.bind(self.module)  # the statistics now belong to the updated module (e.g. a retrained trunk)
            self.history.append(result)
            self.recorder.unlearning_state.unerased.append(ids)
            try:
                self.recorder.erase_pending()
            except Exception as err:  # noqa: BLE001 - executed all the same; the ids stay pending (module docstring)
                return err
        return None

    def mirror_accountant(self) -> None:
        """Copy this method's accountant state into the recorder's (so that checkpoints keep it)."""
        if self.accountant is not None:
            state = self.recorder.unlearning_state
            state.privacy = {**(state.privacy or {}), self.method: self.accountant.state_dict()}

    def restore_accountant(self, mechanism: str = "pld") -> PrivacyAccountant:
        """The accountant of this method's earlier releases: from the recorder's state (a checkpoint),
        else rebuilt from the ledger's entries, else empty."""
        saved = (self.recorder.unlearning_state.privacy or {}).get(self.method)
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
