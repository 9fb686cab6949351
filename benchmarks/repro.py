"""Every reproduction config's CPU smoke run (tables and times), and what each full-scale run costs.

Part 1 runs ``lightning-unlearn reproduce <config> --smoke`` for every config of
:mod:`lightning_unlearn_bench.papers` and prints its tables with the wall and CPU time it took.

Part 2 estimates each full-scale run from its protocol: the training sample-passes it makes (every
method learns the stream itself, its reference learns it and retrains after every request, or once
with ``compare="last"``; trained baselines run their unlearning epochs per request; [ACU]'s backbone
is pre-trained for 300 epochs; HF's recorder adds 3.1 steps per tracked vector and step, and NS/IJ's
dense Hessian d Hessian-vector products over the data (the d x d factorisations are not counted); a
table with MIA-L trains 4 LiRA shadows per reference; evaluation forward passes count a third of a step), times the
per-sample SGD step time of its model measured here on the CPU. The GPU figure scales that by the
ratio of the measured CPU time to a GPU rate anchored on the papers' own measurement: [HF] Table 3
retrains ResNet-18 on CIFAR-10 (40 epochs, 49,950 samples) in 468.65 s on an RTX 4090, i.e.
about 4,260 samples/s; smaller models are assumed to keep their CPU cost ratio to ResNet-18 (an
optimistic assumption for tiny models, which a GPU runs far below its peak), plus 3 ms of loop
overhead per step at the setup's batch size. [interp] estimates, not measurements of a full run.

    python benchmarks/repro.py [--out outputs/repro] [--skip-smoke] [--configs acu-table1,...]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

from lightning_unlearn_bench.papers import CONFIGS
from lightning_unlearn_bench.repro import LIRA_SHADOWS, ReproConfig, Scale, Setup, classifier, run_config

for noise in (
    ".*does not have many workers.*",
    ".*no `val_dataloader`.*",
    ".*module\\(s\\) in eval mode.*",
    ".*smaller than the logging interval.*",
    ".*LeafSpec.*",
    ".*HF deletion capacity exceeded.*",
):
    warnings.filterwarnings("ignore", noise)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

#: training-set sizes of the real datasets (test sets: 10,000 unless a scale caps them)
FULL_TRAIN = {
    "split-mnist": 60_000,
    "split-fmnist": 60_000,
    "split-cifar10": 50_000,
    "split-cifar100": 50_000,
    "split-tinyimagenet": 100_000,
    "lfw-people": 1_000,  # the 29 people's images outside the held-out fifth
    "celeba-gender": 162_770,
}
SHAPES = {
    "split-mnist": (1, 28, 28),
    "split-fmnist": (1, 28, 28),
    "split-cifar10": (3, 32, 32),
    "split-cifar100": (3, 32, 32),
    "split-tinyimagenet": (3, 64, 64),
    "lfw-people": (3, 224, 224),
    "celeba-gender": (3, 128, 128),
}
#: [HF] Table 3: ResNet-18, CIFAR-10, 40 epochs x 49,950 samples retrained in 468.65 s (RTX 4090)
GPU_RESNET18_CIFAR = 40 * 49_950 / 468.65
#: wall time of one training step beyond its arithmetic (Lightning loop, loader, optimizer launch) [interp]
STEP_OVERHEAD_S = 0.003
#: trained baselines' unlearning epochs by registered name, when a config does not set them ([ACU] App. E.3)
UNLEARN_EPOCHS = {"finetune": 10, "l1_sparse": 10, "neggrad": 5, "neggrad_plus": 10, "scrub": 5, "randomlabel": 10}
#: cost of one learning pass relative to an SGD step: ACU's analytic fit is a forward pass
LEARN_FACTOR = {"acu": 1 / 3}
#: HF's recorder per tracked vector and step, in SGD steps: 0.77 Hessian-vector products (chunks of 4 vectors) of
#: 4.06 steps each, measured on resnet18 by benchmarks/hf_recording.py and applied to every model [interp] (the
#: smoke runs' Precompute(s) give ~0.5 for the linear model and ~14 for the small CNN, whose steps are overhead)
HF_STEPS_PER_VECTOR = 0.77 * 4.06


def step_seconds(model: nn.Module, shape: tuple[int, ...], batch: int = 32, steps: int = 3) -> float:
    """Median time of one SGD step per sample (after a warm-up step), on random inputs."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, *shape), torch.randint(10, (batch,))
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2] / batch


def passes(config: ReproConfig, setup: Setup, d: int) -> float:
    """Training sample-passes (SGD-step equivalents) of one setup at full scale (``d``: the model's parameters)."""
    scale = setup.full
    n = scale.train_size or FULL_TRAIN[scale.dataset] * (0.8 if scale.pretrain_epochs else 1.0)
    n_test = scale.test_size or 10_000
    total = scale.pretrain_epochs * 0.2 * FULL_TRAIN[scale.dataset]
    lbfgs = 2 * 200 if setup.protocol == "tasks" else 1  # [CCL]: 2 L-BFGS steps of up to 200 iterations per task
    analytic = config.name == "acu-table1"
    learn = n * (1 if analytic else scale.epochs * lbfgs)
    for requests in scale.requests:
        k = len(requests.tasks) or requests.k
        forgotten = (requests.per_request or 0) * k or (requests.fraction or 0.25) * n
        if requests.kind == "class":
            forgotten = n / 10
        retrains = k if requests.compare == "each" else 1
        total += learn + retrains * learn  # the reference learns, then retrains
        if "MIA-L" in config.columns:  # offline LiRA: every reference trains LIRA_SHADOWS shadow models
            total += LIRA_SHADOWS * learn
        for entry in setup.methods:
            factor = LEARN_FACTOR.get(entry.name, 1 / 3 if analytic else 1.0)
            if entry.name == "hf":  # every tracked vector follows the whole trajectory ([HF] Alg. 1)
                factor += HF_STEPS_PER_VECTOR * (forgotten if entry.options.get("track") == "scheduled" else n)
            total += factor * learn
            if entry.name in ("ns", "ij"):  # the dense Hessian: d Hessian-vector products over the n samples
                total += d * HF_STEPS_PER_VECTOR / 0.77 * n
            epochs = entry.options.get("epochs", UNLEARN_EPOCHS.get(entry.name, 0))
            # unlearning epochs over the retained set, per request (on ACU's frozen backbone: forward passes only)
            total += epochs * (n - forgotten / 2) * k * (1 / 3 if analytic else 1.0)
            evals = k if requests.compare == "each" else 1
            total += evals * (n + n_test) / 3  # metrics: forward passes
    return total


def model_rates(setups: list[tuple[ReproConfig, Setup]]) -> dict[tuple[str, str], tuple[float, float]]:
    """(model, dataset) -> (CPU seconds per sample-pass measured here, GPU seconds estimated)."""
    keys = sorted({(s.full.model, s.full.dataset) for _, s in setups})
    ref = step_seconds(classifier("resnet18", 10, (3, 32, 32), 0), (3, 32, 32))
    out = {}
    for model, dataset in keys:
        shape = SHAPES[dataset]
        width = next(s.full.width for _, s in setups if (s.full.model, s.full.dataset) == (model, dataset))
        cpu = step_seconds(classifier(model, 10, shape, width), shape)
        out[(model, dataset)] = (cpu, cpu / ref / GPU_RESNET18_CIFAR)
    return out


def hours(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def estimate(names: list[str]) -> str:
    setups = [(CONFIGS[n], s) for n in names for s in CONFIGS[n].setups]
    rates = model_rates(setups)
    lines = [
        "| config | setup | model, dataset | CPU ms/sample (measured) | sample-passes | CPU (est.) | GPU (est.) "
        "| GPU? |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for config, setup in setups:
        scale: Scale = setup.full
        cpu, gpu = rates[(scale.model, scale.dataset)]
        classes = 2 if scale.dataset == "celeba-gender" else 10
        d = sum(p.numel() for p in classifier(scale.model, classes, SHAPES[scale.dataset], scale.width).parameters())
        p = passes(config, setup, d)
        steps = p / min(scale.batch_size, scale.train_size or FULL_TRAIN[scale.dataset])
        cpu_s, gpu_s = p * cpu + steps * STEP_OVERHEAD_S, p * gpu + steps * STEP_OVERHEAD_S
        need = "yes" if cpu_s > 3600 else "no"
        lines.append(
            f"| {config.name} | {setup.label} | {scale.model}, {scale.dataset} | {1000 * cpu:.3f} | {p:.3g} "
            f"| {hours(cpu_s)} | {hours(gpu_s)} | {need} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("outputs") / "repro")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--skip-smoke", action="store_true")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: stable times on shared cores)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    if not args.skip_smoke:
        rows = []
        for name in names:
            wall, cpu = time.perf_counter(), time.process_time()
            result = run_config(CONFIGS[name], smoke=True, out=args.out / name)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            print(f"\n## {name} (smoke): {wall:.1f} s wall, {cpu:.1f} s CPU\n", flush=True)
            print("\n\n".join(result.tables), flush=True)
            rows.append(f"| {name} | {wall:.1f} | {cpu:.1f} |")
        print("\n| config (smoke) | wall s | CPU s |\n|---|---:|---:|\n" + "\n".join(rows))
    print(f"\nFull scale, estimated ({torch.get_num_threads()} CPU thread(s)):\n", file=sys.stderr)
    print(estimate(names))


if __name__ == "__main__":
    main()
