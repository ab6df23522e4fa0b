"""The report's plots (matplotlib, Agg): one consistent colour per arm, titles and axis labels with units.

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
from metakernelbench.store import TrialRow  # noqa: E402

ARM_COLORS = {"solo": "#7f7f7f", "skill": "#1f77b4", "placebo": "#ff7f0e", "solo_control": "#2ca02c"}
ARM_LABELS = {"solo": "solo", "skill": "skill", "placebo": "placebo", "solo_control": "solo vs solo (control)"}
OUTCOME_STYLE = {"improved": dict(alpha=1.0, hatch=""), "tied": dict(alpha=0.35, hatch=""),
                 "regressed": dict(alpha=0.75, hatch="//")}


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
    ax.set_title("R@t ladder per arm")
    ax.legend(fontsize=8)
    return _save(fig, path)


def paired_outcome_plot(pairs: dict[str, list[m.Pair]], path: Path) -> Path | None:
    """One row per model × direction of the skill arm (placebo and solo control of the same target alongside)."""
    treated = pairs.get("skill") or pairs.get("placebo") or []
    if not treated:
        return None
    cells = sorted({(p.treated.model, m.direction(p.treated), p.treated.dsl) for p in treated})
    fig, axes = plt.subplots(len(cells), 1, figsize=(max(6, 0.6 * len({p.problem for p in treated}) + 3),
                                                     2.6 * len(cells)), squeeze=False)
    arms = [a for a in ("skill", "placebo", "solo_control") if pairs.get(a)]
    width = 0.8 / len(arms)
    for ax, (model, direction, target) in zip(axes[:, 0], cells):
        def belongs(p: m.Pair, arm: str) -> bool:
            if p.treated.model != model:
                return False
            return p.treated.dsl == target if arm == "solo_control" else m.direction(p.treated) == direction
        problems = sorted({p.problem for a in arms for p in pairs[a] if belongs(p, a)})
        x = np.arange(len(problems))
        for i, arm in enumerate(arms):
            by_problem: dict[str, list[int]] = {}  # one pass over the arm's pairs, not one per problem
            for p in pairs[arm]:
                if belongs(p, arm):
                    by_problem.setdefault(p.problem, []).append(p.outcome)
            mean = {prob: float(np.mean(by_problem[prob])) if by_problem.get(prob) else np.nan for prob in problems}
            ax.bar(x + (i - (len(arms) - 1) / 2) * width, [mean[p] for p in problems], width, color=_color(arm),
                   label=ARM_LABELS[arm])
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(x, problems, rotation=30, ha="right", fontsize=7)
        ax.set_ylim(-1.1, 1.1)
        ax.set_yticks([-1, 0, 1], ["regressed (-1)", "tied (0)", "improved (+1)"], fontsize=7)
        ax.set_ylabel("paired outcome\n(mean over replicates)", fontsize=8)
        ax.set_title(f"{model}: {direction}", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    axes[-1, 0].set_xlabel("problem")
    fig.suptitle("Paired outcome by problem (treated vs its solo)")
    return _save(fig, path)


def standing_plot(report: dict, path: Path) -> Path | None:
    tables = {a: t for a, t in report["standing"].items() if a != "skill_excess"}
    if not tables:
        return None
    standings = list(m.STANDING_NAMES.values())
    arms = list(tables)
    width = 0.8 / len(arms)
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(standings))
    for i, arm in enumerate(arms):
        bottom = np.zeros(len(standings))
        for outcome_name, style in OUTCOME_STYLE.items():
            h = np.array([tables[arm]["cells"][s][outcome_name] for s in standings], dtype=float)
            ax.bar(x + (i - (len(arms) - 1) / 2) * width, h, width, bottom=bottom, color=_color(arm),
                   edgecolor="black", linewidth=0.4, label=f"{ARM_LABELS[arm]}: {outcome_name}", **style)
            bottom += h
    ax.set_xticks(x, [f"source solo {s}\ntarget solo" for s in standings])
    ax.set_ylabel("pairs (count)")
    ax.set_xlabel("relative standing of the skill's source solo")
    ax.set_title("Transfer by relative standing (stacked: improved / tied / regressed)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
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
            ax.scatter(xs, ys, color=_color(arm), label=f"{arm} (n = {len(pts)})", alpha=0.8)
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
    ax.set_title("Solo vs skill speed (pairs correct in both)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def regression_plot(report: dict, path: Path) -> Path | None:
    paired = report["paired"]
    treated = [a for a in ("skill", "placebo") if a in paired]
    if not treated:
        return None
    labels = sorted({(c["model"], c["direction"]) for a in treated for c in paired[a]["cells"]})
    x = np.arange(len(labels))
    width = 0.8 / len(treated)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(labels) + 2), 4))
    for i, arm in enumerate(treated):
        cells = {(c["model"], c["direction"]): c for c in paired[arm]["cells"]}
        rate = [cells[k]["regression_rate"] if k in cells else np.nan for k in labels]
        lo = [max(0.0, cells[k]["regression_rate"] - cells[k]["regression_rate_ci"]["low"]) if k in cells else 0
              for k in labels]
        hi = [max(0.0, cells[k]["regression_rate_ci"]["high"] - cells[k]["regression_rate"]) if k in cells else 0
              for k in labels]
        ax.bar(x + (i - (len(treated) - 1) / 2) * width, rate, width, yerr=[lo, hi], capsize=3, color=_color(arm),
               label=f"{arm} regression rate (95% Wilson)")
    control = paired.get("solo_control")
    if control:
        o = control["overall"]
        ax.axhline(o["regression_rate"], color=_color("solo_control"), linestyle="--",
                   label=f"noise floor: solo vs solo regression rate ({o['regression_rate']:.2f})")
        ax.axhspan(o["regression_rate_ci"]["low"], o["regression_rate_ci"]["high"], color=_color("solo_control"),
                   alpha=0.15, label="noise floor 95% Wilson interval")
    ax.set_xticks(x, [f"{mo}\n{d}" for mo, d in labels], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("regression rate (fraction of pairs)")
    ax.set_xlabel("model, direction")
    ax.set_title("Regression rate vs the solo-vs-solo noise floor")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _save(fig, path)


def make_plots(rows: list[TrialRow], report: dict, out: Path) -> dict[str, Path]:
    """Write every plot that has data into `out`; name -> path."""
    pairs = {"skill": m.pair_trials(rows, "skill"), "placebo": m.pair_trials(rows, "placebo"),
             "solo_control": m.solo_noise_pairs(rows)}
    made = {
        "ladders": ladders_plot(report, out / "ladders.png"),
        "paired_outcome": paired_outcome_plot(pairs, out / "paired_outcome.png"),
        "standing": standing_plot(report, out / "standing.png"),
        "speed_scatter": speed_scatter_plot(pairs, out / "speed_scatter.png"),
        "regression_vs_noise": regression_plot(report, out / "regression_vs_noise.png"),
    }
    return {k: v for k, v in made.items() if v is not None}
