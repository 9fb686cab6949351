"""Unlearning strategies: each executes `ForgetRequest`s on a module with one method."""

from lightning_unlearn.strategies.acu import ACUStrategy
from lightning_unlearn.strategies.base import UnlearningResult, UnlearningStrategy

__all__ = ["ACUStrategy", "UnlearningResult", "UnlearningStrategy"]
