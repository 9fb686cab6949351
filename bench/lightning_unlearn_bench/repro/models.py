"""The classifiers a scale names: ``linear``, ``mlp``, ``cnn2``, ``cnn2fc``, ``cnn-mnist``, or one of
:mod:`lightning_unlearn_bench.models`."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

#: models a scale may name besides :data:`lightning_unlearn_bench.models.MODELS` (``linear``: the raw inputs
#: are the features; ``mlp``, ``cnn2``, ``cnn2fc`` and ``cnn-mnist`` take a width)
MODELS = ("linear", "mlp", "cnn2", "cnn2fc", "cnn-mnist")
#: ``cnn2fc``'s fully connected layers after the flattened feature map (its authors' code: 256 and 128 units)
CNN2FC_HIDDEN = (256, 128)


class Classifier(nn.Module):
    """``fc(net(x))``: a backbone and its final linear layer ``fc`` (the layout
    :func:`~lightning_unlearn_bench.models.backbone_of` strips)."""

    def __init__(self, net: nn.Module, fc: nn.Linear) -> None:
        super().__init__()
        self.net, self.fc = net, fc

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.net(x))


def classifier(model: str, num_classes: int, in_shape: Sequence[int], width: int) -> nn.Module:
    """A fresh classifier by name, ending in a linear layer ``fc``.

    ``linear``: ``fc`` on the flattened inputs (logistic regression); ``mlp``: two hidden ReLU layers
    (``2 * width``, ``width``); ``cnn2``: two 3x3 conv blocks of ``width`` and ``2 * width`` channels and
    global average pooling. Pooling over the whole map after two 3x3 convolutions (an 8x8-pixel receptive field)
    keeps which local patterns occur but not where: on MNIST it learns slowly and stays weak (mnist-5k, one epoch
    of SGD at lr 0.05, batch 32: 14% test accuracy), and it is not the papers' layout, which flattens the map.
    ``cnn2fc``: [SAFE]'s "two-layer CNN" for MNIST and Fashion-MNIST, read from its authors' code for the same
    experiments (``CNN`` of github.com/ShaofeiShen768/CaMU, ``CaMU/Model.py``, and of ``ShaofeiShen768/LAF``,
    ``Model.py``) [interp]: two 5x5 conv blocks (padding 2) of ``width`` and ``2 * width`` channels, each ReLU then
    2x2 max-pooling, the map flattened into linear layers of :data:`CNN2FC_HIDDEN` (256, 128) units (no activation
    between them, as in that code), then ``fc`` (``width`` 16 is that code's; mnist-5k, one epoch at the same
    recipe: 90%). ``cnn-mnist``: [HF]'s "simple CNN" (its code's ``CNNMnist``): two 5x5 convolutions of ``width``
    and ``2 * width`` channels, each max-pooled by 2 then ReLU, a hidden layer of ``5 * width`` units (ReLU) and
    ``fc``; ``width`` 10 on 28x28 MNIST is its d = 21,840 parameters ([interp]: without its two dropout layers, which
    HF's recursion does not model). Any other name is :func:`~lightning_unlearn_bench.models.build_model`'s
    (``lenet``, ...; ``resnet18`` with the CIFAR stem on images up to 64 pixels a side, with torchvision's ImageNet
    stem on larger ones: LFW's 224, CelebA's 128 [interp]).

    Raises:
        ValueError: an unknown model name.
    """
    from lightning_unlearn_bench import models

    if model not in MODELS:
        if model not in models.MODELS:
            raise ValueError(f"unknown model {model!r}; one of {sorted({*MODELS, *models.MODELS})}")
        return models.build_model(model, num_classes, tuple(in_shape), cifar_stem=max(in_shape[1:], default=0) <= 64)
    d = math.prod(in_shape)
    if model == "linear":
        return Classifier(nn.Flatten(), nn.Linear(d, num_classes))
    if model == "mlp":
        net = nn.Sequential(nn.Flatten(), nn.Linear(d, 2 * width), nn.ReLU(), nn.Linear(2 * width, width), nn.ReLU())
        return Classifier(net, nn.Linear(width, num_classes))
    if model == "cnn-mnist":
        side = [((n - 4) // 2 - 4) // 2 for n in in_shape[1:]]
        if min(side, default=0) < 1:
            raise ValueError(f"cnn-mnist needs images of at least 16 pixels a side, got {tuple(in_shape)}")
        net = nn.Sequential(
            nn.Conv2d(in_shape[0], width, 5),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 5),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(2 * width * math.prod(side), 5 * width),
            nn.ReLU(),
        )
        return Classifier(net, nn.Linear(5 * width, num_classes))
    if model == "cnn2fc":
        h1, h2 = CNN2FC_HIDDEN
        net = nn.Sequential(
            nn.Conv2d(in_shape[0], width, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * width * (in_shape[1] // 4) * (in_shape[2] // 4), h1),
            nn.Linear(h1, h2),
        )
        return Classifier(net, nn.Linear(h2, num_classes))
    net = nn.Sequential(  # cnn2
        nn.Conv2d(in_shape[0], width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )
    return Classifier(net, nn.Linear(2 * width, num_classes))
