"""Unlearning metrics as pure functions of tensors: membership-inference scores and their summaries.

The stateless half of :mod:`lightning_unlearn.metrics`, laid out as torchmetrics lays out its own
(``functional/`` computes, the ``Metric`` classes keep state and call these):

* :func:`loss_threshold_mia`: the loss-threshold attack of ACU's App. E.2 (Yeom et al.);
* :func:`mia_u_features`, :func:`attack_auc`: MIA against unlearning ([MIAU], [HF] Sec. 6, App. D.4);
* :func:`logit_confidence`, :func:`lira_offline_scores`: offline [LiRA];
* :func:`roc_auc`, :func:`tpr_at_fpr`: summaries of an attack's ROC curve. [LiRA] argues that an attack is
  judged by its true-positive rate at a low false-positive rate, not by its AUC (a high AUC can come from
  confidently flagging a few easy members or from weakly flagging many): :data:`LIRA_FPRS` are the
  rates reported beside the AUC, 0.1% and 1% [interp] (the two the unlearning literature reports).

scikit-learn (the ``metrics`` extra) is imported by the functions that fit or score with it.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.classification import binary_roc

#: the false-positive rates at which an attack's true-positive rate is reported beside its AUC
LIRA_FPRS = (0.001, 0.01)
#: the MIA-U attack features of [MIAU]
MIA_U_FEATURES = ("direct_diff", "euc_dist")


def tpr_key(fpr: float) -> str:
    """The name of the TPR at ``fpr`` in results and reports: ``tpr_at_0.1pct_fpr`` for ``fpr=0.001``."""
    return f"tpr_at_{100 * fpr:g}pct_fpr"


def loss_threshold_mia(member_losses: Tensor, nonmember_losses: Tensor, target_losses: Tensor) -> float:
    """Loss-threshold membership inference (Yeom et al.; the MIA indicator of ACU App. E.2).

    A sample is predicted a member when its loss is at most a threshold. The threshold is fitted
    on retained samples (members) against test samples (non-members) at the ROC point that
    maximises balanced accuracy (``torchmetrics`` ``binary_roc``, Youden's J). Returns the
    fraction of target (forgotten) samples predicted to be members: a model that truly forgot
    them scores like one retrained without them. NaN when any of the three sets is empty.
    """
    if not len(member_losses) or not len(nonmember_losses) or not len(target_losses):
        return float("nan")
    # exp(-loss) lies in (0, 1], so binary_roc takes it as a probability (no sigmoid)
    scores = torch.exp(-torch.cat([member_losses, nonmember_losses]).double())
    truth = torch.cat([torch.ones_like(member_losses), torch.zeros_like(nonmember_losses)]).long()
    fpr, tpr, thresholds = binary_roc(scores, truth)
    best = int(torch.argmax(tpr - fpr))
    return float((torch.exp(-target_losses.double()) >= thresholds[best]).double().mean())


def mia_u_features(before: Tensor, after: Tensor, feature: str = "direct_diff") -> Tensor:
    """Attack features from the posteriors of the models before and after a request ([MIAU], [HF] App. D.4):
    ``"direct_diff"`` = ``p_before - p_after`` (one row per sample), ``"euc_dist"`` = ``||p_before - p_after||_2``.

    Raises:
        ValueError: an unknown ``feature``.
    """
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


def logit_confidence(probs: Tensor, labels: Tensor) -> Tensor:
    """``log(p_y / sum_{y' != y} p_y')`` of the true label ``y``, [LiRA]'s logit-scaled confidence (Sec. IV-B).

    The denominator is the sum of the other classes' probabilities, not ``1 - p_y`` (as [LiRA]'s released code
    computes it): ``1 - p_y`` rounds to 0 once ``p_y`` is within an ulp of 1, which would tie every confidently
    fitted example. Both are clamped at the smallest positive float of the dtype.
    """
    index = labels.long().view(-1, 1)
    tiny = torch.finfo(probs.dtype).tiny
    p = probs.gather(1, index).squeeze(1).clamp_min(tiny)
    rest = probs.scatter(1, index, 0.0).sum(1).clamp_min(tiny)
    return torch.log(p) - torch.log(rest)


def lira_offline_scores(target: Tensor, shadows: Tensor) -> Tensor:
    """Offline [LiRA] (Sec. VI-C): per example, fit ``N(mu_out, sigma_out^2)`` to the confidences of shadow
    models that did not train on it (``shadows``, one row per shadow; trained with the target's own recipe, or
    the Gaussian describes another model) and score the target model's confidence by the one-sided test's
    statistic ``(target - mu_out) / sigma_out`` (higher: more likely a member; ``Phi`` of it is [LiRA]'s
    ``1 - p``-value, the same order: ``Phi`` itself would round to 1 above 8.3 and tie the clearest members).
    Each example's score depends on its own column only.

    Raises:
        ValueError: fewer than 2 shadow models.
    """
    if shadows.shape[0] < 2:
        raise ValueError(f"offline LiRA needs at least 2 shadow models, got {shadows.shape[0]}")
    mu, sd = shadows.mean(0), shadows.std(0).clamp_min(1e-6)
    return (target - mu) / sd


def _check_roc_inputs(scores: Tensor, members: Tensor) -> None:
    if scores.shape != members.shape or scores.dim() != 1:
        raise ValueError(
            f"scores and members must be 1-D of one length, got {tuple(scores.shape)} and {tuple(members.shape)}"
        )
    n_in = int(members.bool().sum())
    if n_in == 0 or n_in == len(members):
        raise ValueError(f"an ROC curve needs members and non-members, got {n_in} members of {len(members)}")


def roc_auc(scores: Tensor, members: Tensor) -> float:
    """Area under the ROC curve of ``scores`` (higher: member) against the 0/1 ``members`` (scikit-learn's
    ``roc_auc_score``: ties count one half).

    Raises:
        ValueError: shapes differ, or no members or no non-members.
    """
    from sklearn.metrics import roc_auc_score

    _check_roc_inputs(scores, members)
    return float(roc_auc_score(members.numpy(), scores.numpy()))


def tpr_at_fpr(scores: Tensor, members: Tensor, fpr: float) -> float:
    """True-positive rate of the threshold attack on ``scores`` (higher: member) at false-positive rate below
    ``fpr``: the largest TPR over the ROC curve's points with FPR strictly below ``fpr``, as [LiRA]'s released
    code reads it (``tpr[np.where(fpr < .001)[0][-1]]``). With fewer than ``1 / fpr`` non-members only the
    points with no false positive qualify: the TPR at zero false positives.

    Raises:
        ValueError: ``fpr`` outside ``(0, 1]``, shapes differ, or no members or no non-members.
    """
    from sklearn.metrics import roc_curve

    if not 0.0 < fpr <= 1.0:
        raise ValueError(f"fpr must lie in (0, 1], got {fpr}")
    _check_roc_inputs(scores, members)
    # every distinct score is a threshold; the curve starts at (0, 0), so some point qualifies
    rates_fp, rates_tp, _ = roc_curve(members.numpy(), scores.numpy(), drop_intermediate=False)
    return float(rates_tp[rates_fp < fpr].max())
