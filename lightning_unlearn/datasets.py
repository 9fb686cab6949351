"""Small real data that ships with installed packages, so demos and benchmarks need no download."""

from __future__ import annotations

import torch
from torch import Tensor


def digits_splits(seed: int = 0, base_fraction: float = 0.3, test_fraction: float = 0.2) -> dict[str, tuple[Tensor, Tensor]]:
    """scikit-learn's 1,797 real 8x8 handwritten digits (10 classes), split three ways as in ACU
    App. E.1: ``base`` (to pre-train the frozen backbone), ``train`` (the continual stream) and
    ``test``. Pixels are scaled to [0, 1]; the split is stratified and seeded."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=test_fraction, stratify=y, random_state=seed)
    x_train, x_base, y_train, y_base = train_test_split(
        x_rest, y_rest, test_size=base_fraction / (1 - test_fraction), stratify=y_rest, random_state=seed
    )
    return {"base": (x_base, y_base), "train": (x_train, y_train), "test": (x_test, y_test)}
