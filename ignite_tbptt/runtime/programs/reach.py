"""The retained segments a window's program reaches back into (k2 > k1), run again with the weights they ran with.

A program keeps no graph from one run to the next, so the retained segments a window reaches run again inside it:
:func:`reach_of` finds what recomputes them (input, input state, weight version) in the retained history,
:func:`recomputable_from` tells planning from which cuts it would (:class:`~ignite_tbptt.planning.RuntimeFacts`),
:class:`ReachWeights` gives each segment's weights, and :class:`SwappedWeights` runs a model call with them in the
place of the parameters (``torch.func.functional_call``): recomputation (Chen et al. 2016, "Training deep nets with
sublinear memory cost", arXiv:1604.06174, section 3) with each segment's own weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from ..backward_sweep import Recomputation, Segment
from ..weight_versions import ParameterVersions, WeightVersion

__all__ = ["ReachWeights", "SwappedWeights", "reach_of", "recomputable_from", "rnn_weights_kept"]


def reach_of(segments: Sequence[Segment], cut: int, start: int) -> list[Recomputation] | None:
    """What recomputes the retained segments from ``cut`` to ``start``, oldest first, or ``None``: run eagerly.

    ``None`` unless they tile those steps, owe no loss gradient, and the first has a state to start from (the
    stream's start has none). Empty where the cut is the window's start.
    """
    end, reach = start, []
    for segment in reversed(segments):
        if end <= cut:
            break
        owes = segment.y_pred is not None or segment.loss is not None or segment.y_grad is not None
        if segment.end != end or segment.recomputation is None or owes:
            return None
        reach.append(segment.recomputation)
        end = segment.start
    if end != cut or (reach and reach[-1].hidden is None):
        return None
    reach.reverse()
    return reach


def recomputable_from(segments: Sequence[Segment], position: int) -> frozenset[int]:
    """The cuts from which :func:`reach_of` finds the retained segments up to ``position`` whole; ``position`` too."""
    found, end = {position}, position
    for segment in reversed(segments):
        owes = segment.y_pred is not None or segment.loss is not None or segment.y_grad is not None
        if segment.end != end or segment.recomputation is None or owes:
            break
        if segment.recomputation.hidden is not None:
            found.add(segment.start)
        end = segment.start
    return frozenset(found)


class ReachWeights:
    """The trained parameters' values in the weight versions a reach ran with, made once per version.

    A frozen version's values are views into its copies (a few microseconds of Python each, per parameter); a
    per-token window reaches ``k2 - 1`` segments, each of another version, so each is made once rather than once per
    window that reaches it. Only the versions of the last reach are kept, so that no copy outlives the history.
    """

    def __init__(self) -> None:
        self._made: dict[int, tuple[WeightVersion, bool, list[torch.Tensor]]] = {}

    def __call__(self, versions: ParameterVersions, reach: Sequence[Recomputation], index: Sequence[int]) -> list[list]:
        """For each segment of ``reach``, the values of the parameters at ``index`` in its version."""
        made: dict[int, tuple[WeightVersion, bool, list[torch.Tensor]]] = {}
        out = []
        for recomputation in reach:
            version = recomputation.version
            assert version is not None, "a reach's segments ran where weight versions are kept (k2 > k1)"
            hit = made.get(id(version)) or self._made.get(id(version))
            if hit is None or hit[0] is not version or hit[1] != version.frozen:  # the current version froze since
                values = versions.values(version)
                hit = (version, version.frozen, [values[i] for i in index])
            made[id(version)] = hit
            out.append(hit[2])
        self._made = made
        return out

    def clear(self) -> None:
        """Forget every version's values (the trained parameters changed)."""
        self._made = {}


class _SwapRoot(torch.nn.Module):
    # The modules whose parameters a model call uses, under one root for torch.func.functional_call; calling it runs
    # the function it is given, so that model_fn and the initial state run with the weights swapped.
    def __init__(self, model: torch.nn.Module, initial_state: Any) -> None:
        super().__init__()
        self.model = model
        if isinstance(initial_state, torch.nn.Module):
            self.initial_state = initial_state

    def forward(self, fn: Callable[[], Any]) -> Any:
        return fn()


class SwappedWeights:
    """Runs a model call with other tensors in the place of the trained parameters.

    Args:
        model: the model.
        initial_state: the trainer's ``initial_state`` (its parameters are swapped too where it is a module).
        trained: the parameters to swap, in the optimizer's order.

    Raises:
        ValueError: if a trained parameter is neither the model's nor ``initial_state``'s: it could not be swapped,
            and a segment run again would run with its value now, not the one it ran with.
    """

    def __init__(self, model: torch.nn.Module, initial_state: Any, trained: Sequence[torch.Tensor]) -> None:
        self.holder = _SwapRoot(model, initial_state)
        self.rnns = [m for m in model.modules() if isinstance(m, torch.nn.RNNBase)]
        self.names = self._names_in(self.holder, trained)

    @staticmethod
    def check(model: torch.nn.Module, initial_state: Any, trained: Sequence[torch.Tensor]) -> None:
        """Refuse, before a run, trained parameters that a swap would not reach (see the class's ``Raises``)."""
        SwappedWeights._names_in(_SwapRoot(model, initial_state), trained)

    @staticmethod
    def _names_in(holder: torch.nn.Module, trained: Sequence[torch.Tensor]) -> list[str]:
        # Each trained parameter's name under the holder; raises for one it does not hold.
        names = {id(p): name for name, p in holder.named_parameters()}
        found = [names.get(id(p)) for p in trained]
        missing = [tuple(p.shape) for p, name in zip(trained, found) if name is None]
        if missing:
            raise ValueError(
                f"cuda_graphs with k2 > k1 runs the retained segments a window reaches again with the weights they ran "
                f"with, swapped into the model and initial_state, and the optimizer trains parameters of shapes "
                f"{missing} that are neither's (held by model_fn, the loss, or an initial_state that is a function): "
                "hold them in the model, or pass initial_state as a module; or pass cuda_graphs=False."
            )
        return [name for name in found if name is not None]  # every one of them, by now

    def __call__(self, weights: Sequence[torch.Tensor], fn: Callable[[], Any]) -> Any:
        """``fn()``, with ``weights[i]`` in the place of the ``i``-th trained parameter."""
        swapped = dict(zip(self.names, weights))
        with rnn_weights_kept(self.rnns):
            return torch.func.functional_call(self.holder, swapped, (fn,), strict=False)


@contextmanager
def rnn_weights_kept(rnns: Sequence[torch.nn.RNNBase]) -> Iterator[None]:
    """A block that swaps the weights of torch's RNN modules (``functional_call``) without moving their own.

    Given other weights, an ``nn.RNN``, ``nn.GRU`` or ``nn.LSTM`` flattens them on CUDA into one new buffer
    (``flatten_parameters``), and its own again at its next call: the parameters' storage would move every window,
    which the weight versions, the programs' buffers and a graph's recorded addresses all rely on. Inside the block it
    runs on the weights as given (cuDNN copies them per call); after it, it holds its own, as flattened before.
    """
    # Copies: setting a weight writes into the module's list in place.
    kept = [(list(m._flat_weights), list(m._flat_weight_refs)) for m in rnns]
    for m in rnns:
        # An instance attribute, on purpose: the class's method is untouched.
        m.flatten_parameters = lambda: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m, (weights, refs) in zip(rnns, kept):
            del m.flatten_parameters
            m._flat_weights, m._flat_weight_refs = weights, refs
