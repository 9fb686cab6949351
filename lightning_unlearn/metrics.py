"""Evaluation of an unlearned model with torchmetrics: accuracies, membership inference, distances.

Follows the metrics of ACU's Appendix E.2: accuracy on the retained, forgotten and test sets,
a loss-threshold membership-inference score on the forgotten set, and the L2 distance of the
parameters to a model retrained from scratch on the retained data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.functional.classification import binary_roc

from lightning_unlearn.modes import eval_mode
from lightning_unlearn.reporting import log_step, set_log_step

Data = Dataset | DataLoader


def _batches(data: Data, batch_size: int = 512) -> Iterable[Any]:
    return data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size)


@torch.no_grad()
def accuracy(module: nn.Module, data: Data, num_classes: int) -> float:
    """Top-1 accuracy (micro-averaged over samples) with ``torchmetrics.MulticlassAccuracy``."""
    metric = MulticlassAccuracy(num_classes=num_classes, average="micro")
    n = 0
    with eval_mode(module):
        for batch in _batches(data):
            x, y = batch[0], torch.as_tensor(batch[1])
            metric.update(module(x).argmax(-1).cpu(), y.cpu())
            n += len(y)
    return float(metric.compute()) if n else float("nan")


@torch.no_grad()
def sample_losses(module: nn.Module, data: Data) -> Tensor:
    """Per-sample cross-entropy of the module's logits."""
    with eval_mode(module):
        out = [nn.functional.cross_entropy(module(b[0]).float(), torch.as_tensor(b[1]).long(), reduction="none").cpu() for b in _batches(data)]
    return torch.cat(out) if out else torch.empty(0)


def loss_threshold_mia(member_losses: Tensor, nonmember_losses: Tensor, target_losses: Tensor) -> float:
    """Loss-threshold membership inference (Yeom et al.; the MIA indicator of ACU App. E.2).

    A sample is predicted a member when its loss is at most a threshold. The threshold is fitted
    on retained samples (members) against test samples (non-members) at the ROC point that
    maximises balanced accuracy (``torchmetrics`` ``binary_roc``, Youden's J). Returns the
    fraction of target (forgotten) samples predicted to be members: a model that truly forgot
    them scores like one retrained without them.
    """
    if not len(member_losses) or not len(nonmember_losses) or not len(target_losses):
        return float("nan")
    # exp(-loss) lies in (0, 1], so binary_roc takes it as a probability (no sigmoid)
    scores = torch.exp(-torch.cat([member_losses, nonmember_losses]).double())
    truth = torch.cat([torch.ones_like(member_losses), torch.zeros_like(nonmember_losses)]).long()
    fpr, tpr, thresholds = binary_roc(scores, truth)
    best = int(torch.argmax(tpr - fpr))
    return float((torch.exp(-target_losses.double()) >= thresholds[best]).double().mean())


def parameter_distance(a: nn.Module, b: nn.Module) -> float:
    """``||theta_a - theta_b||_2`` over all parameters (float64)."""
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    if pa.keys() != pb.keys():
        raise ValueError("modules have different parameters; cannot compare them")
    return float(sum((pa[k].detach().double() - pb[k].detach().double()).pow(2).sum() for k in pa) ** 0.5)


def evaluate_unlearning(
    module: nn.Module,
    *,
    retain: Data,
    forget: Data,
    test: Data,
    num_classes: int,
    reference: nn.Module | None = None,
) -> dict[str, float]:
    """Retain/forget/test accuracy, MIA score on the forgotten set, and (with ``reference``,
    a model retrained on the retained data) the L2 distance and the gaps to it."""
    out = {
        "retain_acc": accuracy(module, retain, num_classes),
        "forget_acc": accuracy(module, forget, num_classes),
        "test_acc": accuracy(module, test, num_classes),
    }
    retain_l, test_l = sample_losses(module, retain), sample_losses(module, test)
    out["mia"] = loss_threshold_mia(retain_l, test_l, sample_losses(module, forget))
    if reference is not None:
        ref = evaluate_unlearning(reference, retain=retain, forget=forget, test=test, num_classes=num_classes)
        out["l2_to_retrain"] = parameter_distance(module, reference)
        for k in ("retain_acc", "forget_acc", "test_acc", "mia"):
            out[f"{k}_gap"] = abs(out[k] - ref[k])
    return out


def log_metrics(
    trainer: L.Trainer, metrics: Mapping[str, float], step: int | None = None, prefix: str = "unlearn/"
) -> None:
    """Send metrics to every logger of ``trainer`` (TensorBoard, CSV, ...) and flush them.

    Args:
        trainer: whose loggers receive the metrics (nothing happens without loggers).
        metrics: name -> value, logged as ``prefix + name``.
        step: the step to log at; by default the trainer's next step (after its training steps and
            the requests logged so far, :mod:`lightning_unlearn.reporting`), which is then advanced:
            evaluations, training and requests share one increasing axis.
    """
    if not trainer.loggers:
        return
    at = log_step(trainer) if step is None else int(step)
    for logger in trainer.loggers:
        logger.log_metrics({prefix + k: v for k, v in metrics.items()}, step=at)
        logger.save()
    if step is None:
        set_log_step(trainer, at + 1)
