"""Membership-inference attacks on an unlearned model as torchmetrics ``Metric``s: they log and sync like any metric.

Each class is a thin stateful shell over :mod:`lightning_unlearn.functional.metrics`: ``update`` appends a
batch's per-sample quantities to states declared with ``dist_reduce_fx="cat"`` (an attack's ROC needs
every sample's score, as torchmetrics' exact ``BinaryAUROC`` keeps every prediction), and ``compute``
gathers them once across processes (DDP) and calls the pure function. Every value is order-free, so
the synced value equals the value of one process that saw every batch. States are float64
(``set_dtype``), not part of ``state_dict`` (``persistent=False``: nothing about forgotten samples is
written to checkpoints), and a value the samples do not define is NaN, as in
:func:`~lightning_unlearn.metrics.evaluate_unlearning`. ``update`` is the call to use per batch
(``forward`` would also compute the batch's own value).

Example::

    mia = LossThresholdMIA()
    for role, loader in (("member", retain), ("nonmember", test), ("target", forget)):
        for x, y, *_ in loader:
            mia.update(F.cross_entropy(model(x), y, reduction="none"), role)
    mia.compute()  # the fraction of forgotten samples the attack calls members
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from lightning_unlearn.functional import metrics

#: the roles of a sample in :class:`LossThresholdMIA`
ROLES = ("member", "nonmember", "target")


class _AttackMetric(Metric):
    is_differentiable = False
    full_state_update = False

    def _cat_states(self, *names: str) -> None:
        for name in names:
            self.add_state(name, default=[], dist_reduce_fx="cat", persistent=False)
        self.set_dtype(torch.float64)

    def _add(self, name: str, values: Tensor) -> None:
        """Append one value per sample to the ``cat`` state ``name``."""
        getattr(self, name).append(values.detach().flatten().to(self.dtype))

    def _values(self, name: str) -> Tensor:
        """The ``cat`` state ``name`` as one tensor (a list before a sync, one tensor after; empty if nothing)."""
        state = getattr(self, name)
        if isinstance(state, list):
            return dim_zero_cat(state) if state else torch.empty(0, dtype=self.dtype)
        return state


class LossThresholdMIA(_AttackMetric):
    """The loss-threshold attack of :func:`~lightning_unlearn.functional.metrics.loss_threshold_mia` (ACU App. E.2).

    ``update(losses, role)`` adds per-sample losses of ``role`` ``"member"`` (retained samples: the
    threshold's positives), ``"nonmember"`` (test samples: its negatives) or ``"target"`` (forgotten
    samples). ``compute()`` is the fraction of targets predicted members (NaN while a role has no sample):
    like the retrained model's for a model that forgot them.
    """

    higher_is_better = None  # closest to the retrained model's value is best

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cat_states(*ROLES)

    def update(self, losses: Tensor, role: str) -> None:
        """Add the per-sample ``losses`` (any shape, one value per sample) of samples in ``role``.

        Raises:
            ValueError: an unknown ``role``.
        """
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self._add(role, losses)

    def compute(self) -> Tensor:
        member, nonmember, target = (self._values(role) for role in ROLES)
        return torch.tensor(metrics.loss_threshold_mia(member, nonmember, target), dtype=torch.float64)


class OfflineLiRA(_AttackMetric):
    """Offline [LiRA] (:func:`~lightning_unlearn.functional.metrics.lira_offline_scores`): its AUC and its TPR at
    each false-positive rate of ``fprs`` (default :data:`~lightning_unlearn.functional.metrics.LIRA_FPRS`, 0.1%
    and 1%: the numbers [LiRA] argues an attack is judged by).

    ``update(probs, shadow_probs, labels, members)`` takes a batch's softmax posteriors under the target
    model ``(n, C)`` and under each shadow model ``(S, n, C)`` (``S >= 2`` shadows trained with the target's own
    recipe on none of the batch's samples, :func:`~lightning_unlearn.metrics.shadow_models`: every shadow is an
    OUT model), the labels ``(n,)`` and whether each sample is a member ``(n,)`` (for unlearning: forgotten
    samples are the members, held-out samples of the same distribution the non-members; a model that forgot
    them scores like the retrained one, AUC ~0.5). Each sample's score depends on its own
    confidences only, so batches and ranks can split the samples any way. ``compute()`` returns
    ``{"auc": ..., "tpr_at_0.1pct_fpr": ..., "tpr_at_1pct_fpr": ...}`` (names from
    :func:`~lightning_unlearn.functional.metrics.tpr_key`; NaN without members or without non-members).

    Raises:
        ValueError: a rate of ``fprs`` outside ``(0, 1]``.
    """

    higher_is_better = False  # for the unlearned model: the attack should fail

    def __init__(self, fprs: tuple[float, ...] = metrics.LIRA_FPRS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        bad = [f for f in fprs if not 0.0 < f <= 1.0]
        if bad:
            raise ValueError(f"false-positive rates must lie in (0, 1], got {bad}")
        self.fprs = tuple(fprs)
        self._cat_states("scores", "members")

    def update(self, probs: Tensor, shadow_probs: Tensor, labels: Tensor, members: Tensor) -> None:
        """Add a batch (shapes in the class docstring).

        Raises:
            ValueError: shapes that do not match, or fewer than 2 shadows.
        """
        n = len(labels)
        if probs.shape[0] != n or shadow_probs.dim() != 3 or shadow_probs.shape[1:] != probs.shape or len(members) != n:
            raise ValueError(
                f"expected probs (n, C), shadow_probs (S, n, C), labels (n,) and members (n,), got "
                f"{tuple(probs.shape)}, {tuple(shadow_probs.shape)}, {tuple(labels.shape)} and {tuple(members.shape)}"
            )
        target = metrics.logit_confidence(probs.detach().double(), labels)
        shadows = torch.stack([metrics.logit_confidence(p.detach().double(), labels) for p in shadow_probs])
        self._add("scores", metrics.lira_offline_scores(target, shadows))
        self._add("members", members)

    def compute(self) -> dict[str, Tensor]:
        scores, members = self._values("scores"), self._values("members").bool()
        defined = 0 < int(members.sum()) < len(members)
        nan = float("nan")
        out = {"auc": metrics.roc_auc(scores, members) if defined else nan}
        out |= {metrics.tpr_key(f): metrics.tpr_at_fpr(scores, members, f) if defined else nan for f in self.fprs}
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in out.items()}


class MIAUnlearning(_AttackMetric):
    """MIA against unlearning ([HF] Sec. 6, App. D.4, after [MIAU]): the balanced AUC of
    :func:`~lightning_unlearn.functional.metrics.attack_auc` telling forgotten samples from samples neither
    model saw, from the change of their posteriors between the models before and after the requests.

    ``update(before, after, members)`` takes a batch's softmax posteriors under both models ``(n, C)`` and
    whether each sample was forgotten ``(n,)``; the ``feature`` (``"direct_diff"`` or ``"euc_dist"``) of
    :func:`~lightning_unlearn.functional.metrics.mia_u_features` is kept per sample. ``compute()`` puts the
    rows of each class in one canonical order (sorted) before the attack's seeded subsample and folds, so its
    value does not depend on how batches or ranks split the samples; :func:`~lightning_unlearn.metrics.mia_u_auc`
    takes the rows in data order, so the two differ by the attack's sampling noise only. NaN with fewer than
    2 members or non-members (folds are at most the smaller count, as in ``evaluate_unlearning``).

    Args:
        num_classes: the posteriors' width ``C`` (the flattened states are reshaped by it).
        feature: the attack feature.
        folds: cross-validation folds of the attack model (fewer if a class has fewer rows).
        seed: the attack's subsample, folds and forest.

    Raises:
        ValueError: an unknown ``feature``.
    """

    higher_is_better = False

    def __init__(
        self, num_classes: int, feature: str = "direct_diff", folds: int = 5, seed: int = 0, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if feature not in metrics.MIA_U_FEATURES:
            raise ValueError(f"MIA-U feature must be one of {metrics.MIA_U_FEATURES}, got {feature!r}")
        self.num_classes, self.feature, self.folds, self.seed = int(num_classes), feature, int(folds), int(seed)
        self._cat_states("features", "members")

    def update(self, before: Tensor, after: Tensor, members: Tensor) -> None:
        """Add a batch: posteriors before and after ``(n, C)``, forgotten or not ``(n,)``.

        Raises:
            ValueError: shapes that do not match ``(n, num_classes)`` and ``(n,)``.
        """
        n = len(members)
        if before.shape != (n, self.num_classes) or after.shape != before.shape:
            raise ValueError(
                f"expected before and after of shape ({n}, {self.num_classes}), got {tuple(before.shape)} and "
                f"{tuple(after.shape)}"
            )
        features = metrics.mia_u_features(before.detach().double(), after.detach().double(), self.feature)
        self._add("features", features)
        self._add("members", members)

    def compute(self) -> Tensor:
        members = self._values("members").bool()
        folds = min(self.folds, int(members.sum()), int((~members).sum()))
        if folds < 2:
            return torch.tensor(float("nan"), dtype=torch.float64)
        rows = self._values("features").view(len(members), -1)
        inside, outside = (_sorted_rows(rows[mask]) for mask in (members, ~members))
        return torch.tensor(metrics.attack_auc(inside, outside, folds, self.seed), dtype=torch.float64)


def _sorted_rows(rows: Tensor) -> Tensor:
    """``rows`` in lexicographic order (a canonical order for a set of rows)."""
    order = torch.arange(len(rows))
    for col in reversed(range(rows.shape[1])):  # stable sorts from the last key to the first
        order = order[torch.sort(rows[order, col], stable=True).indices]
    return rows[order]
