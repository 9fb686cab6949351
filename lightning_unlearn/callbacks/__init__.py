"""Lightning callbacks that record, during fit, what each unlearning method needs later."""

from lightning_unlearn.callbacks.acu import AnalyticRecorder
from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.callbacks.ccl import CCLHessianRecorder, CCLRecorder
from lightning_unlearn.callbacks.convex import SoftmaxHeadRecorder
from lightning_unlearn.callbacks.frozen import FrozenFeatureRecorder
from lightning_unlearn.callbacks.hf import TrajectoryRecorder
from lightning_unlearn.callbacks.newton import HessianSumRecorder
from lightning_unlearn.callbacks.optimality import TaskOptimality
from lightning_unlearn.callbacks.safe import SAFERecorder
from lightning_unlearn.callbacks.samples import SampleRecorder
from lightning_unlearn.callbacks.sisa import SISABackbone
from lightning_unlearn.callbacks.slices import SlicedBackbone
from lightning_unlearn.regularization import ProximalRegularizer

__all__ = [
    "CCLHessianRecorder",
    "HessianSumRecorder",
    "CCLRecorder",
    "TrajectoryRecorder",
    "AnalyticRecorder",
    "ProximalRegularizer",
    "RecorderCallback",
    "SampleRecorder",
    "SISABackbone",
    "SlicedBackbone",
    "SoftmaxHeadRecorder",
    "FrozenFeatureRecorder",
    "SAFERecorder",
    "TaskOptimality",
]
