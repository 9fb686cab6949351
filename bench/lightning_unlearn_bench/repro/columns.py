"""How each paper column is computed from the harness's per-request rows, and the rows of ours next to the paper's."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lightning_unlearn_bench.repro.schema import ReproConfig, Setup

if TYPE_CHECKING:
    from lightning_unlearn_bench.report import Report


# -- columns: how each paper column is computed from the harness's per-request rows ---------------------------------
def _gap(key: str) -> Callable[[Mapping[str, Any], Mapping[str, Any]], float]:
    return lambda row, ref: 100.0 * float(row[key])


def _acc(key: str) -> Callable[[Mapping[str, Any], Mapping[str, Any]], float]:
    return lambda row, ref: 100.0 * float(row[key])


def _disparity(row: Mapping[str, Any], ref: Mapping[str, Any]) -> float:
    """[RBM] Section 5.2 "Avg. Disparity": mean |ours - retrain| over UA, MIA-Efficacy, RA and TA (pp)."""
    keys = ("forget_acc", "mia", "retain_acc", "test_acc")
    return sum(100.0 * abs(float(row[k]) - float(ref[k])) for k in keys) / len(keys)


def _speedup(row: Mapping[str, Any], ref: Mapping[str, Any]) -> float:
    """[HF] Tables 2 and 6 "Speedup": the reference's retraining time over the method's time per request (a row of
    :func:`evaluate_last` holds the total over its ``n_requests``; the reference retrained once)."""
    return float(ref["time_s"]) / (float(row["time_s"]) / int(row.get("n_requests", 1)))


#: column name -> (value from a method's row and its reference's row at the same request, is it a gap)
COLUMNS: dict[str, tuple[Callable[[Mapping[str, Any], Mapping[str, Any]], float], bool]] = {
    "dParams": (lambda row, ref: float(row["l2_to_retrain"]), True),
    "dRetain": (_gap("retain_acc_gap"), True),
    "dForget": (_gap("forget_acc_gap"), True),
    "dTest": (_gap("test_acc_gap"), True),
    "dMIA": (lambda row, ref: float(row["mia_gap"]), True),
    "RA": (_acc("retain_acc"), False),
    "FA": (_acc("forget_acc"), False),
    "TA": (_acc("test_acc"), False),
    "UA": (lambda row, ref: 100.0 * (1.0 - float(row["forget_acc"])), False),
    "MIA": (_acc("mia"), False),
    "MIA-Efficacy": (lambda row, ref: 100.0 * (1.0 - float(row["mia"])), False),
    "Disparity": (_disparity, True),
    "TestGap": (lambda row, ref: 100.0 * (float(row["test_acc"]) - float(ref["test_acc"])), True),
    "Distance": (lambda row, ref: float(row["l2_to_retrain"]), True),
    "Time(s)": (lambda row, ref: float(row["time_s"]), False),
    "s/sample": (lambda row, ref: float(row["time_s"]) / max(1, int(row["n_removed"])), False),
    "Speedup": (_speedup, True),
    "Precompute(s)": (lambda row, ref: float(row["precompute_s"]), True),
    "Storage(GB)": (lambda row, ref: float(row["storage_bytes"]) / 1e9, True),
    "MIA-L": (lambda row, ref: float(row["lira_auc"]), False),
}
#: columns summed (not averaged) over the requests: a paper's total runtime
SUMMED = frozenset({"Time(s)"})
#: columns plotted on a log axis (when all their values are positive): costs and ratios of them
LOG_COLUMNS = frozenset({"Time(s)", "s/sample", "Speedup", "Precompute(s)", "Storage(GB)"})
#: columns of the requests' cost: read from the request rows even when the others are read at the end of the stream
COSTS = frozenset({"Time(s)", "Speedup", "Precompute(s)", "Storage(GB)", "s/sample"})


def _aggregate(values: Sequence[float], column: str, how: str) -> float:
    if column in SUMMED:
        return float(sum(values))
    return float(values[-1]) if how == "last" else float(sum(values) / len(values))


def comparison_rows(
    config: ReproConfig, setup: Setup, reports: Mapping[str, Report], paper_rows: Mapping[str, str]
) -> list[dict[str, Any]]:
    """One row per (request set, method or reference): ours per column (aggregated over the requests), the
    paper's number, and our absolute retain/forget/test accuracies; ``paper_rows`` names each method's row in the
    paper's table. A method's row carries the seed and recipe digest its harness rows carry.

    With ``aggregate="last"`` and tasks learned after the last request, the columns are read at the end of
    the stream (the report's ``end_rows``), except the requests' costs (:data:`COSTS`, e.g. their total time)."""
    out = []
    for label, report in reports.items():
        for name in report.methods():
            rows = report.table(name)
            refs = [r for r in report.reference_rows if r["method"] == rows[0]["reference"]]
            end = _end_pair(report.end_rows, report.end_reference_rows, name, rows[0]["reference"])
            out.append(_row(config, setup, label, name, paper_rows[name], rows, refs, end, is_reference=False))
        for ref in dict.fromkeys(r["method"] for r in report.reference_rows):
            refs = [r for r in report.reference_rows if r["method"] == ref]
            end = _end_pair(report.end_reference_rows, report.end_reference_rows, ref, ref)
            out.append(_row(config, setup, label, ref, "Retrain", refs, refs, end, is_reference=True))
    return out


def _head(setup: Setup, label: str, name: str, paper_row: str, *, reference: bool, guarantee: str) -> dict[str, Any]:
    """The columns that name a table row: its setup, request set, method, paper row, whether it is a reference,
    and its guarantee."""
    return {
        "setup": setup.label,
        "requests": label,
        "method": name,
        "paper_row": paper_row,
        "reference": reference,
        "guarantee": guarantee,
    }


def refused_row(
    config: ReproConfig, setup: Setup, label: str, name: str, paper_row: str, reason: str, tag: Mapping[str, Any]
) -> dict[str, Any]:
    """The row of a method that refused a certified release: the paper's numbers, ours NaN (shown blank), the
    refusal's first line in ``refused`` and, as ``refused: <reason>``, in ``guarantee``; ``tag``: its seed and
    recipe digest."""
    first = reason.strip().splitlines()[0] if reason.strip() else "refused"
    paper = setup.paper.get((label, paper_row), {})
    row = _head(setup, label, name, paper_row, reference=False, guarantee=f"refused: {first}")
    row.update({key: math.nan for key in ("retain_acc", "forget_acc", "test_acc")})
    for column in config.columns:
        row[column] = math.nan
        row[f"paper {column}"] = paper.get(column, math.nan)
    return {**row, **tag, "refused": first}


def _end_pair(
    rows: Sequence[Mapping[str, Any]], refs: Sequence[Mapping[str, Any]], name: str, ref: str
) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """A method's end-of-stream row and its reference's (``None`` without them)."""
    mine = [r for r in rows if r["method"] == name]
    theirs = [r for r in refs if r["method"] == ref]
    return (mine[0], theirs[0]) if mine and theirs else None


def _row(
    config: ReproConfig,
    setup: Setup,
    label: str,
    name: str,
    paper_row: str,
    rows: Sequence[Mapping[str, Any]],
    refs: Sequence[Mapping[str, Any]],
    end: tuple[Mapping[str, Any], Mapping[str, Any]] | None,
    *,
    is_reference: bool,
) -> dict[str, Any]:
    paper = setup.paper.get((label, paper_row), {})
    guarantee = "/".join(sorted({str(r["certificate"]) for r in rows}))
    row = _head(setup, label, name, paper_row, reference=is_reference, guarantee=guarantee)
    at_end = end if config.aggregate == "last" else None
    for key in ("retain_acc", "forget_acc", "test_acc"):
        values = [float(r[key]) for r in rows]
        row[key] = 100.0 * (float(at_end[0][key]) if at_end else _aggregate(values, key, config.aggregate))
    for column in config.columns:
        fn, is_gap = COLUMNS[column]
        if is_reference and is_gap:
            row[column] = math.nan
        elif at_end and column not in COSTS:
            row[column] = fn(*at_end)
        else:
            row[column] = _aggregate([fn(r, ref) for r, ref in zip(rows, refs)], column, config.aggregate)
        row[f"paper {column}"] = paper.get(column, math.nan)
    for key in ("seed", "recipe"):
        if key in rows[0]:
            row[key] = rows[0][key]
    return row
