"""The prequential study's page and figures, made from its results alone.

As in the budget study (:mod:`benchmarks.tradeoff.report`), a difference is called clear only when the seeds'
ranges do not overlap.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from benchmarks.report import markdown_table
from benchmarks.tradeoff.online import online_truncations
from benchmarks.tradeoff.online_tasks import ONLINE_TASKS
from benchmarks.tradeoff.report import _link, colour, compare, grouped, head, save, spread, verdict

STYLE = {"k1 = k2": "-", "k2 > k1": "--", "random": ":", "unbiased": "-.", "adaptive": ":", "per-token": "-"}
SINGLE = {"random": "tab:green", "unbiased": "tab:purple", "adaptive": "tab:brown", "per-token": "tab:red"}


def summarise(runs: list[dict]) -> dict[str, dict[str, dict]]:
    """Per task and truncation: the chosen rate, whole-stream and last-quarter losses over seeds, and the costs."""
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for (task, truncation), rs in grouped(runs).items():
        out[task][truncation] = {
            "family": rs[0]["family"],
            "lr": rs[0]["lr"],
            **spread([r["final_bits"] for r in rs]),
            "last": spread([r["last_quarter"] for r in rs]),
            "seconds": statistics.fmean(r["seconds"] for r in rs),
            "steps": statistics.fmean(r["steps"] for r in rs),
            "reference": rs[0]["reference"],
            "reference_name": rs[0]["reference_name"],
            "change": rs[0].get("change"),
            "curves": [r["curve"] for r in rs],
        }
    return out


def ordered(task: str, rows: dict[str, dict]) -> list[str]:
    """The task's truncations in the study's order, those with results only."""
    return [t.name for t in online_truncations(ONLINE_TASKS[task].ks) if t.name in rows]


def k1_k2(task: str) -> dict[str, tuple[int, int]]:
    """Each of the task's truncations' ``(k1, k2)``, by name."""
    return {t.name: (t.k1, t.k2) for t in online_truncations(ONLINE_TASKS[task].ks)}


def table(task: str, rows: dict[str, dict]) -> str:
    """One task's table: a row per truncation."""
    unit = ONLINE_TASKS[task].unit
    best = min(s["mean"] for s in rows.values())
    body = []
    for name in ordered(task, rows):
        s, last = rows[name], rows[name]["last"]
        body.append(
            [
                name + (" **(best)**" if s["mean"] == best else ""),
                f"{s['lr']:g}",
                f"{s['mean']:.4f} ({s['low']:.4f}-{s['high']:.4f})",
                f"{last['mean']:.4f} ({last['low']:.4f}-{last['high']:.4f})",
                f"{s['steps']:,.0f}",
                f"{s['seconds']:.1f}",
            ]
        )
    header = ["truncation", "Adam lr", f"prequential {unit}, whole stream (range over seeds)", "last quarter",
              "optimizer steps", "seconds (one core)"]  # fmt: skip
    return markdown_table(header, body)


def findings(task: str, rows: dict[str, dict]) -> list[str]:
    """What the task's measurements say, each a sentence computed from the table."""
    ks = ONLINE_TASKS[task].ks
    fixed = {k: rows.get(f"TBPTT({k}, {k})") for k in ks}
    best = min(rows, key=lambda n: rows[n]["mean"])
    lines = [f"Best over the whole stream: {best}, {rows[best]['mean']:.4f} {ONLINE_TASKS[task].unit}."]
    pairs_of = k1_k2(task)
    for name in ordered(task, rows):
        s = rows[name]
        if s["family"] in ("k2 > k1", "per-token"):
            # Against k1 = k2 at the same reach, and at the same update interval (where there is one): per
            # observation, the first asks what updating more often gives, the second what the longer reach does.
            k1, k2 = pairs_of[name]
            for k in dict.fromkeys((k2, k1)):
                reference = fixed.get(k)
                if reference:
                    cost = s["seconds"] / reference["seconds"]
                    lines.append(
                        f"{name} against TBPTT({k}, {k}): whole stream {compare(s, reference)}, last quarter "
                        f"{compare(s['last'], reference['last'])}; {cost:.1f}x the compute."
                    )
        elif s["family"] in ("random", "unbiased", "adaptive") and fixed.get(ks[2]):
            lines.append(f"{name} against TBPTT({ks[2]}, {ks[2]}): {compare(s, fixed[ks[2]])}.")
    return lines


def answer(summary: dict[str, dict[str, dict]]) -> list[str]:
    """The study's answer over all its streams, each line a sentence computed from the tables.

    Per stream, the best truncation and what per-token updates cost; over all streams, how each k2 > k1 fared
    against k1 = k2 at the same k1 (what the longer reach does) and at the same k2 (what updating more often does).
    """
    lines, same_k1, same_k2 = [], [], []
    for task, rows in summary.items():
        unit, ks = ONLINE_TASKS[task].unit, ONLINE_TASKS[task].ks
        fixed = {k: rows.get(f"TBPTT({k}, {k})") for k in ks}
        best = min(rows, key=lambda n: rows[n]["mean"])
        best_fixed = min((n for n in rows if rows[n]["family"] == "k1 = k2"), key=lambda n: rows[n]["mean"])
        line = (
            f"{ONLINE_TASKS[task].title}: best {best}, {rows[best]['mean']:.3f} {unit} against "
            f"{rows[best_fixed]['mean']:.3f} for {best_fixed}, the best k1 = k2"
        )
        if rows[best]["family"] == "per-token" and fixed.get(ks[1]):
            line += f"; {rows[best]['seconds'] / fixed[ks[1]]['seconds']:.0f}x the seconds of TBPTT({ks[1]}, {ks[1]})"
        lines.append(line + ".")
        pairs_of = k1_k2(task)
        for name in ordered(task, rows):
            if rows[name]["family"] != "k2 > k1":
                continue
            k1, k2 = pairs_of[name]
            for k, pairs in ((k1, same_k1), (k2, same_k2)):
                if fixed.get(k):
                    pairs.append((task, name, f"TBPTT({k}, {k})", rows[name], fixed[k]))

    def tally(pairs: list, what: str) -> str:
        verdicts = [verdict(s, ref) for *_, s, ref in pairs]
        better = [
            f"{name} on {task} ({s['mean']:.3f} against {ref['mean']:.3f} for {reference}, "
            f"{s['seconds'] / ref['seconds']:.1f}x the seconds)"
            for (task, name, reference, s, ref), v in zip(pairs, verdicts)
            if v < 0
        ]
        text = (
            f"k2 > k1 against k1 = k2 at the same {what}, over the whole stream: clearly lower on "
            f"{len(better)} of {len(pairs)} pairs, clearly higher on {verdicts.count(1)}, within the seeds' "
            f"spread on {verdicts.count(0)}."
        )
        return text + (f" Lower: {'; '.join(better)}." if better and len(better) <= 4 else "")

    if same_k1:
        lines.append(tally(same_k1, "k1 (what the longer reach gives)"))
    if same_k2:
        lines.append(tally(same_k2, "k2 (what updating more often gives)"))
    return lines


def section(runs: list[dict], figures: Path, page_path: Path, online_page: Path) -> list[str]:
    """The budget study's page's section on this regime: the answer, the first stream's figure, a link to the page.

    Args:
        runs: the prequential study's reported runs (none: no section).
        figures: the folder holding its figures (``online-TASK.png``, drawn by :func:`page`).
        page_path: the page the section goes into, for the links.
        online_page: the prequential study's page.
    """
    summary = summarise(runs)
    if not summary:
        return []
    first = next(t for t in ONLINE_TASKS if t in summary)
    image = figures / f"online-{first}.png"
    link = _link(page_path, online_page)
    return [
        "## When the data arrives once",
        "The other regime: each stream read once, in order, every observation predicted before it is learnt from "
        f"(`python -m benchmarks.tradeoff --online`; tables, curves and method: [its page]({link})). What it found:",
        "\n".join(f"- {line}" for line in answer(summary)),
        *([f"![{first}, read once]({_link(page_path, image)})"] if image.exists() else []),
    ]


def figure(task: str, rows: dict[str, dict], path: Path) -> None:
    """Prequential loss along the stream (left, per bin of targets) and compute used (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    names = ordered(task, rows)
    shown = []
    for name in names:
        s = rows[name]
        n = min(len(c) for c in s["curves"])
        if n == 0:
            continue
        xs = [s["curves"][0][j]["targets"] for j in range(n)]
        loss = [statistics.fmean(c[j]["loss"] for c in s["curves"]) for j in range(n)]
        seconds = [statistics.fmean(c[j]["seconds"] for c in s["curves"]) for j in range(n)]
        shown += loss[2:]
        siblings = [m for m in names if rows[m]["family"] == s["family"]]
        style = {"color": colour(s["family"], name, siblings) if s["family"] in ("k1 = k2", "k2 > k1")
                 else SINGLE[s["family"]], "linewidth": 2.0 if s["family"] == "k1 = k2" else 1.4}  # fmt: skip
        axes[0].plot(xs, loss, STYLE[s["family"]], label=name, **style)
        axes[1].plot(xs, seconds, STYLE[s["family"]], **style)
    finite = [v for v in shown if math.isfinite(v)]
    if finite:  # the first bins, before anything is learnt, would flatten the rest
        low, high = min(finite), sorted(finite)[int(0.95 * (len(finite) - 1))]
        axes[0].set_ylim(low - 0.05 * (high - low + 1e-9), high + 0.05 * (high - low + 1e-9))
    change = next(iter(rows.values()))["change"]
    if change:
        for ax in axes:
            ax.axvline(change, color="grey", linewidth=0.8)
    axes[0].set_ylabel(f"prequential {ONLINE_TASKS[task].unit} (per bin)")
    axes[1].set_ylabel("training seconds (one core)")
    axes[1].set_yscale("log")  # per-token updates cost tens of times the rest
    for ax in axes:
        ax.set_xlabel("observations seen (targets)")
        ax.grid(alpha=0.3)
    fig.suptitle(ONLINE_TASKS[task].title, fontsize=10)
    save(fig, path)


def page(runs: list[dict], figures: Path, page_path: Path, command: str, setup: str, intro: str) -> None:
    """Write the prequential study's page and one figure per task (``online-TASK.png``) into ``figures``."""
    summary = summarise(runs)
    figures.mkdir(parents=True, exist_ok=True)
    parts = head("does k2 > k1 pay when the data arrives once?", command, setup, intro)
    parts += ["## The answer", "\n".join(f"- {line}" for line in answer(summary))]
    for task in (t for t in ONLINE_TASKS if t in summary):
        rows = summary[task]
        image = figures / f"online-{task}.png"
        figure(task, rows, image)
        first = next(iter(rows.values()))
        parts += [
            f"## {ONLINE_TASKS[task].title}",
            f"Without memory of the stream ({first['reference_name']}): {first['reference']:.4f} "
            f"{ONLINE_TASKS[task].unit}.",
            f"![{task}]({_link(page_path, image)})",
            table(task, rows),
            "\n".join(f"- {line}" for line in findings(task, rows)),
        ]
    page_path.parent.mkdir(parents=True, exist_ok=True)
    page_path.write_text("\n\n".join(parts) + "\n")
