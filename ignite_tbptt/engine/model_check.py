"""Does a model carry its state? :func:`check_model` measures what truncated BPTT relies on, on the user's own model.

Carrying a state from one chunk of a sequence to the next fails silently more often than loudly: a layer that ignores
the state it is given, a ``detach`` inside the model that cuts the gradient k2 > k1 needs, a reset that leaks into
other columns, a state written in place. Each property is measured on an example input, with the figure and the
tolerance for its dtype, and a failing one names the state's leaf (its path and shape) and what to pass.

- **carried**: the outputs of the sequence run in chunks (of 1 step, of a few, of uneven lengths), the state carried,
  equal the outputs of one call over the whole sequence;
- **used**: the carried state changes the next chunk's outputs, each leaf of it;
- **gradient**: the gradient of the second chunk's loss with respect to the parameters, through the carried state,
  equals full backpropagation through the whole sequence, and reaches every leaf of the state;
- **reset**: resetting one column at a chunk boundary (``reset_hidden``) equals running its sequence from a fresh
  state, and leaves the other columns as they were;
- **clean**: no write into the state given, no graph kept in attributes the trainer does not see, no random draws in
  training mode unless declared (``random=True``), the state's dtypes and devices stable;
- **trains**: a few windows of :func:`~ignite_tbptt.create_tbptt_trainer` at k1 = k2 and at k2 = 2 k1 run and change
  the parameters.

The model's parameters and buffers are restored afterwards. ``python -m ignite_tbptt.engine.model_check_command
module:factory`` prints the check of a model a factory makes (:mod:`ignite_tbptt.engine.model_check_command`). Each
model call goes through the trainer's own (:func:`~ignite_tbptt.runtime.build_model_call`), with its checks:
``model_fn``, ``module_state`` and ``initial_state`` mean what they mean there.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..layout import Layout
from ..runtime import (
    StateWrittenInPlace,
    attributes_with_graph,
    build_model_call,
    default_model_fn,
    default_reset_hidden,
    rng,
    tensors_with_paths,
)
from ..runtime import hidden as hs
from .trainer import create_tbptt_trainer

__all__ = ["check_model", "ModelCheck", "Verdict"]

#: What a model raises for a call it does not take (a length its kernels refuse: xLSTM's chunked kernels assert it).
REFUSALS = (RuntimeError, ValueError, AssertionError)

#: The tolerance of a comparison, relative to the largest output, by dtype.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


@dataclass(frozen=True)
class Verdict:
    """One property of a model, as :func:`check_model` measured it."""

    #: ``"carried"``, ``"used"``, ``"gradient"``, ``"reset"``, ``"clean"`` or ``"trains"``.
    name: str
    #: Whether the model has it; ``None`` where it could not be measured (an earlier failure stopped it).
    passed: bool | None
    #: The figure measured (a largest difference relative to the largest output, ...), where there is one.
    figure: float | None
    #: What the figure was held to, where it was.
    tolerance: float | None
    #: What was measured, and where it fails, which leaf and what to pass.
    detail: str


@dataclass
class ModelCheck:
    """The verdicts of :func:`check_model`, in order; printed as a table."""

    verdicts: list[Verdict]

    @property
    def ok(self) -> bool:
        """Whether every property was measured and holds."""
        return all(v.passed for v in self.verdicts)

    def __getitem__(self, name: str) -> Verdict:
        return next(v for v in self.verdicts if v.name == name)

    def __str__(self) -> str:
        rows = ["| property | verdict | figure | tolerance | detail |", "|---|---|---|---|---|"]
        for v in self.verdicts:
            verdict = {True: "yes", False: "NO", None: "not measured"}[v.passed]
            figure = "" if v.figure is None else f"{v.figure:.3g}"
            tolerance = "" if v.tolerance is None else f"{v.tolerance:.0e}"
            rows.append(f"| {v.name} | {verdict} | {figure} | {tolerance} | {v.detail} |")
        return "\n".join(rows)


def check_model(
    model: torch.nn.Module,
    x: torch.Tensor,
    *,
    model_fn: Callable[[Any, Any, Any], tuple[Any, Any]] = default_model_fn,
    reset_hidden: Callable[[Any, torch.Tensor], Any] = default_reset_hidden,
    module_state: Sequence[str] | None = None,
    initial_state: Callable[[int], Any] | None = None,
    time_dim: int = 0,
    random: bool = False,
) -> ModelCheck:
    """Measure whether ``model`` carries its state from chunk to chunk as truncated BPTT relies on (module docs).

    Args:
        model: the model, called as :func:`~ignite_tbptt.create_tbptt_trainer` calls it.
        x: an example input of at least 4 steps and 2 columns, ``(T, B, *)`` along ``time_dim`` (token ids or
            features); the outputs must be floating point.
        model_fn: as :func:`~ignite_tbptt.create_tbptt_trainer`.
        reset_hidden: as :func:`~ignite_tbptt.create_tbptt_trainer`.
        module_state: as :func:`~ignite_tbptt.create_tbptt_trainer`.
        initial_state: as :func:`~ignite_tbptt.create_tbptt_trainer`.
        time_dim: as :func:`~ignite_tbptt.create_tbptt_trainer`.
        random: the model draws random numbers in training mode on purpose (dropout): not a fault of ``clean``.

    Returns:
        The verdicts (:class:`ModelCheck`); ``str()`` of it is a table, ``.ok`` whether all hold.

    Raises:
        ValueError: if ``x`` has fewer than 4 steps or 2 columns.
        TypeError, ValueError: as :func:`~ignite_tbptt.create_tbptt_trainer` for the model's options.

    Examples:
        >>> import torch
        >>> from ignite_tbptt import check_model
        >>> check_model(torch.nn.GRU(3, 4), torch.randn(8, 2, 3)).ok
        True
    """
    layout = Layout.of(time_dim)
    if layout.length(x) < 4 or layout.columns(x) < 2:
        raise ValueError(f"x must have at least 4 steps and 2 columns to check a model, got shape {tuple(x.shape)}.")
    options: dict[str, Any] = {"model_fn": model_fn, "reset_hidden": reset_hidden, "module_state": module_state}
    options["initial_state"] = initial_state
    call = build_model_call(model, device=None, autocast_dtype=None, layout=layout, **options)
    kept = copy.deepcopy(model.state_dict())
    training = model.training
    check = _Check(model, call, layout, x, options)
    try:
        model.eval()  # the comparisons draw nothing; training mode is the clean check's
        verdicts = check.run(random)
    finally:
        model.load_state_dict(kept)
        model.train(training)
    return ModelCheck(verdicts)


def _difference(a: Any, b: Any) -> float:
    # The largest difference of two outputs (trees of tensors), relative to the largest value (at least 1).
    pairs = list(zip(hs.flatten(a), hs.flatten(b)))
    scale = max([1.0, *(float(t.detach().abs().max()) for t, _ in pairs if t.numel())])
    return max([0.0, *(float((s.detach() - t.detach()).abs().max()) for s, t in pairs if s.numel())]) / scale


class _Check:
    # One check's measurements, each a method returning its verdict.

    def __init__(self, model: torch.nn.Module, call: Any, layout: Layout, x: torch.Tensor, options: dict) -> None:
        self.model, self.call, self.layout, self.x, self.options = model, call, layout, x, options
        self.length, self.mid = layout.length(x), layout.length(x) // 2
        self.unread: set[str] = set()  # the state's leaves the model does not read (used)

    def steps(self, t: Any, start: int, end: int) -> Any:
        return hs.unflatten(t, [self.layout.steps(v, start, end) for v in hs.flatten(t)])

    def chunked(self, lengths: Sequence[int], state: Any = None) -> tuple[list[Any], Any]:
        outputs, start = [], 0
        for n in lengths:
            y, state = self.call(self.layout.steps(self.x, start, start + n), state)
            outputs.append(y)
            start += n
        return outputs, state

    def span(self, start: int, end: int, state: Any, starts: torch.Tensor | None = None) -> tuple[Any, Any]:
        # Steps [start, end) from ``state``: one call, or one call a step where the model refuses the longer call
        # (fla's Mamba2 takes a state into one-step calls only); the outputs joined along time.
        try:
            return self.call(self.layout.steps(self.x, start, end), state, None, False, starts)
        except StateWrittenInPlace:
            raise
        except REFUSALS:
            if end - start == 1:
                raise
        outputs = []
        for t in range(start, end):
            y, state = self.call(
                self.layout.steps(self.x, t, t + 1), state, None, False, starts if t == start else None
            )
            outputs.append(y)
        return self.steps_join(outputs), state

    def run(self, random: bool) -> list[Verdict]:
        try:
            y = self.span(0, self.length, None)[0]
        except (TypeError, ValueError) as error:  # as the trainer refuses it: a state it cannot see into, say
            refused = Verdict("carried", False, None, None, f"the model call is refused: {error}")
            return [refused, *(_unmeasured(name) for name in ("used", "gradient", "reset", "clean", "trains"))]
        tensors = hs.flatten(y)
        if not tensors or not all(t.is_floating_point() for t in tensors):
            raise ValueError("check_model compares the model's outputs, which must be floating-point tensors.")
        self.whole, self.tolerance = y, TOLERANCE.get(tensors[0].dtype, 1e-4)
        try:
            verdicts = [_measured(m) for m in (self.carried, self.used, self.gradient, self.reset, self.clean)]
        except StateWrittenInPlace as error:  # the trainer refuses such a model: nothing else is worth measuring
            return [
                Verdict("clean", False, None, None, str(error)) if name == "clean" else _unmeasured(name)
                for name in ("carried", "used", "gradient", "reset", "clean", "trains")
            ]
        verdicts.append(_trains(self))
        if not random and verdicts[4].passed:
            verdicts[4] = _draws(self, verdicts[4])
        return verdicts

    def carried(self) -> Verdict:
        n, worst, refused, where = self.length, 0.0, [], ""
        uneven = [2, 5, 3, 4] * n
        chunkings = {
            "1": [1] * n,
            "3": [3] * (n // 3) + ([n % 3] if n % 3 else []),
            "2, 5, 3, 4": _cut(uneven, n),
            f"{self.mid} (halves)": [self.mid, n - self.mid],
        }
        for name, lengths in chunkings.items():
            try:
                outputs, _ = self.chunked(lengths)
            except StateWrittenInPlace:
                raise
            except REFUSALS as error:
                first = str(error).split(". ")[0]
                refused.append(f"chunks of {name} steps refused by the model ({type(error).__name__}: {first})")
                continue
            start = 0
            for i, (chunk, length) in enumerate(zip(outputs, lengths)):
                moved = _difference(chunk, self.steps(self.whole, start, start + length))
                if moved > worst:
                    worst = moved
                    if moved > self.tolerance and not where:
                        where = f" (first in chunk {i}, steps [{start}, {start + length}), of the chunks of {name})"
                start += length
        measured = len(chunkings) - len(refused)
        detail = f"chunks of 1, of 3, of 2, 5, 3, 4 and of {self.mid} steps against one call over {n} steps"
        if refused:
            detail += "; " + "; ".join(refused)
        passed = measured > 0 and worst <= self.tolerance
        if measured and not passed:
            detail += (
                f": the chunked outputs differ{where}, so the state returned is not all the next call needs: return "
                "all of it (a model_fn), or name the attributes that keep the rest with module_state"
            )
        return Verdict("carried", passed, worst if measured else None, self.tolerance, detail)

    def steps_join(self, outputs: list[Any]) -> Any:
        return hs.cat(outputs, self.layout.time_dim % hs.flatten(outputs[0])[0].dim())

    def used(self) -> Verdict:
        mid, n = self.mid, self.length
        _, state = self.span(0, mid, None)
        second, fresh = self.span(mid, n, state)[0], self.span(mid, n, None)[0]
        moved = _difference(second, fresh)
        ignored = []
        for path, leaf in tensors_with_paths(state):
            if not leaf.is_floating_point():
                continue
            # Each leaf moved alone: one the model does not read moves nothing.
            shifted = hs.unflatten(state, [t + 1 if t is leaf else t for t in hs.flatten(state)])
            if _difference(self.span(mid, n, shifted)[0], second) == 0:
                ignored.append(f"{path} {tuple(leaf.shape)}")
                self.unread.add(path)
        passed = moved > self.tolerance and not ignored
        detail = f"the second chunk's outputs move by {moved:.3g} with the carried state against a fresh one"
        if ignored:
            detail += (
                f"; moving {', '.join(ignored)} by 1 leaves the outputs exactly as they were: the model does not read "
                "that part of the state, not for this input at least"
            )
        return Verdict("used", passed, moved, self.tolerance, detail)

    def gradient(self) -> Verdict:
        params = [p for p in self.model.parameters() if p.requires_grad]
        torch.manual_seed(0)
        weights = [torch.randn_like(t) for t in hs.flatten(self.steps(self.whole, self.mid, self.length))]

        def loss(y: Any) -> torch.Tensor:
            return torch.stack([(t * w).sum() for t, w in zip(hs.flatten(y), weights)]).sum()

        # The earlier chunk's input too, where it is floating point (features, not token ids).
        x, inputs = self.x, []
        if x.is_floating_point():
            self.x = x.detach().clone().requires_grad_()
            inputs = [self.x]
        try:
            whole = self.steps(self.span(0, self.length, None)[0], self.mid, self.length)
            full = torch.autograd.grad(loss(whole), [*params, *inputs], allow_unused=True)
            _, state = self.span(0, self.mid, None)
            leaves = [(path, t) for path, t in tensors_with_paths(state) if t.is_floating_point()]
            differentiable = [t for _, t in leaves if t.requires_grad]
            second = self.span(self.mid, self.length, state)[0]
            wrt = [*params, *inputs, *differentiable]
            grads = torch.autograd.grad(loss(second), wrt, allow_unused=True)
        finally:
            self.x = x
        to_input = grads[len(params)] if inputs else None  # its first chunk's steps: reached through the state only
        reached_input = not inputs or (
            to_input is not None and bool(self.layout.steps(to_input, 0, self.mid).abs().sum())
        )
        zero = torch.zeros(())
        pairs = [(zero if a is None else a, zero if b is None else b) for a, b in zip(grads, full)]
        scale = max([1.0, *(float(b.abs().max()) for _, b in pairs)])
        worst = max([0.0, *(float((a - b).abs().max()) for a, b in pairs)]) / scale
        reached = {id(t): g for t, g in zip(differentiable, grads[len(params) + len(inputs) :])}
        cut = [
            f"{path} {tuple(t.shape)}"
            for path, t in leaves
            if path not in self.unread and (reached.get(id(t)) is None or not bool(reached[id(t)].abs().sum()))
        ]
        passed = worst <= self.tolerance and not cut and reached_input
        detail = (
            "the second chunk's gradient, to the parameters and the first chunk's input, through the carried state "
            "against backpropagation through all of it"
        )
        if not reached_input:
            detail += "; none reaches the first chunk's input"
        if cut:
            detail += f"; no gradient reaches {', '.join(cut)}: a detach in the model cuts what k2 > k1 needs"
        elif worst > self.tolerance:
            detail += ": they differ" + (
                " (a part of the state the model does not read, see used)" if self.unread else ""
            )
        return Verdict("gradient", passed, worst, self.tolerance, detail)

    def reset(self) -> Verdict:
        mid, n = self.mid, self.length
        _, state = self.span(0, mid, None)
        starts = torch.zeros(self.layout.columns(self.x), dtype=torch.bool, device=self.x.device)
        starts[0] = True
        reset = self.span(mid, n, state, starts)[0]
        carried, fresh = self.span(mid, n, state)[0], self.span(mid, n, None)[0]
        axis = self.layout.batch_axis(hs.flatten(reset)[0])

        def columns(y: Any, index: slice) -> Any:
            return hs.unflatten(y, [t.narrow(axis, index.start, index.stop - index.start) for t in hs.flatten(y)])

        b = self.layout.columns(self.x)
        restarted = _difference(columns(reset, slice(0, 1)), columns(fresh, slice(0, 1)))
        others = _difference(columns(reset, slice(1, b)), columns(carried, slice(1, b)))
        worst = max(restarted, others)
        detail = "column 0 reset at the chunk boundary against a fresh start, the other columns against carrying on"
        if restarted > self.tolerance:
            detail += "; the reset column does not start afresh: pass a reset_hidden that resets the whole state"
        if others > self.tolerance:
            detail += "; the reset leaks into the other columns: reset_hidden must touch the starting columns only"
        return Verdict("reset", worst <= self.tolerance, worst, self.tolerance, detail)

    def clean(self) -> Verdict:
        self.model.train()
        _, state = self.span(self.mid, self.length, self.span(0, self.mid, None)[1])
        self.model.eval()
        found = attributes_with_graph(self.model, returned=state)
        first = [(t.dtype, t.device) for t in hs.flatten(self.span(0, self.mid, None)[1])]
        later = [(t.dtype, t.device) for t in hs.flatten(state)]
        problems = []
        if found:
            problems.append(f"attributes keep a graph the trainer does not see: {', '.join(found)} (module_state)")
        if first != later:
            problems.append(f"the state's dtypes or devices change from call to call: {first} then {later}")
        detail = "no write into the given state, no graph in attributes, dtypes and devices stable"
        return Verdict("clean", not problems, None, None, "; ".join(problems) if problems else detail)


def _measured(measure: Callable[[], Verdict]) -> Verdict:
    # A call the measure needs that the model or the trainer refuses fails that property, with what it said.
    try:
        return measure()
    except StateWrittenInPlace:
        raise
    except REFUSALS as error:
        return Verdict(measure.__name__, False, None, None, f"a call refused: {type(error).__name__}: {error}")


def _unmeasured(name: str) -> Verdict:
    return Verdict(
        name, None, None, None, "not measured: the model call it needs is refused (see the property that fails)"
    )


def _cut(lengths: list[int], total: int) -> list[int]:
    out, left = [], total
    for n in lengths:
        if left <= 0:
            break
        out.append(min(n, left))
        left -= out[-1]
    return out


def _output_loss(y_pred: Any, y: Any) -> torch.Tensor:
    # A loss of the outputs alone: the check trains on no targets of the user's.
    return torch.stack([t.float().square().mean() for t in hs.flatten(y_pred)]).sum()


def _draws(check: _Check, verdict: Verdict) -> Verdict:
    check.model.train()
    before = rng.capture(check.x.device)
    check.span(0, check.length, None)
    drew = not rng.same(before, rng.capture(check.x.device))
    check.model.eval()
    if not drew:
        return verdict
    detail = "the model draws random numbers in training mode (dropout): declare it with random=True"
    return Verdict("clean", False, None, None, detail)


def _trains(check: _Check) -> Verdict:
    k1 = max(1, check.length // 4)
    changed = []
    for k2 in (k1, 2 * k1):
        params = [p for p in check.model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in params]
        optimizer = torch.optim.SGD(params, lr=1e-2)
        trainer = create_tbptt_trainer(
            check.model, optimizer, _output_loss, k1, k2, time_dim=check.layout.time_dim, **check.options
        )
        try:
            trainer.run([(check.x, check.x)], max_epochs=1)
        except (RuntimeError, ValueError) as error:
            return Verdict("trains", False, None, None, f"TBPTT({k1}, {k2}) refused: {type(error).__name__}: {error}")
        changed.append(any(not torch.equal(p, q) for p, q in zip(params, before)))
    detail = f"TBPTT({k1}, {k1}) and TBPTT({k1}, {2 * k1}) for one batch, each changing the parameters"
    return Verdict("trains", all(changed), None, None, detail)
