"""The attacks of the tradeoff table measure something (issue 26, item 4): the exact retrain is at chance under
offline LiRA, and a model that never forgot is flagged above it.

On the base commit the table gave the exact retrain a LiRA AUC of 0.917 on mnist-5k: the non-members were test
inputs paired with the labels of other test samples (two independent permutations), so their true-label confidence
was low under any model, and the shadows were SGD-trained on a small split, not the solved head they attacked.

The margins are the AUC's standard error under the null (Hanley & McNeil, Radiology 1982; the Mann-Whitney
variance for continuous scores): ``SE^2 = (n1 + n2 + 1) / (12 n1 n2)`` for ``n1`` members and ``n2`` non-members.
"""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from lightning_unlearn import IndexedDataset
from lightning_unlearn.functional.metrics import lira_offline_scores, logit_confidence
from lightning_unlearn.metrics import shadow_models
from lightning_unlearn_bench.tradeoff import run_tradeoff


def null_se(n1: int, n2: int) -> float:
    """The AUC's standard error when members and non-members are exchangeable (AUC 0.5)."""
    return math.sqrt((n1 + n2 + 1) / (12 * n1 * n2))


def digits_through_a_frozen_feature_map(train_size: int) -> tuple[IndexedDataset, TensorDataset]:
    """A user's (train, test) pair: scikit-learn's digits through a seeded random ReLU layer of width 64 (frozen)."""
    digits = load_digits()
    x, y = torch.tensor(digits.data, dtype=torch.float64) / 16, torch.tensor(digits.target)
    g = torch.Generator().manual_seed(0)
    features = torch.relu((x - x.mean(0)) @ (torch.randn(64, 64, generator=g, dtype=torch.float64) / 32**0.5))
    order = torch.randperm(len(y), generator=g)
    train, test = order[:train_size], order[train_size:]
    return IndexedDataset(TensorDataset(features[train], y[train])), TensorDataset(features[test], y[test])


def rows_of(rows: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Whether each row of ``rows`` is a row of ``table``."""
    return (rows.unsqueeze(1) == table.unsqueeze(0)).all(-1).any(1)


def test_tradeoff_audit_puts_the_exact_retrain_at_chance_and_flags_the_model_that_never_forgot():
    # certified_removal at no finite epsilon: the head family's references only (no request runs)
    rows, setup = run_tradeoff(
        (), methods=("certified_removal",), fraction=0.25, data=digits_through_a_frozen_feature_map(1200), log=print
    )
    by_method = {r["method"]: r for r in rows}
    assert list(by_method) == ["retrain[exact]", "never_forgot[head]"]
    # the audit's sets: forgotten samples against held-out training samples, each with its own label
    (xf, yf), (xn, yn) = setup.forgotten.tensors, setup.nonmembers.tensors
    n1, n2 = len(yf), len(yn)
    assert n1 == setup.m and 0 < n2 <= n1
    base = torch.cat([setup.xb, setup.yb.unsqueeze(1).double()], 1)
    assert rows_of(torch.cat([xn, yn.unsqueeze(1).double()], 1), base).all()
    assert not rows_of(xn, setup.x).any()  # no model trained on a non-member
    assert not rows_of(torch.cat([xf, xn]), setup.population.tensors[0]).any()  # every shadow is OUT for each
    se = null_se(n1, n2)
    assert 0.1 >= 3 * se  # the sample is large enough that 0.6 is 3 standard errors above chance
    retrain, never = by_method["retrain[exact]"], by_method["never_forgot[head]"]
    # LiRA: the retrain never saw either set (exchangeable: chance); the original model holds the forgotten samples
    assert abs(retrain["lira_auc"] - 0.5) <= 3 * se and retrain["lira_auc"] <= 0.6
    # two AUCs on the same samples: their difference has SE at most sqrt(2) se; 2 of them, one-sided p < 0.023
    assert never["lira_auc"] > retrain["lira_auc"] + 2 * math.sqrt(2) * se
    # MIA-U compares the models before and after the requests: never forgetting changes no posterior, so the attack
    # is at chance; the retrain's change is what [MIAU] attacks (a leak of the pair, not of the retrain)
    assert abs(never["mia_u_auc"] - 0.5) <= 3 * null_se(min(n1, n2), min(n1, n2))


def test_shadow_models_train_the_given_recipe_on_seeded_subsets_of_the_population():
    population = TensorDataset(torch.arange(50.0).view(-1, 1), torch.zeros(50, dtype=torch.long))
    subsets: list[list[int]] = []

    def train(data: Dataset) -> nn.Module:
        assert isinstance(data, Subset) and data.dataset is population
        subsets.append(list(data.indices))
        return nn.Identity()

    models = shadow_models(train, population, size=20, count=3, seed=5)
    assert len(models) == len(subsets) == 3
    assert all(len(set(rows)) == 20 and rows == sorted(rows) for rows in subsets)
    assert len({tuple(rows) for rows in subsets}) == 3  # three different subsets
    first = list(subsets)
    shadow_models(train, population, size=20, count=3, seed=5)
    assert subsets[3:] == first  # the seed fixes them
    with pytest.raises(ValueError, match="at least 2 shadow models, got count=1"):
        shadow_models(train, population, size=20, count=1)
    with pytest.raises(ValueError, match="1 <= size < 50"):
        shadow_models(train, population, size=50)
    assert len(subsets) == 6  # a refused call trains nothing


def test_lira_scores_do_not_tie_confidently_fitted_examples():
    # p_y rounds to 1 above a logit margin of ~37: 1 - p_y is 0 there, the other classes' sum is not
    probs = torch.softmax(torch.tensor([[40.0, 0.0], [50.0, 0.0], [60.0, 0.0]], dtype=torch.float64), 1)
    conf = logit_confidence(probs, torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(conf, torch.tensor([40.0, 50.0, 60.0], dtype=torch.float64))
    # the one-sided test's statistic, not its CDF: Phi rounds to 1 above z = 8.3 and would tie these members
    scores = lira_offline_scores(torch.tensor([20.0, 40.0]), torch.tensor([[0.0, 0.0], [2.0, 2.0]]))
    assert scores[1] > scores[0] > 8.3
