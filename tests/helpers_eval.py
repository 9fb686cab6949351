"""A tiny class-incremental Avalanche benchmark for the harness and CLI tests (no download)."""

from __future__ import annotations

import torch
from helpers import N_FEATURES, toy_tensors
from torch.utils.data import TensorDataset

from lightning_unlearn.models import mlp_backbone
from lightning_unlearn_bench import BenchmarkInfo, describe_benchmark


def tiny_info(n: int = 160, n_experiences: int = 2, seed: int = 0) -> BenchmarkInfo:
    """4 Gaussian-blob classes in ``n_experiences`` experiences, a small random frozen backbone."""
    from lightning_unlearn.avalanche import benchmark_with_sample_ids

    x, y = toy_tensors(n)
    xt, yt = toy_tensors(80, seed=9)
    bm = benchmark_with_sample_ids(TensorDataset(x, y), TensorDataset(xt, yt), n_experiences, seed=seed)
    torch.manual_seed(0)
    return describe_benchmark(
        bm, backbone=mlp_backbone(N_FEATURES, 32, 16), backbone_dim=16, seed=seed, epochs=2, lr=0.1, batch_size=32
    )
