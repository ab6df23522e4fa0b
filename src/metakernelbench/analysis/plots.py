"""The report's plots (matplotlib, Agg): one consistent colour per arm, neutral titles, axis labels with units.

Each plot is drawn from the report dict (numbers already computed through metrics/stats) or from the pairs that
`metrics` forms; a plot with nothing to show is not written.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from metakernelbench.analysis import metrics as m  # noqa: E402

ARM_COLORS = {"solo": "#7f7f7f", "skill": "#1f77b4", "placebo": "#ff7f0e", "solo_control": "#2ca02c"}
ARM_LABELS = {"solo": "solo", "skill": "skill", "placebo": "placebo", "solo_control": "solo vs solo (control)"}


def _color(arm: str) -> str:
    return ARM_COLORS.get(arm, "#9467bd")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def ladders_plot(report: dict, path: Path) -> Path | None:
    arms = {a: e for a, e in report["ladders"]["arm"].items() if e["n"]}
    if not arms:
        return None
    th = report["thresholds"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, e in arms.items():
        ax.plot([float(t) for t in th], [e["r_at"][t] for t in th], marker="o", color=_color(arm),
                label=f"{ARM_LABELS.get(arm, arm)} (S = {e['s']:.1f}, n = {e['n']})")
    ax.set_xscale("symlog", linthresh=0.5)
    ax.set_xticks([float(t) for t in th], [f"{t}x" for t in th])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("speedup threshold t (x over PyTorch eager)")
    ax.set_ylabel("R@t (fraction of finished trials)")
    ax.set_title("R@t ladder per arm (share passing with speedup ≥ t)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _problem_label(problem: str) -> str:
    """'attention/03_flash_fwd' -> '03': the problem's number (its stem when it has none), short enough for 74."""
    stem = problem.rsplit("/", 1)[-1]
    digits = stem.split("_", 1)[0]
    return digits if digits.isdigit() else stem


def paired_lift_plot(pairs: dict[str, list[m.Pair]], report: dict, path: Path) -> Path | None:
    """Figure 1: a heatmap, one row per model × direction of the skill arm (and per model × DSL of the solo control
    beneath), one column per problem grouped by family, coloured by the mean paired outcome over replicates."""
    skill = pairs.get("skill") or []
    if not skill:
        return None
    table = {(r["model"], r["direction"]): r for r in report["paired"]["skill"]["rows"]}
    series: list[tuple[str, list[m.Pair]]] = []
    model_starts = []
    for model in sorted({p.treated.model for p in skill}):
        model_starts.append(len(series))
        for direction in sorted({m.direction(p.treated) for p in skill if p.treated.model == model}):
            row = table[(model, direction)]
            series.append((f"{model}  {direction}  skill: {row['paired_outcome']['estimate']:+.0f}% of "
                           f"{row['pairs']}",
                           [p for p in skill if p.treated.model == model and m.direction(p.treated) == direction]))
        for dsl in sorted({p.treated.dsl for p in pairs.get("solo_control", []) if p.treated.model == model}):
            ps = [p for p in pairs["solo_control"] if p.treated.model == model and p.treated.dsl == dsl]
            series.append((f"{model}  {dsl}  solo control: {100.0 * sum(p.outcome for p in ps) / len(ps):+.0f}% of "
                           f"{len(ps)}", ps))
    problems = sorted({p.problem for _, ps in series for p in ps})  # ids sort by family first
    col = {prob: j for j, prob in enumerate(problems)}
    total, count = np.zeros((len(series), len(problems))), np.zeros((len(series), len(problems)))
    for i, (_, ps) in enumerate(series):
        for p in ps:
            total[i, col[p.problem]] += p.outcome
            count[i, col[p.problem]] += 1
    grid = np.ma.masked_where(count == 0, total / np.maximum(count, 1))
    cmap = plt.get_cmap("RdBu").with_extremes(bad="#cccccc")
    fig, ax = plt.subplots(figsize=(max(7.0, 0.13 * len(problems) + 5.0), 0.3 * len(series) + 2.2))
    image = ax.imshow(grid, cmap=cmap, vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(len(series)), [name for name, _ in series], fontsize=7)
    ax.set_xticks(range(len(problems)), [_problem_label(q) for q in problems], rotation=90, fontsize=6)
    for start in model_starts[1:]:
        ax.axhline(start - 0.5, color="black", linewidth=1.2)
    families = [q.split("/", 1)[0] for q in problems]
    edges = [j for j in range(1, len(problems)) if families[j] != families[j - 1]]
    for j in edges:
        ax.axvline(j - 0.5, color="black", linewidth=0.8)
    for lo, hi in zip([0] + edges, edges + [len(problems)]):
        ax.text((lo + hi - 1) / 2, -0.7, families[lo], ha="center", va="bottom", fontsize=7)
    ax.set_xlabel("problem (number), grouped by family")
    bar = fig.colorbar(image, ax=ax, fraction=0.025, pad=0.01, ticks=[-1, 0, 1])
    bar.ax.set_yticklabels(["regressed", "tied", "improved"], fontsize=7)
    ax.set_title("Paired outcome by problem, mean over replicates (row label: the row's paired outcome, of its pairs)",
                 fontsize=9, pad=16)
    return _save(fig, path)


OUTCOME_COLORS = {"improved": "#1b9e77", "tied": "#d9d9d9", "regressed": "#d95f02"}


def standing_plot(report: dict, path: Path) -> Path | None:
    """Figure 2: per model, the shares improved / tied / regressed by standing, the skill arm beside the solo
    control in its place."""
    by_model = (report.get("standing") or {}).get("by_model") or {}
    if not by_model:
        return None
    standings = list(m.STANDING_NAMES.values())
    ncols = min(3, len(by_model))
    nrows = -(-len(by_model) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols + 0.8, 3.6 * nrows + 0.6), squeeze=False,
                             sharey=True)
    for ax in axes.flat[len(by_model):]:
        ax.set_visible(False)
    for ax, (model, arms) in zip(axes.flat, by_model.items()):
        names = [a for a in ("skill", "solo_control") if a in arms]
        width = 0.8 / len(names)
        for i, arm in enumerate(names):
            x = np.arange(len(standings)) + (i - (len(names) - 1) / 2) * width
            totals = np.array([sum(arms[arm][s].values()) for s in standings], dtype=float)
            bottom = np.zeros(len(standings))
            for outcome_name, colour in OUTCOME_COLORS.items():
                share = np.array([arms[arm][s][outcome_name] for s in standings]) / np.maximum(totals, 1)
                ax.bar(x, share, width * 0.95, bottom=bottom, color=colour, edgecolor="black", linewidth=0.4,
                       hatch="//" if arm == "solo_control" else "", label=outcome_name if i == 0 else None)
                for xi, b, h in zip(x, bottom, share):
                    if h >= 0.1 and outcome_name != "tied":
                        ax.text(xi, b + h / 2, f"{100 * h:.0f}%", ha="center", va="center", fontsize=7,
                                bbox=dict(facecolor="white", alpha=0.8, pad=0.6, linewidth=0))
                bottom += share
            for xi, n in zip(x, totals):
                ax.text(xi, 1.01, f"{'skill' if arm == 'skill' else 'ctrl'}\nn={n:.0f}", ha="center", va="bottom",
                        fontsize=6)
        ax.set_xticks(range(len(standings)), [f"source {s}" for s in standings], fontsize=8)
        ax.set_ylim(0, 1.15)
        ax.set_title(model, fontsize=9, pad=20, loc="right")
    for row in axes:
        row[0].set_ylabel("share of pairs")
    axes[0, 0].legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.08), ncol=3, frameon=False)
    fig.suptitle("Outcomes by the source solo's standing against the target's solo (hatched: solo control)",
                 fontsize=9)
    return _save(fig, path)


def _minor_label(v: float, _pos) -> str:
    """Label the 2x and 5x minor ticks of a decade, so a log axis reads as plain speedups."""
    if v <= 0:
        return ""
    lead = v / 10 ** np.floor(np.log10(v))
    return f"{v:g}x" if round(lead, 6) in (2.0, 5.0) else ""


def speed_scatter_plot(pairs: dict[str, list[m.Pair]], path: Path) -> Path | None:
    fig, ax = plt.subplots(figsize=(5, 5))
    values = []
    for arm in ("skill", "placebo"):
        pts = [(m.outcome(p.solo).speedup_vs_eager, m.outcome(p.treated).speedup_vs_eager) for p in pairs.get(arm, [])
               if p.comparison.log_ratio is not None]
        pts = [(a, b) for a, b in pts if a and b and a > 0 and b > 0]
        if pts:
            xs, ys = zip(*pts)
            crowded = len(pts) > 300  # thousands of pairs: small, see-through points so both arms show
            ax.scatter(xs, ys, color=_color(arm), label=f"{arm} (n = {len(pts)})", alpha=0.3 if crowded else 0.8,
                       s=6 if crowded else 20, linewidths=0)
            values += list(xs) + list(ys)
    if not values:
        plt.close(fig)
        return None
    lo, hi = min(values) / 1.3, max(values) * 1.3
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, linestyle="--", label="equal speed")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        axis.set_minor_formatter(FuncFormatter(_minor_label))
    ax.set_xlabel("solo speedup vs PyTorch eager (x, log)")
    ax.set_ylabel("treated speedup vs PyTorch eager (x, log)")
    ax.set_title("Speed of pairs correct in both: treated vs its solo")
    ax.legend(fontsize=8)
    return _save(fig, path)


def regression_plot(report: dict, path: Path) -> Path | None:
    paired = report["paired"]
    treated = [a for a in ("skill", "placebo") if a in paired]
    if not treated:
        return None
    labels = sorted({(c["model"], c["direction"]) for a in treated for c in paired[a]["rows"]})
    x = np.arange(len(labels))
    width = 0.8 / len(treated)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(labels) + 2), 4))
    for i, arm in enumerate(treated):
        cells = {(c["model"], c["direction"]): c["regression_rate"] for c in paired[arm]["rows"]}
        rate = [cells[k]["estimate"] / 100 if k in cells else np.nan for k in labels]
        lo = [max(0.0, (cells[k]["estimate"] - cells[k]["low"]) / 100) if k in cells else 0 for k in labels]
        hi = [max(0.0, (cells[k]["high"] - cells[k]["estimate"]) / 100) if k in cells else 0 for k in labels]
        ax.bar(x + (i - (len(treated) - 1) / 2) * width, rate, width, yerr=[lo, hi], capsize=3, color=_color(arm),
               label=f"{arm} regression rate (95%, problem-clustered)")
    control = paired.get("solo_control")
    if control:
        o = control["overall"]["regression_rate"]
        ax.axhline(o["estimate"] / 100, color=_color("solo_control"), linestyle="--",
                   label=f"solo vs solo regression rate ({o['estimate'] / 100:.2f})")
        ax.axhspan(o["low"] / 100, o["high"] / 100, color=_color("solo_control"), alpha=0.15,
                   label="solo vs solo 95% interval")
    ax.set_xticks(x, [f"{mo}\n{d}" for mo, d in labels], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("regression rate (fraction of pairs)")
    ax.set_xlabel("model, direction")
    ax.set_title("Regression rate per model and direction, and the solo-vs-solo rate")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _save(fig, path)


def make_plots(pairs: dict[str, list[m.Pair]], report: dict, out: Path) -> dict[str, Path]:
    """Write every plot that has data into `out`; name -> path. `pairs`: the report's own, per arm."""
    made = {
        "paired_lift": paired_lift_plot(pairs, report, out / "paired_lift.png"),
        "standing": standing_plot(report, out / "standing.png"),
        "ladders": ladders_plot(report, out / "ladders.png"),
        "speed_scatter": speed_scatter_plot(pairs, out / "speed_scatter.png"),
        "regression_vs_noise": regression_plot(report, out / "regression_vs_noise.png"),
    }
    return {k: v for k, v in made.items() if v is not None}
