"""Evaluation of an unlearned model with torchmetrics: accuracies, membership inference, distances.

Follows the metrics of ACU's Appendix E.2 (accuracy on the retained, forgotten and test sets,
a loss-threshold membership-inference score on the forgotten set, and the L2 distance of the
parameters to a model retrained from scratch on the retained data), plus two stronger attacks
reported as AUC: MIA against unlearning (:func:`mia_u_auc`, [HF] Sec. 6) and an offline
likelihood-ratio attack with shadow models (:func:`lira_auc`, [LiRA]).
Every batch runs on the module's device (:func:`~lightning_unlearn.modes.module_device`); results come back
to the CPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.functional.classification import binary_roc

from lightning_unlearn.modes import eval_mode, module_device
from lightning_unlearn.reporting import log_step, set_log_step

Data = Dataset | DataLoader


def _batches(data: Data, batch_size: int = 512) -> Iterable[Any]:
    return data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size)


@torch.no_grad()
def accuracy(module: nn.Module, data: Data, num_classes: int) -> float:
    """Top-1 accuracy (micro-averaged over samples) with ``torchmetrics.MulticlassAccuracy``."""
    metric = MulticlassAccuracy(num_classes=num_classes, average="micro")
    n, device = 0, module_device(module)
    with eval_mode(module):
        for batch in _batches(data):
            x, y = batch[0], torch.as_tensor(batch[1])
            metric.update(module(x.to(device)).argmax(-1).cpu(), y.cpu())
            n += len(y)
    return float(metric.compute()) if n else float("nan")


@torch.no_grad()
def sample_losses(module: nn.Module, data: Data) -> Tensor:
    """Per-sample cross-entropy of the module's logits."""
    device = module_device(module)
    with eval_mode(module):
        out = [
            nn.functional.cross_entropy(
                module(b[0].to(device)).float(), torch.as_tensor(b[1]).long().to(device), reduction="none"
            ).cpu()
            for b in _batches(data)
        ]
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
    * with ``shadows`` (at least 2 models trained on neither the forgotten nor the test samples):
      the offline [LiRA] AUC of :func:`lira_auc`, forgotten vs test samples (``lira_auc``; NaN without
      forgotten samples);
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
        out["lira_auc"] = lira_auc(module, shadows, forget, test) if forget_l.numel() else float("nan")
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


# -- attacks: MIA against unlearning ([HF] Sec. 6, App. D.4) and an offline likelihood-ratio attack ([LiRA]) ------
@torch.no_grad()
def posteriors(module: nn.Module, data: Data) -> Tensor:
    """Softmax posteriors of the module on ``data`` (float64, eval mode)."""
    device = module_device(module)
    with eval_mode(module):
        out = [torch.softmax(module(b[0].to(device)).double(), -1).cpu() for b in _batches(data)]
    return torch.cat(out) if out else torch.empty(0)


MIA_U_FEATURES = ("direct_diff", "euc_dist")


def mia_u_features(before: Tensor, after: Tensor, feature: str = "direct_diff") -> Tensor:
    """Attack features from the posteriors of the models before and after a request ([MIAU], [HF] App. D.4):
    ``"direct_diff"`` = ``p_before - p_after`` (one row per sample), ``"euc_dist"`` = ``||p_before - p_after||_2``."""
    if feature not in MIA_U_FEATURES:
        raise ValueError(f"MIA-U feature must be one of {MIA_U_FEATURES}, got {feature!r}")
    diff = before - after
    return diff if feature == "direct_diff" else diff.norm(dim=1, keepdim=True)


def attack_auc(members: Tensor, nonmembers: Tensor, folds: int = 5, seed: int = 0) -> float:
    """AUC of a random-forest attack model telling ``members`` rows from ``nonmembers`` rows.

    The MIA-U setting of [MIAU], which [HF] App. D.4 follows: the attack model is a random forest (one
    of [MIAU]'s attack models) and the evaluation is balanced: the larger of the two sets is subsampled
    (seeded) to the size of the smaller, so the attack cannot profit from the prior. [MIAU] trains the
    attack model on shadow models' before/after pairs; here it is
    trained on the target pair's own rows and scores every row out of fold (stratified
    ``folds``-fold cross-validation), so no row is scored by a model trained on it, and the attacker
    is at least as strong as with shadow pairs [interp]. Constant features give 0.5.

    Raises:
        ValueError: fewer than ``folds`` members or non-members.
    """
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold

    if len(members) < folds or len(nonmembers) < folds:
        raise ValueError(
            f"attack_auc needs at least {folds} members and non-members, got {len(members)} and {len(nonmembers)}"
        )
    n = min(len(members), len(nonmembers))
    g = torch.Generator().manual_seed(seed)
    members = members[torch.randperm(len(members), generator=g)[:n]]
    nonmembers = nonmembers[torch.randperm(len(nonmembers), generator=g)[:n]]
    x = torch.cat([members, nonmembers]).double().numpy()
    y = torch.cat([torch.ones(n), torch.zeros(n)]).numpy()
    scores = torch.zeros(len(y), dtype=torch.float64).numpy()
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, y):
        model = RandomForestClassifier(n_estimators=30, random_state=seed).fit(x[train], y[train])
        scores[test] = model.predict_proba(x[test])[:, 1]
    return float(roc_auc_score(y, scores))


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


def logit_confidence(probs: Tensor, labels: Tensor) -> Tensor:
    """``log(p_y / (1 - p_y))`` of the true label ([LiRA] Sec. IV-B), clipped away from 0 and 1."""
    p = probs.gather(1, labels.long().view(-1, 1)).squeeze(1).clamp(1e-12, 1 - 1e-12)
    return torch.log(p) - torch.log1p(-p)


def lira_offline_scores(target: Tensor, shadows: Tensor) -> Tensor:
    """Offline [LiRA] (Sec. VI-C): per example, fit ``N(mu_out, sigma_out^2)`` to the confidences of shadow
    models that did not train on it (``shadows``, one row per shadow) and score the target model's
    confidence by the one-sided test ``Phi((target - mu_out) / sigma_out)`` (higher: more likely a member)."""
    if shadows.shape[0] < 2:
        raise ValueError(f"offline LiRA needs at least 2 shadow models, got {shadows.shape[0]}")
    mu, sd = shadows.mean(0), shadows.std(0).clamp_min(1e-6)
    return torch.distributions.Normal(0.0, 1.0).cdf((target - mu) / sd)


def lira_auc(module: nn.Module, shadows: Iterable[nn.Module], members: Data, nonmembers: Data) -> float:
    """AUC of offline [LiRA] telling ``members`` from ``nonmembers`` for ``module``, with ``shadows``
    trained on data that contains neither (so every shadow is an OUT model for every example).
    For unlearning, pass the forgotten samples as ``members``: a model that forgot them scores ~0.5,
    like the retrained model."""
    from sklearn.metrics import roc_auc_score

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
    return float(roc_auc_score(truth.numpy(), scores.numpy()))
