"""Unlearning strategies: each executes `ForgetRequest`s on a module with one method."""

from lightning_unlearn.strategies.acu import ACUStrategy
from lightning_unlearn.strategies.base import ErasurePendingError, UnlearningResult, UnlearningStrategy
from lightning_unlearn.strategies.baselines import (
    FinetuneStrategy,
    NegGradPlusStrategy,
    NegGradStrategy,
    RandomLabelStrategy,
    RetrainStrategy,
)
from lightning_unlearn.strategies.certified import GradientCertifiedStrategy, HessianCertifiedStrategy
from lightning_unlearn.strategies.convex import CertifiedRemovalStrategy, ResolveStrategy
from lightning_unlearn.strategies.hf import HFStrategy
from lightning_unlearn.strategies.newton import InfinitesimalJackknifeStrategy, NewtonStepStrategy
from lightning_unlearn.strategies.noisy import NoisyFinetuneStrategy
from lightning_unlearn.strategies.rbm import MaskProjection, RBMStrategy
from lightning_unlearn.strategies.scrub import SCRUBStrategy
from lightning_unlearn.strategies.sliced import SlicedResolveStrategy
from lightning_unlearn.strategies.sparse import L1SparseStrategy, WoodFisherStrategy
from lightning_unlearn.strategies.streaming import StreamingStrategy

__all__ = [
    "GradientCertifiedStrategy",
    "HFStrategy",
    "HessianCertifiedStrategy",
    "InfinitesimalJackknifeStrategy",
    "NewtonStepStrategy",
    "ACUStrategy",
    "ErasurePendingError",
    "UnlearningResult",
    "UnlearningStrategy",
    "FinetuneStrategy",
    "NegGradStrategy",
    "NegGradPlusStrategy",
    "RandomLabelStrategy",
    "RetrainStrategy",
    "StreamingStrategy",
    "RBMStrategy",
    "SCRUBStrategy",
    "L1SparseStrategy",
    "WoodFisherStrategy",
    "MaskProjection",
    "CertifiedRemovalStrategy",
    "ResolveStrategy",
    "NoisyFinetuneStrategy",
    "SlicedResolveStrategy",
]
