"""The optimizer step as a program: division, inf/NaN check, clipping, the step and the scale's update, on the device.

With window programs (``cuda_graphs``), an optimizer step that needs nothing from the host runs as a program too, a
second graph after the window's: the gradients are divided by the step's target count and checked for inf/NaN in one
kernel (unscaled and checked by the ``GradScaler`` where there is one), the handlers of
``TBPTTEvents.OPTIMIZER_STEP_STARTED`` that run on the device alone (:class:`~ignite_tbptt.GradientClipping`) clip
them, and the optimizer steps, skipping itself on the device if the check found inf or NaN; the scaler updates its
scale on the device. Nothing is read back to the host: the decisions are read once at the iteration's end, where the
trainer reads its output anyway (:meth:`~ignite_tbptt.engine.optimizer_step.OptimizerStep.take_failure`).

What a step program needs, and what runs eagerly otherwise (planning decides, :func:`~ignite_tbptt.planning.plan_step`):
an optimizer that skips its own step on the device given ``found_inf`` (``_step_supports_amp_scaling``: torch's
``SGD``, ``Adam`` and ``AdamW`` with ``fused=True``, the optimizers ``GradScaler`` steps without a host read); one
process (a distributed step sums over processes first); no profiler running; no handler of
``TBPTTEvents.OPTIMIZER_STEP_STARTED`` that runs on the host. Retained segments (k2 > k1) need nothing of it: their
weights were copied before the step.

Values that change from step to step reach it through buffers written before each run: the target count, and each
parameter group's learning rate, which ignite's schedulers set as a float (``LRScheduler``, ``ParamScheduler``,
``create_lr_scheduler_with_warmup``). The optimizer steps with the group's ``lr`` set to its buffer, a 0-dim tensor
(float64 on the CPU, where the fused kernels read it as a double: the eager step's values bit for bit; float32 on
CUDA, the dtype torch's fused CUDA kernels read it in). Any other hyper-parameter a handler changes gives a new
program. Gradients live in static buffers, one per parameter, kept across steps (:class:`StaticGradients`): the
first window of a step copies its gradients in where an eager backward pass would have set ``.grad``.

A handler of ``OPTIMIZER_STEP_STARTED`` runs inside the program if it has ``device_part(engine, shared)``, which
makes only device operations and returns tensors (``shared``: one dict per step for all such handlers), and
``host_part(engine, outputs)``, run on the host after each step with those outputs. With a ``GradScaler``, whether it
skipped the step is read after each, as eagerly, to restart a hidden state that overflowed.

Values a captured step took from Python at capture stay as they were: ``GradientClipping``'s limit, and the
optimizer's step hooks, which run at warm-up and capture only. ``capturable`` is set on Adam's and AdamW's groups
under capture (their check asks for it; their fused kernels do the same either way).

Sources: PyTorch's CUDA semantics notes, "CUDA Graphs" (whole-network capture, the optimizer's step included);
torch's ``test_graph_scaling_fused_optimizers`` (``GradScaler.step`` and ``update`` captured with fused optimizers);
the compiled-optimizer tutorial (a tensor learning rate, changed by a scheduler without recompiling).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch.amp.grad_scaler import _refresh_per_optimizer_state

from ..gradients import divide_and_check, skips_on_device
from ..step_body import gradients_of, parameters_of, step_optimizer, unscale_and_divide
from .capture import GraphCapture, Program, ProgramCache, ProgramCounts, copied_out
from .recording import Recorder

__all__ = ["StaticGradients", "StepHandler", "StepHandlers", "StepPrograms", "StepProgram"]


class StepHandler(NamedTuple):
    """A handler of ``OPTIMIZER_STEP_STARTED`` that runs inside a step program, bound to its engine."""

    #: ``device_part(shared)``: device operations on the step's gradients; returns their outputs (tensors).
    #: ``shared`` is one dict per step for all its handlers (a norm computed once for the step, say).
    device_part: Callable[[dict], Any]
    #: ``host_part(outputs)``: after each step, on the host.
    host_part: Callable[[Any], None]
    #: What identifies the handler in a program's key (``id`` of the handler object).
    key: int


class StepHandlers(NamedTuple):
    """The handlers of ``OPTIMIZER_STEP_STARTED`` as a step program sees them."""

    #: The last handlers, each with a device part and a host part: they may run inside the program.
    on_device: tuple[StepHandler, ...]
    #: Whether handlers that run on the host come before them (the step then runs eagerly:
    #: :attr:`~ignite_tbptt.planning.EagerReason.HOST_HANDLERS`).
    host_first: bool


class StaticGradients:
    """One ``.grad`` tensor per parameter, kept across optimizer steps: a captured step reads fixed addresses.

    ``zero_grad()`` still sets ``.grad`` to ``None`` between steps; the first window of the next step puts the buffer
    back, holding its gradients (:meth:`take`), and gradients an eager window left elsewhere are moved in before the
    step (:meth:`settle`).
    """

    def __init__(self) -> None:
        self._buffers: dict[int, torch.Tensor] = {}  # by id(parameter); a parameter's new storage gets a new one

    def buffer(self, p: torch.Tensor) -> torch.Tensor:
        """``p``'s buffer, of its shape, dtype, device and strides."""
        b = self._buffers.get(id(p))
        if b is None or b.shape != p.shape or b.dtype != p.dtype or b.device != p.device or b.stride() != p.stride():
            b = self._buffers[id(p)] = torch.empty_like(p)
        return b

    def take(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> None:
        """Add a window's ``grads`` into ``params``' ``.grad``: copied into the buffer where ``.grad`` is ``None``.

        The gradients autograd's backward pass would leave, bit for bit; a parameter without a gradient from the
        window keeps its ``.grad``.
        """
        copied, sources, into, added = [], [], [], []
        for p, g in zip(params, grads):
            if g is None:
                continue
            if p.grad is None:
                b = p.grad = self.buffer(p)
                copied.append(b)
                sources.append(g)
            else:
                into.append(p.grad)
                added.append(g)
        if copied:
            torch._foreach_copy_(copied, sources)
        if into:
            torch._foreach_add_(into, added)

    def settle(self, params: Sequence[torch.Tensor]) -> None:
        """Move each ``.grad`` that is not its parameter's buffer (an eager window's, a checkpoint's) into it."""
        moved, sources = [], []
        for p in params:
            g = p.grad
            if g is not None and g is not self._buffers.get(id(p)):
                b = p.grad = self.buffer(p)  # the buffer kept, or a new one: either way not g
                moved.append(b)
                sources.append(g)
        if moved:
            torch._foreach_copy_(moved, sources)


class StepPrograms:
    """The optimizer step's programs, one per set of parameters with gradients, handlers and hyper-parameters.

    Args:
        optimizer: the optimizer; steps run as programs only if it skips its step on the device (``found_inf``).
        scaler: the ``GradScaler``, or ``None``.
        capture: the trainer's :class:`~ignite_tbptt.runtime.programs.capture.GraphCapture`, or ``None`` to run the
            programs uncaptured.
        limit: the most programs kept; a new kind of step drops the least recently used.
    """

    def __init__(
        self, optimizer: Any, scaler: torch.amp.GradScaler | None, capture: GraphCapture | None, limit: int = 8
    ) -> None:
        self.optimizer, self.scaler, self.capture = optimizer, scaler, capture
        #: Whether the optimizer can step inside a program: it skips its step on the device given ``found_inf``,
        #: as ``GradScaler`` steps it too without a host read.
        self.supported = skips_on_device(optimizer)
        self.gradients = StaticGradients()
        #: How the programs ran (``engine.state.programs``), shared with the window programs.
        self.counts = capture.counts if capture is not None else ProgramCounts()
        self.cache = ProgramCache(limit, self.counts)
        if isinstance(capture, Recorder):  # its errors name the optimizer's state
            capture.name_optimizer(optimizer)
        self.device: torch.device | None = None
        self.divisor: torch.Tensor | None = None  # float64, the step's target count (or 1)
        self.found: torch.Tensor | None = None  # float32 inf/NaN decision, carried from step to step until read
        self.lrs: list[torch.Tensor] = []

    def parameters(self) -> list[torch.Tensor]:
        """The optimizer's parameters, in its order."""
        return parameters_of(self.optimizer)

    def program(self, divisor: int, handlers: Sequence[StepHandler]) -> StepProgram | None:
        """The program for this step, its buffers written (target count, learning rates); ``None`` to step eagerly.

        Args:
            divisor: what the gradients are divided by: the step's target count, or 1 where its one window
                backpropagated its mean.
            handlers: the ``OPTIMIZER_STEP_STARTED`` handlers, every one of which runs inside the program.
        """
        present, settings = self.fill_buffers()
        if not any(present):
            return None
        key = (present, tuple(h.key for h in handlers), len(settings), self.identity())
        # Made again where a hyper-parameter other than the learning rate changed, or the state has new tensors.
        program = self.cache.fetch(
            key,
            lambda: StepProgram(self, handlers, settings),
            lambda p: same_settings(p.settings, settings) and not p.stale(),
        )
        assert self.divisor is not None, "fill_buffers() made the buffers"
        self.divisor.fill_(divisor)
        return program

    def identity(self) -> tuple:
        """What a captured step reads that a new program must follow: the parameters' storage, the optimizer's state.

        ``model.to()`` or ``p.data = ...`` moves the parameters; ``optimizer.load_state_dict()`` gives the optimizer
        a new state (new tensors, in a new dict), which a graph captured before would not update.
        """
        return tuple(p.data_ptr() for p in self.parameters()), id(self.optimizer.state)

    def _state(self) -> Iterator[tuple[int, str, torch.Tensor]]:
        # The optimizer's state tensors: each parameter's place, the state's key, the tensor.
        state = self.optimizer.state
        for i, p in enumerate(self.parameters()):
            for key, value in state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    yield i, key, value

    def state_tensors(self) -> tuple:
        """Where the optimizer's state tensors are: a handler may give a parameter's state new ones.

        Moments restarted with ``torch.zeros_like`` rather than in place: a step captured before reads the old ones,
        freed (:meth:`StepProgram.stale`).
        """
        return tuple((i, key, t.data_ptr()) for i, key, t in self._state())

    def fill_buffers(self) -> tuple[tuple[bool, ...], list[dict]]:
        """Make the buffers ready for a run: gradients in their static buffers, learning rates written.

        Returns:
            Which parameters have a gradient, and each group's hyper-parameters but the learning rate (what a
            program is valid for).
        """
        params = self.parameters()
        self._buffers(params)
        self.gradients.settle(params)
        groups = self.optimizer.param_groups
        for lr, group in zip(self.lrs, groups):
            lr.fill_(group["lr"])
        return tuple(p.grad is not None for p in params), [
            {k: v for k, v in g.items() if k not in ("params", "lr")} for g in groups
        ]

    # -- what a program runs -----------------------------------------------------------------------------------
    def step(self, handlers: Sequence[StepHandler]) -> tuple[list, Any]:
        """The step's body: division and check (or unscale), ``handlers``' device parts, the step, the scale's update.

        Returns:
            The handlers' outputs, in order (each given one dict, shared by the step's handlers: a norm computed
            for the step is computed once, as ``gradient_norm`` does eagerly); and with an enabled scaler, whether
            it skipped the step (a 0-dim float32 tensor, read by the host as the eager step reads it), else ``None``.
        """
        optimizer, scaler, divisor = self.optimizer, self.scaler, self.divisor
        assert divisor is not None, "program() wrote it before a program runs"
        grads = gradients_of(optimizer)
        # Without a scaler, the optimizer skips itself on the device where the decision is 1.0.
        found = None
        if scaler is not None:
            unscale_and_divide(optimizer, scaler, grads, divisor)
        else:
            found = self.found
            assert found is not None, "fill_buffers() made the buffers before any program runs"
            decision = divide_and_check(grads, divisor, into=found)
            if decision is not found:  # several groups (dtypes, devices): only the first checked into it
                found.copy_(decision)
        shared: dict = {}
        outputs = [handler.device_part(shared) for handler in handlers]
        groups = optimizer.param_groups
        rates = [group["lr"] for group in groups]
        for group, lr in zip(groups, self.lrs):
            group["lr"] = lr
        try:
            skipped = step_optimizer(optimizer, scaler, found)
        finally:
            for group, rate in zip(groups, rates):
                group["lr"] = rate
        return outputs, skipped

    def updated(self) -> None:
        """After a replayed step: the scaler's records of the step cleared, as its ``update`` clears them."""
        assert self.scaler is not None, "called for a step with a scaler only"
        self.scaler._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _buffers(self, params: list[torch.Tensor]) -> None:
        device = params[0].device
        if self.device != device or len(self.lrs) != len(self.optimizer.param_groups):
            self.clear()
            self.device = device
            self.divisor = torch.ones((), dtype=torch.float64, device=device)
            self.found = torch.zeros((), dtype=torch.float32, device=device)
            # torch's fused CUDA kernels read a tensor learning rate as float32; on the CPU as a double.
            dtype = torch.float64 if device.type == "cpu" else torch.float32
            self.lrs = [torch.zeros((), dtype=dtype, device=device) for _ in self.optimizer.param_groups]
        if self.capture is not None:
            self.capture.device = device
            for group in self.optimizer.param_groups:
                if group.get("capturable") is False:  # Adam's and AdamW's check under capture asks for it
                    group["capturable"] = True

    def forget_failure(self) -> None:
        """Start the next step's decision afresh (a run starts, or a refused step was reported)."""
        if self.found is not None:
            self.found.zero_()

    def clear(self) -> None:
        """Forget every program (the parameters moved, the groups changed)."""
        self.cache.clear()


class StepProgram:
    """One kind of optimizer step as one program."""

    def __init__(self, steps: StepPrograms, handlers: Sequence[StepHandler], settings: list[dict]) -> None:
        self.steps, self.handlers, self.settings = steps, tuple(handlers), settings
        self.program = Program(self._body, steps.capture, "the optimizer step", "step")
        self._state: tuple | None = None  # where the optimizer's state tensors were as the step was captured

    def stale(self) -> bool:
        """Whether the optimizer's state has other tensors than the captured step reads (then it must not replay)."""
        if self.steps.capture is None:
            return False  # its Python runs every step, and reads the state as it is
        now = self.steps.state_tensors()
        if self.program.graph is None:  # not captured yet: its capture will read the state as it is then
            self._state = now
            return False
        return now != self._state

    def step(self) -> torch.Tensor | None:
        """Run the step: division and check, device handlers, the optimizer's step, the scale's update.

        Returns:
            With an enabled scaler, whether it skipped the step (a 0-dim tensor); else ``None``.
        """
        steps = self.steps
        (outputs, skipped), fresh = self.program()
        if steps.scaler is not None and not fresh:
            steps.updated()
        # A handler may keep what it is given: the next replay overwrites the graph's tensors.
        for handler, output in zip(self.handlers, copied_out(outputs, fresh)):
            handler.host_part(output)
        return skipped

    def _body(self) -> tuple[list, Any]:
        return self.steps.step(self.handlers)


def same_settings(a: list[dict], b: list[dict]) -> bool:
    """Whether two lists of hyper-parameters are equal; a tensor is compared by identity (== would read it)."""
    return len(a) == len(b) and all(x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x) for x, y in zip(a, b))


def _same(v: Any, w: Any) -> bool:
    return v is w if isinstance(v, torch.Tensor) or isinstance(w, torch.Tensor) else bool(v == w)
