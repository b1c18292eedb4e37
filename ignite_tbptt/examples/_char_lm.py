"""The main job's data, model and training, which ``python -m ignite_tbptt.examples.char_lm`` runs.

:mod:`ignite_tbptt.examples.char_lm` reads the options and forwards every name
here, imported when first asked for.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import signal
import sys
import sysconfig
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Events
from ignite.handlers import Checkpoint, DiskSaver, ProgressBar
from torch import nn

from ignite_tbptt import (
    ARTBP,
    AdaptiveTruncation,
    BitsPerTarget,
    FullStateDict,
    GradientClipping,
    GradientReach,
    attach_tensorboard,
    count_targets,
    create_tbptt_evaluator,
    create_tbptt_trainer,
    load_checkpoint,
)
from ignite_tbptt.data import pack_sequences, stream_batches

__all__ = [
    "STDLIB_MODULES",
    "LN2",
    "IGNORE",
    "stdlib_documents",
    "stdlib_corpus",
    "split_documents",
    "held_out_corpus",
    "held_out_text",
    "batch_major",
    "cross_entropy",
    "Vocabulary",
    "CharLSTM",
    "load_data",
    "choose_logdir",
    "epoch_line",
    "build",
    "new_run_dir",
    "run",
    "train_process",
    "LineProgress",
    "StopOnInterrupt",
]

# Paths relative to the standard library's directory, sorted: the default corpus.
STDLIB_MODULES = (
    "abc.py",
    "argparse.py",
    "ast.py",
    "bisect.py",
    "calendar.py",
    "collections/__init__.py",
    "configparser.py",
    "contextlib.py",
    "copy.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "enum.py",
    "fnmatch.py",
    "fractions.py",
    "functools.py",
    "glob.py",
    "heapq.py",
    "json/decoder.py",
    "json/encoder.py",
    "logging/__init__.py",
    "numbers.py",
    "operator.py",
    "pathlib.py",
    "pprint.py",
    "queue.py",
    "random.py",
    "sched.py",
    "shlex.py",
    "shutil.py",
    "statistics.py",
    "string.py",
    "tempfile.py",
    "textwrap.py",
    "threading.py",
)
LN2 = math.log(2)
IGNORE = -100  # target of padding steps: nn.functional.cross_entropy's default ignore_index


def stdlib_documents() -> list[str]:
    """The default corpus: the sources of :data:`STDLIB_MODULES` in the running Python (missing ones skipped).

    Raises:
        FileNotFoundError: if none of the modules is found (a Python installed without its sources).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / name).read_text(encoding="utf-8") for name in STDLIB_MODULES if (root / name).is_file()]
    if not parts:
        raise FileNotFoundError(f"no standard-library sources under {root}; pass --text FILE instead.")
    return parts


def stdlib_corpus() -> str:
    """:func:`stdlib_documents` joined into one text, a line break between modules."""
    return "\n".join(stdlib_documents())


WHOLE = {"rank": 0, "world_size": 1}  # all the columns, on every process
AUTO_KEPT = 0.9  # the least share of the training characters the documents layout must keep to be chosen


def split_documents(documents: list[str], fraction: float) -> tuple[list[str], list[str]]:
    """Hold out the last ``fraction`` of the characters: the document it falls in is split in two there."""
    split = int(sum(len(d) for d in documents) * (1 - fraction))
    train: list[str] = []
    for i, document in enumerate(documents):
        if len(document) >= split:
            head, tail = document[:split], document[split:]
            return [*train, *([head] if head else [])], [*([tail] if tail else []), *documents[i + 1 :]]
        train.append(document)
        split -= len(document)
    return train, []


class Vocabulary:
    """Characters of a training text, most frequent first; index 0 stands for any unseen character.

    Args:
        text: the training text.
    """

    def __init__(self, text: str) -> None:
        self.counts = Counter(text)
        self.chars = ["\0", *(c for c, _ in self.counts.most_common())]
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of ``text``, shape ``(N,)``."""
        return torch.tensor([self.index.get(c, 0) for c in text], dtype=torch.long)

    def unigram_bpc(self, text: str) -> float:
        """Bits per character of ``text`` under the training text's character frequencies (add-one smoothed)."""
        total = sum(self.counts.values()) + len(self.chars)
        return -sum(math.log2((self.counts.get(c, 0) + 1) / total) for c in text) / len(text)


class CharLSTM(nn.Module):
    """Embedding, LSTM and a linear read-out over characters.

    Args:
        vocab_size: number of characters ``V``.
        embedding: embedding size.
        hidden: LSTM hidden size ``H``.
        layers: LSTM layers.

    Shapes:
        ``forward(x, hidden)``: ``x`` of shape ``(T, B)`` (token ids), ``hidden`` an ``(h, c)`` pair of
        ``(layers, B, H)`` tensors or None; returns logits ``(T, B, V)`` and the new ``(h, c)``.
    """

    def __init__(self, vocab_size: int, embedding: int = 64, hidden: int = 256, layers: int = 1) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=layers)
        self.readout = nn.Linear(hidden, vocab_size)

    def forward(self, x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Logits ``(T, B, V)`` for the next character at each step, and the new hidden state."""
        out, hidden = self.lstm(self.embedding(x), hidden)
        return self.readout(out), hidden


def cross_entropy(y_pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per character) of logits ``(T, B, V)`` against targets ``(T, B)``, padding ignored."""
    return nn.functional.cross_entropy(y_pred.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE)


def batch_major(tokens: torch.Tensor, batch_size: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`~ignite_tbptt.data.stream_batches` as ``(B, T)`` pairs (``time_dim=1``), whole batches only."""
    pairs = stream_batches(tokens, batch_size, length)
    return [(x.t().contiguous(), y.t().contiguous()) for x, y in pairs if x.shape[0] == length]


def held_out_corpus(max_chars: int, fraction: float = 0.1) -> tuple[Vocabulary, torch.Tensor, torch.Tensor, float]:
    """The first ``max_chars`` of the default corpus, its last ``fraction`` held out, for the other examples.

    Returns:
        As :func:`held_out_text`.
    """
    return held_out_text(stdlib_corpus()[:max_chars], fraction)


def held_out_text(text: str, fraction: float) -> tuple[Vocabulary, torch.Tensor, torch.Tensor, float]:
    """``text`` with its last ``fraction`` held out.

    Returns:
        The training text's vocabulary, the training and the held-out tokens, and the held-out text's unigram bits
        per character.
    """
    split = int(len(text) * (1 - fraction))
    vocab = Vocabulary(text[:split])
    return vocab, vocab.encode(text[:split]), vocab.encode(text[split:]), vocab.unigram_bpc(text[split:])


def load_data(args: argparse.Namespace) -> tuple[Vocabulary, Any, Any, float]:
    """The vocabulary, training and validation batches, and the validation text's unigram bits per character."""
    documents = [path.read_text(encoding="utf-8") for path in args.text] if args.text else stdlib_documents()
    if args.max_chars:
        documents = split_documents(documents, 1 - args.max_chars / sum(len(d) for d in documents))[0]
    joined = 0  # how many training documents were joined into one stream, where they were
    if args.layout == "stream":
        starts = list(itertools.accumulate((len(d) + 1 for d in documents), initial=0))[:-1]
        documents = ["\n".join(documents)]
    train_docs, valid_docs = split_documents(documents, args.valid_fraction)
    if args.layout == "stream":
        joined = sum(start < len(train_docs[0]) for start in starts) if train_docs else 0
    vocab = Vocabulary("".join(train_docs))
    layout, why = args.layout, ""
    if layout != "stream":
        # Longest first: each next document goes to the column that frees first, so the columns end close
        # together; the epoch ends where the first runs out, rather than training on the last few alone.
        train_docs = sorted(train_docs, key=len, reverse=True)
        columns = min(args.batch_size, len(train_docs))  # no column without a document
        train = pack_sequences([vocab.encode(d) for d in train_docs], columns, args.seq_len, drop_last=True)
        kept = train.steps * columns / max(1, sum(len(d) - 1 for d in train_docs))
        if layout == "auto" and (columns < args.batch_size or kept < AUTO_KEPT):
            # One large file, or a few of very different lengths, would train in few columns or drop most of
            # the longest documents: one stream cut into --batch-size columns uses every character.
            why = (
                f" (auto: {documents_count(len(train_docs), 'training ')} for {args.batch_size} columns)"
                if columns < args.batch_size
                else f" (auto: packed, the documents would keep only {kept:.0%} of the characters)"
            )
            joined, layout = len(train_docs), "stream"
            train_docs, valid_docs = ["\n".join(train_docs)], ["\n".join(valid_docs)]
        layout = "stream" if layout == "stream" else "documents"
    if layout == "stream":
        train = stream_batches(vocab.encode(train_docs[0]), args.batch_size, args.seq_len)
        # Every process evaluates all the validation columns: the metric's sums over processes keep the same mean.
        valid = stream_batches(vocab.encode(valid_docs[0]), min(args.batch_size, 8), args.seq_len, **WHOLE)
    else:
        valid_columns = min(args.batch_size, len(valid_docs))
        valid = pack_sequences([vocab.encode(d) for d in valid_docs], valid_columns, args.seq_len, **WHOLE)
    valid_text = "".join(d[1:] for d in valid_docs)  # the characters predicted: all but each document's first
    unigram = vocab.unigram_bpc(valid_text)
    # Every column is full in every step of a drop_last epoch: no need to build the batches to count.
    used = train.steps * train.batch_size if layout != "stream" else sum(y.shape[0] for _, y in train) * args.batch_size
    # The documents as read, also where a stream joins them: the start-up line's counts agree with its reason.
    trained_on = (
        f"one stream of {documents_count(joined)} joined by line breaks"
        if layout == "stream"
        else documents_count(len(train_docs))
    )
    (print if idist.get_rank() == 0 else lambda *_, **__: None)(
        f"{sum(map(len, train_docs)):,} training characters in {trained_on} ({used:,} predicted per "
        f"epoch), {len(valid_text):,} validation characters, {len(vocab)} symbols; unigram model: {unigram:.2f} "
        f"bits/char; {truncation(args)}, {layout} layout{why}",
        flush=True,
    )
    return vocab, train, valid, unigram


def documents_count(n: int, kind: str = "") -> str:
    """``n`` documents in words, ``kind`` before the noun: ``"1 document"``, ``"2 training documents"``."""
    return f"{n} {kind}document{'' if n == 1 else 's'}"


def truncation(args: argparse.Namespace) -> str:
    """The truncation the run trains with, for the start-up line."""
    if args.artbp:
        return f"ARTBP(grid={args.artbp_grid}, mean length {args.artbp})"
    return f"TBPTT(k1={args.k1}, k2={args.k2})"


def build(args: argparse.Namespace, vocab_size: int, device: torch.device) -> tuple:
    """The model, its optimizer, the TBPTT trainer (with clipping) and the evaluator."""
    model = CharLSTM(vocab_size, args.embedding, args.hidden, args.layers).to(device)
    if args.fsdp:  # each layer, then the root, as FSDP2's documentation shards a transformer
        from torch.distributed.fsdp import fully_shard

        for layer in (model.embedding, model.lstm, model.readout):
            fully_shard(layer)
        fully_shard(model)
    # Under --cuda-graphs the fused Adam, which skips its step on the device: the step is captured after the window.
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True if args.cuda_graphs else None)
    amp_dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]
    trainer = create_tbptt_trainer(
        model,
        optimizer,
        cross_entropy,
        ARTBP(grid=args.artbp_grid, mean_length=args.artbp, seed=args.seed) if args.artbp else args.k1,
        None if args.artbp else args.k2,
        carry_hidden=True,
        gradient_accumulation_steps=args.accumulation,
        autocast_dtype=amp_dtype,
        scaler=args.amp == "fp16",
        device=device,
        # Padding does not count in the mean (captured windows count on the device and read the count after).
        target_count_fn=count_targets,
        cuda_graphs=args.cuda_graphs,
        deterministic=True,  # resumable mid-epoch: ignite's DeterministicEngine skips the batches already seen
    )
    if args.clip > 0:
        GradientClipping(model, max_norm=args.clip).attach(trainer)
    bpc = BitsPerTarget(cross_entropy)  # counts the real targets: padding (-100) is left out
    evaluator = create_tbptt_evaluator(model, {"bpc": bpc}, carry_hidden=True, device=device, autocast_dtype=amp_dtype)
    return model, optimizer, trainer, evaluator


def new_run_dir(root: Path) -> Path:
    """A directory under ``root`` that no run has used: ``char_lm-DATE-TIME``, with ``-2``, ``-3``... if taken.

    Only named here: the run creates it once it has started (a refused ``--resume`` leaves nothing behind).
    """
    base = root / time.strftime("char_lm-%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def read_resumed(path: Path, device: Any) -> dict:
    """Read the checkpoint ``--resume`` names with ``weights_only=True`` (:func:`ignite_tbptt.load_checkpoint`).

    Raises:
        SystemExit: if the file cannot be read, or holds other objects (loading those could run code).
    """
    try:
        return load_checkpoint(path, map_location=device)
    except (OSError, ValueError) as error:
        raise SystemExit(str(error)) from None


def choose_logdir(args: argparse.Namespace) -> None:
    """``args.logdir``, a new ``runs/char_lm-DATE-TIME`` unless given, and ``args.view``, what TensorBoard is told."""
    args.view = args.logdir  # all runs where the job names the directory
    if args.logdir is None:  # one directory per run, so that reruns do not mix their curves and checkpoints
        args.logdir = new_run_dir(Path("runs"))
        args.view = args.logdir.parent


def run(args: argparse.Namespace) -> dict:
    """Train the model as ``args`` say; returns the validation bits per character of each epoch and the unigram's."""
    choose_logdir(args)
    if args.nproc == 1:
        return train_process(args)
    backend = "nccl" if torch.device(args.device).type == "cuda" else "gloo"
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "history.json"
        with idist.Parallel(backend=backend, nproc_per_node=args.nproc) as parallel:
            parallel.run(_process, args, result)
        return json.loads(result.read_text())


def _process(local_rank: int, args: argparse.Namespace, result: Path) -> None:
    history = train_process(args)
    if idist.get_rank() == 0:
        result.write_text(json.dumps(history))
    # Free the model while the process group is alive: a sharded one keeps FSDP2's last asynchronous collectives,
    # which gloo's threads may abort on if they are freed at the interpreter's exit.
    gc.collect()


def attach_handlers(args: argparse.Namespace, trainer: Any, evaluator: Any, to_save: dict, logs: bool) -> Any:
    """Checkpoints, the truncation handlers asked for and, where ``logs``, TensorBoard; returns its logger or None."""
    if args.checkpoint_every > 0:
        saver = DiskSaver(args.logdir / "checkpoints", require_empty=False)
        checkpoint = Checkpoint(to_save, saver, n_saved=2, global_step_transform=lambda e, _: e.state.iteration)
        trainer.add_event_handler(Events.ITERATION_COMPLETED(every=args.checkpoint_every), checkpoint)
    if args.adaptive:
        k2_min = args.k1 + 1  # the decay is measured between a window's start and its cut
        first = min(max(args.k2, k2_min), args.k2_max)
        every = args.reach or 10
        AdaptiveTruncation(args.adaptive, k2_min, args.k2_max, every=every, k2=first).attach(trainer)
    if args.reach:
        GradientReach(every=args.reach, stride=args.reach_stride).attach(trainer)
    if not logs:
        return None
    hparams = {name: getattr(args, name) for name in ("lr", "batch_size", "seq_len", "hidden", "embedding", "clip")}
    return attach_tensorboard(
        trainer, args.logdir, evaluators={"validation": evaluator}, hparams=hparams, reach_picture_every=50
    )


def train_process(args: argparse.Namespace) -> dict:
    """Train as one process of ``args.nproc`` (all of them when 1): its share of the columns, rank 0 logging."""
    # One process: Ctrl-C ends the run at an iteration's end. Several: each would stop at its own iteration, so
    # Ctrl-C stops them all at once. Caught from here on, a Ctrl-C during the set-up is recorded rather than raised
    # inside a library, which could swallow the KeyboardInterrupt.
    interrupted = StopOnInterrupt(enabled=args.nproc == 1)
    try:
        return train(args, interrupted)
    finally:
        interrupted.restore()


def train(args: argparse.Namespace, interrupted: StopOnInterrupt) -> dict:
    """Load the data, build the model and trainer, and train; ``interrupted`` is attached before training starts."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    elif args.nproc > 1:  # the processes share the cores
        torch.set_num_threads(max(1, torch.get_num_threads() // args.nproc))
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    vocab, train_batches, valid, unigram = load_data(args)
    model, optimizer, trainer, evaluator = build(args, len(vocab), device)

    history: dict = {"unigram_bpc": unigram, "valid_bpc": [], "train_bpc": []}
    rank0 = idist.get_rank() == 0  # in a multi-process run, only rank 0 reports
    progress = None if args.no_progress or not rank0 else terminal_bar() if sys.stderr.isatty() else LineProgress()
    say = progress.log_message if progress is not None else print if rank0 else lambda _: None

    @trainer.on(Events.EPOCH_COMPLETED)
    def validate(engine):
        say(epoch_line(history, engine.state.epoch, evaluator.run(valid).metrics["bpc"], engine.state.output / LN2))

    to_save = {"trainer": trainer, "model": model, "optimizer": optimizer}
    if args.fsdp:  # the full state dicts: rank 0 writes the file, and every process loads its shards from it
        to_save.update(model=FullStateDict(model), optimizer=FullStateDict(model, optimizer))
    if args.resume:
        resume(args, to_save, device, say)
    args.logdir.mkdir(parents=True, exist_ok=True)
    if rank0:
        print(where_it_logs(args), flush=True)
    tb_logger = attach_handlers(args, trainer, evaluator, to_save, logs=rank0)
    if progress is not None:
        progress.attach(trainer, output_transform=lambda loss: {"bits/char": loss / LN2})
    interrupted.attach(trainer, to_save, args.logdir / "checkpoints", say)
    try:
        trainer.run(train_batches, max_epochs=args.epochs)
    finally:
        if tb_logger is not None:
            tb_logger.close()
    history["logdir"] = str(args.logdir)
    history["interrupted"] = interrupted.checkpoint
    return history


def epoch_line(history: dict, epoch: int, bpc: float, last: float | None) -> str:
    """Keep an epoch's validation and last training batch's bits per character in ``history``; the line printed."""
    history["valid_bpc"].append(bpc)
    history["train_bpc"].append(last)
    batch = "" if last is None else f", last training batch {last:.3f} bits/char"
    return f"epoch {epoch}: validation {bpc:.3f} bits/char (unigram {history['unigram_bpc']:.2f}){batch}"


def where_it_logs(args: argparse.Namespace) -> str:
    """The lines that say where the run writes its TensorBoard logs and checkpoints, and how to view them."""
    logdir, checkpoints = args.logdir, args.logdir / "checkpoints"
    when = f"every {args.checkpoint_every} iterations and on Ctrl-C" if args.checkpoint_every else "on Ctrl-C only"
    return (
        f"TensorBoard logs: {logdir}{os.sep} (to view them: tensorboard --logdir {getattr(args, 'view', logdir)})\n"
        f"checkpoints: {checkpoints}{os.sep}, {when} (--resume FILE continues from one)"
    )


#: The progress bar in a terminal: the batches of the epoch, their rate and the last batch's bits per character.
BAR = "{desc}[{n_fmt}/{total_fmt}] {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def terminal_bar() -> ProgressBar:
    """Ignite's progress bar, its rate in batches per second and the bits per character after it."""
    return ProgressBar(persist=True, bar_format=BAR, unit=" batches")


class LineProgress:
    """The progress of each epoch as lines of text, for a file: every ``seconds``, and once at the epoch's end.

    A progress bar redraws itself in place, which a file keeps as a new copy every time. Where standard error is not a
    terminal the main job writes these lines to standard output instead, each once.

    Args:
        seconds: the least time between two lines of an epoch.
    """

    def __init__(self, seconds: float = 30.0) -> None:
        self.seconds = seconds
        self.start = self.last = time.perf_counter()
        self.first = 0

    def attach(self, trainer: Any, output_transform: Any) -> None:
        """Report ``trainer``'s epochs, with ``output_transform(engine.state.output)``'s values."""
        self.transform = output_transform
        trainer.add_event_handler(Events.EPOCH_STARTED, self._started)
        trainer.add_event_handler(Events.ITERATION_COMPLETED, self._iteration)

    def log_message(self, message: str) -> None:
        """Print ``message`` on a line of its own."""
        print(message, flush=True)

    def _started(self, engine: Any) -> None:
        self.start = self.last = time.perf_counter()
        self.first = engine.state.iteration  # a resumed run starts mid-epoch

    def _iteration(self, engine: Any) -> None:
        now, length = time.perf_counter(), engine.state.epoch_length
        done = (engine.state.iteration - 1) % length + 1
        if done < length and now - self.last < self.seconds:
            return
        self.last = now
        rate = (engine.state.iteration - self.first) / max(now - self.start, 1e-9)
        values = ", ".join(f"{name} {value:.3f}" for name, value in self.transform(engine.state.output).items())
        self.log_message(
            f"epoch {engine.state.epoch}/{engine.state.max_epochs}: {done}/{length} batches ({done / length:.0%}) in "
            f"{now - self.start:.0f} s, {rate:.2f} batches/s; last batch {values}"
        )


def resume(args: argparse.Namespace, to_save: dict, device: Any, say: Any) -> None:
    """Load ``args.resume`` into ``to_save``.

    Raises:
        SystemExit: if the checkpoint holds another configuration (refused before anything loads, by
            :func:`ignite_tbptt.load_checkpoint`), or more epochs done than ``--epochs``.
    """
    try:
        Checkpoint.load_objects(to_save, read_resumed(args.resume, device))
    except ValueError as error:
        raise SystemExit(f"--resume {args.resume}: {error}") from None
    state = to_save["trainer"].state
    if state.epoch > args.epochs:
        raise SystemExit(
            f"--resume {args.resume}: the checkpoint has {state.epoch} epochs done, more than --epochs {args.epochs}; "
            f"pass --epochs {state.epoch} or more."
        )
    say(f"resuming from {args.resume} at iteration {state.iteration}")


class StopOnInterrupt:
    """On Ctrl-C, end the run after the current iteration and write a checkpoint there; a second Ctrl-C stops at once.

    Created before the set-up, it records a Ctrl-C from then on; :meth:`attach` it to the trainer before
    ``run()``. A Ctrl-C during the set-up then ends the run as it starts, with a checkpoint of iteration 0. A
    checkpoint between two iterations is one ``--resume`` continues exactly from (the interrupted iteration is
    finished first: at the default sizes well under a second).

    Args:
        enabled: whether to take Ctrl-C at all (only the main thread can).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.trainer: Any = None
        self.checkpoint: str | None = None
        self.requested = False
        self.previous = signal.getsignal(signal.SIGINT)
        self.installed = enabled and threading.current_thread() is threading.main_thread()  # signals: main thread
        if self.installed:
            signal.signal(signal.SIGINT, self._interrupt)

    def attach(self, trainer: Any, to_save: dict, folder: Path, say: Any) -> None:
        """Stop ``trainer`` on Ctrl-C, saving ``to_save`` into ``folder`` and telling ``say`` how to resume."""
        self.trainer, self.say = trainer, say
        self.saver = Checkpoint(to_save, DiskSaver(folder, require_empty=False), filename_prefix="interrupted")
        trainer.add_event_handler(Events.TERMINATE, self._save)
        # ignite clears a terminate request when run() starts: one made before then is made again at STARTED.
        trainer.add_event_handler(Events.STARTED, self._terminate_if_requested)

    def _interrupt(self, signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, self.previous)  # the next Ctrl-C is an immediate KeyboardInterrupt
        self.requested = True
        if self.trainer is not None:
            self.trainer.terminate()

    def _terminate_if_requested(self, engine: Any) -> None:
        if self.requested:
            engine.terminate()

    def _save(self, engine: Any) -> None:
        self.saver(engine)
        self.checkpoint = str(self.saver.last_checkpoint)
        self.say(f"interrupted at iteration {engine.state.iteration}: --resume {self.checkpoint} continues from there")

    def restore(self) -> None:
        """Give Ctrl-C back to whoever had it."""
        if self.installed:
            signal.signal(signal.SIGINT, self.previous)
