"""`UnlearningStrategy`: the one interface every unlearning method implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.core.catalog import SampleCatalog
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.core.request import ForgetRequest

ForgetData = Dataset | DataLoader | None


@dataclass
class UnlearningResult:
    """What one executed :class:`ForgetRequest` did."""

    request: ForgetRequest
    removed_ids: Tensor
    certificate: Certificate
    wall_time_s: float
    extra: dict[str, Any] = field(default_factory=dict)


class UnlearningStrategy(ABC):
    """Executes forget requests on a module in place, between experiences.

    ``forget`` resolves the request against the recorder's catalog (unknown ids, ids already
    forgotten, a class or experience never learned are ``ValueError``s), runs the method, marks
    the ids forgotten and appends the result to the ledger. If the method raises, the module's
    parameters are restored and nothing is marked or logged; a subclass's ``_forget`` must in
    turn compute everything before it commits to its recorder's statistics.

    Subclasses set :attr:`method` and :attr:`needs_forget_data`, and implement :meth:`_forget`.
    """

    method: ClassVar[str]
    #: whether ``forget`` needs the samples to forget (their inputs), passed as ``data``
    needs_forget_data: ClassVar[bool] = False

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
            data: a dataset or loader yielding ``(x, y, sample_id, ...)`` that contains the samples
                to forget (it may contain more; only the requested ids are used). Required by
                methods with ``needs_forget_data``; the retained data is never needed by the
                recorded methods.
        """
        if not isinstance(request, ForgetRequest):
            raise TypeError(f"forget expects a ForgetRequest, got {type(request).__name__}")
        self.recorder.require_fitted()
        ids = self.catalog.resolve(request)
        if self.needs_forget_data and data is None:
            raise ValueError(f"{self.method} needs the samples to forget: pass data=<dataset yielding (x, y, id)>")
        saved = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        start = perf_counter()
        try:
            certificate, extra = self._forget(ids, data)
        except BaseException:
            self.module.load_state_dict(saved)
            raise
        wall = perf_counter() - start
        self.catalog.mark_forgotten(ids)
        result = UnlearningResult(request, ids, certificate, wall, extra)
        self.ledger.append(result, self.module)
        self.history.append(result)
        return result

    @abstractmethod
    def _forget(self, ids: Tensor, data: ForgetData) -> tuple[Certificate, dict[str, Any]]:
        """Update ``self.module`` (and the recorder's statistics) to forget ``ids``."""

    def _labels_checked(self, ids: Tensor, y: Tensor) -> Tensor:
        """The catalog labels of ``ids``; ``ValueError`` if the given data's labels disagree."""
        labels = self.catalog.labels_of(ids)
        bad = (labels != torch.as_tensor(y).long().cpu()).nonzero().flatten()
        if bad.numel():
            raise ValueError(f"forget data labels differ from the learned labels for sample ids {ids[bad][:10].tolist()}")
        return labels
