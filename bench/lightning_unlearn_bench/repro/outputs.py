"""A setup's files: the harness's per request set, ``paper_vs_ours.csv`` and ``paper_vs_ours.png``."""

from __future__ import annotations

import csv
from pathlib import Path

from lightning_unlearn_bench.plot import write_report
from lightning_unlearn_bench.repro.figures import plot_paper_vs_ours
from lightning_unlearn_bench.repro.journal import slug
from lightning_unlearn_bench.repro.schema import ReproConfig
from lightning_unlearn_bench.repro.tables import SetupResult


def write_setup(config: ReproConfig, result: SetupResult, out: Path, *, figures: bool = True) -> list[Path]:
    """A setup's files: the harness's per request set, ``paper_vs_ours.csv`` and (``figures``) ``paper_vs_ours.png``
    and the harness's accuracy plots."""
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for label, report in result.reports.items():
        paths += write_report(report, out, stem=f"{slug(label)}_", figures=figures)
    table = out / "paper_vs_ours.csv"
    keys = list(dict.fromkeys(k for r in result.rows for k in r))
    with table.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(result.rows)
    paths.append(table)
    if figures:
        paths.append(plot_paper_vs_ours(config, result, out / "paper_vs_ours.png"))
    return paths
