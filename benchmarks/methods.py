"""The training loops the benchmark compares, each on the same model, data and optimizer.

Every function trains ``model`` in place on ``batches`` (``(x, y)`` of shape ``(T, B)``, each batch its own
stream, as ignite's trainer treats it). The hand loop also returns the seconds it spent in forward passes
(loss included), backward passes and optimizer steps, from which the benchmark builds the compute limit.
"""

from __future__ import annotations

import time

import torch
from ignite.contrib.engines.tbptt import create_supervised_tbptt_trainer
from torch import nn
from torch.func import functional_call

from ignite_tbptt import GradientReach, Schedule, create_tbptt_trainer

__all__ = [
    "CharModel",
    "Autocast",
    "build_model",
    "loss_fn",
    "hand",
    "segmented",
    "ignite",
    "chained",
    "recompute",
    "ours",
]


class CharModel(nn.Module):
    """The char-LM shape: embedding 64, ``layers`` recurrent layers of 256, read-out over the vocabulary."""

    def __init__(
        self, cell: str = "lstm", vocab: int = 100, embedding: int = 64, hidden: int = 256, layers: int = 1
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, embedding)
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell](embedding, hidden, num_layers=layers)
        self.readout = nn.Linear(hidden, vocab)

    def forward(self, x, hidden=None):
        out, hidden = self.rnn(self.embedding(x), hidden)
        return self.readout(out), hidden


class Autocast(nn.Module):
    """``model`` run under ``torch.autocast`` with ``dtype``; its predictions come back in float32 for the loss.

    Wrapping the model, rather than each loop, puts every method under the same autocast: the hand loops and
    ignite's trainer have no autocast argument.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, x, hidden=None):
        with torch.autocast(x.device.type, dtype=self.dtype):
            y_pred, hidden = self.model(x, hidden)
        return y_pred.float(), hidden


def build_model(options, cell: str, device: torch.device) -> nn.Module:
    """A :class:`CharModel` of ``cell`` at ``options``' sizes, in :class:`Autocast` if ``options.autocast`` is set.

    ``options`` has ``vocab``, ``embedding``, ``hidden``, ``layers`` and ``autocast`` (a dtype's name, or None):
    the command-line options of ``benchmarks.run`` and ``benchmarks.memory``.
    """
    model = CharModel(cell, options.vocab, options.embedding, options.hidden, options.layers).to(device)
    return model if options.autocast is None else Autocast(model, getattr(torch, options.autocast))


def loss_fn(y_pred, y):
    return nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten())


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _detach(hidden):
    return tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()


def hand(model, optimizer, batches, k1, k2, device):
    """A hand-written fused loop: chunks of k1, detach, backward, step (k1 = k2 only)."""
    assert k1 == k2
    forward = backward = step = 0.0
    for x, y in batches:
        hidden = None
        for xc, yc in zip(x.split(k1), y.split(k1)):
            t0 = time.perf_counter()
            y_pred, hidden = model(xc, hidden)
            loss = loss_fn(y_pred, yc)
            _sync(device)
            t1 = time.perf_counter()
            optimizer.zero_grad()
            loss.backward()
            _sync(device)
            t2 = time.perf_counter()
            optimizer.step()
            hidden = _detach(hidden)
            _sync(device)
            t3 = time.perf_counter()
            forward, backward, step = forward + t1 - t0, backward + t2 - t1, step + t3 - t2
    return forward, backward, step


def segmented(model, optimizer, batches, k1, k2, device, make_windows=None, one_stream=False):
    """The hand loop made exact for k2 >= k1: fused calls, split only where a later window's cut falls.

    What a careful hand-written loop must do to compute TBPTT(k1, k2) exactly with fused calls. The steps
    between two window ends or cuts are one model call from leaf copies of its input state. Each window
    backpropagates its losses through its own pieces and the retained ones back to its cut, one backward
    call per piece, keeping the graphs of the pieces the next window reaches. Each window runs on a
    differentiable clone of the weights taken after the last optimizer step, so that the retained graphs
    keep the weights they ran with. It is ``create_tbptt_trainer``'s work with no engine, events or checks,
    and the backend's cost of a call is paid as often: the reference for what exactness costs.

    ``make_windows()`` (a fresh window source, default ``Schedule(k1, k2)``) gives the windows; ``one_stream``
    runs the batches as one stream, as ``carry_hidden=True`` does.
    """
    source = Schedule(k1, k2) if make_windows is None else make_windows()
    _exact(model, optimizer, batches, k1, k2, device, per_step=False, source=source, one_stream=one_stream)


def ignite(model, optimizer, batches, k1, k2, device):
    """ignite's ``create_supervised_tbptt_trainer`` (k1 = k2 only)."""
    assert k1 == k2
    create_supervised_tbptt_trainer(model, optimizer, loss_fn, tbtt_step=k1).run(batches)
    _sync(device)


def ours(model, optimizer, batches, k1, k2, device, recompute_steps=None, make_windows=None, **options):
    """``create_tbptt_trainer``; with the windows of ``make_windows()`` (random windows), recording the gradient
    reach (``reach_every``), or running the batches as one stream (``one_stream``, ``carry_hidden=True``)."""
    reach_every, one_stream = options.get("reach_every"), options.get("one_stream", False)
    trainer = create_tbptt_trainer(
        model,
        optimizer,
        loss_fn,
        k1 if make_windows is None else make_windows(),
        k2 if make_windows is None else None,
        recompute=recompute_steps,
        carry_hidden=one_stream,
    )
    if reach_every is not None:
        GradientReach(every=reach_every).attach(trainer)
    trainer.run(batches)
    _sync(device)


def chained(model, optimizer, batches, k1, k2, device):
    """The per-step recipe: detach each step, chain backward through the last k2 states, made correct.

    The well-known version backpropagates only the window's last loss and crashes once ``optimizer.step()``
    changes weights a retained graph saved. Here every step's loss counts (its gradient joins the chain at
    its own step) and each window runs on a differentiable clone of the weights taken after the last
    optimizer step, so the retained graphs keep the weights they used: :func:`segmented` with every step
    its own model call.
    """
    _exact(model, optimizer, batches, k1, k2, device, per_step=True)


def _stream_windows(source, length):
    """``(start, end, cut)`` of every window of a stream of ``length`` steps, as the trainer asks ``source``."""
    source.reset()
    windows, start = [], 0
    while start < length:
        end = min(source.window(start).end, length)
        windows.append((start, end, source.cut(start, end)))
        start = end
    return windows


def _exact(model, optimizer, batches, k1, k2, device, per_step, source=None, one_stream=False):
    assert k2 >= k1
    source = Schedule(k1, k2) if source is None else source
    params = dict(model.named_parameters())
    if one_stream:
        batches = [(torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]))]
    for x, y in batches:
        length, hidden = x.shape[0], None
        planned = _stream_windows(source, length)
        cuts = [cut for _, _, cut in planned]
        pieces = []  # [start, input state leaves, output state, owed loss] of the retained model calls
        for i, (start, end, cut) in enumerate(planned):
            weights = {name: p.clone() for name, p in params.items()}
            if per_step:
                bounds = list(range(start, end + 1))
            else:  # a piece ends where the window does and where a later window's cut falls
                bounds = sorted({start, end, *(c for c in cuts[i + 1 :] if start < c < end)})
            for a, b in zip(bounds, bounds[1:]):
                state_in = None if hidden is None else tuple(h.detach().requires_grad_() for h in _as_tuple(hidden))
                args = (x[a:b],) if state_in is None else (x[a:b], _from_tuple(state_in, hidden))
                y_pred, hidden = functional_call(model, weights, args)
                pieces.append([a, state_in, _as_tuple(hidden), loss_fn(y_pred, y[a:b]) * ((b - a) / (end - start))])
            next_cut = cuts[i + 1] if i + 1 < len(planned) else length
            optimizer.zero_grad()
            state_grad = None
            for piece in reversed(pieces):
                a, state_in, state_out, loss = piece
                outputs, grads = ([loss], [torch.ones_like(loss)]) if loss is not None else ([], [])
                if state_grad is not None:
                    outputs, grads = outputs + list(state_out), grads + state_grad
                torch.autograd.backward(outputs, grads, retain_graph=a >= next_cut)
                piece[3] = None
                if a == cut:
                    break
                state_grad = [h.grad for h in state_in]
                for h in state_in:
                    h.grad = None
            optimizer.step()
            pieces = [piece for piece in pieces if piece[0] >= next_cut]
    _sync(device)


def _as_tuple(hidden):
    return hidden if isinstance(hidden, tuple) else (hidden,)


def _from_tuple(leaves, like):
    return leaves if isinstance(like, tuple) else leaves[0]


def recompute(model, optimizer, batches, k1, k2, device):
    """Every k1 steps, rerun the last k2 steps from a stored state and backprop (no retained graph; k2 >= k1)."""
    assert k2 >= k1
    for x, y in batches:
        states = {0: None}  # the hidden state entering a step some window starts its rerun from
        for start in range(0, x.shape[0], k1):
            end = min(start + k1, x.shape[0])
            cut = max(0, start - (k2 - k1))
            following = max(0, end - (k2 - k1))  # the next window's cut: split the rerun there to store it
            if cut < following < end:
                y_first, middle = model(x[cut:following], states[cut])
                y_last, hidden = model(x[following:end], middle)
                y_pred = torch.cat([y_first, y_last])
                states[following] = _detach(middle)
            else:
                y_pred, hidden = model(x[cut:end], states[cut])
            loss = loss_fn(y_pred[start - cut :], y[start:end])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            states[end] = _detach(hidden)
            for old in [p for p in states if p < following]:
                del states[old]
    _sync(device)
