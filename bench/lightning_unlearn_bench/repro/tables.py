"""A run's results and their text: one table per setup and request set (``ours (paper)``), the Markdown summary."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_unlearn_bench.report import format_table
from lightning_unlearn_bench.repro.schema import ReproConfig, Scale, Setup

if TYPE_CHECKING:
    from lightning_unlearn_bench.report import Report


@dataclass
class SetupResult:
    """One setup's reports (by request label), table rows and wall times (by phase). A request set whose every
    method refused has rows (the refused ones) but no report."""

    setup: Setup
    scale: Scale
    reports: dict[str, Report]
    rows: list[dict[str, Any]]
    seconds: dict[str, float]

    @property
    def labels(self) -> list[str]:
        """The request sets with a row, in the order they ran: one table each."""
        return list(dict.fromkeys(r["requests"] for r in self.rows))


@dataclass
class ReproResult:
    """What :func:`run_config` measured: per-setup results, the formatted tables, files written, total time."""

    config: ReproConfig
    smoke: bool
    setups: list[SetupResult]
    tables: list[str]
    paths: list[Path]
    seconds: float

    @property
    def refused(self) -> list[str]:
        """``<setup> <request set> <paper row>: <reason>`` for every row whose method refused a certified release."""
        return [
            f"{s.setup.label} {r['requests']} {r['paper_row']}: {r['refused']}"
            for s in self.setups
            for r in s.rows
            if r.get("refused")
        ]


def _number(value: float) -> str:
    """An accuracy in %, blank when there is none (a refused row)."""
    return "" if math.isnan(value) else f"{value:.2f}"


def _cell(ours: float, paper: float) -> str:
    if math.isnan(ours):
        return "-" if math.isnan(paper) else f"- ({paper:.2f})"
    text = f"{ours:.3g}" if abs(ours) < 0.01 and ours != 0 else f"{ours:.2f}"
    return text if math.isnan(paper) else f"{text} ({paper:.2f})"


def format_comparison(config: ReproConfig, result: SetupResult, label: str) -> str:
    """The table of one setup and request set: ``ours (paper)`` per column, the reference with its own accuracies."""
    head = ["method", "retain%", "forget%", "test%", *config.columns, "guarantee"]
    body = [
        [
            f"{r['method']} [{r['paper_row']}]",
            *(_number(r[key]) for key in ("retain_acc", "forget_acc", "test_acc")),
            *(_cell(r[c], r[f"paper {c}"]) for c in config.columns),
            r["guarantee"],
        ]
        for r in result.rows
        if r["requests"] == label
    ]
    title = (
        f"{config.paper} {config.table}, {result.setup.label}, {label} ({result.scale.dataset}, {result.scale.model}): "
        f"ours (paper); {_reading(config, result.reports.get(label))}"
    )
    return format_table(head, body, title=title)


def _reading(config: ReproConfig, report: Report | None) -> str:
    """How a table's columns read the requests (``mean over the requests``, ``at the end of the stream``, ...)."""
    if config.aggregate == "last" and report is not None and report.end_rows:
        n = report.end_rows[0]["after_request"]
        return f"at the end of the stream, tasks learned after the last of {n} requests (time: their total)"
    return f"{config.aggregate} over the requests"


def _markdown(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def summary_markdown(
    config: ReproConfig, results: Sequence[SetupResult], smoke: bool, seconds: float, *, seed: int | None = None
) -> str:
    """The run's Markdown summary: one table per setup and request set, the protocol, notes and wall times."""
    parts = [
        f"# {config.name}: {config.paper} {config.table}{' (CPU smoke scale)' if smoke else ''}",
        "",
        config.protocol,
        "",
        "Cells are `ours (paper)`; accuracies in %, gaps in percentage points to retraining from scratch "
        "(the reference row shows its own accuracies).",
    ]
    if seed is not None:
        parts += ["", f"Seed {seed}; the exact recipe is `recipe.yaml` (each row's digest: `paper_vs_ours.csv`)."]
    for res in results:
        for label in res.labels:
            head = ["method", "paper row", "retain%", "forget%", "test%", *config.columns, "guarantee"]
            body = [
                [
                    r["method"],
                    r["paper_row"],
                    *(_number(r[key]) for key in ("retain_acc", "forget_acc", "test_acc")),
                    *(_cell(r[c], r[f"paper {c}"]) for c in config.columns),
                    r["guarantee"],
                ]
                for r in res.rows
                if r["requests"] == label
            ]
            parts += [
                "",
                f"## {res.setup.label}, {label}",
                "",
                f"{res.scale.dataset}, {res.scale.model}; paper numbers: {res.setup.source}; columns "
                f"{_reading(config, res.reports.get(label))}; run time {res.seconds[label]:.1f} s "
                f"(data {res.seconds['data']:.1f} s)",
                "",
                _markdown(head, body),
            ]
    if config.notes:
        parts += ["", "## Notes", "", *(f"- {n}" for n in config.notes)]
    parts += ["", f"Total wall time: {seconds:.1f} s", ""]
    return "\n".join(parts)
