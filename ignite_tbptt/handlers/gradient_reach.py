"""How far back a window's gradient reaches: the hidden-state gradient norm at each point of its backward sweep.

TBPTT's gradient is biased towards short dependencies (Tallec & Ollivier, 2017, "Unbiasing truncated
backpropagation through time", arXiv:1705.08209): whatever would flow past a window's cut is thrown away.
How much that is shows in the gradient of the window's loss with respect to the hidden state, traced
backwards from the window's end: Aicher, Foti & Fox (2019, "Adaptively truncating backpropagation through time
to control gradient bias", UAI) measure its decay to choose the truncation length. :class:`GradientReach`
records that profile at the points the backward sweep passes anyway: the input of each segment from the
window's end back to its cut.
"""

from __future__ import annotations

from ignite.engine import Engine

from ..checks import positive_int
from ..engine import TBPTTProcessFunction

__all__ = ["GradientReach"]


class GradientReach:
    """Record the gradient reach of every ``every``-th window in ``engine.state.gradient_reach``.

    For a recorded window ``[start, end)`` with cut ``c``, ``engine.state.gradient_reach`` is a dict mapping
    each *lag* ``end - s`` to the L2 norm of the gradient of the window's mean per-target loss with respect to
    the hidden state entering step ``s`` (all tensors of the hidden tree together; unscaled when a
    ``GradScaler`` is used), for every step ``s >= c`` where one of the window's segments starts, the cut
    included. The entry at the largest lag, the cut, is the gradient that truncation throws away. At k1 = k2
    that is the cut alone; at k2 > k1 the sweep also passes the window's start and the next window's cut, and
    anywhere a batch ends or a sequence starts. There is no entry at the stream's first step (no hidden state).
    It is set before ``TBPTTEvents.WINDOW_COMPLETED`` fires, and is ``None`` for windows that are not
    recorded, which cost nothing extra; a recorded window costs one backward step into its cut's hidden state
    and one host synchronisation.

    With several handlers that record (another ``GradientReach``, an
    :class:`~ignite_tbptt.AdaptiveTruncation`), the windows any of them asks for are recorded.

    With ``stride``, a recorded window also starts a segment every ``stride`` steps from its own start, so
    that its profile has a point there too: a denser picture, at k1 = k2 as well, for the price of more and
    shorter model calls in the recorded windows. Splitting a model call changes no gradient; the hidden-state
    points between a window's start and its cut come from the windows before it, so they are dense where
    those were recorded too (``every=1``). Inside a window, the gradient at a point sums the losses of the
    steps after it, so the norm grows with the lag until the window's start and decays after it.

    Args:
        every: record windows ``every``, ``2 * every``, ... (ignite's ``every=`` counting); default every window.
        stride: steps between the extra points of a recorded window; default none.

    Raises:
        TypeError: if ``every`` or ``stride`` is not an int, or :meth:`attach` gets an engine that is not a
            TBPTT trainer.
        ValueError: if ``every`` or ``stride`` is not positive.

    Examples:
        >>> import torch
        >>> from ignite_tbptt import GradientReach, TBPTTEvents, create_tbptt_trainer
        >>> model = torch.nn.GRU(1, 4)
        >>> trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
        ...                                lambda y_pred, y: (y_pred[..., :1] - y).pow(2).mean(), k1=3, k2=5)
        >>> reach = GradientReach().attach(trainer)
        >>> profiles = []
        >>> record = lambda engine: profiles.append(engine.state.gradient_reach)
        >>> _ = trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED, record)
        >>> x = torch.randn(9, 2, 1)
        >>> _ = trainer.run([(x, x)])
        >>> [list(p) for p in profiles]  # lags of the segment starts from the window's end back to its cut
        [[2], [2, 3, 5], [3, 5]]
    """

    def __init__(self, every: int = 1, stride: int | None = None) -> None:
        self.every = positive_int("every", every, "windows between recordings")
        self.stride = None if stride is None else positive_int("stride", stride, "steps between points")

    def attach(self, engine: Engine) -> GradientReach:
        """Record on ``engine``, a ``create_tbptt_trainer`` trainer or ``Engine(step)``; returns ``self``."""
        step = TBPTTProcessFunction.of(engine, "GradientReach")
        step.record_reach(self.every, self.stride)
        return self
