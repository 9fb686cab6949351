"""An existing Avalanche script gains recording and exact forgetting with one plugin.

Real data, no download: scikit-learn's handwritten digits, 5 class-incremental experiences. A small
MLP pre-trained on a disjoint split is the frozen backbone of an ACU analytic head; Avalanche's own
``Naive`` strategy learns the stream, with ``UnlearningPlugin`` recording the head's statistics and
executing two forget requests between experiences. Avalanche's ``EvaluationPlugin`` receives each
request's metrics (``unlearn/removed``, ``unlearn/exact``, ...) next to its accuracy metrics, and its
``TextLogger`` prints them.

    python examples/avalanche_plugin.py
"""

from __future__ import annotations

import sys
import warnings

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import (
    ACUUnlearner,
    AnalyticClassifier,
    AnalyticRecorder,
    ForgetRequest,
)
from lightning_unlearn.avalanche import UnlearningPlugin, benchmark_with_sample_ids
from lightning_unlearn.harness.digits import digits_splits
from lightning_unlearn.models import SupervisedClassifier, mlp_backbone
from lightning_unlearn.progress import progress_bar

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


def pretrained_backbone(x: torch.Tensor, y: torch.Tensor) -> torch.nn.Module:
    L.seed_everything(0, verbose=False)
    backbone = mlp_backbone(64, 128, 64)
    net = torch.nn.Sequential(backbone, torch.nn.Linear(64, 10))
    # progress_bar(): Lightning's bar on a terminal, one line at the end of the fit in a pipe or a file
    trainer = L.Trainer(
        max_epochs=30, logger=False, enable_checkpointing=False, enable_model_summary=False, callbacks=[progress_bar()]
    )
    trainer.fit(SupervisedClassifier(net, lr=0.1), DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True))
    return backbone


def main() -> None:
    splits = digits_splits()
    (x, y), (xt, yt) = splits["train"], splits["test"]
    # Avalanche's items stay (x, y, task); each sample's id is the dataset attribute "sample_id" (its row)
    bm = benchmark_with_sample_ids(TensorDataset(x, y), TensorDataset(xt, yt), 5, seed=0)
    order = [c for experience in bm.train_stream for c in sorted(experience.classes_in_this_experience)]

    model = AnalyticClassifier(pretrained_backbone(*splits["base"]), 64, 10, expansion_dim=512)
    recorder = AnalyticRecorder(ridge=1.0)
    requests = {
        1: [ForgetRequest.samples(torch.nonzero(y == order[0]).flatten()[:8])],  # a user deletes 8 records
        3: [ForgetRequest.of_class(order[2])],  # a class is withdrawn
    }
    plugin = UnlearningPlugin(recorder, ACUUnlearner(model, recorder), requests)

    # the Avalanche script as it was, plus plugins=[plugin]; the head is solved in closed form (lr=0)
    evaluator = EvaluationPlugin(accuracy_metrics(experience=True, stream=True), loggers=[TextLogger(sys.stdout)])
    strategy = Naive(
        model=model,
        optimizer=torch.optim.SGD(model.head.parameters(), lr=0.0),
        criterion=torch.nn.CrossEntropyLoss(),
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
