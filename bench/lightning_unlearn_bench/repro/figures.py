"""Figures of a run: ours next to the paper's per column, and [CCL] Fig. 2's lambda sweep (matplotlib, no pyplot)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from lightning_unlearn_bench.repro.columns import LOG_COLUMNS
from lightning_unlearn_bench.repro.schema import ReproConfig
from lightning_unlearn_bench.repro.tables import SetupResult

_OURS, _PAPER = "#0072B2", "#E69F00"


def plot_paper_vs_ours(config: ReproConfig, result: SetupResult, path: Path) -> Path:
    """One panel per column and request set: paired horizontal bars, ours and the paper's, per method."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = list(result.reports)
    names = list(dict.fromkeys((r["method"], r["paper_row"]) for r in result.rows))
    fig = Figure(figsize=(2.6 * len(config.columns) + 1.8, 0.32 * len(names) * len(labels) + 1.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(labels), len(config.columns), squeeze=False, sharey="row")
    for i, label in enumerate(labels):
        rows = {(r["method"], r["paper_row"]): r for r in result.rows if r["requests"] == label}
        ys = list(range(len(names)))
        for j, column in enumerate(config.columns):
            ax = axes[i, j]
            ours = [rows[n][column] if n in rows else math.nan for n in names]
            paper = [rows[n][f"paper {column}"] if n in rows else math.nan for n in names]
            for shift, values, color, name in (
                (-0.2, ours, _OURS, "ours"),
                (0.2, paper, _PAPER, f"paper ({config.paper})"),
            ):
                bars = ax.barh([y + shift for y in ys], values, height=0.38, color=color, label=name)
                texts = ["" if math.isnan(v) else f"{v:.3g}" for v in values]
                ax.bar_label(bars, texts, fontsize=6, padding=2)
            shown = [v for v in ours + paper if not math.isnan(v)]
            if column in LOG_COLUMNS and any(shown) and min(shown) >= 0:  # costs spanning orders of magnitude
                ax.set_xscale("log")
            ax.set_yticks(ys, [f"{m} [{p}]" for m, p in names], fontsize=8)
            ax.invert_yaxis()
            ax.grid(True, axis="x", color="0.9", lw=0.6)
            ax.set_axisbelow(True)
            ax.margins(x=0.18)  # room for the value labels
            ax.set_title(f"{column}" + (f", {label}" if len(labels) > 1 else ""), fontsize=9)
            ax.tick_params(axis="x", labelsize=8)
    handles, texts = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, texts, loc="outside lower center", ncols=2, frameon=False, fontsize=8)
    fig.suptitle(f"{config.paper} {config.table}, {result.setup.label}: ours ({result.scale.dataset}) vs the paper's")
    fig.savefig(path, dpi=150)
    return path


def plot_lambda_sweep(results: Sequence[SetupResult], path: Path) -> Path:
    """[CCL] Fig. 2 against lambda, each setup's table row (at the end of the stream): (a) test accuracy,
    (b) distance to retraining (the approximation error ``||w_T - w_T^retrain||``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.5, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax_a, ax_b = fig.subplots(1, 2)
    lambdas = [float(r.setup.label.split("=")[1]) for r in results]
    accs: dict[str, list[float]] = {}
    distances: dict[str, list[float]] = {}
    for res in results:
        for row in res.rows:
            accs.setdefault(row["paper_row"], []).append(float(row["TA"]))
            if not row["reference"]:
                distances.setdefault(row["paper_row"], []).append(float(row["Distance"]))
    styles = ["o-", "s--", "^-.", "D:"]
    for ax, series in ((ax_a, accs), (ax_b, distances)):
        for k, (name, values) in enumerate(series.items()):
            ax.plot(lambdas, values, styles[k % len(styles)], label=name, mfc="white")
        ax.set_xticks(lambdas, [f"{v:g}" for v in lambdas])
        ax.set_xlabel(r"$\lambda$ (proximal regulariser)")
        ax.legend(fontsize=8, frameon=False, loc="best")
    ax_a.set_ylabel("test accuracy at the end (%)")
    ax_a.set_title("(a) excess risk (Alg. 1 noise-free = CL without unlearning)", fontsize=10)
    ax_b.set_yscale("log")
    ax_b.set_ylabel(r"$\|w_T - w_T^{retrain}\|_2$")
    ax_b.set_title("(b) unlearning loss (approximation error)", fontsize=10)
    fig.suptitle("[CCL] Fig. 2 protocol: gradient (Alg. 1, natural forgetting) vs Hessian (Alg. 2) unlearning")
    fig.savefig(path, dpi=150)
    return path
