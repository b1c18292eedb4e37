import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import methods, run
from ignite_tbptt import RandomWindows

pytestmark = pytest.mark.slow  # runs the quick benchmark
ROOT = Path(__file__).parent.parent


def tiny_batches(steps=24, length=12, batch=3):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 100, (steps + 1, batch), generator=g)
    return [(tokens[i : i + length], tokens[i + 1 : i + 1 + length]) for i in range(0, steps, length)]


def train(method, k1, k2, **kwargs):
    torch.manual_seed(0)
    model = methods.CharModel(hidden=8).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    method(model, optimizer, tiny_batches(), k1, k2, torch.device("cpu"), **kwargs)
    return [p.detach() for p in model.parameters()]


def assert_equal(a, b):
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-9)


@pytest.mark.parametrize("k1,k2", [(3, 7), (4, 6), (2, 5), (4, 4)])
@pytest.mark.parametrize("method", [methods.chained, methods.segmented])
def test_the_exact_baselines_compute_what_ours_computes(method, k1, k2):
    # A baseline is only a fair comparison if it does the same work correctly.
    assert_equal(train(method, k1, k2), train(methods.ours, k1, k2))


@pytest.mark.parametrize("k1,k2", [(3, 7), (4, 4)])
def test_the_exact_hand_loop_on_random_windows_and_one_stream_computes_what_ours_computes(k1, k2):
    windows = functools.partial(RandomWindows, k1, k2, std=1.5, min_length=1, seed=0)
    options = dict(make_windows=windows, one_stream=True)
    assert_equal(train(methods.segmented, k1, k2, **options), train(methods.ours, k1, k2, **options))


@pytest.mark.parametrize("k1,k2", [(4, 8), (1, 5), (2, 8)])
def test_the_captured_exact_hand_loop_for_k2_above_k1_computes_what_ours_computes(k1, k2):
    # benchmarks.graphs' floor for k2 > k1, its graph's body run eagerly every window on the CPU.
    from benchmarks.graphs import hand_captured_reaching

    def gru(method):
        torch.manual_seed(0)
        model = methods.CharModel("gru", hidden=8).double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        method(model, optimizer, tiny_batches(), k1, k2, torch.device("cpu"))
        return [p.detach() for p in model.parameters()]

    assert_equal(gru(hand_captured_reaching), gru(methods.ours))


def test_the_hand_loop_and_ignite_compute_what_ours_computes_for_k1_equal_k2():
    ours = train(methods.ours, 4, 4)
    assert_equal(train(methods.hand, 4, 4), ours)
    assert_equal(train(methods.ignite, 4, 4), ours)
    assert_equal(train(methods.ours, 4, 4, recompute_steps=2), ours)


def test_quick_benchmark_runs_every_contender_and_writes_its_table(tmp_path):
    out, markdown = tmp_path / "results.json", tmp_path / "benchmarks.md"
    run.main(["--quick", "--documents", "--out", str(out), "--markdown", str(markdown)])
    result = json.loads(out.read_text())
    methods_seen = {(r["k1"] == r["k2"], r["method"]) for r in result["time"]}
    assert {(True, "hand"), (True, "ignite"), (True, "ours"), (True, "compute limit")} <= methods_seen
    assert {(False, "chained"), (False, "recompute"), (False, "ours"), (False, "compute limit")} <= methods_seen
    assert {(False, "hand, exact segments"), (True, "compute limit, recompute")} <= methods_seen
    assert {(True, "ours, documents"), (False, "ours, documents")} <= methods_seen
    assert all(r["tokens_per_second"] > 0 for r in result["time"])
    assert [(r["steps"], r["recompute"]) for r in result["memory"]] == [(60, None), (240, None), (40, 5)]
    assert all(r["saved_activations_mib"] > 0 for r in result["memory"])
    assert "| lstm | 25 | 50 | chained |" in markdown.read_text()


def test_the_benchmark_runs_at_other_sizes_and_under_autocast(tmp_path):
    markdown, out = tmp_path / "page.md", tmp_path / "result.json"
    sizes = ["--layers", "2", "--hidden", "24", "--vocab", "40", "--embedding", "8", "--autocast", "bfloat16"]
    # A GRU: oneDNN's CPU LSTM has no bfloat16 kernel on every machine (CUDA's has).
    options = ["--quick", "--cells", "gru", "--pairs", "20/30", *sizes, "--out", str(out), "--markdown", str(markdown)]
    result = run.main(options)
    assert {"ours", "hand, exact segments", "compute limit"} <= {r["method"] for r in result["time"]}
    assert {r["model"] for r in result["time"]} == {"gru"}
    assert len(result["memory"]) == 3 and all(r["peak_mib"] > 0 for r in result["memory"])
    assert "(2 layers of 24 units), vocabulary 40, under bfloat16 autocast" in markdown.read_text()
    # Every method trains this model: two layers, 40 symbols, predictions back in float32 for the loss.
    args = argparse.Namespace(vocab=40, embedding=8, hidden=24, layers=2, autocast="bfloat16")
    y_pred, hidden = methods.build_model(args, "gru", torch.device("cpu"))(torch.zeros(5, 3, dtype=torch.long))
    assert y_pred.shape == (5, 3, 40) and y_pred.dtype == torch.float32 and hidden.shape[0] == 2


def test_overhead_benchmark_counts_the_host_reads_per_window(tmp_path):
    from benchmarks import overhead

    markdown = tmp_path / "overhead.md"
    rows = overhead.main(["--repeats", "1", "--steps", "200", "--calls", "100", "--markdown", str(markdown)])
    reads = {(r["k1"], r["method"]): r["reads_per_window"] for r in rows}
    # On the CPU each step's decision is read at once: one read per window (one step each), and one per iteration.
    for k1 in (5, 1):
        assert 1.0 < reads[k1, "ours"] < 1.1 and 1.0 < reads[k1, "ours, no state checks (ablation)"] < 1.1
        # An accelerator's path: two reads per iteration, none per window.
        assert reads[k1, "ours, decisions on the device (an accelerator's path)"] < 0.1
    assert reads[5, "ignite"] == 2.0 and reads[5, "ours, unfused SGD"] > 1.0  # ignite: two per chunk
    assert "µs per window" in markdown.read_text() and "| torch's zero_grad() |" in markdown.read_text()


def test_lightning_benchmark_trains_lightnings_example_as_its_recipe_does(tmp_path):
    pytest.importorskip("lightning")
    from benchmarks import lightning

    markdown = tmp_path / "lightning.md"
    result = lightning.main(["--repeats", "1", "--steps", "200", "--epochs", "1", "--markdown", str(markdown)])
    assert set(result["us"]) == set(lightning.CONTENDERS) and all(us > 0 for us in result["us"].values())
    recipe, ours = (result["example"][name] for name in lightning.EXAMPLE[:2])
    # The same parameters bit for bit; the epoch's loss is averaged in Lightning's log in another order.
    assert all(torch.equal(p, q) for p, q in zip(recipe["params"], ours["params"], strict=True))
    assert recipe["test"] == ours["test"] and recipe["losses"] == pytest.approx(ours["losses"], rel=1e-6)
    text = markdown.read_text()
    assert "TBPTT(10, 10): equal, bit for bit" in text and "| TBPTTModule |" in text


def test_sysid_benchmark_trains_every_method_and_tunes_the_burn_in():
    from benchmarks import sysid

    rows = sysid.main(["--steps", "10", "--seeds", "0"])
    methods = [(r["system"], r["method"]) for r in rows if "method" in r]
    assert len(methods) == len(sysid.SYSTEMS) * len(sysid.METHODS)
    steps = {r["method"]: r["steps"] for r in rows if "method" in r}
    assert steps["full BPTT, as many samples"] == 2  # a fifth: each of its steps sees the whole record
    assert steps["full BPTT, as many steps"] == steps["windows, m = 0"] == 10
    for r in rows:  # a burn-in without gradient holds no graph of its steps
        if r.get("method") == "windows, tuned m, no gradient":
            assert r["graph"] == f"{50 - r['m']} x 16"
    assert all(len(r["errors"]) == 1 and r["errors"][0] > 0 for r in rows if "method" in r)
    tuned = [r["m"] for r in rows if r.get("method") == "windows, tuned m"]
    assert all(m in sysid.BURN_INS for m in tuned)


def test_alignment_benchmark_and_profile_run(tmp_path, capsys):
    from benchmarks import profile, sequences

    rows = sequences.main(["--repeats", "1", "--cells", "gru", "--means", "2", "--per-column", "4"])
    layouts = {r["layout"]: r for r in rows}
    assert layouts["one stream, no starts"]["vs_stream"] == 1.0 and layouts["one stream, no starts"]["padding"] == 0
    assert layouts["packed, align=k1"]["padding"] > 0  # alignment pads; the time per predicted token counts it
    profile.main(["--steps", "200", "--hidden", "16", "--k1", "20", "--k2", "30"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("tbptt.forward", "tbptt.sweep", "tbptt.optimizer_step"))


def test_influence_balancing_fixed_windows_diverge_and_artbp_converges():
    from benchmarks import influence_balancing as ib
    from ignite_tbptt import ARTBP

    fixed = ib.train(3, steps=3000)  # the short window sees only theta's short-term, positive effect
    assert fixed["final_theta"] > 1000 > -ib.OPTIMUM
    artbp = ib.train(ARTBP(grid=1, mean_length=8, seed=0), steps=6000)
    assert not artbp["diverged"] and abs(artbp["final_theta"] - ib.OPTIMUM) < 0.01


def test_the_device_check_runs_every_step_on_the_cpu_at_tiny_sizes(tmp_path):
    # benchmarks/gpu_check.sh is run by hand on a GPU; its dry run here keeps every step's command working. Its two
    # fla steps are left out: on the CPU they are pytest runs of tests this suite runs itself (fla's reference
    # kernels), through the same command as the other test steps, and each would import fla again (10 s). The page
    # takes the fla example's table and the fla tests' summary from the logs those steps leave, written here.
    (tmp_path / "fla-tests.log").write_text("tests/models/test_fla.py::test_x PASSED\n===== 10 passed in 9.87s =====\n")
    header = "Each model trained for 30 s or 1000 optimizer steps; 8 columns"
    row = "| fla GLA | 1,234 | 1000 | 2.345 |"
    (tmp_path / "fla-example.log").write_text(f"{header}\n| model | parameters | steps | valid_bpc |\n|---|\n{row}\n")
    steps = "tests graph-tests table-float32 table-bfloat16 graphs prequential profile main-job page"
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "ONLY": steps}
    done = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every step passed" in done.stdout
    for name in steps.split():
        assert f"== {name}: done" in done.stdout
    # The graph tests' step prints each test's outcome as it ends, a pass too: what a GPU run certifies is read off it.
    assert " PASSED" in done.stdout.split("== graph-tests:", 1)[1].split("== ", 1)[0]
    assert "| lstm |" in (tmp_path / "table-float32.md").read_text()
    graphs = (tmp_path / "graphs.md").read_text()
    assert "| ours, cuda_graphs |" in graphs and "| (1, 8) | ours, cuda_graphs |" in graphs
    assert "| TBPTT(1, 25) | cuda_graphs |" in (tmp_path / "prequential.log").read_text()
    assert "bits" in (tmp_path / "main-job.log").read_text()
    # The page takes every part the steps left: the tests' outcome, both tables, the graphs and the main job.
    page = (tmp_path / "benchmarks-cuda.md").read_text()
    assert "passed" in page and "| ours, cuda_graphs |" in page and "| eager |" in page
    assert "| TBPTT(1, 25) | eager |" in page
    assert f"{header}\n\n| model |" in page and row in page and "**10 passed in 9.87s**" in page
    assert "left no" not in page


def test_the_sharded_memory_benchmark_runs_at_tiny_sizes():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.sharded_memory", "--hidden", "16", "--batches", "1", "--ratios", "1", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 2 |" in done.stdout and "weights" in done.stderr


def test_the_mamba2_memory_benchmark_measures_tbptt_and_full_bptt_at_tiny_sizes():
    pytest.importorskip("transformers")
    command = [sys.executable, "-m", "benchmarks.mamba2_memory", "--lengths", "128", "--full-up-to", "128"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 128 | TBPTT(32, 64) |" in done.stdout and "| 128 | full BPTT |" in done.stdout


def test_the_spread_of_an_examples_figures_runs_each_seed_and_thread_count_apart_and_writes_its_page(tmp_path):
    from benchmarks import spread

    out, page = tmp_path / "spread.jsonl", tmp_path / "examples.md"
    argv = ["decoder", "--seeds", "0", "1", "--threads", "1", "--out", str(out), "--page", str(page)]
    spread.main([*argv, "--", "--length", "200"])  # a few seconds a run
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["example"], r["seed"], r["threads"], r["args"]) for r in records] == [
        ("decoder", seed, 1, ["--length", "200"]) for seed in (0, 1)
    ]
    assert records[0]["figures"] != records[1]["figures"]  # another seed, another training
    right = [r["figures"]["TBPTT(1, 8): accuracy"] for r in records]
    text = page.read_text()
    assert "`python -m ignite_tbptt.examples.decoder [--k2 3] --length 200`, 2 runs: seeds 0, 1 on 1 thread." in text
    assert f"| spread |  | {min(right):.3f}-{max(right):.3f} |" in text


def test_the_models_page_has_a_checked_row_for_each_model_and_the_torch_rows_are_what_check_model_says(monkeypatch):
    from benchmarks import models

    page = models.PAGE.read_text()
    section = page[page.index(models.BEGIN) : page.index(models.END)]
    assert section.count("\n| ") == len(models.MODELS) + 1  # the header and one row each
    monkeypatch.setattr(models, "MODELS", [m for m in models.MODELS if m[1] == "torch"][:4])
    torch_rows = [row for row in section.splitlines() if "| torch " in row][:4]
    for fresh, written in zip(models.rows(), torch_rows):
        assert fresh[3:9] == [cell.strip() for cell in written.split("|")[4:10]], (fresh[0], written)
