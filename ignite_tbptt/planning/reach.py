"""Which windows have their gradient reach recorded, and how densely: the one place that decides it.

The gradient reach of a window is the norm of its mean loss's gradient with respect to the hidden state at each
segment start its backward pass crosses, back to its cut (:class:`~ignite_tbptt.GradientReach`; Bengio et al. 1994
and Pascanu et al. 2013 on its decay). The handlers that want it (``GradientReach``, ``AdaptiveTruncation``) only ask
for it here, through the trainer, and read ``engine.state.gradient_reach``. What a recorded window needs follows from
this decision alone: its segments take gradient into their input hidden state, down to the cut, and with a stride
also end every ``stride`` steps (:func:`~ignite_tbptt.planning.plan_segment`'s ``recorded`` and ``stride``); its
sweep hands back the gradients (:attr:`~ignite_tbptt.planning.ClosePlan.recorded`); and
:func:`~ignite_tbptt.runtime.reach_profile` turns them into the mean loss's norms, dividing by the scale and the
target count the window backpropagated.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReachRequests"]


@dataclass
class ReachRequests:
    """The windows whose gradient reach is recorded: every ``n``-th, for each ``n`` asked for, and the stride.

    Attributes:
        every: the periods asked for, ascending; window ``w`` (counted from 1 over the run) is recorded if any
            divides it (ignite's ``every=`` counting).
        stride: if set, a recorded window also ends a segment every ``stride`` steps from its start.

    Examples:
        >>> reach = ReachRequests()
        >>> reach.ask(every=4)
        >>> reach.ask(every=6, stride=2)
        >>> [w for w in range(1, 13) if reach.records(w)], reach.stride
        ([4, 6, 8, 12], 2)
    """

    every: tuple[int, ...] = ()
    stride: int | None = None

    def ask(self, every: int, stride: int | None = None) -> None:
        """Record every ``every``-th window too; a ``stride`` replaces the one asked for before."""
        self.every = tuple(sorted({*self.every, every}))
        if stride is not None:
            self.stride = stride

    def records(self, window: int) -> bool:
        """Whether window number ``window`` (from 1) is recorded."""
        return any(window % every == 0 for every in self.every) if self.every else False
