"""Lightning callbacks that record, during fit, what each unlearning method needs later."""

from lightning_unlearn.callbacks.analytic import AnalyticRecorder
from lightning_unlearn.callbacks.base import RecorderCallback

__all__ = ["AnalyticRecorder", "RecorderCallback"]
