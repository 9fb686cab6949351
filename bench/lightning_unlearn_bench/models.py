"""Models by name for the file benchmarks, and the frozen backbone [ACU] pre-trains on its base split.

* :func:`build_model`: ``"resnet18"`` (torchvision's, with the CIFAR stem the papers' CIFAR
  ResNet-18s use), ``"vit_tiny"`` (ViT-Tiny, [RBM]'s SVHN model), ``"cnn"`` (a small CNN with
  BatchNorm), ``"lenet"`` (LeNet-5, [HF]'s FMNIST model), ``"mlp"`` or ``"linear"`` (logistic
  regression on the pixels, [HF]'s "LR"); every model ends in a
  linear layer named ``fc``.
* :func:`backbone_of`: the model without its ``fc`` (the feature extractor) and its output width.
* :func:`pretrain_backbone`: [ACU] App. E.1's recipe (SGD, momentum 0.9, weight decay 5e-4,
  cosine half-cycle from lr 0.5, batch 256, random crops and flips) on the base samples, then
  frozen: hand it to :class:`~lightning_unlearn.models.AnalyticClassifier`, or put it in your own
  module next to an :class:`~lightning_unlearn.models.AnalyticHead` and name it to
  :class:`~lightning_unlearn.callbacks.acu.AnalyticRecorder` (``backbone="<attribute>"``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_unlearn.progress import QUIET_TRAINER

MODELS = ("resnet18", "vit_tiny", "cnn", "lenet", "mlp", "linear")

#: [ACU] App. E.1: the base model's training recipe (300 epochs; SGD with cosine half-cycle decay)
ACU_PRETRAIN: dict[str, Any] = {
    "epochs": 300,
    "lr": 0.5,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "batch_size": 256,
}


def build_model(name: str, num_classes: int, in_shape: tuple[int, ...], *, cifar_stem: bool = True) -> nn.Module:
    """A freshly initialised classifier ``name`` for inputs of shape ``in_shape`` (``(C, H, W)``, no batch axis).

    Args:
        name: ``"resnet18"``: torchvision's ResNet-18 (random weights; the machine has no
            internet and the papers train from scratch); with ``cifar_stem`` its first
            convolution is 3x3 with stride 1 and the max-pool is dropped, as the CIFAR ResNet-18s
            of [SCRUB], [SalUn] and [RBM]'s code bases (32x32 inputs keep their resolution);
            otherwise torchvision's ImageNet stem (7x7 stride 2 + max-pool).
            ``"vit_tiny"``: torchvision's ``VisionTransformer`` in ViT-Tiny's size (12 layers, 3 heads,
            width 192, MLP 768; 5.7M parameters at 224x224 with 16x16 patches), on square images with
            the largest patch of 16, 8, 4 or 2 pixels that leaves at least 7 patches a side [interp].
            ``"cnn"``: three conv-BatchNorm-ReLU-max-pool blocks (32, 64, 128 channels), global
            average pooling, a linear layer. ``"lenet"``: LeNet-5 (two 5x5 convolutions with 6 and 16
            channels, each followed by 2x2 max-pooling, then 120 and 84 units; ReLU [interp]), on
            28x28 grey images the 61,706 parameters of [HF]'s FMNIST LeNet. ``"mlp"``: two hidden
            layers of 256 ReLU units. ``"linear"``: one linear layer on the flattened input.
        num_classes: outputs of the final linear layer ``fc``.
        in_shape: one input's shape; its first entry is the channel count (1 for (Fashion-)MNIST).
        cifar_stem: the CIFAR stem for ``resnet18`` (ignored by the others).

    Raises:
        ValueError: an unknown name, ``num_classes < 1``, or an ``in_shape`` the model cannot take.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; one of {MODELS}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be positive, got {num_classes}")
    if not in_shape or min(in_shape) < 1:
        raise ValueError(f"in_shape must be a non-empty shape of positive sizes, got {in_shape}")
    if name == "mlp":
        return MLP(math.prod(in_shape), num_classes)
    if name == "linear":
        return Linear(math.prod(in_shape), num_classes)
    if len(in_shape) != 3:
        raise ValueError(f"model {name!r} takes images of shape (C, H, W), got in_shape={in_shape}")
    if name == "cnn":
        return SmallCNN(in_shape[0], num_classes)
    if name == "lenet":
        return LeNet5(in_shape, num_classes)
    if name == "vit_tiny":
        return ViTTiny(in_shape, num_classes)
    return resnet18(num_classes, in_shape[0], cifar_stem=cifar_stem)


def resnet18(num_classes: int, in_channels: int = 3, *, cifar_stem: bool = True) -> nn.Module:
    """torchvision's ResNet-18 with ``in_channels`` inputs, optionally with the CIFAR stem (see :func:`build_model`)."""
    from torchvision.models import resnet18 as tv_resnet18

    net = tv_resnet18(weights=None, num_classes=num_classes)
    if cifar_stem:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net


class SmallCNN(nn.Module):
    """Three conv-BatchNorm-ReLU-max-pool blocks (32, 64, 128 channels), global average pooling, ``fc``."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 32) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for out in (width, 2 * width, 4 * width):
            layers += [
                nn.Conv2d(channels, out, 3, padding=1, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            channels = out
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


class LeNet5(nn.Module):
    """LeNet-5: conv(5x5, 6, padding 2)-ReLU-pool, conv(5x5, 16)-ReLU-pool, 120 and 84 ReLU units, ``fc``.

    Raises:
        ValueError: images smaller than 12x12 (nothing is left after the second pooling).
    """

    def __init__(self, in_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        c, h, w = in_shape
        side_h, side_w = (h // 2 - 4) // 2, (w // 2 - 4) // 2
        if min(side_h, side_w) < 1:
            raise ValueError(f"lenet takes images of at least 12x12, got in_shape={in_shape}")
        self.features = nn.Sequential(
            nn.Conv2d(c, 6, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * side_h * side_w, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
        )
        self.fc = nn.Linear(84, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


class MLP(nn.Module):
    """``Flatten -> Linear -> ReLU -> Linear -> ReLU -> fc``."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 256) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


class Linear(nn.Module):
    """Logistic regression: ``fc`` on the flattened input (its backbone is ``Flatten``)."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Flatten()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


class ViTTiny(nn.Module):
    """ViT-Tiny (torchvision's ``VisionTransformer``: 12 layers, 3 heads, width 192, MLP 768); ``fc`` reads the
    class token.

    Raises:
        ValueError: a non-square image, or one with no patch size of 16, 8, 4 or 2 leaving 7 patches a side.
    """

    def __init__(self, in_shape: tuple[int, ...], num_classes: int) -> None:
        from torchvision.models import VisionTransformer

        super().__init__()
        c, h, w = in_shape
        patches = [p for p in (16, 8, 4, 2) if h % p == 0 and h // p >= 7]
        if h != w or not patches:
            raise ValueError(
                f"vit_tiny takes square images divisible into at least 7x7 patches, got in_shape={in_shape}"
            )
        patch = patches[0]
        self.features = VisionTransformer(
            image_size=h, patch_size=patch, num_layers=12, num_heads=3, hidden_dim=192, mlp_dim=768
        )
        if c != 3:
            self.features.conv_proj = nn.Conv2d(c, 192, kernel_size=patch, stride=patch)
        self.features.heads = nn.Identity()
        self.fc = nn.Linear(192, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


def backbone_of(model: nn.Module) -> tuple[nn.Module, int]:
    """A copy of ``model`` whose final linear layer ``fc`` is the identity, and that layer's input width.

    Raises:
        ValueError: ``model`` has no ``fc`` linear layer (every model of :func:`build_model` has one).
    """
    fc = getattr(model, "fc", None)
    if not isinstance(fc, nn.Linear):
        raise ValueError(f"{type(model).__name__} has no linear layer named 'fc' to strip; build it with build_model")
    backbone = copy.deepcopy(model)
    backbone.fc = nn.Identity()
    return backbone, fc.in_features


class _Pretraining(L.LightningModule):
    """Cross-entropy training with SGD and a cosine half-cycle learning rate ([ACU] App. E.1)."""

    def __init__(self, net: nn.Module, lr: float, momentum: float, weight_decay: float, epochs: int) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["net"])
        self.net = net
        self.lr, self.momentum, self.weight_decay, self.epochs = lr, momentum, weight_decay, epochs

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = nn.functional.cross_entropy(self.net(batch[0]), batch[1].long())
        self.log("pretrain_loss", loss, prog_bar=True, batch_size=len(batch[1]))
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.net.parameters(), lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.epochs)}


class _Augmented(Dataset):
    """``(augment(x), y)`` for each ``(x, y, ...)`` item of ``dataset`` (a fresh random draw per access)."""

    def __init__(self, dataset: Dataset, augment: Callable[[Tensor], Tensor]) -> None:
        self.dataset, self.augment = dataset, augment

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[Tensor, Any]:
        item = self.dataset[i]
        return self.augment(item[0]), item[1]


def standard_augmentation(in_shape: tuple[int, ...], flip: bool = True) -> Callable[[Tensor], Tensor]:
    """Random crops (padding 4, or 1/8 of the side) and, with ``flip``, horizontal flips of image tensors
    ([ACU] App. E.1's augmentation; digits are not flipped)."""
    from torchvision import transforms

    pad = max(1, in_shape[-1] // 8)
    steps: list[Any] = [transforms.RandomCrop(tuple(in_shape[-2:]), padding=pad)]
    if flip:
        steps.append(transforms.RandomHorizontalFlip())
    return transforms.Compose(steps)


def pretrain_backbone(
    model: nn.Module,
    base: Dataset,
    *,
    epochs: int = ACU_PRETRAIN["epochs"],
    lr: float = ACU_PRETRAIN["lr"],
    momentum: float = ACU_PRETRAIN["momentum"],
    weight_decay: float = ACU_PRETRAIN["weight_decay"],
    batch_size: int = ACU_PRETRAIN["batch_size"],
    augment: Callable[[Tensor], Tensor] | None = None,
    seed: int = 0,
    num_workers: int = 0,
    trainer_kwargs: Mapping[str, Any] | None = None,
) -> tuple[nn.Module, int]:
    """Train ``model`` (ending in ``fc``) on the base samples, then return its frozen feature extractor.

    [ACU] App. E.1: the base model is trained on base samples disjoint from the continual stream
    (10,000 of CIFAR's 50,000 training images: :func:`~lightning_unlearn_bench.datasets.load_splits`
    with ``base_fraction=0.2``) for 300 epochs by SGD (momentum 0.9, weight decay 5e-4, batch 256)
    with the learning rate decayed from 0.5 by a cosine half-cycle, under random crops and flips;
    these are the defaults. The paper does not say which classes the base samples cover; ours
    are stratified over all classes [interp]. ``model`` is trained in place; the returned backbone
    (:func:`backbone_of`) is a frozen copy in eval mode on the CPU.

    Args:
        model: the classifier to pre-train (e.g. :func:`build_model`'s), its ``fc`` over all classes.
        base: yields ``(x, y, ...)``.
        epochs, lr, momentum, weight_decay, batch_size: the recipe.
        augment: applied to each training input (e.g. :func:`standard_augmentation`); ``None``: none.
        seed: seeds the shuffling and the augmentation (not ``model``'s initialisation, done
            before); the global RNG state is restored afterwards.
        num_workers: the ``DataLoader``'s worker processes (decoding and augmentation).
        trainer_kwargs: further ``lightning.Trainer`` options (``accelerator``, ``devices``, ...).

    Returns:
        ``(backbone, backbone_dim)``.

    Raises:
        ValueError: ``base`` is empty, ``epochs < 1``, or ``model`` has no ``fc`` linear layer.
    """
    if len(base) == 0:  # type: ignore[arg-type]
        raise ValueError("pretrain_backbone: the base split is empty (raise base_fraction or per_class)")
    if epochs < 1:
        raise ValueError(f"pretrain_backbone: epochs must be positive, got {epochs}")
    backbone_of(model)  # fail before training when there is no fc
    data: Dataset = _Augmented(base, augment) if augment is not None else base
    options = {
        "max_epochs": epochs,
        **QUIET_TRAINER,
        **(trainer_kwargs or {}),
    }
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        loader = DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=num_workers)
        L.Trainer(**options).fit(_Pretraining(model, lr, momentum, weight_decay, epochs), loader)
    backbone, dim = backbone_of(model.cpu())
    return backbone.requires_grad_(False).eval(), dim
