"""The data, models and training of ``python -m ignite_tbptt.examples.fla_lm``.

:mod:`ignite_tbptt.examples.fla_lm` reads the options and forwards every name here, imported when first asked for.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from ignite.engine import Events

from ignite_tbptt import (
    BitsPerTarget,
    GradientClipping,
    count_targets,
    create_tbptt_evaluator,
    create_tbptt_trainer,
)
from ignite_tbptt.models import fla_model_fn, fla_reset_hidden, mamba2_model_fn, mamba2_reset_hidden

from . import _mamba_lm
from ._char_lm import LN2, CharLSTM, cross_entropy
from .curves import log_figures, log_training
from .options import torch_threads

__all__ = ["ARCHITECTURES", "Contender", "build_model", "contenders", "train", "evaluate", "run"]

#: ``--arch``: fla's config and model classes, and the layer's name as the tables print it.
ARCHITECTURES = {
    "gated_deltanet": ("GatedDeltaNetConfig", "GatedDeltaNetForCausalLM", "GatedDeltaNet"),
    "gla": ("GLAConfig", "GLAForCausalLM", "GLA"),
    "delta_net": ("DeltaNetConfig", "DeltaNetForCausalLM", "DeltaNet"),
}


def build_model(vocab_size: int, args: argparse.Namespace) -> torch.nn.Module:
    """A small fla ``...ForCausalLM`` of ``--arch``: ``--layers`` layers of ``--hidden`` units in ``--heads`` heads.

    Every layer has its short convolutions (GLA's are off by default in fla; on here, as in the other two), so the
    carried state is each layer's recurrent state and its convolutions' last inputs. The loss is this example's own
    (``fuse_cross_entropy=False``); fla's other fused kernels (norms, SwiGLU) stay as fla configures them.
    """
    import fla.models

    config_name, model_name, _ = ARCHITECTURES[args.arch]
    sizes: dict[str, Any] = {"num_heads": args.heads}
    if args.arch == "gated_deltanet":
        sizes["head_dim"] = args.hidden // args.heads  # fla's default, 256, is for a hidden size of 2,048
    if args.arch == "gla":
        sizes["use_short_conv"] = True
    config = getattr(fla.models, config_name)(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        fuse_cross_entropy=False,
        tie_word_embeddings=True,
        **sizes,
    )
    return getattr(fla.models, model_name)(config)


def _mamba2_options(args: argparse.Namespace) -> argparse.Namespace:
    """The ``mamba_lm`` example's model at its defaults, its scan's blocks ``--k1`` long."""
    return argparse.Namespace(hidden=64, heads=4, state=16, layers=2, k1=args.k1)


@dataclass
class Contender:
    """A model of the comparison, and how the trainer and the evaluator call it.

    Attributes:
        name: as the table prints it.
        build: the model for a vocabulary of this size.
        batch_first: whether the model reads ``(B, T)`` batches (``time_dim=1``), else ``(T, B)``.
        options: ``model_fn`` and ``reset_hidden`` for :func:`~ignite_tbptt.create_tbptt_trainer`, if not the default.
        chunks: trained, and read, on independent chunks: the state reset at every window's start.
    """

    name: str
    build: Callable[[int], torch.nn.Module]
    batch_first: bool
    options: dict[str, Any] = field(default_factory=dict)
    chunks: bool = False

    def call_options(self, reset_every: int | None = None) -> dict[str, Any]:
        """The trainer's or evaluator's options: the layout, the state's functions, the state reset every N steps."""
        if not self.batch_first:
            if reset_every is not None:
                raise ValueError(f"{self.name}: a state reset every {reset_every} steps is read batch-first only")
            return {"time_dim": 0, **self.options}
        return {"time_dim": 1, "prepare_batch": _mamba_lm.batch_major(reset_every), **self.options}


def contenders(args: argparse.Namespace) -> dict[str, Contender]:
    """The fla model of ``--arch`` (on chunks too, for ``--compare``), the main job's LSTM and Hugging Face's Mamba2.

    The fla model's ``chunks`` follow ``--reset-every-window``; the comparison trains it both ways.
    """
    arch = ARCHITECTURES[args.arch][2]
    fla_options = {"model_fn": fla_model_fn, "reset_hidden": fla_reset_hidden}
    mamba2_options = {"model_fn": mamba2_model_fn, "reset_hidden": mamba2_reset_hidden}

    def fla(vocab: int) -> torch.nn.Module:
        return build_model(vocab, args)

    return {
        "fla": Contender(f"fla {arch}", fla, True, fla_options, chunks=args.reset_every_window),
        "fla_chunks": Contender(f"fla {arch}, state reset every window", fla, True, fla_options, chunks=True),
        "lstm": Contender("LSTM (the main job's)", lambda vocab: CharLSTM(vocab, 64, 256, 1), False),
        "mamba2": Contender(
            "Mamba2 (Hugging Face's)",
            lambda vocab: _mamba_lm.build_model(vocab, _mamba2_options(args)),
            True,
            mamba2_options,
        ),
    }


@dataclass
class Trained:
    """A trained model and what its training measured."""

    model: torch.nn.Module
    seconds: float
    steps: int
    characters: int
    train_bpc: float


def train(contender: Contender, args: argparse.Namespace, vocab_size: int, batches: Any, name: str = "fla") -> Trained:
    """Train for ``--steps`` optimizer steps, or until ``--seconds`` of training have passed, whichever comes first.

    The clock starts once the first batch has run (the device's queue waited for), so that the compiles and
    autotuning of fla's Triton kernels, once per kernel and shape, do not count; it stops with the queue waited for
    again. The characters are the targets of the batches trained on within that time, padding left out. With
    ``--logdir``, the curves go to the directory ``name`` under it.
    """
    torch.manual_seed(args.seed)
    model = contender.build(vocab_size).to(args.device)
    trainer = create_tbptt_trainer(
        model,
        torch.optim.Adam(model.parameters(), lr=args.lr, fused=True if args.cuda_graphs else None),  # a captured step
        cross_entropy,
        args.k1,
        args.k2,
        carry_hidden=True,
        device=args.device,
        target_count_fn=count_targets,
        cuda_graphs=args.cuda_graphs,
        **contender.call_options(args.k1 if contender.chunks else None),
    )
    if args.clip > 0:
        GradientClipping(model, max_norm=args.clip).attach(trainer)
    log_training(trainer, args, name)
    windows_per_batch = args.seq_len // args.k1
    iterations = math.ceil(args.steps / windows_per_batch)
    characters, start = 0, 0.0

    @trainer.on(Events.ITERATION_COMPLETED)
    def count_and_stop(engine: Any) -> None:
        nonlocal characters, start
        if engine.state.iteration == 1:
            _wait_for(args.device)
            start = time.perf_counter()
        else:
            characters += int(count_targets(engine.state.batch[1]))  # the loader's batch, on the host: no device read
        if engine.state.iteration >= iterations or (args.seconds and time.perf_counter() - start >= args.seconds):
            engine.terminate()

    @trainer.on(Events.ITERATION_COMPLETED(every=max(1, iterations // 5)))
    def report(engine: Any) -> None:
        print(f"  iteration {engine.state.iteration}: {engine.state.output / LN2:.3f} bits/char", flush=True)

    state = trainer.run(batches, max_epochs=math.ceil(iterations / len(batches)))
    _wait_for(args.device)
    seconds = time.perf_counter() - start
    return Trained(model, seconds, state.iteration * windows_per_batch, characters, state.output / LN2)


def _wait_for(device: Any) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def evaluate(
    contender: Contender, model: torch.nn.Module, batches: Any, args: argparse.Namespace, reset_every: int | None = None
) -> float:
    """Validation bits per character: the state carried through each held-out piece, or reset every N steps."""
    evaluator = create_tbptt_evaluator(
        model,
        {"bpc": BitsPerTarget(cross_entropy)},
        carry_hidden=True,
        device=args.device,
        **contender.call_options(reset_every),
    )
    return evaluator.run(batches).metrics["bpc"]


def run(args: argparse.Namespace) -> dict:
    """Train and evaluate the fla model, or with ``--compare`` all three; returns the figures.

    Runs on ``args.threads`` of torch's CPU threads where given, and gives torch back its own number after.
    """
    with torch_threads(args.threads):
        return compare(args) if args.compare else train_and_evaluate(args)


def _header(args: argparse.Namespace, train_batches: Any, predicted: int, unigram: float) -> str:
    return (
        f"TBPTT({args.k1}, {args.k2}); {train_batches.steps * train_batches.batch_size:,} training characters per "
        f"epoch in {train_batches.batch_size} columns, {predicted:,} validation characters, unigram {unigram:.2f} "
        f"bits/char; on {args.device}{', CUDA graphs' if args.cuda_graphs else ''}"
    )


def train_and_evaluate(args: argparse.Namespace) -> dict:
    """One fla model, with its state carried or reset every window, read both ways."""
    vocab, train_batches, valid, unigram, predicted = _mamba_lm.load_data(args)
    contender = contenders(args)["fla"]
    mode = "independent chunks (state reset every window)" if args.reset_every_window else "state carried"
    print(
        f"{contender.name}, {args.layers} layers, hidden {args.hidden}, {args.heads} heads, {mode}; "
        + _header(args, train_batches, predicted, unigram),
        flush=True,
    )
    trained = train(contender, args, len(vocab), train_batches)
    carried = evaluate(contender, trained.model, valid, args)
    chunked = evaluate(contender, trained.model, valid, args, reset_every=args.k1)
    log_figures(args, "fla", {"valid_bpc": carried, "valid_bpc_chunks": chunked})
    print(
        f"after {trained.steps} optimizer steps ({trained.seconds:.0f} s, {trained.characters / trained.seconds:,.0f} "
        f"characters/s): validation {carried:.3f} bits/char with the state carried, {chunked:.3f} with it reset every "
        f"{args.k1} characters",
        flush=True,
    )
    return {
        "mode": "reset" if args.reset_every_window else "carried",
        "valid_bpc": carried,
        "valid_bpc_chunks": chunked,
        "train_bpc": trained.train_bpc,
        "unigram_bpc": unigram,
        "seconds": trained.seconds,
        "characters_per_second": trained.characters / trained.seconds,
        "steps": trained.steps,
    }


def compare(args: argparse.Namespace) -> dict:
    """The fla model, the same on chunks, the main job's LSTM and Hugging Face's Mamba2, trained for the same time.

    Each trains until ``--seconds`` have passed (or ``--steps``), with the same TBPTT(k1, k2), batches, optimizer
    and clipping, its state carried (the fla model on chunks: reset at every window's start); then each reads the
    held-out text the way it was trained. Prints one table.
    """
    vocab, train_batches, valid, unigram, predicted = _mamba_lm.load_data(args)
    print(
        f"Each model trained for {args.seconds or 'unlimited'} s or {args.steps} optimizer steps; "
        + _header(args, train_batches, predicted, unigram),
        flush=True,
    )
    rows = {}
    for key, contender in contenders(args).items():
        print(f"{contender.name}:", flush=True)
        trained = train(contender, args, len(vocab), train_batches, key)
        rows[key] = {
            "name": contender.name,
            "parameters": sum(p.numel() for p in trained.model.parameters()),
            "steps": trained.steps,
            "seconds": trained.seconds,
            "characters_per_second": trained.characters / trained.seconds,
            "valid_bpc": evaluate(contender, trained.model, valid, args, args.k1 if contender.chunks else None),
        }
        log_figures(args, key, {"valid_bpc": rows[key]["valid_bpc"]})
    print("\n| model | parameters | optimizer steps | seconds | characters/s | validation bits/char, read as trained |")
    print("|---|---|---|---|---|---|")
    for row in rows.values():
        print(
            f"| {row['name']} | {row['parameters']:,} | {row['steps']:,} | {row['seconds']:.0f} | "
            f"{row['characters_per_second']:,.0f} | {row['valid_bpc']:.3f} |",
            flush=True,
        )
    return {"unigram_bpc": unigram, "rows": rows}
