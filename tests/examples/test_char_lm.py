import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ignite_tbptt.examples import char_lm

from .documented import BITS, figures, full_run, within

pytestmark = pytest.mark.slow  # trains the main job's model in subprocesses


SMALL = ["--max-chars", "40000", "--hidden", "64", "--embedding", "16", "--seq-len", "50", "--batch-size", "8"]
STREAM = [*SMALL, "--layout", "stream"]


def test_main_job_learns_and_logs_the_loss_curve_to_tensorboard(tmp_path):
    history = char_lm.main([*STREAM, "--k1", "10", "--k2", "20", "--epochs", "2", "--logdir", str(tmp_path)])

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert {"train/window_loss", "train/grad_norm", "validation/bpc"} <= set(events.Tags()["scalars"])
    assert events.Tags()["images"] == ["schedule"]
    curve = events.Scalars("train/window_loss")
    # 38,000 training characters in 8 streams: 4,749 steps per epoch, so 475 windows of 10 steps.
    assert [e.step for e in curve] == list(range(1, 2 * 475 + 1))
    first, last = curve[:20], curve[-20:]
    assert curve[0].value > math.log(50)  # the untrained model guesses among ~80 symbols
    assert sum(e.value for e in last) / 20 < 0.75 * sum(e.value for e in first) / 20
    validation = events.Scalars("validation/bpc")
    assert [e.step for e in validation] == [475, 950]
    assert [e.value for e in validation] == pytest.approx(history["valid_bpc"], rel=1e-6)
    assert history["valid_bpc"][1] < history["valid_bpc"][0] < history["unigram_bpc"]


def test_stdlib_corpus_is_real_python_source():
    documents = char_lm.stdlib_documents()
    assert len(documents) > 30 and all(d.strip() for d in documents)
    text = char_lm.stdlib_corpus()
    assert len(text) > 500_000
    assert "def " in text and "import " in text
    vocab = char_lm.Vocabulary(text)
    assert 3.5 < vocab.unigram_bpc(text[-50_000:]) < 5.5


def test_module_runs_from_the_command_line_on_a_text_file(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400, encoding="utf-8")
    logdir = tmp_path / "runs"
    result = subprocess.run(
        [sys.executable, "-m", "ignite_tbptt.examples.char_lm", *STREAM, "--text", str(corpus), "--k1", "8"]
        + ["--k2", "12", "--epochs", "2", "--logdir", str(logdir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "epoch 1: validation" in out
    bpc = float(out.split("epoch 1: validation ")[1].split()[0])
    assert bpc < 3.0  # a 28-symbol repeated sentence is learnt well below its unigram entropy
    assert list(logdir.glob("events.out.tfevents.*"))
    # Where the logs go, before training; then, written to a file (no terminal), each epoch's progress as lines, the
    # finished one once, and nothing redrawn with carriage returns.
    assert f"TensorBoard logs: {logdir}/ (to view them: tensorboard --logdir {logdir})" in out
    assert f"checkpoints: {logdir / 'checkpoints'}/, every 100 iterations and on Ctrl-C" in out
    assert "\r" not in out + result.stderr
    for epoch in (1, 2):
        done = [line for line in out.splitlines() if line.startswith(f"epoch {epoch}/2: ") and "(100%)" in line]
        assert len(done) == 1, out
        assert " batches/s; last batch bits/char " in done[0]
    assert out.index("epoch 1/2: ") < out.index("epoch 1: validation") < out.index("epoch 2/2: ")


def test_the_progress_bar_in_a_terminal_shows_the_rate_and_bits_per_character_after_it():
    from tqdm import tqdm

    from ignite_tbptt.examples._char_lm import BAR

    line = tqdm.format_meter(
        431, 958, 10.5, ncols=100, prefix="Epoch [1/2]: ", bar_format=BAR, postfix="bits/char=2.11", unit=" batches"
    )
    assert line.startswith("Epoch [1/2]: [431/958]  45%|") and len(line) == 100
    assert line.endswith("| [00:10<00:12, 41.05 batches/s, bits/char=2.11]")


def test_resume_from_a_mid_epoch_checkpoint_reproduces_the_uninterrupted_run(tmp_path):
    args = [*STREAM, "--k1", "10", "--k2", "25", "--epochs", "2", "--no-progress", "--checkpoint-every", "40"]
    full = char_lm.main([*args, "--logdir", str(tmp_path / "full")])
    # 4,749 steps of 50 per epoch: 95 iterations; the last two checkpoints kept are 120 and 160, in epoch 2.
    checkpoint = tmp_path / "full" / "checkpoints" / "checkpoint_120.pt"
    assert checkpoint.is_file()
    resumed = char_lm.main([*args, "--logdir", str(tmp_path / "resumed"), "--resume", str(checkpoint)])
    assert resumed["valid_bpc"] == [full["valid_bpc"][-1]]  # exactly: the same parameters


def test_a_refused_resume_says_why_in_one_line_and_leaves_no_run_directory(tmp_path, monkeypatch):
    args = [*STREAM, "--k1", "10", "--k2", "25", "--epochs", "1", "--no-progress", "--checkpoint-every", "40"]
    char_lm.main([*args, "--logdir", str(tmp_path / "first")])
    checkpoint = tmp_path / "first" / "checkpoints" / "checkpoint_80.pt"  # mid-stream: k2 may not change there
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:
        char_lm.main([*STREAM, "--k1", "10", "--k2", "30", "--no-progress", "--resume", str(checkpoint)])
    message = str(refused.value.code)
    assert "\n" not in message and message.startswith(f"--resume {checkpoint}: ")
    assert "windows: saved Schedule(k1=10, k2=25), given Schedule(k1=10, k2=30)" in message
    assert not (tmp_path / "runs").exists()  # the refused run wrote nothing


def test_documents_are_packed_with_a_reset_at_each_start(tmp_path, capsys):
    # Three files, each a document: a column resets its hidden state where the next one starts.
    paths = []
    for i, sentence in enumerate(["the quick brown fox. ", "jumps over the dog. ", "pack my box with jugs. "]):
        paths.append(tmp_path / f"doc{i}.txt")
        paths[-1].write_text(sentence * (60 + 40 * i), encoding="utf-8")
    args = ["--text", *map(str, paths), "--batch-size", "2", "--seq-len", "40", "--hidden", "64", "--embedding", "16"]
    args += [
        "--layout",
        "documents",
        "--valid-fraction",
        "0.2",
        "--k1",
        "8",
        "--k2",
        "12",
        "--epochs",
        "2",
        "--no-progress",
    ]
    history = char_lm.main([*args, "--reach", "3", "--adaptive", "0.01", "--k2-max", "30", "--logdir", str(tmp_path)])
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert "train/reach_at_cut" in events.Tags()["scalars"]  # --reach: the gradient reach in TensorBoard
    k2s = [e.value for e in events.Scalars("train/k2")]  # --adaptive: k2 from 12, in (8, 30]
    assert k2s[0] == 12 and all(9 <= k2 <= 30 for k2 in k2s) and len(set(k2s)) > 1
    assert "in 3 documents" in capsys.readouterr().out  # the validation tail splits the last file in two
    _, train, valid, _ = char_lm.load_data(char_lm.parse_args(args))
    starts = torch.cat([s for _, _, s in train])
    assert starts.sum() == 3 and starts[0].all()  # each training document starts once, two at step 0
    assert all((y != char_lm.IGNORE).all() for _, y, _ in train)  # drop_last: no padding in training
    assert history["valid_bpc"][1] < history["valid_bpc"][0] < 2.5


def test_every_run_logs_to_a_directory_of_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [*STREAM, "--epochs", "1", "--no-progress", "--checkpoint-every", "0"]
    first = Path(char_lm.main(args)["logdir"])
    written = sorted(first.iterdir())
    second = Path(char_lm.main(args)["logdir"])
    assert first != second and first.parent == second.parent == Path("runs")
    assert sorted(first.iterdir()) == written  # the second run added nothing to the first's curves
    assert list(second.glob("events.out.tfevents.*"))


def test_one_large_file_trains_in_every_column_and_the_default_corpus_as_documents(tmp_path, capsys):
    # Packed as one document it would train in one column, the batch size ignored: auto cuts it into streams.
    path = tmp_path / "book.txt"
    path.write_text("it was the best of times, it was the worst of times. " * 400, encoding="utf-8")
    _, train, _, _ = char_lm.load_data(char_lm.parse_args(["--text", str(path), "--batch-size", "6"]))
    assert len(train) > 1 and all(x.shape[1] == 6 for x, _ in train)
    assert "in one stream of 1 document joined by line breaks" in (out := capsys.readouterr().out)
    assert "stream layout (auto: 1 training document for 6 columns)" in out
    _, stream, _, _ = char_lm.load_data(
        char_lm.parse_args(["--text", str(path), "--batch-size", "6", "--layout", "stream"])
    )
    assert len(train) == len(stream)  # the same iterations per epoch as the stream layout
    _, train, _, _ = char_lm.load_data(char_lm.parse_args([]))  # 34 modules of the standard library
    assert "documents layout" in capsys.readouterr().out and train.batch_size == 12


@pytest.mark.parametrize("layout", ["auto", "stream"])
def test_the_start_up_line_counts_the_documents_a_stream_joins_as_its_reason_does(capsys, layout):
    # The first 100,000 characters of the corpus end inside its second module, and 95% of them train: two documents
    # for 12 columns, which auto joins into one stream, a line break between them (one character more); --layout
    # stream joins them before it holds the last 5% out.
    char_lm.load_data(char_lm.parse_args(["--max-chars", "100000", "--layout", layout]))
    line = capsys.readouterr().out
    found = re.search(r"([\d,]+) training characters in one stream of (\d+) documents joined by line breaks", line)
    assert found, line
    characters, documents = int(found.group(1).replace(",", "")), int(found.group(2))
    assert documents == 2 and characters == 95_000 + (documents - 1 if layout == "auto" else 0)
    if layout == "auto":
        assert line.rstrip().endswith("stream layout (auto: 2 training documents for 12 columns)")


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit) as done:
        char_lm.parse_args(["--help"])
    assert done.value.code == 0
    assert "--layout" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        char_lm.parse_args(["--artbp", "25", "--adaptive", "0.1"])  # two ways of choosing the windows


def test_the_main_job_trains_with_unbiased_truncation(tmp_path, capsys):
    args = [*STREAM, "--artbp", "10", "--artbp-grid", "5", "--epochs", "1", "--no-progress", "--checkpoint-every", "0"]
    history = char_lm.main([*args, "--logdir", str(tmp_path)])
    assert "ARTBP(grid=5, mean length 10)" in capsys.readouterr().out
    assert history["valid_bpc"][0] < history["unigram_bpc"]


def test_ctrl_c_stops_the_main_job_within_seconds_every_time_with_a_checkpoint_to_resume(tmp_path):
    # Ten interrupts at random moments, from the set-up to training: each run ends within 5 s of its Ctrl-C, says so
    # in one line and exits with 130. The moments count from the job's first line (its data), printed once the job
    # has taken Ctrl-C over: before, while Python imports torch and the other libraries, a Ctrl-C is Python's own
    # KeyboardInterrupt, which an import can swallow (seen at 1.25 s from start in three full test runs in a row;
    # not reproduced alone).
    import random
    import signal
    import time

    moments = random.Random(0).sample([x / 16 for x in range(4, 32)], 10)  # 0.25 to 2 s after the first line
    args = [*STREAM, "--epochs", "40", "--no-progress", "--checkpoint-every", "0"]  # runs far past 8 s
    checkpoints = []
    for i, moment in enumerate(moments):
        logdir = tmp_path / f"run{i}"
        job = subprocess.Popen(
            [sys.executable, "-m", "ignite_tbptt.examples.char_lm", *args, "--logdir", str(logdir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        first = job.stdout.readline()  # the data line: load_data runs inside the job's Ctrl-C handling
        time.sleep(moment)
        job.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = job.communicate(timeout=30)
        out = first + out
        assert time.monotonic() - sent < 5, (moment, out, err)
        assert job.returncode == 130 and "Traceback" not in err, (moment, out, err)
        assert "interrupted at iteration" in out, (moment, out, err)  # in the set-up too: the run ends as it starts
        checkpoints += list(logdir.glob("checkpoints/interrupted_*.pt"))
    assert len(checkpoints) == len(moments)  # each Ctrl-C leaves a checkpoint; resuming one goes on
    last = str(checkpoints[-1])
    state = torch.load(last, weights_only=True)["trainer"]
    done = state["iteration"] // state["epoch_length"]  # epochs completed: --epochs must be at least that
    args = [*STREAM, "--no-progress", "--logdir", str(tmp_path / "on"), "--resume", last]
    if done > 1:
        with pytest.raises(SystemExit, match=f"has {done} epochs done, more than --epochs 1; pass --epochs {done}"):
            char_lm.main([*args, "--epochs", "1"])
    resumed = char_lm.main([*args, "--epochs", str(done + 1)])
    assert resumed["interrupted"] is None and len(resumed["valid_bpc"]) == 1  # the epoch it was in, finished


def test_a_ctrl_c_before_training_starts_still_stops_the_run_with_a_checkpoint(tmp_path):
    # A Ctrl-C during the set-up is recorded, and ends the run as it starts (ignite clears a terminate request when
    # run() starts; it used to be lost, and the job trained to the end).
    from ignite.engine import Engine

    trainer = Engine(lambda engine, batch: batch)
    said = []
    interrupted = char_lm.StopOnInterrupt()
    try:
        interrupted._interrupt(2, None)  # what the SIGINT handler runs: during the set-up, before attach
        interrupted.attach(trainer, {"trainer": trainer}, tmp_path, said.append)
        trainer.run(range(10), max_epochs=3)
    finally:
        interrupted.restore()
    assert trainer.state.iteration == 0 and trainer.state.epoch == 0
    assert Path(interrupted.checkpoint).is_file() and said == [
        f"interrupted at iteration 0: --resume {interrupted.checkpoint} continues from there"
    ]


@pytest.fixture
def two_processes(device, monkeypatch, free_port):
    """``--device`` for a run of two processes: each on a GPU of its own on CUDA, so skipped with fewer.

    Their rendezvous is on a free port (ignite's ``Parallel`` reads ``MASTER_PORT``; its default, 2222, would be
    taken by such a run of the other pytest worker).
    """
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("two processes on CUDA need two GPUs")
    monkeypatch.setenv("MASTER_PORT", str(free_port))
    return ["--device", str(device)]


def test_more_processes_than_gpus_are_refused_with_the_fix(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit):
        char_lm.main([*STREAM, "--device", "cuda", "--nproc", "2"])
    assert "puts each process on a GPU of its own, and torch sees 1: pass --nproc 1" in capsys.readouterr().err


def test_float16_on_the_cpu_is_refused_with_the_fix(capsys):
    with pytest.raises(SystemExit):
        char_lm.main([*STREAM, "--amp", "fp16"])
    assert (
        "--amp fp16 on the CPU: its LSTM kernels (oneDNN) have none for float16; pass --amp bf16"
        in capsys.readouterr().err
    )


def test_processes_on_one_named_gpu_are_refused_with_the_fix(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(SystemExit):
        char_lm.main([*STREAM, "--device", "cuda:1", "--nproc", "2"])
    assert "each process takes the GPU of its local rank: pass --device cuda." in capsys.readouterr().err


def test_two_processes_train_the_main_job_as_one(tmp_path, two_processes):
    args = [*STREAM, *two_processes, "--k1", "10", "--k2", "20", "--epochs", "2", "--no-progress"]
    args += ["--checkpoint-every", "0", "--max-chars", "20000"]  # the last value of an option counts
    one = char_lm.main([*args, "--logdir", str(tmp_path / "one")])
    two = char_lm.main([*args, "--nproc", "2", "--logdir", str(tmp_path / "two")])
    # Each process trains on its 4 of the 8 columns, gradients summed at each step: the same training up to float32
    # rounding, which Adam compounds step after step (in float64, tests/engine/test_distributed.py agrees to 1e-9).
    assert two["valid_bpc"] == pytest.approx(one["valid_bpc"], abs=5e-3)
    assert two["valid_bpc"][1] < two["valid_bpc"][0] < one["unigram_bpc"]


def test_a_two_process_run_resumed_mid_epoch_on_two_processes_ends_as_the_uninterrupted_one(tmp_path, two_processes):
    args = [*STREAM, *two_processes, "--k1", "10", "--k2", "25", "--epochs", "1", "--no-progress"]
    args += ["--checkpoint-every", "15", "--max-chars", "10000"]
    full = char_lm.main([*args, "--nproc", "2", "--logdir", str(tmp_path / "full")])
    checkpoint = tmp_path / "full" / "checkpoints" / "checkpoint_15.pt"  # mid-epoch (23 batches), k2 > k1
    assert checkpoint.is_file()
    resumed = char_lm.main([*args, "--nproc", "2", "--logdir", str(tmp_path / "on"), "--resume", str(checkpoint)])
    assert resumed["valid_bpc"] == [full["valid_bpc"][-1]]  # exactly: the same parameters
    with pytest.raises(SystemExit, match="holds the streams of 2 processes, taken mid-epoch, and 1 are resuming it"):
        char_lm.main([*args, "--logdir", str(tmp_path / "one"), "--resume", str(checkpoint)])


def test_the_main_job_sharded_with_fsdp_trains_and_resumes_as_unsharded(tmp_path, two_processes):
    one = [*STREAM, *two_processes, "--k1", "10", "--k2", "25", "--epochs", "1", "--no-progress"]
    one += ["--max-chars", "10000"]  # the last value of an option counts: a quarter of SMALL's corpus
    args = [*one, "--nproc", "2"]
    plain = char_lm.main([*one, "--checkpoint-every", "0", "--logdir", str(tmp_path / "plain")])
    sharded = char_lm.main([*args, "--fsdp", "--checkpoint-every", "15", "--logdir", str(tmp_path / "sharded")])
    # The one-process training but for float32 rounding: each process trains its 4 of the 8 columns, and FSDP2
    # reduce-scatters their gradients (two unsharded processes train as one: the test above).
    assert sharded["valid_bpc"] == pytest.approx(plain["valid_bpc"], abs=5e-3)
    checkpoint = tmp_path / "sharded" / "checkpoints" / "checkpoint_15.pt"  # mid-epoch (23 batches), k2 > k1
    on = ["--fsdp", "--checkpoint-every", "0", "--logdir", str(tmp_path / "on"), "--resume", str(checkpoint)]
    resumed = char_lm.main([*args, *on])
    assert resumed["valid_bpc"] == [sharded["valid_bpc"][-1]]  # exactly: the full state dicts restore the shards
    with pytest.raises(SystemExit):
        char_lm.main([*STREAM, "--fsdp"])  # one process has nothing to shard over


@full_run
@pytest.mark.cpu_only("the documented figures are CPU runs")
def test_the_main_job_prints_figures_within_the_spread_its_page_gives(tmp_path):
    history = char_lm.main(["--no-progress", "--checkpoint-every", "0", "--logdir", str(tmp_path)])  # about a minute
    assert all(within(v, s, BITS) for v, s in zip(history["valid_bpc"], figures("char_lm"), strict=True)), history


def test_the_main_job_on_lightning_prints_what_the_ignite_run_prints_and_logs_to_tensorboard(tmp_path, capsys):
    pytest.importorskip("lightning")
    args = [*SMALL, "--k1", "10", "--k2", "20", "--epochs", "2", "--no-progress", "--checkpoint-every", "0"]
    ignite = char_lm.main([*args, "--logdir", str(tmp_path / "ignite")])
    lightning = char_lm.main([*args, "--trainer", "lightning", "--logdir", str(tmp_path / "lightning")])
    # The same trainer on the same data, in float32: the validation figures agree to the printed digits.
    assert lightning["valid_bpc"] == pytest.approx(ignite["valid_bpc"], abs=5e-4)
    assert lightning["unigram_bpc"] == ignite["unigram_bpc"]
    printed = capsys.readouterr().out
    assert printed.count(f"epoch 2: validation {ignite['valid_bpc'][1]:.3f} bits/char") == 2
    events = EventAccumulator(str(tmp_path / "lightning"))
    events.Reload()
    assert {"train_loss_step", "grad_norm", "lr-Adam", "val_loss"} <= set(events.Tags()["scalars"])
    assert [e.value / math.log(2) for e in events.Scalars("val_loss")] == pytest.approx(lightning["valid_bpc"])
    # Resumed from the first epoch's checkpoint, the second epoch ends where the uninterrupted run ended.
    one = char_lm.main([*args, "--epochs", "1", "--trainer", "lightning", "--logdir", str(tmp_path / "one")])
    checkpoint = next((tmp_path / "one" / "checkpoints").glob("epoch=0-*.ckpt"))
    resumed = char_lm.main(
        [*args, "--trainer", "lightning", "--resume", str(checkpoint), "--logdir", str(tmp_path / "resumed")]
    )
    assert resumed["valid_bpc"] == [lightning["valid_bpc"][1]] and one["valid_bpc"] == lightning["valid_bpc"][:1]


@pytest.mark.parametrize(
    "option",
    [["--nproc", "2"], ["--fsdp"], ["--cuda-graphs"], ["--adaptive", "0.1"], ["--reach", "5"], ["--reach-stride", "2"]],
)
def test_the_ignite_trainers_own_options_are_refused_on_lightning_with_the_fix(capsys, option):
    pytest.importorskip("lightning")  # else the missing Lightning is named first
    with pytest.raises(SystemExit):
        char_lm.main([*STREAM, "--trainer", "lightning", *option])
    err = capsys.readouterr().err
    assert f"{' '.join(option)} is the ignite trainer's here" in err and "leave it out with --trainer lightning" in err
