"""Metrics: torchmetrics accuracy, loss-threshold MIA, parameter distance."""

import torch
from torch import nn
from torch.utils.data import TensorDataset

from lightning_unlearn.metrics import accuracy, evaluate_unlearning, loss_threshold_mia, parameter_distance


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
