"""An existing Avalanche script gains recording and exact forgetting with one plugin.

Real data, no download: scikit-learn's handwritten digits, 5 class-incremental experiences. Your own
module: a small batch-norm MLP pre-trained on a disjoint split is its frozen ``trunk``, and an ACU analytic
head its ``head`` (an ``AnalyticHeadModule``). Avalanche's own ``Naive`` strategy learns the stream with
its usual optimizer and loss, with ``UnlearningPlugin`` recording the head's statistics and executing two
forget requests between experiences (it keeps the trunk in eval mode, so its batch-norm statistics do not
move, and no optimizer step touches the solved head). Avalanche's ``EvaluationPlugin`` receives each
request's metrics (``unlearn/removed``, ``unlearn/exact``, ...) next to its accuracy metrics, and its
``TextLogger`` prints them.

    python examples/avalanche_plugin.py
"""

from __future__ import annotations

import sys
import warnings

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import (
    ACUUnlearner,
    AnalyticHead,
    AnalyticHeadModule,
    AnalyticRecorder,
    ForgetRequest,
)
from lightning_unlearn.avalanche import UnlearningPlugin, benchmark_with_sample_ids
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.progress import progress_bar
from lightning_unlearn_bench.digits import digits_splits

# Avalanche imports qpsolvers for GEM, and qpsolvers warns "no QP solver found" when none is installed: this script
# runs Naive, which needs none, so that one warning of the import is dropped; Lightning 2.6.6 (the newest) builds
# torch's deprecated LeafSpec in every fit, which no user can change: that FutureWarning is dropped too
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="no QP solver found", category=UserWarning, module="qpsolvers")
    from avalanche.evaluation.metrics import accuracy_metrics
    from avalanche.logging import TextLogger
    from avalanche.training import Naive
    from avalanche.training.plugins import EvaluationPlugin


def pretrained_backbone(x: Tensor, y: Tensor) -> nn.Module:
    L.seed_everything(0, verbose=False)
    backbone = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU())
    net = nn.Sequential(backbone, nn.Linear(64, 10))
    # progress_bar(): Lightning's bar on a terminal, one line at the end of the fit in a pipe or a file
    trainer = L.Trainer(
        max_epochs=30, logger=False, enable_checkpointing=False, enable_model_summary=False, callbacks=[progress_bar()]
    )
    trainer.fit(SupervisedClassifier(net, lr=0.1), DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True))
    return backbone


class DigitsNet(AnalyticHeadModule):
    """Your own module: the frozen pre-trained trunk and an analytic head on its output."""

    def __init__(self, trunk: nn.Module) -> None:
        super().__init__()
        self.trunk = trunk.requires_grad_(False)
        self.head = AnalyticHead(64, 10, expansion_dim=512)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.trunk(x))


def main() -> None:
    splits = digits_splits()
    (x, y), (xt, yt) = splits["train"], splits["test"]
    # Avalanche's items stay (x, y, task); each sample's id is the dataset attribute "sample_id" (its row)
    bm = benchmark_with_sample_ids(TensorDataset(x, y), TensorDataset(xt, yt), 5, seed=0)
    order = [c for experience in bm.train_stream for c in sorted(experience.classes_in_this_experience)]

    model = DigitsNet(pretrained_backbone(*splits["base"]))
    recorder = AnalyticRecorder(ridge=1.0, backbone="trunk", head="head")
    requests = {
        1: [ForgetRequest.samples(torch.nonzero(y == order[0]).flatten()[:8])],  # a user deletes 8 records
        3: [ForgetRequest.of_class(order[2])],  # a class is withdrawn
    }
    plugin = UnlearningPlugin(recorder, ACUUnlearner(model, recorder), requests)

    # the Avalanche script as it was, plus plugins=[plugin]
    evaluator = EvaluationPlugin(accuracy_metrics(experience=True, stream=True), loggers=[TextLogger(sys.stdout)])
    strategy = Naive(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        criterion=nn.CrossEntropyLoss(),
        train_mb_size=64,
        train_epochs=1,
        plugins=[plugin],
        evaluator=evaluator,
    )
    for k, experience in enumerate(bm.train_stream):
        strategy.train(experience)
        strategy.eval(bm.test_stream[: k + 1])

    print("\nrequests executed by the plugin:")
    for result in plugin.results:
        print(f"  {result.request}: removed {result.removed_ids.numel()} samples, {result.certificate}")
    forgotten = evaluator.get_all_metrics()["unlearn/removed"]
    print(f"EvaluationPlugin received unlearn/removed at iterations {forgotten[0]}: {forgotten[1]}")


if __name__ == "__main__":
    main()
