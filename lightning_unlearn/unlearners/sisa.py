"""`SISAUnlearner`: exact forgetting on a :class:`~lightning_unlearn.callbacks.sisa.SISABackbone` ([SISA] shards x
slices on a stream, [CLPU] temporary experiences), one request at a time or queued and executed together."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_unlearn.callbacks.sisa import SISABackbone, SISAChange
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger, utc_timestamp
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.core.result import UnlearningResult
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo, Unlearner, UnlearningUpdate

#: what a queued request's status says
Status = Literal["queued", "executed"]

_DETERMINISM = (
    "every stage is a deterministic function of its start state, rows (in order), epochs and seed: CPU kernels, the "
    "same thread count, library versions and machine as the first training (stated, not checked)"
)


@dataclass
class QueuedRequest:
    """A request accepted by :meth:`SISAUnlearner.submit`.

    Until its :attr:`status` is ``"executed"`` the published ensemble **still holds its samples**: nothing is
    forgotten yet.

    Args:
        request: the request as submitted.
        ids: the sample ids it resolved to when submitted.
        asked: when it was submitted (UTC, ISO 8601).
        status: ``"queued"`` or ``"executed"``.
        executed: when its batch was executed (UTC, ISO 8601), or ``None``.
        result: the result of the batch it was executed in (one ledger entry for the batch), or ``None``.
    """

    request: ForgetRequest
    ids: Tensor
    asked: str
    asked_at: float
    status: Status = "queued"
    executed: str | None = None
    result: UnlearningResult | None = None


class SISAUnlearner(Unlearner):
    """Forgets exactly from a :class:`~lightning_unlearn.callbacks.sisa.SISABackbone`'s ensemble: the forgotten ids
    leave their slices and only the shards that held them train again, from their first slice that did
    (:meth:`SISABackbone.plan_forget`); a temporary experience forgotten whole is dropped without training.

    Requests run at once with :meth:`forget`, or queue with :meth:`submit` and run together (one retrain per affected
    shard from the earliest affected slice, one ledger entry listing each request with when it was asked) on
    :meth:`flush`, at the next experience boundary (before the backbone learns the next experience), or when a
    deadline passes: ``deadline_requests`` queued, or the oldest queued ``deadline_seconds`` ago, checked whenever
    this unlearner is called (:meth:`submit`, :meth:`poll`) and at each boundary (there is no timer thread: call
    :meth:`poll` to honour a deadline in time between calls). A queued request is **not** forgotten: its
    :class:`QueuedRequest` says ``status="queued"`` until its batch is executed.

    Guarantee: **exact**. The backbone's stored states are, at every moment, those of training from scratch on its
    current slices (its invariant); removing ids changes the slices of the shards that held them from their first
    slice with one, and every stage before it is the same deterministic function of the same inputs, so the retrained
    ensemble equals one trained from scratch on the retained data with the same shards, slices, seeds and initial
    weights ([SISA] Sec. IV). A dropped temporary experience's stages were the last ones: the states below them are
    those of a run that never learned it ([CLPU]'s isolation, here exact in a class-incremental ensemble).

    Args:
        backbone: the trained :class:`SISABackbone` (its :attr:`~SISABackbone.ensemble` is the module forgotten from,
            it is the recorder).
        ledger: the ledger (in memory by default).
        deadline_seconds: execute the queue once its oldest request waited this long (checked as above).
        deadline_requests: execute the queue once it holds this many requests.
        clock: the monotonic clock the deadline reads (seconds).

    Raises:
        ValueError: a deadline below or at zero.
    """

    method = "sisa"
    method_info = MethodInfo(
        guarantee="exact: the ensemble (or its ridge head) equals SISA training from scratch on the retained data "
        "([SISA] Sec. IV; the head [ACU] eq. 3, to the rounding of its feature_dtype, float64 by default)",
        assumptions="every stage a deterministic function of its start state, rows, epochs and seed (CPU kernels, "
        "one thread count; stated); the experiences' data kept to retrain",
        cost="the stages from the first slice holding a forgotten sample, in the shards holding one; with the head, "
        "those shards' forward over the retained samples, a block update of F^T F and an O((S d_F)^3) solve",
        paper="SISA, ARCANE, CLPU, ACU",
    )
    reads_data = True

    def __init__(
        self,
        backbone: SISABackbone,
        ledger: Ledger | None = None,
        *,
        deadline_seconds: float | None = None,
        deadline_requests: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (deadline_seconds is not None and not deadline_seconds > 0) or (
            deadline_requests is not None and deadline_requests < 1
        ):
            raise ValueError(
                f"SISAUnlearner deadlines must be positive, got {deadline_seconds} seconds and {deadline_requests} "
                "requests"
            )
        super().__init__(backbone.ensemble, backbone, ledger)
        self.backbone = backbone
        self.deadline_seconds, self.deadline_requests, self.clock = deadline_seconds, deadline_requests, clock
        self._queue: list[QueuedRequest] = []
        self._batch: dict[str, Any] | None = None  # the extra of the batch being executed
        backbone.add_boundary_hook(self._at_boundary)

    @property
    def queued(self) -> tuple[QueuedRequest, ...]:
        """The requests submitted and not executed yet (their samples are still in the published model)."""
        return tuple(self._queue)

    def forget(self, request: ForgetRequest, data: ForgetData = None) -> UnlearningResult:
        """Execute ``request`` now (see :meth:`Unlearner.forget`).

        Raises:
            ValueError: as :meth:`Unlearner.forget`, or the request names samples of a queued request (flush first).
        """
        if isinstance(request, ForgetRequest) and self._queue:
            self._refuse_queued(self.catalog.resolve(request))
        return super().forget(request, data)

    def submit(self, request: ForgetRequest) -> QueuedRequest:
        """Queue ``request`` (resolved against what was learned now); executes the queue if a deadline is reached.

        Returns:
            its :class:`QueuedRequest` (``status="queued"`` unless a deadline executed it).

        Raises:
            TypeError: ``request`` is not a :class:`ForgetRequest`.
            ValueError: it names nothing learned, samples already forgotten or already queued; nothing is queued.
        """
        if not isinstance(request, ForgetRequest):
            raise TypeError(f"submit expects a ForgetRequest, got {type(request).__name__}")
        self.recorder.require_fitted()
        ids = self.catalog.resolve(request)
        self._refuse_queued(ids)
        queued = QueuedRequest(request, ids, utc_timestamp(), self.clock())
        self._queue.append(queued)
        self.poll()
        return queued

    def due(self) -> bool:
        """Whether a deadline is reached (the queue is then executed by :meth:`poll`)."""
        if not self._queue:
            return False
        many = self.deadline_requests is not None and len(self._queue) >= self.deadline_requests
        late = self.deadline_seconds is not None and self.clock() - self._queue[0].asked_at >= self.deadline_seconds
        return many or late

    def poll(self, data: ForgetData = None) -> UnlearningResult | None:
        """Execute the queue if a deadline is reached (:meth:`flush`); ``None`` otherwise."""
        return self.flush(data) if self.due() else None

    def flush(self, data: ForgetData = None) -> UnlearningResult:
        """Execute every queued request together: one request for the union of their ids, one ledger entry whose
        ``extra["batch"]`` lists (as JSON) each request with when it was asked; each :class:`QueuedRequest` is then
        ``"executed"``.

        Raises:
            ValueError: nothing is queued; or as :meth:`Unlearner.forget` (then nothing changes and the queue stays).
        """
        if not self._queue:
            raise ValueError("SISAUnlearner.flush: no request is queued")
        ids = torch.cat([q.ids for q in self._queue])
        batch = [{"request": q.request.to_dict(), "asked": q.asked, "removed": len(q.ids)} for q in self._queue]
        self._batch = {"batch": json.dumps(batch)}  # the ledger keeps scalar extras: the list as JSON
        try:
            result = super().forget(ForgetRequest.samples(ids), data)
        finally:
            self._batch = None
        executed = utc_timestamp()
        for q in self._queue:
            q.status, q.executed, q.result = "executed", executed, result
        self._queue = []
        return result

    def _at_boundary(self) -> None:
        if self._queue:
            self.flush()

    def _refuse_queued(self, ids: Tensor) -> None:
        queued = torch.cat([q.ids for q in self._queue]) if self._queue else torch.zeros(0, dtype=torch.long)
        both = ids[torch.isin(ids, queued)]
        if both.numel():
            raise ValueError(
                f"sample ids {both[:10].tolist()} are in a queued request already: flush() executes it (or wait for "
                "the next experience boundary)"
            )

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        source = data.dataset if isinstance(data, DataLoader) else data
        change = self.backbone.plan_forget(ids, source)
        update = UnlearningUpdate(
            self._certificate(change),
            weights=self.backbone.weights_of(change),
            statistics={"sisa": change.state},
            extra={
                "shards_retrained": sum(f < len(change.state.stages) for f in change.first),
                "stages_retrained": sum(change.trained),
                "samples_trained": change.samples,
                "feature_rows_computed": change.computed,
                "train_cpu_seconds": change.seconds,
                "experiences_dropped": self.backbone.dropped(change),
                "storage_bytes": change.state.storage_bytes(),
                **(self._batch or {}),
            },
        )
        return update

    def _certificate(self, change: SISAChange) -> Certificate:
        backbone, stages = self.backbone, len(change.state.stages)
        dropped, temporary = backbone.dropped(change), set(backbone.sisa.temporary)
        changed = {s: f + 1 for s, f in enumerate(change.first) if f < stages}
        parts = []
        if changed:
            parts.append(
                "shards " + ", ".join(f"{s} from stage {t}" for s, t in changed.items()) + f" (of {stages}) retrained "
                "on the retained samples of their slices; the stages before each never held a forgotten sample"
            )
        if dropped:
            parts.append(
                f"experience(s) {dropped} left the stage order"
                + (" (temporary: stages on top of the permanent ones [CLPU])" if set(dropped) <= temporary else "")
                + (", nothing above them to retrain" if not changed else "")
            )
        precision = str(backbone.feature_dtype).removeprefix("torch.")
        statement = (
            "; ".join(parts)
            + f"; {backbone.shards - len(changed)} of {backbone.shards} shards untouched. The ensemble equals training "
            "from scratch on the retained data with the same shards, slices, seeds and initial weights [SISA]"
            + (
                f"; its ridge head re-solved in float64 on the retained samples' features ({change.computed} feature "
                f"rows computed in {precision}, the others kept from unchanged shards), equal to a from-scratch run's "
                f"to {precision} rounding [ACU] eq. 3"
                if backbone.aggregate == "head"
                else ""
            )
        )
        return Certificate(
            method=self.method,
            exact=True,
            statement=statement,
            assumptions=[
                _DETERMINISM,
                "every learned sample is in exactly one slice of one shard, and the ensemble reads nothing else "
                "(checked: the backbone's slices and the catalog are kept together)",
            ],
        )
