"""Unlearners: each executes `ForgetRequest`s on a module with one method."""

from lightning_unlearn.unlearners.acu import ACUUnlearner
from lightning_unlearn.unlearners.base import ErasurePendingError, Unlearner, UnlearningResult
from lightning_unlearn.unlearners.baselines import (
    FinetuneUnlearner,
    NegGradPlusUnlearner,
    NegGradUnlearner,
    RandomLabelUnlearner,
    RetrainUnlearner,
)
from lightning_unlearn.unlearners.certified import GradientCertifiedUnlearner, HessianCertifiedUnlearner
from lightning_unlearn.unlearners.convex import CertifiedRemovalUnlearner, ResolveUnlearner
from lightning_unlearn.unlearners.hf import HFUnlearner
from lightning_unlearn.unlearners.newton import InfinitesimalJackknifeUnlearner, NewtonStepUnlearner
from lightning_unlearn.unlearners.noisy import NoisyFinetuneUnlearner
from lightning_unlearn.unlearners.rbm import MaskProjection, RBMUnlearner
from lightning_unlearn.unlearners.scrub import SCRUBUnlearner
from lightning_unlearn.unlearners.sisa import SISAUnlearner
from lightning_unlearn.unlearners.sliced import SlicedResolveUnlearner
from lightning_unlearn.unlearners.sparse import L1SparseUnlearner, WoodFisherUnlearner
from lightning_unlearn.unlearners.streaming import StreamingUnlearner

__all__ = [
    "GradientCertifiedUnlearner",
    "HFUnlearner",
    "HessianCertifiedUnlearner",
    "InfinitesimalJackknifeUnlearner",
    "NewtonStepUnlearner",
    "ACUUnlearner",
    "ErasurePendingError",
    "UnlearningResult",
    "Unlearner",
    "FinetuneUnlearner",
    "NegGradUnlearner",
    "NegGradPlusUnlearner",
    "RandomLabelUnlearner",
    "RetrainUnlearner",
    "StreamingUnlearner",
    "RBMUnlearner",
    "SCRUBUnlearner",
    "L1SparseUnlearner",
    "WoodFisherUnlearner",
    "MaskProjection",
    "CertifiedRemovalUnlearner",
    "ResolveUnlearner",
    "NoisyFinetuneUnlearner",
    "SlicedResolveUnlearner",
    "SISAUnlearner",
]
