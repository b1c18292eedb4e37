"""The study's page and figures, made from its results alone: tables, curves and the comparisons they support.

A difference between two truncations is called clear when their seeds' ranges do not overlap; otherwise the
page says it is within the spread of the seeds.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import defaultdict
from pathlib import Path

from benchmarks.report import markdown_table
from benchmarks.tradeoff.tasks import TASKS
from benchmarks.tradeoff.truncations import truncations

STYLE = {"k1 = k2": "-", "k2 > k1": "--", "random": ":", "unbiased": "-.", "adaptive": ":"}
PALETTE = {"k1 = k2": "Blues", "k2 > k1": "Oranges"}  # shades by the family's order: darker, longer
SINGLE = {"random": "tab:green", "unbiased": "tab:purple", "adaptive": "tab:brown"}


def grouped(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """``runs`` by task and truncation: the seeds of each."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs:
        groups[r["task"], r["truncation"]].append(r)
    return groups


def spread(values: list[float]) -> dict[str, float]:
    """The seeds' ``mean``, ``low`` and ``high`` of a measure (what :func:`compare` reads)."""
    return {"mean": statistics.fmean(values), "low": min(values), "high": max(values)}


def summarise(runs: list[dict]) -> dict[str, dict[str, dict]]:
    """Per task and truncation: the chosen rate, the final bits (mean, min, max over seeds) and the costs."""
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for (task, truncation), rs in grouped(runs).items():
        seconds = [r["curve"][-1]["seconds"] for r in rs if r["curve"]]
        out[task][truncation] = {
            "family": rs[0]["family"],
            "lr": rs[0]["lr"],
            "seeds": len(rs),
            **spread([r["final_bits"] for r in rs]),
            "steps": statistics.fmean(r["curve"][-1]["steps"] for r in rs if r["curve"]),
            "rate": statistics.fmean(r["curve"][-1]["targets"] / r["curve"][-1]["seconds"] for r in rs if r["curve"]),
            "seconds": statistics.fmean(seconds) if seconds else math.nan,
            "peak_mib": max(r["peak_mib"] for r in rs),
            "budget": rs[0]["budget"],
            "reference": rs[0]["reference"],
            "reference_name": rs[0]["reference_name"],
            "curves": [r["curve"] for r in rs],
        }
    return out


def ordered(task: str, rows: dict[str, dict]) -> list[str]:
    """The task's truncations in the study's order, those with results only."""
    return [t.name for t in truncations(TASKS[task].ks) if t.name in rows]


def table(task: str, rows: dict[str, dict]) -> str:
    """One task's table: a row per truncation."""
    unit = TASKS[task].unit
    best = min(rows.values(), key=lambda s: s["mean"])["mean"]
    body = []
    for name in ordered(task, rows):
        s = rows[name]
        mark = " **(best)**" if s["mean"] == best else ""
        body.append(
            [
                name + mark,
                f"{s['lr']:g}",
                f"{s['mean']:.3f} ({s['low']:.3f}-{s['high']:.3f})",
                f"{s['steps']:,.0f}",
                f"{s['rate']:,.0f}",
                f"{s['peak_mib']:.0f}",
            ]
        )
    header = ["truncation", "Adam lr", f"{unit} at the budget, mean (range over seeds)", "optimizer steps",
              "targets per second", "peak MiB"]  # fmt: skip
    return markdown_table(header, body)


def verdict(a: dict, b: dict) -> int:
    """-1 if ``a`` is clearly lower than ``b`` (the seeds' ranges apart), 1 if clearly higher, 0 within the spread."""
    return -1 if a["high"] < b["low"] else 1 if b["high"] < a["low"] else 0


def compare(a: dict, b: dict) -> str:
    """``a`` against ``b``: the difference of the means, and whether the seeds' ranges separate them."""
    diff = a["mean"] - b["mean"]
    word = "lower" if diff < 0 else "higher"
    return f"{abs(diff):.3f} {word}" + ("" if verdict(a, b) else " (within the seeds' spread)")


def findings(task: str, rows: dict[str, dict]) -> list[str]:
    """What the task's measurements say, each a sentence computed from the table."""
    ks = TASKS[task].ks
    fixed = {k: rows.get(f"TBPTT({k}, {k})") for k in ks}
    best_name = min(rows, key=lambda n: rows[n]["mean"])
    best_fixed = min((n for n in rows if rows[n]["family"] == "k1 = k2"), key=lambda n: rows[n]["mean"], default=None)
    lines = [f"Best: {best_name}, {rows[best_name]['mean']:.3f} {TASKS[task].unit}."]
    if best_fixed is not None and best_fixed != best_name:
        lines.append(f"Best with k1 = k2: {best_fixed}, {rows[best_fixed]['mean']:.3f}.")
    for name in ordered(task, rows):
        s = rows[name]
        if s["family"] == "k2 > k1":
            k2 = int(name.split(", ")[1].rstrip(")"))
            if fixed.get(k2):
                lines.append(f"{name} against TBPTT({k2}, {k2}): {compare(s, fixed[k2])}.")
        elif s["family"] in ("random", "unbiased", "adaptive") and fixed.get(ks[2]):
            lines.append(f"{name} against TBPTT({ks[2]}, {ks[2]}): {compare(s, fixed[ks[2]])}.")
    return lines


def figure(task: str, rows: dict[str, dict], path: Path) -> None:
    """Validation quality against training seconds (left) and optimizer steps (right), one curve per truncation.

    Each curve is the mean over the seeds, evaluation by evaluation.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    shown = []
    names = ordered(task, rows)
    for name in names:
        s = rows[name]
        n = min(len(c) for c in s["curves"])
        if n == 0:
            continue

        def mean(field: str, curves: list = s["curves"], n: int = n) -> list[float]:
            return [statistics.fmean(c[j][field] for c in curves) for j in range(n)]

        bits = mean("bits")
        shown += bits[1:] or bits
        siblings = [n for n in names if rows[n]["family"] == s["family"]]
        style = {"color": colour(s["family"], name, siblings), "marker": "o", "markersize": 3,
                 "linewidth": 2.2 if s["family"] == "k1 = k2" else 1.6}  # fmt: skip
        axes[0].plot(mean("seconds"), bits, STYLE[s["family"]], label=name, **style)
        axes[1].plot(mean("steps"), bits, STYLE[s["family"]], **style)
    finite = [b for b in shown if math.isfinite(b)]
    if finite:  # the first, high points would flatten the curves where they differ
        low, high = min(finite), sorted(finite)[int(0.9 * (len(finite) - 1))]
        axes[0].set_ylim(low - 0.05 * (high - low + 1e-9), high + 0.05 * (high - low + 1e-9))
    axes[0].set_xlabel("training seconds (one core; evaluation not counted)")
    axes[1].set_xlabel("optimizer steps")
    axes[1].set_xscale("log")
    axes[0].set_ylabel(f"validation {TASKS[task].unit}")
    fig.suptitle(TASKS[task].title, fontsize=10)
    for ax in axes:
        ax.grid(alpha=0.3)
    save(fig, path)


def save(fig: object, path: Path) -> None:
    """The legend right of the plots, then ``fig`` written to ``path`` and closed."""
    import matplotlib.pyplot as plt

    fig.legend(fontsize=7, loc="center left", bbox_to_anchor=(0.86, 0.5))
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def colour(family: str, name: str, siblings: list[str]) -> object:
    """A family's colour: one shade per member of the fixed and k2 > k1 families, darker for later ones."""
    if family not in PALETTE:
        return SINGLE[family]
    import matplotlib

    shade = 0.45 + 0.55 * siblings.index(name) / max(1, len(siblings) - 1)
    return matplotlib.colormaps[PALETTE[family]](shade)


def grid_table(task: str, rows: dict[str, dict], results: list[dict]) -> str:
    """The learning-rate grid of one task: each truncation's seed-0 loss at the budget under each rate."""
    lrs, budget = TASKS[task].lrs, next(iter(rows.values()))["budget"]
    finals = {
        (r["truncation"], r["lr"]): r["final_bits"]
        for r in results
        if r["task"] == task and r["seed"] == 0 and r["budget"] == budget
    }
    body = []
    for name in ordered(task, rows):
        cells = []
        for lr in lrs:
            bits = finals.get((name, lr))
            cell = "" if bits is None else f"{bits:.3f}"
            cells.append(f"**{cell}**" if cell and lr == rows[name]["lr"] else cell)
        body.append([name, *cells])
    return markdown_table(["truncation", *(f"lr {lr:g}" for lr in lrs)], body)


def page(
    runs: list[dict],
    results: list[dict],
    figures: Path,
    page_path: Path,
    command: str,
    setup: str,
    intro: str,
    closing: list[str] = (),
) -> None:
    """Write the page (tables, findings, figure links) and one figure per task into ``figures``.

    Args:
        runs: the runs reported: the fresh seeds at each truncation's chosen rate.
        results: every run, the grid's other rates too (for the grid tables).
        figures: the folder of the figures, ``tradeoff-TASK.png``.
        page_path: the markdown page to write; it links the figures relative to its folder.
        command: the command line that made the page, as the page states it.
        setup: the machine and settings, one line.
        intro: the text under the title.
        closing: parts after the tasks' (the prequential study's section, say).
    """
    summary = summarise(runs)
    figures.mkdir(parents=True, exist_ok=True)
    parts = head("when does k2 > k1 pay?", command, setup, intro)
    for task in (t for t in TASKS if t in summary):
        rows = summary[task]
        image = figures / f"tradeoff-{task}.png"
        figure(task, rows, image)
        first = next(iter(rows.values()))
        parts += [
            f"## {TASKS[task].title}",
            f"Budget: {first['budget']:g} training seconds per run. Without memory of the sequence "
            f"({first['reference_name']}): {first['reference']:.2f} {TASKS[task].unit}.",
            f"![{task}]({_link(page_path, image)})",
            table(task, rows),
            "\n".join(f"- {line}" for line in findings(task, rows)),
            f"The learning-rate grid: seed 0's validation {TASKS[task].unit} at the budget, the chosen rate in bold.",
            grid_table(task, rows, results),
        ]
    parts += closing
    page_path.parent.mkdir(parents=True, exist_ok=True)
    page_path.write_text("\n\n".join(parts) + "\n")


def head(title: str, command: str, setup: str, intro: str) -> list[str]:
    """A study page's first parts: its title, the command that made it, the machine and the introduction."""
    return [
        f"# Benchmarks: {title}",
        f"Generated by `{command}`; rerun it rather than editing the numbers.",
        f"Machine: {setup}.",
        intro,
    ]


def _link(page_path: Path, image: Path) -> str:
    """``image`` relative to the page's folder."""
    return Path(os.path.relpath(image.resolve(), page_path.parent.resolve())).as_posix()
