import json
import math
import os
import re

import pytest

from benchmarks.tradeoff import __main__ as tradeoff
from benchmarks.tradeoff import runner
from benchmarks.tradeoff.report import compare
from benchmarks.tradeoff.study import QUICK_BUDGET, chosen_lr
from benchmarks.tradeoff.truncations import truncations
from ignite_tbptt import ARTBP, AdaptiveTruncation, RandomWindows


def test_truncations_compare_k2_above_k1_at_the_same_k2_and_build_each_source():
    specs = truncations((10, 25, 50, 100, 200))
    assert [s.name for s in specs] == [
        "TBPTT(10, 10)", "TBPTT(25, 25)", "TBPTT(50, 50)", "TBPTT(100, 100)", "TBPTT(200, 200)",
        "TBPTT(10, 50)", "TBPTT(25, 50)", "TBPTT(25, 100)", "TBPTT(50, 100)",
        "random, mean 50", "ARTBP, mean 50", "adaptive k2, k1 = 25",
    ]  # fmt: skip
    random_windows, artbp, adaptive = (s.build(seed=3) for s in specs[-3:])
    assert isinstance(random_windows[0], RandomWindows) and random_windows[0].k1 == 50
    assert isinstance(artbp[0], ARTBP) and artbp[0].grid == 25
    assert adaptive[:2] == (25, 50) and isinstance(adaptive[2], AdaptiveTruncation)
    assert (adaptive[2].k2_min, adaptive[2].k2_max) == (26, 200)


def test_learning_rate_rule_takes_the_lowest_seed_zero_loss_and_puts_diverged_runs_last():
    entry = {"task": "t", "truncation": "a", "budget": 5.0, "lrs": (1e-3, 3e-3, 1e-2)}

    def run(lr, bits, seed=0):
        return {"task": "t", "truncation": "a", "budget": 5.0, "lr": lr, "seed": seed, "final_bits": bits}

    results = [run(1e-3, 2.0), run(3e-3, 1.5), run(1e-2, math.nan), run(1e-3, 0.1, seed=1)]
    assert chosen_lr(results, entry) == 3e-3  # seed 1's lower loss does not vote; NaN never wins


def test_a_difference_is_clear_only_when_the_seeds_ranges_do_not_overlap():
    a, b = {"mean": 1.0, "low": 0.9, "high": 1.1}, {"mean": 1.3, "low": 1.2, "high": 1.4}
    assert compare(a, b) == "0.300 lower"
    assert compare(b, {**a, "high": 1.25}) == "0.300 higher (within the seeds' spread)"


def test_the_training_clock_stops_while_paused(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(runner.time, "perf_counter", lambda: now[0])
    clock = runner.TrainingClock()
    clock.start()
    now[0] += 2.0
    clock.pause()  # the evaluator runs here
    now[0] += 30.0
    assert clock.seconds() == 2.0
    clock.start()
    now[0] += 0.5
    assert clock.seconds() == 2.5


@pytest.mark.slow  # trains the quick study
def test_quick_study_trains_each_truncation_to_its_budget_and_reports_what_it_measured(tmp_path):
    results, page = tmp_path / "runs.jsonl", tmp_path / "page.md"
    argv = ["--quick", "--seeds", "1", "--results", str(results), "--markdown", str(page), "--figures", str(tmp_path)]
    malloc = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    runs = tradeoff.main(argv)
    assert os.environ.get("MALLOC_MMAP_THRESHOLD_") == malloc  # the runs' setting does not leak into this process
    assert {r["task"] for r in runs} == {"python", "folk", "vowels", "digits"}
    assert len(runs) == 4 * 2 and {r["seed"] for r in runs} == {1}  # seed 0 chose the rate and is not reported
    assert len(results.read_text().splitlines()) == 4 * 2 * 2
    for r in runs:
        last = r["curve"][-1]
        assert len(r["curve"]) == 6 and r["peak_mib"] > 0
        assert last["seconds"] >= QUICK_BUDGET  # the run ends only once the budget is spent
        assert all(a["seconds"] < b["seconds"] for a, b in zip(r["curve"], r["curve"][1:]))
        first = r["curve"][0]
        if r["task"] in ("python", "folk") and first["epoch"] == 1:
            # 12 full columns, windows ending on batch ends until the epoch's last, shorter batch: a step a window
            k1 = int(re.match(r"TBPTT\((\d+)", r["truncation"]).group(1))
            steps = first["steps"] * k1 * 12
            if r["task"] == "folk":  # one stream: every step predicts a character
                assert first["targets"] == steps
            else:  # documents: a few steps are padding, with no target
                assert 0.99 * steps < first["targets"] <= steps
    text = page.read_text()
    for task in ("python", "folk", "vowels", "digits"):
        assert (tmp_path / f"tradeoff-{task}.png").stat().st_size > 10_000
    python_runs = [r for r in runs if r["task"] == "python" and r["truncation"] == "TBPTT(50, 50)"]
    assert len(python_runs) == 1 and "| TBPTT(50, 50) " in text and f"{python_runs[0]['final_bits']:.3f} (" in text
    assert "TBPTT(25, 50) against TBPTT(50, 50): " in text

    # A second call finds every run in the results file: nothing is trained again, the page is redrawn.
    lines = results.read_text().splitlines()
    page.unlink()
    again = tradeoff.main(argv)
    assert results.read_text().splitlines() == lines and page.read_text() == text
    assert sorted(json.dumps(r, sort_keys=True) for r in again) == sorted(json.dumps(r, sort_keys=True) for r in runs)


def test_prequential_summary_weights_windows_by_targets_and_takes_the_last_quarter_of_them():
    from benchmarks.tradeoff.online import summary

    values, targets = [4.0, 2.0, 1.0, 3.0], [10, 30, 20, 20]  # 80 targets; the last quarter is the last window
    moments = [(0.1, 1), (0.2, 2), (0.3, 3), (0.4, 4)]
    out = summary(values, targets, moments, bins=2)
    assert out["final_bits"] == (40 + 60 + 20 + 60) / 80
    assert out["last_quarter"] == 3.0
    assert out["curve"] == [
        {"targets": 40, "loss": (40 + 60) / 40, "seconds": 0.2, "steps": 2},
        {"targets": 80, "loss": (20 + 60) / 40, "seconds": 0.4, "steps": 4},
    ]
    assert math.isnan(summary([1.0, math.inf], [1, 1], moments[:2])["final_bits"])  # a diverged run ranks last


def test_prequential_run_scores_every_target_once_with_the_weights_before_it_learns_from_it():
    import torch

    from benchmarks.tradeoff.online import online_run
    from benchmarks.tradeoff.online_tasks import ONLINE_TASKS

    # With lr = 0 nothing is learnt, so the prequential loss is the initial model's over the whole stream, computed
    # here in one call: each target counted once, whatever the windows (k2 > k1 reaches back over scored targets).
    frozen = online_run("power", "TBPTT(10, 20)", 0.0, 3, None, True)
    torch.manual_seed(3)
    stream = ONLINE_TASKS["power"].load(True)
    model = stream.model()
    x = torch.cat([x for x, _ in stream.batches])
    y = torch.cat([y for _, y in stream.batches])
    with torch.no_grad():
        expected = stream.loss_fn(model(x)[0], y).item()
    assert frozen["targets"] == y.numel()
    assert frozen["final_bits"] == pytest.approx(expected, rel=1e-5)
    # Learning lowers the loss of the targets scored after it, so that the two differ (the test can fail).
    learnt = online_run("power", "TBPTT(10, 20)", 3e-3, 3, None, True)
    assert learnt["targets"] == y.numel() and learnt["final_bits"] < 0.9 * expected


@pytest.mark.slow  # trains the quick prequential study
def test_quick_prequential_study_reads_each_stream_once_and_reports_per_observation(tmp_path):
    results, page = tmp_path / "runs.jsonl", tmp_path / "page.md"
    argv = ["--online", "--quick", "--seeds", "1", "--results", str(results), "--markdown", str(page)]
    runs = tradeoff.main([*argv, "--figures", str(tmp_path)])
    assert {r["task"] for r in runs} == {"python", "power", "shift"}
    assert len(runs) == 3 * 2 and len(results.read_text().splitlines()) == 3 * 2 * 2
    for r in runs:
        assert r["budget"] is None and r["steps"] > 0 and len(r["curve"]) > 10
        assert math.isfinite(r["final_bits"]) and math.isfinite(r["last_quarter"])
        same_task = [q for q in runs if q["task"] == r["task"]]
        assert {q["targets"] for q in same_task} == {r["targets"]}  # every truncation scores the same targets
    shift = next(r for r in runs if r["task"] == "shift")
    assert 0 < shift["change"] < shift["targets"]
    text = page.read_text()
    assert "TBPTT(25, 50) against TBPTT(50, 50): whole stream " in text
    assert "TBPTT(25, 50) against TBPTT(25, 25)" not in text  # only comparisons with runs that exist
    for task in ("python", "power", "shift"):
        assert (tmp_path / f"online-{task}.png").stat().st_size > 10_000


def test_prequential_answer_counts_each_k2_above_k1_pair_as_clearly_lower_higher_or_within_the_spread(tmp_path):
    from benchmarks.tradeoff.online_report import answer, section

    def row(family, mean, spread=0.01, seconds=1.0):
        return {"family": family, "mean": mean, "low": mean - spread, "high": mean + spread, "seconds": seconds}

    # The power stream's truncations (ks 5, 10, 20, 40, 80): k2 > k1 pairs TBPTT(5, 20) and TBPTT(10, 20) beside
    # TBPTT(20, 20); TBPTT(10, 40) and TBPTT(20, 40) beside TBPTT(40, 40).
    rows = {
        "TBPTT(5, 5)": row("k1 = k2", 1.00),
        "TBPTT(10, 10)": row("k1 = k2", 1.10, seconds=0.5),
        "TBPTT(20, 20)": row("k1 = k2", 1.30),
        "TBPTT(40, 40)": row("k1 = k2", 1.60),
        "TBPTT(5, 20)": row("k2 > k1", 0.90, seconds=2.0),  # clearly below TBPTT(5, 5)
        "TBPTT(10, 20)": row("k2 > k1", 1.25),  # clearly above TBPTT(10, 10)
        "TBPTT(10, 40)": row("k2 > k1", 1.11),  # within the spread of TBPTT(10, 10)
        "TBPTT(1, 10)": row("per-token", 0.80, seconds=10.0),
    }
    lines = answer({"power": rows})
    assert lines[0].endswith(
        "best TBPTT(1, 10), 0.800 squared error against 1.000 for TBPTT(5, 5), the best k1 = k2; 20x the seconds of "
        "TBPTT(10, 10)."
    )
    assert "same k1 (what the longer reach gives), over the whole stream: clearly lower on 1 of 3 pairs, clearly " \
        "higher on 1, within the seeds' spread on 1. Lower: TBPTT(5, 20) on power (0.900 against 1.000 for " \
        "TBPTT(5, 5), 2.0x the seconds)." in lines[1]  # fmt: skip
    assert "same k2 (what updating more often gives), over the whole stream: clearly lower on 3 of 3 pairs" in lines[2]
    parts = section([], tmp_path, tmp_path / "page.md", tmp_path / "online.md")
    assert parts == []  # no prequential results: the budget page has no such section
