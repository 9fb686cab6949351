"""The accuracies of a :class:`Report` over its requests, as a figure a paper can print.

Object-oriented matplotlib (``Figure`` + ``FigureCanvasAgg``): no global backend is chosen,
so importing or calling this never changes the backend of the caller's own plots.
"""

from __future__ import annotations

from pathlib import Path

from lightning_unlearn_bench.report import Report, describe

#: a colour-blind-safe palette (Okabe-Ito), markers and line styles cycled per method of a family
_COLORS = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#000000",
    "#F0E442",
)
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINESTYLES = ("-", "--", "-.", ":")


def write_report(report: Report, out_dir: str | Path, stem: str = "", *, figures: bool = True) -> list[Path]:
    """:meth:`Report.write`'s CSVs, then (``figures``) ``<stem>accuracies.png`` (:func:`plot_accuracies`)."""
    paths = report.write(out_dir, stem)
    if figures:
        paths.append(Path(out_dir) / f"{stem}accuracies.png")
        plot_accuracies(report, paths[-1])
    return paths


def plot_accuracies(report: Report, path: str | Path) -> None:
    """Retain, forget and test accuracy over the requests: one row of panels per gold standard.

    Each row shows one reference (retraining from scratch a model family) as a thick grey line
    and the methods measured against it with distinct colours, markers and line styles, dodged
    sideways so methods with equal accuracies stay visible; each row's legend sits right of it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    keys = {
        "retain_acc": "retain accuracy",
        "forget_acc": "forget accuracy",
        "test_acc": "test accuracy",
    }
    refs = list(dict.fromkeys(r["reference"] for r in report.rows))
    fig = Figure(figsize=(10.5, 2.4 * len(refs) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(refs), len(keys), sharex=True, sharey="row", squeeze=False)
    for row, ref in enumerate(refs):
        methods = [m for m in report.methods() if report.table(m)[0]["reference"] == ref]
        ref_rows = [r for r in report.reference_rows if r["method"] == ref]
        width = 0.3 if len(methods) > 1 else 0.0
        for col, key in enumerate(keys):
            ax = axes[row, col]
            ax.plot(
                [r["request"] for r in ref_rows],
                [r[key] for r in ref_rows],
                color="0.6",
                lw=4,
                alpha=0.6,
                solid_capstyle="round",
                label=ref,
                zorder=1,
            )
            for j, m in enumerate(methods):
                rows = report.table(m)
                shift = width * (j / (len(methods) - 1) - 0.5) if len(methods) > 1 else 0.0
                ax.plot(
                    [r["request"] + shift for r in rows],
                    [r[key] for r in rows],
                    label=m,
                    zorder=2,
                    color=_COLORS[j % len(_COLORS)],
                    marker=_MARKERS[j % len(_MARKERS)],
                    linestyle=_LINESTYLES[j % len(_LINESTYLES)],
                    lw=1.2,
                    ms=5,
                    mfc="white",
                    mew=1.2,
                )
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
            ax.set_xlim(0.5, report.k + 0.5)
            ax.grid(True, color="0.9", lw=0.6)
            ax.set_axisbelow(True)
            if row == 0:
                ax.set_title(keys[key])
            if row == len(refs) - 1:
                ax.set_xlabel("forget request")
        axes[row, 0].set_ylabel(f"{report.family(ref)} family\naccuracy")
        handles, labels = axes[row, -1].get_legend_handles_labels()
        axes[row, -1].legend(
            handles,
            labels,
            loc="center left",
            bbox_to_anchor=(1.03, 0.5),
            fontsize=8,
            frameon=False,
        )
    fig.suptitle(f"Continual unlearning: K = {report.k} forget requests ({describe(report.schedule)})")
    fig.savefig(path, dpi=150)
