"""The Avalanche plugin on a user's own module: a frozen BatchNorm trunk and a head that an AnalyticRecorder
solves, inside Avalanche's own ``Naive``, ``Replay``, ``EWC`` and ``DER``, added with the README's one line
``plugins=[UnlearningPlugin(recorder, unlearn, requests)]`` and an ordinary optimizer over all parameters.

Avalanche puts the model in train mode before each ``train`` (EWC's importance pass and DER's logits pass do it
again) and steps its optimizer after a backward of the loss: the trunk's batch-norm statistics must not move, the
backward must pass with a head that takes no gradient, and no optimizer step may move the solved head.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from lightning_unlearn import ACUUnlearner, AnalyticRecorder, ForgetRequest
from lightning_unlearn.avalanche import UnlearningPlugin, benchmark_with_sample_ids, sample_ids
from lightning_unlearn.models import AnalyticHead, AnalyticHeadModule, float64_forward
from lightning_unlearn_bench.digits import digits_splits

from avalanche.training import DER, EWC, Naive, Replay  # isort: skip  (imported quietly by lightning_unlearn.avalanche)

WIDTH, CLASSES, RIDGE = 32, 10, 1.0
STRATEGIES = {
    Naive: {},
    Replay: {"mem_size": 60},
    EWC: {"ewc_lambda": 1.0},
    DER: {"mem_size": 60, "batch_size_mem": 16},
}


def bn_trunk(base: Tensor) -> nn.Sequential:
    """A "pre-trained" trunk with batch norm: its running statistics are those of the digits ``base``; frozen."""
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Linear(64, WIDTH), nn.BatchNorm1d(WIDTH), nn.ReLU())
    with torch.no_grad():
        trunk(base)  # train mode: the batch-norm statistics move away from (0, 1)
    return trunk.requires_grad_(False)


class UserNet(L.LightningModule):
    """A user's own module: the frozen trunk and a plain float64 ``nn.Linear`` head (it requires gradients)."""

    def __init__(self, trunk: nn.Module) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(WIDTH, CLASSES, dtype=torch.float64)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.trunk(x).double())


class HeadNet(AnalyticHeadModule):
    """The README's recipe: an AnalyticHeadModule with the frozen trunk and an AnalyticHead (no gradients at all)."""

    def __init__(self, trunk: nn.Module) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = AnalyticHead(WIDTH, CLASSES, expansion_dim=96, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.trunk(x))


@pytest.fixture(scope="module")
def digits():
    splits = digits_splits()
    (x, y), (xt, yt) = splits["train"], splits["test"]
    return splits["base"][0], x, y, benchmark_with_sample_ids(TensorDataset(x, y), TensorDataset(xt, yt), 2, seed=0)


def closed_form(model: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, float]:
    """The ridge head on ``(x, y)`` computed here from scratch (float64), and the tolerance of a comparison with it:
    float64 eps times the condition number of ``F^T F + ridge I`` times its size (rounding of the sums, of the
    solve and of the forgetting updates), relative to the largest weight."""
    b = float64_forward(model.trunk, x)
    features = model.head.features(b) if isinstance(model.head, AnalyticHead) else b
    features = torch.cat([features, torch.ones(len(features), 1, dtype=torch.float64)], dim=1)  # the bias
    A = features.T @ features + RIDGE * torch.eye(features.shape[1], dtype=torch.float64)
    W = torch.linalg.solve(A, features.T @ F.one_hot(y, CLASSES).double())
    tol = torch.finfo(torch.float64).eps * float(torch.linalg.cond(A)) * A.shape[0] * float(W.abs().max())
    return W, tol


@pytest.mark.parametrize("template", list(STRATEGIES), ids=lambda t: t.__name__)
@pytest.mark.parametrize("net", [UserNet, HeadNet])
def test_a_frozen_batchnorm_trunk_and_a_solved_head_in_avalanche_strategies(digits, net, template):
    base, x, y, bm = digits
    model = net(bn_trunk(base))
    frozen = {k: v.clone() for k, v in model.trunk.state_dict().items()}
    assert any(k.endswith("running_mean") for k in frozen)
    recorder = AnalyticRecorder(ridge=RIDGE, backbone="trunk", head="head")
    unlearn = ACUUnlearner(model, recorder)
    first = sample_ids(bm.train_stream[0].dataset)
    forgotten = first[:7].tolist()
    requests = {0: [ForgetRequest.samples(forgotten)]}  # between the two experiences
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # the user's own, over every parameter
    strategy = template(
        model=model,
        optimizer=optimizer,
        criterion=nn.CrossEntropyLoss(),
        train_mb_size=64,
        train_epochs=1,
        plugins=[UnlearningPlugin(recorder, unlearn, requests)],
        evaluator=None,
        **STRATEGIES[template],
    )
    strategy.train(bm.train_stream)  # one call: EWC's and DER's train() after experience 0 come before experience 1

    assert len(unlearn.history) == 1 and len(recorder.catalog) == len(y)
    assert all(torch.equal(v, frozen[k]) for k, v in model.trunk.state_dict().items())  # parameters and buffers
    assert not any(m.training for m in model.trunk.modules())  # left in eval mode, after EWC's and DER's train()
    assert model(x[:4]).requires_grad == (net is UserNet)  # the plugin's output hook is gone (UserNet: its head)
    linear = model.head.linear if isinstance(model.head, AnalyticHead) else model.head
    assert not optimizer.state.get(linear.weight)  # no optimizer step ever moved the solved head (no momentum)
    retained = torch.tensor([i for i in range(len(y)) if i not in set(forgotten)])
    W, tol = closed_form(model, x[retained], y[retained])
    assert 0 < tol < 1e-9
    solved = torch.cat([linear.weight.T, linear.bias[None]])
    assert torch.allclose(solved, W, rtol=0, atol=tol), (float((solved - W).abs().max()), tol)
    assert sorted(recorder.catalog.ids[recorder.catalog.forgotten].tolist()) == sorted(forgotten)
    assert not set(forgotten) & set(recorder.catalog.active_ids().tolist())
