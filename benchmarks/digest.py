"""The ledger's weights digest: SHA-256 vs BLAKE3 vs BLAKE2b (vs the former XXH3-128) on a resnet18 (issue 20).

Each ledger entry pins the weights a request published with a digest of the module's ``state_dict``
(names, dtypes, shapes and bytes of every tensor, :func:`lightning_unlearn.core.digest.weights_digest`).
A tamper-evidence digest must be collision-resistant; this measures what that costs per request on
torchvision's resnet18 (11.7M parameters and buffers, 44.7 MiB float32). Each variant hashes the same
bytes the same way (one ``update`` per tensor); reported is the best of ``--repeat`` runs, its
throughput, and the ratio to SHA-256. ``blake3`` (a registry package, Rust) runs single-threaded and
with its own thread pool (``max_threads=AUTO``); the 2 CPU cores of this machine are shared.

    python benchmarks/digest.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable
from typing import Any

import torch
import torchvision
import xxhash

from lightning_unlearn.core.digest import state_bytes

Hasher = Callable[[], Any]


def hashers() -> dict[str, Hasher]:
    out: dict[str, Hasher] = {
        "sha256 (hashlib)": hashlib.sha256,
        "blake2b (hashlib)": hashlib.blake2b,
    }
    try:
        import blake3
    except ImportError:  # the benchmark's optional dependency: pip install blake3
        print("blake3 is not installed (pip install blake3): its rows are skipped")
    else:
        out["blake3 (1 thread)"] = blake3.blake3
        out["blake3 (AUTO threads)"] = lambda: blake3.blake3(max_threads=blake3.blake3.AUTO)
    out["xxh3-128 (former, not cryptographic)"] = xxhash.xxh3_128
    return out


def best_time(make: Hasher, chunks: list[bytes | memoryview], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        h = make()
        for c in chunks:
            h.update(c)
        h.hexdigest()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    module = torchvision.models.resnet18(num_classes=1000)
    start = time.perf_counter()
    chunks = list(state_bytes(module))
    extract = time.perf_counter() - start
    size = sum(len(c) for c in chunks)
    params = sum(t.numel() for t in module.state_dict().values())
    print(
        f"resnet18 state_dict: {params / 1e6:.2f}M values, {size / 2**20:.1f} MiB; extracting the bytes {extract:.4f} s"
    )
    times = {name: best_time(make, chunks, args.repeat) for name, make in hashers().items()}
    ref = times["sha256 (hashlib)"]
    print(f"{'digest':<38} {'best s':>8} {'MiB/s':>8} {'/ sha256':>9}")
    for name, t in times.items():
        print(f"{name:<38} {t:8.4f} {size / 2**20 / t:8.0f} {t / ref:9.2f}")


if __name__ == "__main__":
    main()
