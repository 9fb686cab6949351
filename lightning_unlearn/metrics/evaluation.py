"""Evaluation of an unlearned module on data: accuracies, membership inference, distances, as one dict.

Follows the metrics of ACU's Appendix E.2 (accuracy on the retained, forgotten and test sets,
a loss-threshold membership-inference score on the forgotten set, and the L2 distance of the
parameters to a model retrained from scratch on the retained data), plus two stronger attacks:
MIA against unlearning (:func:`mia_u_auc`, [HF] Sec. 6) as an AUC and an offline likelihood-ratio
attack (:func:`lira`, [LiRA]) as an AUC and TPRs at low false-positive rates, with shadow models trained by the
target's own recipe (:func:`shadow_models` takes it as an argument).
These functions run modules over datasets; the math is in :mod:`lightning_unlearn.functional.metrics`,
and :mod:`lightning_unlearn.metrics.attacks` offers the attacks as torchmetrics ``Metric``s.
Every batch runs on the module's device in its floating dtype (:func:`~lightning_unlearn.modes.module_input`);
results come back to the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset
from torchmetrics.classification import MulticlassAccuracy

from lightning_unlearn.functional.metrics import (
    LIRA_FPRS,
    MIA_U_FEATURES,
    attack_auc,
    lira_offline_scores,
    logit_confidence,
    loss_threshold_mia,
    mia_u_features,
    roc_auc,
    tpr_at_fpr,
    tpr_key,
)
from lightning_unlearn.modes import eval_mode, module_device, module_input

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
            metric.update(module(module_input(module, x)).argmax(-1).cpu(), y.cpu())
            n += len(y)
    return float(metric.compute()) if n else float("nan")


@torch.no_grad()
def sample_losses(module: nn.Module, data: Data) -> Tensor:
    """Per-sample cross-entropy of the module's logits."""
    device = module_device(module)
    with eval_mode(module):
        out = [
            nn.functional.cross_entropy(
                module(module_input(module, b[0])).float(), torch.as_tensor(b[1]).long().to(device), reduction="none"
            ).cpu()
            for b in _batches(data)
        ]
    return torch.cat(out) if out else torch.empty(0)


def parameter_distance(a: nn.Module, b: nn.Module) -> float:
    """``||theta_a - theta_b||_2`` over all parameters (float64)."""
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    if pa.keys() != pb.keys():
        raise ValueError("modules have different parameters; cannot compare them")
    return float(
        sum((pa[k].detach().double() - pb[k].detach().double().to(pa[k].device)).pow(2).sum() for k in pa) ** 0.5
    )


def evaluate_unlearning(
    module: nn.Module,
    *,
    retain: Data,
    forget: Data,
    test: Data,
    num_classes: int,
    reference: nn.Module | None = None,
    before: nn.Module | None = None,
    shadows: Sequence[nn.Module] = (),
) -> dict[str, float]:
    """Retain/forget/test accuracy and the loss-threshold MIA score on the forgotten set, plus:

    * with ``before`` (the model before the requests): the MIA-U AUCs of :func:`mia_u_auc` with both
      features, forgotten vs test samples (``mia_u_direct_diff_auc``, ``mia_u_euc_dist_auc``; NaN with
      fewer than 2 of either);
    * with ``shadows`` (at least 2 models trained as ``module`` was, on neither the forgotten nor the test samples:
      :func:`shadow_models`): offline [LiRA] (:func:`lira`), forgotten vs test samples (``test`` must come from
      the training data's distribution): its AUC (``lira_auc``) and its TPR at 0.1%
      and 1% FPR (``lira_tpr_at_0.1pct_fpr``, ``lira_tpr_at_1pct_fpr``); NaN without forgotten samples;
    * with ``reference`` (a model retrained on the retained data): the L2 distance and the gaps to it.
    """
    out = {
        "retain_acc": accuracy(module, retain, num_classes),
        "forget_acc": accuracy(module, forget, num_classes),
        "test_acc": accuracy(module, test, num_classes),
    }
    retain_l, test_l, forget_l = (sample_losses(module, d) for d in (retain, test, forget))
    out["mia"] = loss_threshold_mia(retain_l, test_l, forget_l)
    if before is not None:  # sample counts from the losses: len() of a DataLoader counts batches
        folds = min(5, forget_l.numel(), test_l.numel())
        for feature in MIA_U_FEATURES:
            out[f"mia_u_{feature}_auc"] = (
                mia_u_auc(before, module, forget, test, feature, folds=folds) if folds >= 2 else float("nan")
            )
    if shadows:
        attack = lira(module, shadows, forget, test) if forget_l.numel() else dict.fromkeys(LIRA_KEYS, float("nan"))
        out |= {f"lira_{k}": v for k, v in attack.items()}
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
        step: the step to log at; by default the trainer's ``global_step`` (where its next training batch
            logs, as requests do: :mod:`lightning_unlearn.reporting`).
    """
    if not trainer.loggers:
        return
    at = trainer.global_step if step is None else int(step)
    for logger in trainer.loggers:
        logger.log_metrics({prefix + k: v for k, v in metrics.items()}, step=at)
        logger.save()


# -- attacks: MIA against unlearning ([HF] Sec. 6, App. D.4) and an offline likelihood-ratio attack ([LiRA]) ------
#: the keys of :func:`lira`'s result with the default rates
LIRA_KEYS = ("auc", *(tpr_key(f) for f in LIRA_FPRS))


@torch.no_grad()
def posteriors(module: nn.Module, data: Data) -> Tensor:
    """Softmax posteriors of the module on ``data`` (float64, eval mode)."""
    with eval_mode(module):
        out = [torch.softmax(module(module_input(module, b[0])).double(), -1).cpu() for b in _batches(data)]
    return torch.cat(out) if out else torch.empty(0)


def mia_u_auc(
    before: nn.Module,
    after: nn.Module,
    forgotten: Data,
    nonmembers: Data,
    feature: str = "direct_diff",
    folds: int = 5,
    seed: int = 0,
) -> float:
    """MIA against unlearning ([HF] Sec. 6 and App. D.4, after [MIAU]): can an attacker holding the
    models before and after a request tell the forgotten samples (members of ``before`` only) from samples
    neither model saw, from the change of their posteriors? Balanced AUC of :func:`attack_auc` on
    :func:`mia_u_features` (``"direct_diff"``, the feature of [HF]'s main text, or ``"euc_dist"``); 0.5 is
    chance. Report it next to the retrained model's AUC: retraining itself leaks under MIA-U when few
    samples are deleted ([HF] Fig. 5: AUC 0.89 for retraining at a 1% deletion rate).
    """
    members = mia_u_features(posteriors(before, forgotten), posteriors(after, forgotten), feature)
    others = mia_u_features(posteriors(before, nonmembers), posteriors(after, nonmembers), feature)
    return attack_auc(members, others, folds, seed)


def shadow_models(
    train: Callable[[Dataset], nn.Module], population: Dataset, *, size: int, count: int = 4, seed: int = 0
) -> list[nn.Module]:
    """The shadow models of offline [LiRA], trained the way the target was: ``train`` on ``count`` seeded random
    subsets of ``size`` samples of ``population`` (each a ``torch.utils.data.Subset``, in the population's order).

    LiRA asks whether the target is more confident on an example than models *trained like it* that did not see
    the example are; shadows trained with another recipe (another optimizer, regulariser, tolerance or training-set
    size) answer another question, and a weak attack is all they can give. So ``train`` is how the target was
    trained: for a head solved in closed form, the same solver with the same ``l2`` and tolerance; for an SGD-trained
    model, the same module, optimizer, epochs and batch size. ``population`` holds samples of the target's data
    distribution and none of the audited ones (every shadow is an OUT model for every audited example); ``size`` is
    the target's training-set size.

    Raises:
        ValueError: ``count`` below 2, or ``size`` not in ``[1, len(population))`` (equal subsets would be the
            same model under a deterministic recipe).
    """
    if count < 2:
        raise ValueError(f"offline LiRA needs at least 2 shadow models, got count={count}")
    n = len(population)  # type: ignore[arg-type]  # a map-style dataset
    if not 1 <= size < n:
        raise ValueError(f"shadow training sets need 1 <= size < {n} (the population's samples), got size={size}")
    g = torch.Generator().manual_seed(seed)
    draws = [torch.randperm(n, generator=g)[:size].sort().values for _ in range(count)]
    return [train(Subset(population, rows.tolist())) for rows in draws]


def lira(
    module: nn.Module,
    shadows: Iterable[nn.Module],
    members: Data,
    nonmembers: Data,
    fprs: Sequence[float] = LIRA_FPRS,
) -> dict[str, float]:
    """Offline [LiRA] telling ``members`` from ``nonmembers`` for ``module``, with ``shadows`` trained with
    ``module``'s own recipe on data that contains neither (:func:`shadow_models`; every shadow is an OUT model for
    every example): ``{"auc": ..., "tpr_at_0.1pct_fpr": ..., "tpr_at_1pct_fpr": ...}`` (one TPR per rate of
    ``fprs``, :func:`~lightning_unlearn.functional.metrics.tpr_at_fpr`). For unlearning, pass the forgotten samples
    as ``members`` and samples of the same distribution that no model saw as ``nonmembers`` (a held-out part of the
    training data; a test set of another distribution makes even a retrain look like a leak): a model that forgot
    them scores like the retrained model (AUC ~0.5, TPR ~ the rate).

    Raises:
        ValueError: fewer than 2 shadows, no members or no non-members.
    """

    def labels(data: Data) -> Tensor:
        return torch.cat([torch.as_tensor(b[1]) for b in _batches(data)])

    y_in, y_out = labels(members), labels(nonmembers)
    shadows = list(shadows)

    def conf(m: nn.Module) -> Tensor:
        return torch.cat(
            [logit_confidence(posteriors(m, members), y_in), logit_confidence(posteriors(m, nonmembers), y_out)]
        )

    scores = lira_offline_scores(conf(module), torch.stack([conf(s) for s in shadows]))
    truth = torch.cat([torch.ones(len(y_in)), torch.zeros(len(y_out))])
    return {"auc": roc_auc(scores, truth), **{tpr_key(f): tpr_at_fpr(scores, truth, f) for f in fprs}}


def lira_auc(module: nn.Module, shadows: Iterable[nn.Module], members: Data, nonmembers: Data) -> float:
    """The AUC of :func:`lira` alone."""
    return lira(module, shadows, members, nonmembers, fprs=())["auc"]
