import math
import subprocess
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ignite_tbptt.examples import char_lm

SMALL = ["--max-chars", "40000", "--hidden", "64", "--embedding", "16", "--seq-len", "50", "--batch-size", "8"]


def test_main_job_learns_and_logs_the_loss_curve_to_tensorboard(tmp_path):
    history = char_lm.main([*SMALL, "--k1", "10", "--k2", "20", "--epochs", "2", "--logdir", str(tmp_path)])

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert {"train/window_loss", "validation/valid_bpc"} <= set(events.Tags()["scalars"])
    curve = events.Scalars("train/window_loss")
    # 38,000 training characters in 8 streams: 4,749 steps per epoch, so 475 windows of 10 steps.
    assert [e.step for e in curve] == list(range(1, 2 * 475 + 1))
    first, last = curve[:20], curve[-20:]
    assert curve[0].value > math.log(50)  # the untrained model guesses among ~80 symbols
    assert sum(e.value for e in last) / 20 < 0.75 * sum(e.value for e in first) / 20
    assert [e.step for e in events.Scalars("validation/valid_bpc")] == [475, 950]
    assert history["valid_bpc"][1] < history["valid_bpc"][0] < history["unigram_bpc"]


def test_stdlib_corpus_is_real_python_source():
    text = char_lm.stdlib_corpus()
    assert len(text) > 500_000
    assert "def " in text and "import " in text
    vocab = char_lm.Vocabulary(text)
    assert 3.5 < vocab.unigram_bpc(text[-50_000:]) < 5.5


def test_module_runs_from_the_command_line_on_a_text_file(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "ignite_tbptt.examples.char_lm", *SMALL, "--text", str(corpus), "--k1", "8"]
        + ["--k2", "12", "--epochs", "1", "--no-progress", "--logdir", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "epoch 1: validation" in result.stdout
    bpc = float(result.stdout.split("epoch 1: validation ")[1].split()[0])
    assert bpc < 3.0  # a 28-symbol repeated sentence is learnt well below its unigram entropy
    assert list((tmp_path / "runs").glob("events.out.tfevents.*"))
