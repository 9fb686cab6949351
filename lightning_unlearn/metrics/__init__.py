"""Unlearning metrics: accuracies, membership-inference attacks and distances of an unlearned model.

* :mod:`~lightning_unlearn.metrics.evaluation`: functions that run a module over datasets and return
  floats (:func:`evaluate_unlearning` gathers them in one dict; :func:`log_metrics` sends them to loggers);
* :mod:`~lightning_unlearn.metrics.attacks`: the attacks as torchmetrics ``Metric``s (:class:`LossThresholdMIA`,
  :class:`OfflineLiRA`, :class:`MIAUnlearning`), which log and synchronise across processes like any metric;
* their math, pure functions of tensors: :mod:`lightning_unlearn.functional.metrics` (re-exported here).
"""

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
from lightning_unlearn.metrics.attacks import LossThresholdMIA, MIAUnlearning, OfflineLiRA
from lightning_unlearn.metrics.evaluation import (
    LIRA_KEYS,
    accuracy,
    evaluate_unlearning,
    lira,
    lira_auc,
    log_metrics,
    mia_u_auc,
    parameter_distance,
    posteriors,
    sample_losses,
    shadow_models,
)

__all__ = [
    "LIRA_FPRS",
    "LIRA_KEYS",
    "MIA_U_FEATURES",
    "LossThresholdMIA",
    "MIAUnlearning",
    "OfflineLiRA",
    "accuracy",
    "attack_auc",
    "evaluate_unlearning",
    "lira",
    "lira_auc",
    "lira_offline_scores",
    "log_metrics",
    "logit_confidence",
    "loss_threshold_mia",
    "mia_u_auc",
    "mia_u_features",
    "parameter_distance",
    "posteriors",
    "roc_auc",
    "sample_losses",
    "shadow_models",
    "tpr_at_fpr",
    "tpr_key",
]
