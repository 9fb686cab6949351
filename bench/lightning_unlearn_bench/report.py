"""A harness run's results: per-request rows, the Table 1 summary ([ACU] Table 1), CSVs and a text table."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_unlearn.functional.metrics import LIRA_FPRS, tpr_key
from lightning_unlearn.schedule import Schedule

#: summary columns ([ACU] Table 1 plus time) and the per-request metric each averages, with its scale
TABLE1 = {
    "l2_to_retrain": ("l2_to_retrain", 1.0),
    "retain_gap_pp": ("retain_acc_gap", 100.0),
    "forget_gap_pp": ("forget_acc_gap", 100.0),
    "test_gap_pp": ("test_acc_gap", 100.0),
    "mia_gap": ("mia_gap", 1.0),
    "time_per_request_s": ("time_s", 1.0),
}
#: attack results of :func:`~lightning_unlearn.metrics.evaluate_unlearning`: AUCs, and [LiRA]'s TPR at 0.1% and
#: 1% FPR; each method's row also holds ``<name>_retrain``, the same attack on its reference (the retrained
#: model) after the same request
ATTACKS = ("mia_u_direct_diff_auc", "mia_u_euc_dist_auc", "lira_auc", *(f"lira_{tpr_key(f)}" for f in LIRA_FPRS))
#: attack summary columns: the mean over the requests (where the attack is defined) of each AUC, each
#: followed by the same attack's mean on the reference
ATTACK_COLUMNS = tuple(col for name in ATTACKS for col in (name, f"{name}_retrain"))


#: the text table's heads of the attack columns
ATTACK_HEADS = {
    "mia_u_direct_diff_auc": "MIA-U(DD)",
    "mia_u_direct_diff_auc_retrain": "[retr]",
    "mia_u_euc_dist_auc": "MIA-U(Euc)",
    "mia_u_euc_dist_auc_retrain": "[retr]",
    "lira_auc": "LiRA",
    "lira_auc_retrain": "[retr]",
    **{
        col: head
        for f in LIRA_FPRS
        for col, head in ((f"lira_{tpr_key(f)}", f"TPR@{100 * f:g}%"), (f"lira_{tpr_key(f)}_retrain", "[retr]"))
    },
}


@dataclass
class Report:
    """Per-request metrics of every method (``rows``) and of the references (``reference_rows``).

    Each row holds the method, the request (counted from 1), its kind, size, wall time and
    guarantee, and the :func:`evaluate_unlearning` metrics after it (with the gaps to the reference).
    When learning continued after the last request, ``end_rows`` and ``end_reference_rows`` hold the same
    metrics at the end of the stream (with the requests' count ``after_request``, total size and time).
    """

    schedule: Schedule
    rows: list[dict[str, Any]]
    reference_rows: list[dict[str, Any]]
    end_rows: list[dict[str, Any]] = field(default_factory=list)
    end_reference_rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def k(self) -> int:
        return len(self.schedule)

    def methods(self) -> list[str]:
        return list(dict.fromkeys(r["method"] for r in self.rows))

    def table(self, method: str) -> list[dict[str, Any]]:
        """The per-request rows of one method."""
        return [r for r in self.rows if r["method"] == method]

    def summary(self) -> dict[str, dict[str, float]]:
        """Paper Table 1 row per method: mean over requests of each gap, and time per request; then the
        mean of each attack result the rows hold (:data:`ATTACK_COLUMNS`, NaN where no request defines it)."""
        out = {}
        for m in self.methods():
            rows = self.table(m)
            out[m] = {col: scale * sum(float(r[key]) for r in rows) / len(rows) for col, (key, scale) in TABLE1.items()}
            for col in ATTACK_COLUMNS:
                if col in rows[0]:
                    values = [float(r[col]) for r in rows if not math.isnan(float(r[col]))]
                    out[m][col] = sum(values) / len(values) if values else float("nan")
        return out

    def family(self, method: str) -> str:
        """The model family ``method`` (or a reference, ``"<name> (reference)"``) ran on."""
        return next(r["family"] for r in self.rows + self.reference_rows if r["method"] == method)

    def format(self) -> str:
        """The summary as an aligned plain-text table."""
        head = [
            "method",
            "family",
            "dParams(L2)",
            "dRetain(pp)",
            "dForget(pp)",
            "dTest(pp)",
            "dMIA",
            "s/request",
        ]
        summary = self.summary()
        attacks = [c for c in ATTACK_COLUMNS if all(c in s for s in summary.values())]
        head += [*(ATTACK_HEADS[c] for c in attacks), "reference R/F/T(%)", "guarantee"]
        body = [
            [
                m,
                self.family(m),
                *(f"{s[c]:.4g}" if c == "time_per_request_s" else f"{s[c]:.2f}" for c in TABLE1),
                *(f"{s[c]:.2f}" for c in attacks),
                "/".join(f"{100 * a:.1f}" for a in self.reference_accuracies(m)),
                self._guarantee(m),
            ]
            for m, s in summary.items()
        ]
        title = (
            f"K = {self.k} requests ({describe(self.schedule)}); gaps to retraining from scratch, whose own "
            "retain/forget/test accuracies (mean over the requests) are in column 'reference R/F/T'"
        )
        if attacks:
            tprs = [f"{100 * f:g}%" for f in LIRA_FPRS if f"lira_{tpr_key(f)}" in attacks]
            rates = f" and LiRA's TPR at {' and '.join(tprs)} FPR (chance: the rate)" if tprs else ""
            title += f"; attack AUCs (0.5: chance){rates}, each next to retraining's [retr]"
        return format_table(head, body, title=title)

    def reference_accuracies(self, method: str) -> tuple[float, float, float]:
        """Retain, forget and test accuracy of ``method``'s reference, each the mean over the requests: what a
        gap is measured against (a reference that itself forgot its early experiences makes small gaps cheap)."""
        ref = self.table(method)[0]["reference"]
        rows = [r for r in self.reference_rows if r["method"] == ref]
        means = [sum(float(r[k]) for r in rows) / len(rows) for k in ("retain_acc", "forget_acc", "test_acc")]
        return means[0], means[1], means[2]

    def _guarantee(self, method: str) -> str:
        certs = {r["certificate"] for r in self.table(method)}
        return certs.pop() if len(certs) == 1 else "/".join(sorted(certs))

    def write(self, out_dir: str | Path, stem: str = "") -> list[Path]:
        """Write ``<stem>requests.csv`` (every row) and ``<stem>summary.csv``, and ``<stem>end.csv`` with the
        end-of-stream rows if there are any (the figure: :func:`~lightning_unlearn_bench.plot.write_report`)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / f"{stem}requests.csv", out / f"{stem}summary.csv"]
        _write_csv(paths[0], self.rows + self.reference_rows)
        _write_csv(
            paths[1],
            [{"method": m, "family": self.family(m), "k": self.k, **s} for m, s in self.summary().items()],
        )
        if self.end_rows or self.end_reference_rows:
            paths.append(out / f"{stem}end.csv")
            _write_csv(paths[-1], self.end_rows + self.end_reference_rows)
        return paths


def describe(schedule: Schedule) -> str:
    kinds = "/".join(dict.fromkeys(r.kind for r in schedule))
    seed = f", seed {schedule.seed}" if schedule.seed is not None else ""
    return f"{kinds}{seed}"


def format_table(head: Sequence[str], body: Sequence[Sequence[str]], title: str = "") -> str:
    """Columns padded to their widest cell: the first left-aligned, the others right-aligned."""
    widths = [max(len(str(row[c])) for row in [head, *body]) for c in range(len(head))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(str(v).ljust(w) if c == 0 else str(v).rjust(w) for c, (v, w) in enumerate(zip(row, widths)))

    rule = "-" * len(line(head))
    return "\n".join([*([title] if title else []), line(head), rule, *(line(r) for r in body)])


def _write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
