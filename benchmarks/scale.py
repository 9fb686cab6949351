"""The certified softmax head at CIFAR-100-feature size and beyond, on 1 and 2 processes (rows sharded, gloo).

Synthetic non-negative features (a ReLU of class means plus unit noise, the last feature a constant 1 for the bias)
for ``n`` samples, ``p`` features and ``K`` classes; ``l2 = 1e-3``, ``radius = 2e-4`` (the recorder's defaults of
``docs/certified_head.md``). Each process generates only its share of the rows (``i % R == rank``, as a DDP fit
leaves them) and runs the solver path of ``SoftmaxHeadRecorder`` + ``ResolveUnlearner`` (functional/convex.py: the
curvature and sums downdated by the removed rows, Newton-CG from the current head, every product all-reduced),
without Lightning: a cold solve from zero, a single-sample request, a 1% request (each from the cold solve's head).
One torch thread per process, so 2 processes use 2 cores. Each configuration runs in fresh processes, so the peak
RSS (``ru_maxrss``, the largest over the ranks) is its own.

Columns: ``cold_s`` (curvature built and solved from zero), ``pass_s`` (one gradient pass over the rows),
``request_s``/``request_passes`` (a single-sample request), ``batch_s``/``batch_passes`` (1% of the rows),
``*_over_pass`` (seconds in units of one gradient pass), ``peak_rss_gb_per_rank`` (the largest over the ranks) and
``base_rss_gb`` (rank 0 before any row: Python, torch and the process group), ``*_cpu_s`` (the CPU seconds of the
step, the largest over the ranks: what each rank computes, whatever else shares the cores).

Run: ``python benchmarks/scale.py`` (writes ``benchmarks/results/scale.csv``); ``--sizes 20000`` for a quick look;
``--device cuda --backend nccl`` on a GPU host (``benchmarks/scale_gpu.sh``).
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_unlearn.functional import convex

L2, RADIUS = 1e-3, 2e-4
BLOCK = 8192  # rows generated at a time
COLUMNS = [
    "n", "p", "K", "ranks", "row_dtype", "device", "cold_s", "cold_passes", "pass_s", "requests", "request_s",
    "request_passes", "request_passes_max", "request_over_pass", "batch_s", "batch_passes", "batch_over_pass",
    "peak_rss_gb_per_rank", "base_rss_gb", "peak_added_gb_per_rank", "cold_cpu_s", "request_cpu_s", "batch_cpu_s",
]  # fmt: skip


def shard(n: int, p: int, K: int, rank: int, world: int, dtype: torch.dtype, device: str) -> tuple:
    """This rank's rows ``i % world == rank`` of the synthetic data, generated block by block into their final
    tensors (the others' rows are never kept)."""
    means = torch.randn(K, p, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.5
    ids = torch.arange(rank, n, world)
    features = torch.empty(len(ids), p, dtype=dtype, device=device)
    labels = torch.empty(len(ids), dtype=torch.long, device=device)
    at = 0
    for start in range(0, n, BLOCK):
        g = torch.Generator().manual_seed(1 + start // BLOCK)
        idx = torch.arange(start, min(start + BLOCK, n))
        y = torch.randint(0, K, (len(idx),), generator=g)
        A = torch.randn(len(idx), p, generator=g, dtype=torch.float64).add_(means[y]).relu_()  # in place: one block
        A[:, -1] = 1.0
        mine = idx % world == rank
        m = int(mine.sum())
        features[at : at + m], labels[at : at + m] = A[mine].to(device), y[mine].to(device)
        at += m
    return features, labels, ids


CPU: dict[str, float] = {}  # CPU seconds of this process per timed step


def timed(fn, device: str, name: str = ""):  # type: ignore[no-untyped-def]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    CPU[name] = time.process_time() - cpu
    return out, time.perf_counter() - start


def request(problem, curvature, solution, ids: torch.Tensor, forget: torch.Tensor, device: str, name: str):  # type: ignore[no-untyped-def]
    """One request as ``ResolveUnlearner`` runs it: downdates from the removed rows, Newton-CG from the head."""

    def run():  # type: ignore[no-untyped-def]
        drop = torch.isin(ids, forget).to(problem.features.device)
        kept = problem.restricted(~drop)
        sums = solution.sums.without(problem, drop)
        out = convex.solve(kept, solution.W, L2 * RADIUS, curvature=curvature.restricted(problem, ~drop), sums=sums)
        assert out.converged and out.gradient_norm <= L2 * RADIUS
        return out

    return timed(run, device, name)


def worker(rank: int, world: int, args: argparse.Namespace, port: int, out: str) -> None:
    torch.set_num_threads(args.threads)
    device = args.device if args.device == "cpu" else f"cuda:{rank}"
    ranks = None
    if world > 1:
        dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

        def all_reduce(t: torch.Tensor) -> torch.Tensor:
            t = t.clone()
            dist.all_reduce(t)
            return t

        ranks = convex.RankSum(all_reduce, world)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # the process before any row (torch, gloo)
    dtype = getattr(torch, args.row_dtype)
    F, y, ids = shard(args.n, args.p, args.K, rank, world, dtype, device)
    problem = convex.SoftmaxProblem(F, y, args.K, L2, ranks=ranks, dtype=torch.float64)
    zero = torch.zeros(args.p, args.K, dtype=torch.float64, device=device)

    def cold():  # type: ignore[no-untyped-def]
        curvature = convex.FeatureCurvature.at(zero, problem)
        return curvature, convex.solve(problem, zero, L2 * RADIUS, curvature=curvature)

    (curvature, solution), cold_s = timed(cold, device, "cold")
    cold_passes = problem.passes
    curvature = convex.FeatureCurvature.at(solution.W, problem)  # as the recorder keeps it after a fit
    _, pass_s = timed(lambda: convex.HeadSums.at(solution.W, problem), device)
    g = torch.Generator().manual_seed(2)
    singles = []  # each from the cold solve's head, as the first request after a fit
    for i, forget in enumerate(torch.randperm(args.n, generator=g)[: args.requests].split(1)):
        singles.append(request(problem, curvature, solution, ids, forget, device, f"request{i}"))
    times = sorted(t for _, t in singles)
    passes = sorted(out.passes for out, _ in singles)
    request_s, request_passes, request_passes_max = times[len(times) // 2], passes[len(passes) // 2], passes[-1]
    CPU["request"] = sorted(CPU.pop(f"request{i}") for i in range(len(singles)))[len(singles) // 2]
    batch_ids = torch.randperm(args.n, generator=g)[: args.n // 100]
    batch, batch_s = request(problem, curvature, solution, ids, batch_ids, device, "batch")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KB -> GB (Linux)
    # the largest over the ranks: peak RSS and CPU seconds (wall seconds depend on what else the cores run)
    peak = torch.tensor(
        [rss, rss - base, CPU["cold"], CPU["request"], CPU["batch"]], dtype=torch.float64, device=device
    )
    if world > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    rss, added, cold_cpu, request_cpu, batch_cpu = peak.tolist()
    if rank == 0:
        row = {
            "n": args.n, "p": args.p, "K": args.K, "ranks": world, "row_dtype": args.row_dtype, "device": args.device,
            "cold_s": round(cold_s, 2), "cold_passes": cold_passes, "pass_s": round(pass_s, 3),
            "requests": args.requests, "request_s": round(request_s, 2), "request_passes": request_passes,
            "request_passes_max": request_passes_max,
            "request_over_pass": round(request_s / pass_s, 1), "batch_s": round(batch_s, 2),
            "batch_passes": batch.passes, "batch_over_pass": round(batch_s / pass_s, 1),
            "peak_rss_gb_per_rank": round(rss, 3), "base_rss_gb": round(base, 3),
            "peak_added_gb_per_rank": round(added, 3),
            "cold_cpu_s": round(cold_cpu, 2), "request_cpu_s": round(request_cpu, 2),
            "batch_cpu_s": round(batch_cpu, 2),
        }  # fmt: skip
        torch.save(row, out)
    if world > 1:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[50_000, 200_000])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--p", type=int, default=512)
    parser.add_argument("--K", type=int, default=100)
    parser.add_argument("--row-dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (rank r on cuda:r)")
    parser.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (GPU)")
    parser.add_argument("--requests", type=int, default=9, help="single-sample requests (median and max reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "scale.csv")
    args = parser.parse_args()
    rows = []
    for n in args.sizes:
        for world in args.ranks:
            args.n = n
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "row.pt")
                mp.spawn(worker, args=(world, args, free_port(), out), nprocs=world, join=True)
                row = torch.load(out, weights_only=True)
            print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
            rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
