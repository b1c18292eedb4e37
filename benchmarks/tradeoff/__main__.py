"""``python -m benchmarks.tradeoff``: quality against time under each truncation, on four real tasks.

See :mod:`benchmarks.tradeoff` for what it measures. The full study writes ``docs/data/tradeoff.jsonl``, the page
``docs/benchmarks-tradeoff.md`` and ``docs/images/tradeoff-TASK.png``; ``--quick`` (two truncations, one rate,
runs of one second) writes under ``runs/tradeoff-quick/`` unless told otherwise. ``--online`` runs the prequential
study instead (:mod:`benchmarks.tradeoff.online`): ``docs/data/online.jsonl``, ``docs/benchmarks-online.md`` and
``docs/images/online-TASK.png``, or with ``--quick`` (short streams, small models) under ``runs/online-quick/``.
Runs already in the results file are not trained again (a stopped study continues; a finished one is redrawn);
``--fresh`` starts over.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch

from benchmarks.tradeoff import INTRO, ONLINE_INTRO, online_report
from benchmarks.tradeoff.online_tasks import ONLINE_TASKS
from benchmarks.tradeoff.report import page
from benchmarks.tradeoff.study import plan, read_results, selected, study
from benchmarks.tradeoff.tasks import TASKS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line's options, with the output paths filled in."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.tradeoff", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tasks", nargs="+", choices=sorted({*TASKS, *ONLINE_TASKS}), help="default: every task of the study"
    )
    p.add_argument("--online", action="store_true", help="the prequential study: each stream read once, in order")
    p.add_argument(
        "--seeds", type=int, default=3, help="seeds reported, at the chosen rate; seed 0 only chooses it (default 3)"
    )
    p.add_argument("--workers", type=int, default=2, help="runs at once, one core each (default 2)")
    p.add_argument("--quick", action="store_true", help="a smoke test: two truncations, one rate, 1-second runs")
    p.add_argument("--results", type=Path, help="JSON lines of the runs, read and appended to")
    p.add_argument("--markdown", type=Path, help="the page to write")
    p.add_argument("--figures", type=Path, help="the folder of the figures")
    p.add_argument("--fresh", action="store_true", help="discard the runs in --results and train every run again")
    p.add_argument("--report-only", action="store_true", help="redraw the page and figures from --results")
    args = p.parse_args(argv)
    if args.fresh and args.report_only:
        p.error("--fresh discards the runs that --report-only would draw: pass one of them.")
    tasks = ONLINE_TASKS if args.online else TASKS
    args.tasks = args.tasks or list(tasks)
    unknown = [t for t in args.tasks if t not in tasks]
    if unknown:
        kind = "prequential study" if args.online else "study"
        p.error(f"{', '.join(unknown)}: not a task of the {kind} ({', '.join(tasks)}).")
    name = "online" if args.online else "tradeoff"
    root = Path(f"runs/{name}-quick") if args.quick else Path("docs")
    args.results = args.results or root / "data" / f"{name}.jsonl"
    args.markdown = args.markdown or root / f"benchmarks-{name}.md"
    args.figures = args.figures or root / "images"
    # The budget study's page ends with the prequential study's answer, read from its results beside.
    online_root = Path("runs/online-quick") if args.quick else Path("docs")
    args.online_results, args.online_page = online_root / "data" / "online.jsonl", online_root / "benchmarks-online.md"
    return args


def _online_runs(args: argparse.Namespace) -> list[dict]:
    """The prequential study's reported runs, if its results lie beside the budget study's; else none."""
    if not args.online_results.exists():
        return []
    return selected(read_results(args.online_results), plan(list(ONLINE_TASKS), args.quick, True), args.seeds)


def main(argv: list[str] | None = None) -> list[dict]:
    """Run (or, with ``--report-only``, read) the study; write its page and figures; the runs reported."""
    args = parse_args(argv)
    if args.fresh:
        args.results.unlink(missing_ok=True)
    if args.report_only:
        runs = selected(read_results(args.results), plan(args.tasks, args.quick, args.online), args.seeds)
    else:
        runs = study(args.tasks, args.seeds, args.workers, args.quick, args.results, args.online)
    command = " ".join(["python -m benchmarks.tradeoff", *(argv if argv is not None else sys.argv[1:])])
    setup = (
        f"{platform.machine()}, {args.workers} runs at once, one thread each, torch {torch.__version__}; "
        f"seeds 1 to {args.seeds} reported"
    )
    if args.online:
        online_report.page(runs, args.figures, args.markdown, command, setup, ONLINE_INTRO)
    else:
        closing = online_report.section(_online_runs(args), args.figures, args.markdown, args.online_page)
        page(runs, read_results(args.results), args.figures, args.markdown, command, setup, INTRO, closing)
    print(f"wrote {args.markdown} and {len(args.tasks)} figures in {args.figures}")
    return runs


if __name__ == "__main__":
    main()
