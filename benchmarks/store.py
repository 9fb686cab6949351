"""Checkpoint of a TrajectoryRecorder: in-memory store vs memory-mapped store (issue 12 benchmark).

For a store of ``rows x dim`` float32 vectors (default 4096 x 18,000 = 281 MiB), each variant runs in
a fresh process: build the recorder's store (rows filled with random values, as after a fit), then
``torch.save(recorder.state_dict())``. Reported: the checkpoint file size, the peak RSS growth
during the save (``ru_maxrss`` after minus before), and the wall time of ``state_dict`` + save.
The memory-mapped checkpoint holds a reference to the file and a BLAKE3 digest of its rows,
so its size and RAM growth do not scale with the store; loading it re-hashes the file (timed too).

    python benchmarks/store.py [--rows 4096] [--dim 18000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lightning_unlearn.callbacks import TrajectoryRecorder


def run(kind: str, rows: int, dim: int, workdir: Path) -> dict[str, float]:
    """One variant (in its own process, so that peak RSS is its own)."""
    kw = {"store": "mmap", "path": workdir / "store.bin", "capacity": rows} if kind == "mmap" else {}
    rec = TrajectoryRecorder(dtype=torch.float32, **kw)
    rec._allocate(list(range(rows)), dim)  # the rows a fit would have allocated
    g = torch.Generator().manual_seed(0)
    for block in torch.arange(rows).split(256):
        rec.A[block] = torch.randn(len(block), dim, generator=g)
    rec.l2, rec.lrs, rec.batch_sizes = 0.1, [0.1], [rows]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    ckpt = workdir / f"{kind}.ckpt"
    torch.save(rec.state_dict(), ckpt)
    save_s = time.perf_counter() - start
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    state = torch.load(ckpt, weights_only=True)
    rec.close()
    start = time.perf_counter()
    TrajectoryRecorder(dtype=torch.float32, **kw).load_state_dict(state)
    load_s = time.perf_counter() - start
    return {
        "store_mib": rows * dim * 4 / 2**20,
        "ckpt_mib": ckpt.stat().st_size / 2**20,
        "rss_growth_mib": rss_growth / 1024,
        "save_s": save_s,
        "load_s": load_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=18_000)
    parser.add_argument("--child", choices=["memory", "mmap"])
    parser.add_argument("--workdir")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run(args.child, args.rows, args.dim, Path(args.workdir))))
        return
    print(f"{'store':>7} {'store MiB':>10} {'ckpt MiB':>10} {'RSS growth MiB':>15} {'save s':>8} {'load s':>8}")
    for kind in ("memory", "mmap"):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, __file__, "--child", kind, "--rows", str(args.rows), "--dim", str(args.dim)]
            out = subprocess.run([*cmd, "--workdir", tmp], check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
        sizes = f"{r['store_mib']:10.1f} {r['ckpt_mib']:10.3f} {r['rss_growth_mib']:15.1f}"
        print(f"{kind:>7} {sizes} {r['save_s']:8.3f} {r['load_s']:8.3f}")


if __name__ == "__main__":
    main()
