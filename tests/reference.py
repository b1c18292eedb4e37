"""Brute-force TBPTT(k1, k2) straight from SPEC.md, for comparing the trainer against.

Nothing here shares code with the package: the forward pass runs one step at a time, recording the
parameters each step used; each window's gradient is computed by rebuilding, for every step's loss, the
computation from that step's cut one step at a time with per-step copies of the recorded parameters.
Sequence starts replace a column's hidden state before every flagged step, inside that rebuilt computation.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call


class Net(nn.Module):
    """Linear input, a recurrent layer, linear head; returns ``(y_pred, hidden)`` like ignite expects."""

    def __init__(self, cell="lstm", batch_first=False, n_in=3, n_hidden=5, n_out=4, dropout=0.0, layers=1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]
        self.inp = nn.Linear(n_in, n_in)
        self.rnn = rnn(n_in, n_hidden, batch_first=batch_first, num_layers=layers)
        self.head = nn.Linear(n_hidden, n_out)

    def forward(self, x, hidden=None):
        h, hidden = self.rnn(self.dropout(torch.tanh(self.inp(x))), hidden)
        return self.head(h), hidden


class DictNet(Net):
    """An LSTM whose hidden state travels as ``{"h": h, "c": c}``."""

    def forward(self, x, hidden=None):
        y, (h, c) = super().forward(x, None if hidden is None else (hidden["h"], hidden["c"]))
        return y, {"h": h, "c": c}


def zero_columns(hidden, starts):
    """The reference's reset: zeros where ``starts`` (``(B,)``) is True, for ``(L, B, H)`` and ``(B, H)`` tensors."""
    if isinstance(hidden, dict):
        return {key: zero_columns(value, starts) for key, value in hidden.items()}
    if isinstance(hidden, (tuple, list)):
        return type(hidden)(zero_columns(value, starts) for value in hidden)
    mask = starts[None, :, None] if hidden.dim() == 3 else starts[:, None]
    return torch.where(mask, torch.zeros_like(hidden), hidden)


def cross_entropy(y_pred, y):
    return nn.functional.cross_entropy(y_pred.reshape(-1, y_pred.shape[-1]), y.reshape(-1))


def burn_in_mask(starts, length: int, columns: int, m: int) -> torch.Tensor:
    """``(T, B)`` bool: the steps inside a burn-in of ``m`` steps, counted in Python from each fresh start (a stream's
    first step, and each step where ``starts``, ``(T, B)`` or ``None``, starts a column's sequence)."""
    mask = torch.zeros(length, columns, dtype=torch.bool)
    for b in range(columns):
        since = 0
        for t in range(length):
            if starts is not None and bool(starts[t, b]):
                since = 0
            mask[t, b] = since < m
            since += 1
    return mask


def spec_cut(k1: int, k2: int, start: int, end: int) -> int:
    """SPEC.md's cut, written out again: k2 >= k1 reaches k2 - k1 before the start, k2 < k1 k2 before the end."""
    if k2 >= k1:
        return max(0, start - (k2 - k1))
    return max(start, end - k2)


def reference_train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn,
    batches,
    k1: int,
    k2: int,
    *,
    carry_hidden: bool,
    accumulation: int = 1,
    epochs: int = 1,
    time_dim: int = 0,
    reset_hidden=zero_columns,
    windows=None,
    initial_state=None,
    burn_in: int = 0,
    burn_in_gradient: bool = True,
) -> None:
    """Train ``model`` in place with brute-force TBPTT(k1, k2) on ``batches`` of ``(x, y)`` or ``(x, y, starts)``.

    ``windows``: the ``(start, end, cut)`` of every window, stream after stream, in place of SPEC.md's fixed
    k1, k2 rule (for variable window sources). ``initial_state(params, batch)``: the state a column starting a
    sequence is reset to, computed from the parameters of the step where it starts (a learned initial state; the
    model's forward uses it for a stream's start itself). ``burn_in``: the first steps after each fresh start carry no
    loss (their columns' targets left out of each step's loss and count, NaN targets too: ``loss_fn`` leaves NaN
    out); with ``burn_in_gradient=False`` a column's state is detached where its burn-in ends (time first only).
    """
    recorded = None if windows is None else iter(windows)
    names = [name for name, _ in model.named_parameters()]

    def call(params, x, hidden):
        args = (x,) if hidden is None else (x, hidden)
        return functional_call(model, params, args)

    def step_of(t, v):
        return t.narrow(time_dim, v, 1)

    def entering(hidden, starts, v, params):
        """The hidden state step ``v`` runs from: ``hidden`` with the columns starting at ``v`` reset, and without a
        burn-in's gradient, detached in the columns whose burn-in ends at ``v``."""
        if hidden is not None and burn_in and not burn_in_gradient and v > 0:
            ends = burned[v - 1] & ~burned[v]
            if bool(ends.any()):
                hidden = tuple(torch.where(ends[None, :, None], h.detach(), h) for h in hidden)
        if hidden is None or starts is None:
            return hidden
        flags = starts[v] if time_dim == 0 else starts[:, v]
        if not bool(flags.any()):
            return hidden
        if initial_state is None:
            return reset_hidden(hidden, flags)
        initial = initial_state(params, flags.shape[0])
        return torch.where(flags[None, :, None] if hidden.dim() == 3 else flags[:, None], initial, hidden)

    batches = [(*batch, None) if len(batch) == 2 else tuple(batch) for batch in batches]
    for _ in range(epochs):
        if carry_hidden:
            x, y, starts = zip(*batches)
            no_starts = all(s is None for s in starts)
            starts = [torch.zeros(b.shape[:2], dtype=torch.bool) if s is None else s for b, s in zip(y, starts)]
            joined = None if no_starts else torch.cat(starts, time_dim)
            streams = [(torch.cat(x, time_dim), torch.cat(y, time_dim), joined)]
        else:
            streams = batches
        total = {name: None for name in names}
        group_windows = group_targets = 0

        def apply():
            nonlocal group_windows, group_targets, total
            for name, p in model.named_parameters():
                p.grad = None if total[name] is None else total[name] / group_targets
            optimizer.step()
            optimizer.zero_grad()
            total = {name: None for name in names}
            group_windows = group_targets = 0

        for x, y, starts in streams:
            length = x.shape[time_dim]
            burned = burn_in_mask(starts, length, x.shape[1], burn_in) if burn_in else None  # (T, B): no loss there
            hiddens = [None]  # hiddens[t]: the hidden state entering step t
            params_at = []  # params_at[t]: the parameters step t was computed with
            start = 0
            for t in range(length):
                params_at.append({name: p.detach().clone() for name, p in model.named_parameters()})
                with torch.no_grad():
                    _, h = call(params_at[t], step_of(x, t), entering(hiddens[t], starts, t, params_at[t]))
                hiddens.append(h)
                end = t + 1
                if recorded is None:
                    if end - start < k1 and end < length:
                        continue
                    cut = spec_cut(k1, k2, start, end)
                else:
                    if end == start + 1:  # a window starts: where it ends and cuts, as recorded
                        window = next(recorded)
                        assert window[0] == start, (window, start)
                    if end < window[1]:
                        continue
                    cut = window[2]
                for u in range(start, end):
                    first = cut if u >= cut else u
                    copies = [
                        {name: q.clone().requires_grad_() for name, q in params_at[v].items()}
                        for v in range(first, u + 1)
                    ]
                    h = hiddens[first]
                    for v, params in zip(range(first, u + 1), copies):
                        y_pred, h = call(params, step_of(x, v), entering(h, starts, v, params))
                    y_u = step_of(y, u)
                    if burn_in:  # the columns past their burn-in, and their targets that are not padding
                        keep = ~burned[u]
                        y_pred, y_u = y_pred[:, keep], y_u[:, keep]
                        n = int((~torch.isnan(y_u)).sum())
                        if n == 0:
                            continue
                    else:
                        n = y_u.numel()
                    loss = loss_fn(y_pred, y_u) * n
                    leaves = [params[name] for params in copies for name in names]
                    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
                    for i, g in enumerate(grads):
                        if g is not None:
                            name = names[i % len(names)]
                            total[name] = g if total[name] is None else total[name] + g
                    group_targets += n
                group_windows += 1
                if group_windows == accumulation:
                    apply()
                start = end
        if group_windows:
            apply()
