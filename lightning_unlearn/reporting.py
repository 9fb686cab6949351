"""Executed requests as logged metrics: one flat dict of numbers, sent to a Lightning Trainer's loggers.

:func:`result_metrics` turns an :class:`UnlearningResult` into scalars (what was removed, how long
it took, the certificate's summary, the method's own numbers). :meth:`Unlearner.forget`
sends them to the loggers of the Trainer its recorder last recorded with (:func:`log_to_trainer`);
the Avalanche plugin publishes the same dict to Avalanche's ``EvaluationPlugin``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import lightning as L
from torch import Tensor

from lightning_unlearn.core.result import UnlearningResult
from lightning_unlearn.warnings import warn

__all__ = ["PREFIX", "log_to_trainer", "result_metrics"]

PREFIX = "unlearn"


def _scalar(value: Any) -> float | None:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value)
    return None


def result_metrics(result: UnlearningResult, prefix: str = PREFIX) -> dict[str, float]:
    """The numbers of one executed request, keyed ``<prefix>/<name>``.

    ``removed`` (samples), ``wall_time_s``, the certificate's ``exact`` and ``certified`` (0/1)
    and, when set, ``epsilon``, ``delta``, ``sigma``; its finite ``bounds`` as ``bound/<name>``;
    the method's finite scalar ``extra`` numbers as ``extra/<name>`` (non-scalars are left out).
    """
    cert = result.certificate
    out: dict[str, float] = {
        "removed": float(result.removed_ids.numel()),
        "wall_time_s": float(result.wall_time_s),
        "exact": float(cert.exact),
        "certified": float(cert.certified),
    }
    for name in ("epsilon", "delta", "sigma"):
        if getattr(cert, name) is not None:
            out[name] = float(getattr(cert, name))
    for group, values in (("bound", cert.bounds), ("extra", result.extra)):
        for name, value in values.items():
            number = _scalar(value)
            if number is not None:
                out[f"{group}/{name}"] = number
    return {f"{prefix}/{k}": v for k, v in out.items()}


def log_to_trainer(trainer: L.Trainer | None, result: UnlearningResult) -> None:
    """Log ``result``'s :func:`result_metrics` to every logger of ``trainer`` at its ``global_step`` and flush them.

    That is the step the trainer's next training batch logs at: a request between two fits of one
    Trainer (``fit_stream``) appears where training resumes, and the requests between the same two fits
    share that step (each is its own row of a ``CSVLogger``). Nothing happens without a trainer or loggers.
    The request is already committed when this runs, so a logger that fails is reported by an
    :class:`UnlearningWarning`, not raised.
    """
    if trainer is None or not trainer.loggers:
        return
    step, metrics = trainer.global_step, result_metrics(result)
    try:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
            logger.save()
    except Exception as error:  # noqa: BLE001 - the request is done; a logger must not undo it
        warn(f"the {result.certificate.method} request was executed but logging it failed: {error!r}")
