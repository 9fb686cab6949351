"""Metrics: torchmetrics accuracy, loss-threshold MIA, parameter distance, MIA-U and offline LiRA (AUC and TPR at
low FPR), as functions and as torchmetrics Metrics."""

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn.metrics import (
    LossThresholdMIA,
    MIAUnlearning,
    OfflineLiRA,
    accuracy,
    attack_auc,
    evaluate_unlearning,
    lira,
    lira_auc,
    lira_offline_scores,
    loss_threshold_mia,
    mia_u_auc,
    mia_u_features,
    parameter_distance,
    posteriors,
    sample_losses,
    tpr_at_fpr,
)


class Fixed(nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.logits = logits

    def forward(self, x):
        return self.logits[x.long().flatten()]


def test_accuracy_counts_correct_predictions():
    logits = torch.eye(3)[[0, 1, 2, 0]]
    data = TensorDataset(torch.arange(4), torch.tensor([0, 1, 1, 0]))
    assert accuracy(Fixed(logits), data, num_classes=3) == 0.75


def test_a_float64_module_reads_float32_data_as_its_fit_did():
    # a module fitted with precision="64-true" is float64; Lightning cast each training batch, the metrics do too
    torch.manual_seed(0)
    module, x = nn.Linear(5, 3).double(), torch.randn(8, 5)
    data = TensorDataset(x, torch.arange(8) % 3)
    expected = torch.softmax(module(x.double()), -1)
    assert torch.equal(posteriors(module, data), expected.detach())
    assert accuracy(module, data, num_classes=3) == float((expected.argmax(-1) == torch.arange(8) % 3).double().mean())
    assert sample_losses(module, data).dtype == torch.float32


def test_mia_threshold_separates_members():
    members, nonmembers = torch.linspace(0.0, 0.1, 50), torch.linspace(1.0, 2.0, 50)
    assert loss_threshold_mia(members, nonmembers, torch.full((10,), 0.05)) == 1.0
    assert loss_threshold_mia(members, nonmembers, torch.full((10,), 1.5)) == 0.0
    assert loss_threshold_mia(members, nonmembers, torch.tensor([0.05, 1.5])) == 0.5


def test_parameter_distance_and_gaps():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    with torch.no_grad():
        for p in b.parameters():
            p.copy_(dict(a.named_parameters())[[k for k, q in b.named_parameters() if q is p][0]] + 1.0)
    assert abs(parameter_distance(a, b) - 6**0.5) < 1e-6
    data = TensorDataset(torch.randn(20, 2), torch.randint(0, 2, (20,)))
    out = evaluate_unlearning(a, retain=data, forget=data, test=data, num_classes=2, reference=a)
    assert out["l2_to_retrain"] == 0.0 and out["retain_acc_gap"] == 0.0


# -- attacks ----------------------------------------------------------------------------------------------
N_ROWS, N_LABELS = 120, 4
ROWS = torch.eye(N_ROWS, dtype=torch.float64)  # one-hot inputs: a linear model can memorise every row
LABELS = torch.randint(0, N_LABELS, (N_ROWS,), generator=torch.Generator().manual_seed(0))


def memoriser(rows: list[int], seed: int, steps: int = 60) -> nn.Module:
    """A linear model on one-hot rows, trained by full-batch gradient descent on ``rows`` only; trained once per
    (rows, seed, steps) in this module (the attacks only read a model: eval mode, no gradients)."""
    key = (tuple(rows), seed, steps)
    if key not in _MEMORISED:
        _MEMORISED[key] = _train_memoriser(rows, seed, steps)
    return _MEMORISED[key]


_MEMORISED: dict[tuple[tuple[int, ...], int, int], nn.Module] = {}


def _train_memoriser(rows: list[int], seed: int, steps: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    net = nn.Linear(N_ROWS, N_LABELS, bias=False).double()
    with torch.no_grad():
        net.weight.copy_(0.1 * torch.randn(N_LABELS, N_ROWS, generator=g, dtype=torch.float64))
    opt = torch.optim.SGD(net.parameters(), lr=20.0)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(net(ROWS[rows]), LABELS[rows]).backward()
        opt.step()
    return net


def subset(rows: list[int]) -> TensorDataset:
    return TensorDataset(ROWS[rows], LABELS[rows])


FORGOTTEN, RETAINED, OUTSIDE = list(range(20)), list(range(20, 80)), list(range(80, 120))


def test_mia_u_is_chance_on_identical_models_and_detects_a_leaking_update():
    before = memoriser(FORGOTTEN + RETAINED, seed=0)
    after = memoriser(RETAINED, seed=0)  # retrained without the forgotten rows: their posteriors change
    for feature in ("direct_diff", "euc_dist"):
        # identical models: every feature is 0, so the attack cannot beat chance
        assert mia_u_auc(before, before, subset(FORGOTTEN), subset(OUTSIDE), feature) == 0.5
        # before/after differ exactly on the forgotten rows: the attack finds them
        assert mia_u_auc(before, after, subset(FORGOTTEN), subset(OUTSIDE), feature) > 0.9
    with pytest.raises(ValueError, match="feature"):
        mia_u_features(torch.zeros(2, 3), torch.zeros(2, 3), "sorted_diff")


def test_offline_lira_flags_members_and_not_forgotten_samples():
    shadows = [memoriser(OUTSIDE[:10] + RETAINED, seed=s) for s in range(1, 5)]  # OUT for every target row
    trained = memoriser(FORGOTTEN + RETAINED, seed=0)
    retrained = memoriser(RETAINED, seed=0)
    targets_out = subset(OUTSIDE[10:])
    assert lira_auc(trained, shadows, subset(FORGOTTEN), targets_out) > 0.9  # memorised rows are flagged
    assert abs(lira_auc(retrained, shadows, subset(FORGOTTEN), targets_out) - 0.5) < 0.25  # forgotten rows look unseen
    with pytest.raises(ValueError, match="2 shadow"):
        lira_offline_scores(torch.zeros(3), torch.zeros(1, 3))


def test_evaluate_unlearning_attacks_tell_doing_nothing_from_retraining():
    """On rows the trained model memorised, MIA-U flags retraining (the posteriors of exactly the forgotten rows
    change) and cannot flag doing nothing (no posterior changes: features all 0, AUC 0.5 exactly), while offline
    LiRA flags doing nothing (the forgotten rows are still memorised) and not retraining."""
    trained, retrained = memoriser(FORGOTTEN + RETAINED, seed=0), memoriser(RETAINED, seed=0)
    shadows = [memoriser(OUTSIDE[:10] + RETAINED, seed=s) for s in range(1, 4)]
    common = dict(retain=subset(RETAINED), forget=subset(FORGOTTEN), test=subset(OUTSIDE[10:]), num_classes=N_LABELS)
    nothing = evaluate_unlearning(trained, before=trained, shadows=shadows, **common)
    retrain = evaluate_unlearning(retrained, before=trained, shadows=shadows, **common)
    for out in (nothing, retrain):
        assert {"mia_u_direct_diff_auc", "mia_u_euc_dist_auc", "lira_auc"} <= set(out)
        assert all(0.0 <= out[k] <= 1.0 for k in ("mia_u_direct_diff_auc", "mia_u_euc_dist_auc", "lira_auc"))
    assert nothing["mia_u_direct_diff_auc"] == nothing["mia_u_euc_dist_auc"] == 0.5
    assert retrain["mia_u_direct_diff_auc"] > 0.9 and retrain["mia_u_euc_dist_auc"] > 0.9
    assert nothing["lira_auc"] > 0.9 and abs(retrain["lira_auc"] - 0.5) < 0.25
    # without before/shadows the attacks are absent; with too few forgotten samples MIA-U is NaN
    assert "lira_auc" not in evaluate_unlearning(trained, **common)
    one = evaluate_unlearning(retrained, **{**common, "forget": subset(FORGOTTEN[:1])}, before=trained)
    assert math.isnan(one["mia_u_direct_diff_auc"])
    # DataLoaders of one batch each: the sample counts, not len(loader) == 1, decide the folds
    loaders = {k: DataLoader(v, batch_size=1000) for k, v in common.items() if k != "num_classes"}
    batched = evaluate_unlearning(retrained, **loaders, num_classes=N_LABELS, before=trained)
    assert batched["mia_u_direct_diff_auc"] == retrain["mia_u_direct_diff_auc"]


def test_attack_auc_on_imbalanced_sets():
    """10 members among 200 non-members (scored on a balanced subsample): separable features give 1,
    identically distributed ones about 0.5 (20 scored rows: a wide margin), too few members an error."""
    g = torch.Generator().manual_seed(0)
    members, nonmembers = torch.randn(10, 3, generator=g) + 5.0, torch.randn(200, 3, generator=g)
    assert attack_auc(members, nonmembers) == 1.0
    same = torch.randn(210, 3, generator=g)
    assert abs(attack_auc(same[:10], same[10:]) - 0.5) < 0.3
    with pytest.raises(ValueError, match="at least 5"):
        attack_auc(members[:4], nonmembers)


# -- TPR at low FPR, and the attacks as torchmetrics Metrics ---------------------------------------------------
def test_tpr_at_fpr_is_the_best_threshold_below_the_rate_as_lira_reads_it():
    """Against a sweep over every threshold (predict member when score >= t) and [LiRA]'s plot.py reading of
    scikit-learn's (thinned) ROC curve, on scores with ties."""
    from sklearn.metrics import roc_curve

    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 40, (300,), generator=g).double() / 40  # many ties
    members = torch.rand(300, generator=g) < 0.4 + 0.4 * scores  # higher scores: more members
    n_in, n_out = int(members.sum()), int((~members).sum())
    for rate in (0.001, 0.01, 0.05, 0.3):
        sweep = max(
            int(((scores >= t) & members).sum()) / n_in
            for t in [*scores.unique().tolist(), math.inf]
            if int(((scores >= t) & ~members).sum()) / n_out < rate
        )
        fpr, tpr, _ = roc_curve(members.numpy(), scores.numpy())
        lira_code = float(tpr[np.where(fpr < rate)[0][-1]])
        assert tpr_at_fpr(scores, members, rate) == sweep == lira_code
    assert tpr_at_fpr(torch.tensor([0.9, 0.8, 0.1]), torch.tensor([1, 1, 0]), 0.001) == 1.0  # separable
    with pytest.raises(ValueError, match="fpr must lie"):
        tpr_at_fpr(scores, members, 0.0)
    with pytest.raises(ValueError, match="members and non-members"):
        tpr_at_fpr(scores, torch.ones(300, dtype=torch.bool), 0.01)


def test_evaluate_unlearning_reports_lira_tprs_beside_the_auc():
    trained, retrained = memoriser(FORGOTTEN + RETAINED, seed=0), memoriser(RETAINED, seed=0)
    shadows = [memoriser(OUTSIDE[:10] + RETAINED, seed=s) for s in range(1, 4)]
    common = dict(retain=subset(RETAINED), forget=subset(FORGOTTEN), test=subset(OUTSIDE[10:]), num_classes=N_LABELS)
    nothing = evaluate_unlearning(trained, shadows=shadows, **common)
    retrain = evaluate_unlearning(retrained, shadows=shadows, **common)
    direct = lira(trained, shadows, subset(FORGOTTEN), subset(OUTSIDE[10:]))
    assert {f"lira_{k}": v for k, v in direct.items()} == {k: nothing[k] for k in LIRA_KEYS_ROW}
    assert direct["auc"] == lira_auc(trained, shadows, subset(FORGOTTEN), subset(OUTSIDE[10:]))
    # 30 non-members: both rates read the TPR at zero false positives; memorised rows are flagged there
    assert nothing["lira_tpr_at_0.1pct_fpr"] == nothing["lira_tpr_at_1pct_fpr"] > 0.5
    assert retrain["lira_tpr_at_1pct_fpr"] < nothing["lira_tpr_at_1pct_fpr"]
    without = evaluate_unlearning(trained, shadows=shadows, **{**common, "forget": subset([])})
    assert all(math.isnan(without[k]) for k in LIRA_KEYS_ROW)


LIRA_KEYS_ROW = ("lira_auc", "lira_tpr_at_0.1pct_fpr", "lira_tpr_at_1pct_fpr")


def test_metric_classes_equal_the_functions_whatever_the_batches():
    """Each Metric's compute() equals the function of all its samples, and does not depend on how the samples are
    split into updates (the states are concatenated; every value is order-free)."""
    g = torch.Generator().manual_seed(1)
    losses = {
        role: torch.rand(n, generator=g) * s
        for role, n, s in (("member", 50, 1.0), ("nonmember", 40, 3.0), ("target", 30, 2.0))
    }
    expected = loss_threshold_mia(losses["member"], losses["nonmember"], losses["target"])
    for chunk in (7, 100):
        mia = LossThresholdMIA()
        for role, values in reversed(list(losses.items())):
            for part in values.split(chunk):
                mia.update(part, role)
        assert float(mia.compute()) == expected
    no_target = LossThresholdMIA()
    no_target.update(losses["member"], "member")
    no_target.update(losses["nonmember"], "nonmember")
    assert math.isnan(float(no_target.compute()))

    trained = memoriser(FORGOTTEN + RETAINED, seed=0)
    shadows = [memoriser(OUTSIDE[:10] + RETAINED, seed=s) for s in range(1, 4)]
    data = TensorDataset(ROWS[FORGOTTEN + OUTSIDE[10:]], LABELS[FORGOTTEN + OUTSIDE[10:]])
    members = torch.arange(len(data)) < len(FORGOTTEN)
    lira_metric = OfflineLiRA()
    lira_metric.update(
        posteriors(trained, data), torch.stack([posteriors(s, data) for s in shadows]), data.tensors[1], members
    )
    out = {k: float(v) for k, v in lira_metric.compute().items()}
    assert out == lira(trained, shadows, subset(FORGOTTEN), subset(OUTSIDE[10:]))

    before, after = memoriser(FORGOTTEN + RETAINED, seed=0), memoriser(RETAINED, seed=0)
    p0, p1 = posteriors(before, data), posteriors(after, data)
    feats = mia_u_features(p0, p1)
    perm = torch.randperm(len(data), generator=g)
    values = []
    for order, chunk in ((torch.arange(len(data)), 100), (perm, 9)):
        metric = MIAUnlearning(num_classes=N_LABELS)
        for idx in order.split(chunk):
            metric.update(p0[idx], p1[idx], members[idx])
        values.append(float(metric.compute()))
    assert values[0] == values[1] > 0.9  # the forgotten rows' posteriors changed: the attack finds them
    assert abs(values[0] - attack_auc(feats[members], feats[~members])) < 0.1  # data order: same attack, other draw


def test_metric_classes_refuse_bad_input():
    with pytest.raises(ValueError, match="role must be one of"):
        LossThresholdMIA().update(torch.zeros(3), "forgotten")
    with pytest.raises(ValueError, match="false-positive rates"):
        OfflineLiRA(fprs=(0.0,))
    with pytest.raises(ValueError, match="shadow_probs"):
        OfflineLiRA().update(torch.full((4, 3), 1 / 3), torch.full((2, 5, 3), 1 / 3), torch.zeros(4), torch.ones(4))
    with pytest.raises(ValueError, match="2 shadow"):
        OfflineLiRA().update(torch.full((4, 3), 1 / 3), torch.full((1, 4, 3), 1 / 3), torch.zeros(4), torch.ones(4))
    with pytest.raises(ValueError, match="feature"):
        MIAUnlearning(num_classes=3, feature="sorted_diff")
    with pytest.raises(ValueError, match=r"shape \(4, 3\)"):
        MIAUnlearning(num_classes=3).update(torch.zeros(4, 2), torch.zeros(4, 2), torch.ones(4))
    only_members = OfflineLiRA()
    only_members.update(torch.full((4, 3), 1 / 3), torch.rand(2, 4, 3), torch.zeros(4), torch.ones(4))
    assert all(math.isnan(float(v)) for v in only_members.compute().values())
    few = MIAUnlearning(num_classes=3)
    few.update(torch.rand(3, 3), torch.rand(3, 3), torch.tensor([True, False, False]))
    assert math.isnan(float(few.compute()))  # one forgotten sample: no two folds
