"""Certified forgetting that keeps the model useful: the certified softmax head on real MNIST (mnist-5k).

Two settings, both a user's own LightningModule whose head a SoftmaxHeadRecorder solves:

* ``pixels``: softmax regression on the 784 normalised pixels (+ bias), l2 = 1e-3;
* ``features``: a small CNN with BatchNorm pre-trained (and then frozen) on a public split of 1,000 of the
  4,000 training images, its 64 features feeding the head; the other 3,000 images are learned and forgotten.
  ``cnn retrain`` is the same CNN trained end to end on the public split plus the retained images.

Requests: 1% of the learned images one sample per request, and 10% in ten requests of 1%. After the last one,
each method's test accuracy is compared with the exact retrain (the optimum on the retained rows, solved from
scratch); ``s/request`` is the whole ``forget`` call, ``cold s`` the solver from zero on the final retained rows,
measured in the same run. Per-release (epsilon, delta) = (1, 1e-5); ``eps total`` is the PLD composition of
all releases. Run: ``python benchmarks/certified_head.py [--quick]``.
"""

from __future__ import annotations

import argparse
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from lightning_unlearn import ForgetRequest, IndexedDataset, ReleaseConfig
from lightning_unlearn.callbacks.convex import SoftmaxHeadRecorder
from lightning_unlearn.data import sample_ids_of
from lightning_unlearn.functional import convex
from lightning_unlearn.progress import QUIET_TRAINER
from lightning_unlearn.unlearners.convex import CertifiedRemovalUnlearner, ResolveUnlearner
from lightning_unlearn_bench.datasets import MNIST5k

L2, RADIUS, EPSILON, DELTA = 1e-3, 2e-4, 1.0, 1e-5
PUBLIC = 1000


class PixelHead(L.LightningModule):
    """Logistic regression on pixels; the recorder is the head's only writer."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(784, 10)
        self.automatic_optimization = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.flatten(1))

    def training_step(self, batch, batch_idx):
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def cnn_trunk() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(),
    )  # fmt: skip


class CNN(L.LightningModule):
    """The user's CNN: trained end to end (``frozen=False``) or a frozen trunk under a solved head."""

    def __init__(self, trunk: nn.Module, frozen: bool) -> None:
        super().__init__()
        self.trunk, self.head, self.frozen = trunk, nn.Linear(64, 10), frozen
        self.automatic_optimization = not frozen
        if frozen:
            self.trunk.requires_grad_(False)  # the recorder runs it in eval mode, in float64

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))

    def training_step(self, batch, batch_idx):
        if self.frozen:
            return None
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self):
        return (
            torch.optim.Adam(self.parameters(), lr=1e-3)
            if not self.frozen
            else torch.optim.SGD(self.parameters(), lr=0.0)
        )


def accuracy(model: nn.Module, test: TensorDataset) -> float:
    model.eval()
    with torch.no_grad():
        return 100 * float((model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean())


def train_cnn(data, epochs: int, seed: int) -> nn.Module:
    L.seed_everything(seed, verbose=False)
    model = CNN(cnn_trunk(), frozen=False)
    L.Trainer(max_epochs=epochs, **QUIET_TRAINER).fit(model, DataLoader(data, batch_size=64, shuffle=True))
    return model


def fit_head(model: L.LightningModule, recorder: SoftmaxHeadRecorder, data) -> float:
    start = time.perf_counter()
    L.Trainer(max_epochs=1, callbacks=[recorder], **QUIET_TRAINER).fit(model, DataLoader(data, batch_size=500))
    return time.perf_counter() - start


def scenarios(ids: list[int], quick: bool) -> dict[str, list[list[int]]]:
    g = torch.Generator().manual_seed(0)
    order = [ids[i] for i in torch.randperm(len(ids), generator=g).tolist()]
    one = len(ids) // 100
    single = [[i] for i in order[: (5 if quick else one)]]
    batched = [order[k * one : (k + 1) * one] for k in range(2 if quick else 10)]
    return {f"{len(single)} x 1 ({100 * len(single) / len(ids):.2g}%)": single,
            f"{len(batched)} x {one} ({100 * len(batched) * one / len(ids):.2g}%)": batched}  # fmt: skip


def run(setting: str, make, data, test, quick: bool) -> list[dict]:
    ids = sample_ids_of(data).tolist()  # known by position: no image is read
    rows = []
    for scenario, requests in scenarios(ids, quick).items():
        for method in ("resolve", "resolve[noise=off]", "certified_removal"):
            model = make()
            beta = CertifiedRemovalUnlearner.perturbation_std(0.1, EPSILON, DELTA)
            recorder = SoftmaxHeadRecorder(
                L2, radius=RADIUS, backbone="trunk" if setting == "features" else None,
                loss_perturbation=beta if method == "certified_removal" else None,
            )  # fmt: skip
            fit_head(model, recorder, data)
            if method == "certified_removal":
                strategy = CertifiedRemovalUnlearner(model, recorder, epsilon=EPSILON, delta=DELTA)
            else:
                strategy = ResolveUnlearner(
                    model, recorder, release=ReleaseConfig(epsilon=EPSILON, delta=DELTA, noise=method == "resolve")
                )
            times = []
            for request in requests:
                start = time.perf_counter()
                result = strategy.forget(ForgetRequest.samples(request))
                times.append(time.perf_counter() - start)
            problem = recorder.problem()
            start = time.perf_counter()
            cold = convex.solve(problem, torch.zeros_like(recorder.solved_head), recorder.tolerance)
            cold_s = time.perf_counter() - start
            retrain = make()
            recorder.write_weights(retrain, cold.W)
            cert = result.certificate
            rows.append({
                "setting": setting, "requests": scenario, "method": method,
                "test": accuracy(model, test), "retrain": accuracy(retrain, test),
                "s/request": sum(times) / len(times), "cold s": cold_s,
                "eps total": cert.accounting.get("epsilon_total", float("nan")), "certified": cert.certified,
                "sigma": cert.sigma or 0.0, "resolved": sum(bool(r.extra.get("resolved")) for r in strategy.history),
            })  # fmt: skip
            print(format_row(rows[-1]), flush=True)
    return rows


HEADER = (
    f"{'setting':9} {'requests':16} {'method':19} {'test%':>6} {'retrain%':>8} {'gap pp':>6} {'s/request':>9} "
    f"{'cold s':>7} {'ratio':>6} {'eps total':>9} {'cert':>4} {'sigma':>8}"
)


def format_row(r: dict) -> str:
    return (
        f"{r['setting']:9} {r['requests']:16} {r['method']:19} {r['test']:6.2f} {r['retrain']:8.2f} "
        f"{r['retrain'] - r['test']:6.2f} {r['s/request']:9.3f} {r['cold s']:7.3f} {r['s/request'] / r['cold s']:6.3f} "
        f"{r['eps total']:9.3g} {'yes' if r['certified'] else 'no':>4} {r['sigma']:8.2g}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few requests per scenario (smoke)")
    parser.add_argument("--settings", nargs="+", choices=("pixels", "features"), default=["pixels", "features"])
    args = parser.parse_args()
    train, test = MNIST5k(train=True), MNIST5k(train=False)
    data = IndexedDataset(train)
    print(HEADER, flush=True)
    if "pixels" in args.settings:
        run("pixels", PixelHead, data, test, args.quick)
    if "features" not in args.settings:
        return
    # mnist-5k's training images are ordered by digit: the public split is a random one (all ten digits)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).tolist()
    public, stream = Subset(data, order[:PUBLIC]), Subset(data, sorted(order[PUBLIC:]))
    L.seed_everything(0, verbose=False)
    base = CNN(cnn_trunk(), frozen=False)
    L.Trainer(max_epochs=10, **QUIET_TRAINER).fit(base, DataLoader(public, batch_size=64, shuffle=True))
    print(f"public backbone: CNN trained end to end on the {PUBLIC} public images, test {accuracy(base, test):.2f}%")
    trunk_state = base.trunk.state_dict()

    def frozen_cnn() -> CNN:
        trunk = cnn_trunk()
        trunk.load_state_dict(trunk_state)
        return CNN(trunk, frozen=True)

    rows = run("features", frozen_cnn, stream, test, args.quick)
    # the same architecture trained end to end on the public split and the retained images of the last scenario
    forgotten = {i for request in scenarios(sample_ids_of(stream).tolist(), args.quick)[
        rows[-1]["requests"]] for i in request}  # fmt: skip
    retained = Subset(data, [p for p, i in enumerate(sample_ids_of(data).tolist()) if i not in forgotten])
    cnn = train_cnn(retained, epochs=10, seed=0)
    print(f"cnn retrain (end to end, public + retained of {rows[-1]['requests']}): test {accuracy(cnn, test):.2f}%")


if __name__ == "__main__":
    main()
