"""Run one reproduction config into ``benchmarks/results/<config>/`` and record how it ran (issue 21).

Runs ``lightning-unlearn reproduce CONFIG --out RESULTS/CONFIG --resume --progress false [ARGS...]`` in a child
process (same interpreter), measures its wall time and its CPU time (user + system of the child and every process
it waited for, e.g. DDP ranks: ``resource.getrusage(RUSAGE_CHILDREN)``; on a shared machine the CPU time is the
comparable figure), appends one line per invocation to ``RESULTS/CONFIG/runs.csv`` and writes
``RESULTS/CONFIG/README.md``: every invocation (exact command, UTC date, machine, wall and CPU seconds, rows run)
and the tables of the ``summary.md`` the command wrote (cells ``ours (paper)``). ``--resume`` makes a stopped run
continue where it stopped, and a second invocation with other ``--setups`` add its setups to the same tables
(pass every setup label run so far: ``summary.md`` holds the setups of the last invocation).

    python benchmarks/tables.py hf-table2 -- --setups '["MNIST LR"]'
    python benchmarks/tables.py safe-table1 --results /tmp/res -- --root ~/data --trainer.accelerator gpu
    python benchmarks/tables.py hf-table2 --dry-run -- --setups '["MNIST LR"]'   # print the command only

The GPU configs: ``benchmarks/gpu_tables.sh``.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import resource
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

RUN_FIELDS = ("date_utc", "command", "exit", "wall_s", "cpu_s", "machine")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("config", help="a name of `lightning-unlearn reproduce --list` or a YAML file")
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"), help="parent of <config>/")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing, write nothing")
    parser.epilog = "after --: more `reproduce` options (--root, --setups, --trainer.*)"
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    ns = parser.parse_args(argv[:cut])
    ns.args = argv[cut + 1 :]
    return ns


def command(ns: argparse.Namespace) -> list[str]:
    """The ``reproduce`` invocation: results in ``RESULTS/<config>``, resumable, one line per stage."""
    if any(a == "--out" or a.startswith("--out=") for a in ns.args):
        raise SystemExit("tables.py: --out is RESULTS/<config>; choose its parent with --results")
    out = ns.results / Path(ns.config).stem
    script = Path(sys.executable).with_name("lightning-unlearn")  # unlike `python -m`, keeps PYTHONPATH first
    launch = [str(script)] if script.exists() else [sys.executable, "-m", "lightning_unlearn_bench"]
    return [
        *launch, "reproduce", ns.config,
        "--out", str(out), "--resume", "--progress", "false", *ns.args,
    ]  # fmt: skip


def machine() -> str:
    """CPU count and, with CUDA, the GPUs' names: where the times were measured."""
    text = f"{platform.machine()}, {os.cpu_count()} CPU(s)"
    try:
        import torch

        if torch.cuda.is_available():
            text += ", " + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except ImportError:  # pragma: no cover (torch is a dependency)
        pass
    return text


def run(cmd: Sequence[str]) -> tuple[int, float, float]:
    """Exit code, wall seconds and CPU seconds (user + system) of ``cmd`` and the processes it waited for.

    A SIGTERM sent to this process (``kill``) goes on to ``cmd``, which stops at once keeping its finished rows
    (``reproduce`` exits 143); this process waits for it and records the invocation as any other. A ``cmd`` ended
    by a signal ``n`` has exit code ``128 + n``, as a shell reports it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    children: list[subprocess.Popen[bytes]] = []
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        for child in children:
            child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        children.append(subprocess.Popen(list(cmd)))
        if received:  # arrived while the child was being started
            children[0].send_signal(received[0])
        code = children[0].wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    code = 128 - code if code < 0 else code
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, wall, cpu


def record(out: Path, row: dict[str, str]) -> None:
    """Append one invocation to ``out/runs.csv``."""
    path = out / "runs.csv"
    new = not path.exists()
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=RUN_FIELDS)
        if new:
            writer.writeheader()
        writer.writerow(row)


def tables_of(summary: str) -> str:
    """``summary.md`` from its first table section to its notes (the notes stay in ``summary.md``)."""
    start = summary.find("\n## ")
    end = summary.find("\n## Notes")
    return summary[start : end if end > 0 else len(summary)].strip() if start >= 0 else "(no table written)"


def write_readme(out: Path, config: str) -> Path:
    """``out/README.md`` from ``out/runs.csv`` and ``out/summary.md``."""
    with (out / "runs.csv").open(newline="") as fh:
        runs = list(csv.DictReader(fh))
    summary = (out / "summary.md").read_text() if (out / "summary.md").exists() else ""
    lines = [
        f"# `{config}` results",
        "",
        "Written by `benchmarks/tables.py` (the commands below, run from the repository root; `--resume` skips rows"
        " an earlier invocation finished). Cells are `ours (paper)`. The protocol, the paper's numbers and the notes"
        " on where and why ours differ: `summary.md` (and the config's `notes`); the exact recipe: `recipe.yaml`;"
        " per setup: `paper_vs_ours.csv`/`.png`, the per-request CSVs and accuracy plots.",
        "",
        "| date (UTC) | command | exit | wall (s) | CPU (s) | machine |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['date_utc']} | `{r['command']}` | {r['exit']} | {r['wall_s']} | {r['cpu_s']} | {r['machine']} |"
            for r in runs
        ),
        "",
        tables_of(summary),
        "",
    ]
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse(sys.argv[1:] if argv is None else argv)
    cmd = command(ns)
    shown = shlex.join(["lightning-unlearn", *cmd[cmd.index("reproduce") :]])
    if ns.dry_run:
        print(shown)
        return 0
    out = ns.results / Path(ns.config).stem
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    code, wall, cpu = run(cmd)
    out.mkdir(parents=True, exist_ok=True)
    record(out, {"date_utc": date, "command": shown, "exit": str(code), "wall_s": f"{wall:.0f}",
                 "cpu_s": f"{cpu:.0f}", "machine": machine()})  # fmt: skip
    print(f"{shown}: exit {code}, wall {wall:.0f} s, CPU {cpu:.0f} s; wrote {write_readme(out, ns.config)}")
    if code == 128 + signal.SIGTERM:
        print("stopped by SIGTERM: run this script again as it was run to continue (it resumes, keeping every row)")
    return code


if __name__ == "__main__":
    sys.exit(main())
