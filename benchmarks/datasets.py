"""Cost of the file benchmarks at the papers' scale, from times measured on this machine (CPU).

Two tables. (1) Reading: images per second through the real readers (torchvision's CIFAR/MNIST
readers, the Tiny-ImageNet folder reader; decoding, ``ToTensor``, normalisation) on tiny files
written in each real format, and the time one pass over the full training set takes at that rate.
(2) Training: the time of one SGD step (forward, backward, update) of each model at each input
shape, per sample, measured at ``--batch`` samples, and what [ACU] App. E.1's recipe costs at that
rate: pre-training the backbone for 300 epochs on the base samples (a fifth of the training set),
and one epoch over the stream (the other four fifths). CPU step times grow about linearly with the
batch, so the per-sample time is the figure that extrapolates; a GPU is needed for every row
whose pre-training estimate runs into hours.

    python benchmarks/datasets.py [--batch 32] [--steps 3] [--per-class 50]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from time import perf_counter

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_unlearn_bench.datasets import ACU_BASE_FRACTION, BENCHMARKS, load_dataset
from lightning_unlearn_bench.fake_data import write_fake_dataset
from lightning_unlearn_bench.models import ACU_PRETRAIN, MODELS, build_model

#: training-set sizes of the real datasets
FULL_TRAIN = {
    "split-mnist": 60_000,
    "split-fmnist": 60_000,
    "split-svhn": 73_257,
    "split-cifar10": 50_000,
    "split-cifar100": 50_000,
    "split-tinyimagenet": 100_000,
}


def reading_rate(name: str, per_class: int) -> float:
    """Images per second read by the real reader from tiny files in ``name``'s format."""
    with tempfile.TemporaryDirectory() as root:
        write_fake_dataset(name, root, per_class=per_class)
        dataset = load_dataset(name, root)
        start = perf_counter()
        n = sum(len(batch[1]) for batch in DataLoader(dataset, batch_size=256))
        return n / (perf_counter() - start)


def step_seconds(model: nn.Module, in_shape: tuple[int, ...], num_classes: int, batch: int, steps: int) -> float:
    """Median wall time of one SGD step on random inputs (after one warm-up step)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x, y = torch.randn(batch, *in_shape), torch.randint(num_classes, (batch,))
    times = []
    for _ in range(steps + 1):
        start = perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=20, help="images per class of the files read")
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {args.batch}", file=sys.stderr)

    print("\n| benchmark | images/s read | one pass over the full training set |")
    print("|---|---:|---:|")
    for name in BENCHMARKS:
        rate = reading_rate(name, args.per_class)
        print(f"| {name} | {rate:,.0f} | {hours(FULL_TRAIN[name] / rate)} |", flush=True)

    epochs = ACU_PRETRAIN["epochs"]
    print(f"\n| model | input | ms/sample (step) | pre-train {epochs} epochs on the base | one stream epoch |")
    print("|---|---|---:|---:|---:|")
    shapes = {
        "(1, 28, 28)": ("split-mnist", (1, 28, 28)),
        "(3, 32, 32)": ("split-cifar10", (3, 32, 32)),
        "(3, 64, 64)": ("split-tinyimagenet", (3, 64, 64)),
    }
    for model_name in MODELS:
        for label, (name, shape) in shapes.items():
            classes = BENCHMARKS[name].num_classes
            per_sample = step_seconds(build_model(model_name, classes, shape), shape, classes, args.batch, args.steps)
            per_sample /= args.batch
            base = ACU_BASE_FRACTION * FULL_TRAIN[name]
            stream = FULL_TRAIN[name] - base
            print(
                f"| {model_name} | {label} {name} | {1000 * per_sample:.2f} | {hours(epochs * base * per_sample)} "
                f"| {hours(stream * per_sample)} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
