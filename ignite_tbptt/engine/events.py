"""Events fired by the TBPTT trainer at window and optimizer-step boundaries."""

from __future__ import annotations

from typing import Any

from ignite.contrib.engines.tbptt import Tbptt_Events
from ignite.engine import Engine, EventEnum

__all__ = ["TBPTTEvents", "register_tbptt_events", "EventFiring"]


class TBPTTEvents(EventEnum):
    """Events of :func:`~ignite_tbptt.create_tbptt_trainer`, fired inside an iteration.

    Each event has a counter in ``engine.state`` that starts at 0 with a fresh run, grows by one just before
    the ``*_STARTED`` event fires, and is saved by ``engine.state_dict()``:

    - ``engine.state.window``: windows started. ``WINDOW_STARTED`` fires before the window's first model call,
      ``WINDOW_COMPLETED`` after its backward pass and, when the window completes an accumulation, after the
      optimizer step. ``engine.state.window_loss`` then holds the window's mean per-target loss (a 0-dim tensor;
      0.0 for a window of padding only, whose ``engine.state.window_targets`` is 0).
    - ``engine.state.optimizer_step``: optimizer steps. ``OPTIMIZER_STEP_STARTED`` fires once the gradients are
      final (summed over the accumulated windows, divided by their target count, unscaled by the
      ``GradScaler``) and before ``optimizer.step()``: attach gradient clipping and gradient logging here.
      ``OPTIMIZER_STEP_COMPLETED`` fires after ``optimizer.step()`` (and ``scaler.update()``).

    With ``carry_hidden=True`` a window may span iterations; the window still open when an epoch ends is
    completed in ``Events.EPOCH_COMPLETED``, before handlers attached by the user.

    Because the counters are registered with ``event_to_attr``, ignite's event filters and loggers work:

    .. code-block:: python

        @trainer.on(TBPTTEvents.WINDOW_COMPLETED(every=100))
        def log(engine):
            print(engine.state.window, engine.state.window_loss.item())

        tb_logger.attach_output_handler(
            trainer, TBPTTEvents.WINDOW_COMPLETED, tag="train",
            state_attributes=["window_loss"],
            global_step_transform=global_step_from_engine(trainer, TBPTTEvents.WINDOW_COMPLETED),
        )

    ignite's ``Tbptt_Events.TIME_ITERATION_STARTED`` / ``TIME_ITERATION_COMPLETED`` fire together with
    ``WINDOW_STARTED`` / ``WINDOW_COMPLETED``, so handlers written for ``create_supervised_tbptt_trainer`` keep
    working. They stay without a counter, as in ignite (whose state-attribute table is shared by every engine
    in the process), so filter on ``TBPTTEvents`` instead.

    Firing costs next to nothing while no handler listens, so the counters and filters are there for every
    trainer without slowing down one that attaches none.
    """

    WINDOW_STARTED = "window_started"
    WINDOW_COMPLETED = "window_completed"
    OPTIMIZER_STEP_STARTED = "optimizer_step_started"
    OPTIMIZER_STEP_COMPLETED = "optimizer_step_completed"


_EVENT_TO_ATTR = {
    TBPTTEvents.WINDOW_STARTED: "window",
    TBPTTEvents.WINDOW_COMPLETED: "window",
    TBPTTEvents.OPTIMIZER_STEP_STARTED: "optimizer_step",
    TBPTTEvents.OPTIMIZER_STEP_COMPLETED: "optimizer_step",
}
COUNTERS = ("window", "optimizer_step")


def register_tbptt_events(engine: Engine) -> None:
    """Register :class:`TBPTTEvents` and ignite's ``Tbptt_Events`` with their counters on ``engine``."""
    engine.register_events(*TBPTTEvents, *Tbptt_Events, event_to_attr=_EVENT_TO_ATTR)
    for name in COUNTERS:
        if name not in engine.state_dict_user_keys:
            engine.state_dict_user_keys.append(name)


class EventFiring:
    """Fires ``events`` (registered by :func:`register_tbptt_events`) on ``engine``, as ``engine.fire_event`` does.

    ``Engine.fire_event`` first checks the event against every allowed one, one Python comparison each, and
    formats a debug message: about 6 µs an event, paid several times a window even when nothing listens. The
    trainer's own events are registered when it attaches, so here only their handlers run, if any.

    Finding an event's handlers hashes it, a Python call (ignite's ``CallableEventWithFilter.__hash__``), six
    times a window; so each event's list in ``engine._event_handlers`` is looked up once and kept. ignite's
    ``add_event_handler`` appends to that list, so a handler attached later is seen at once. Only
    ``remove_event_handler`` replaces it, and the list kept still holds the removed handler: where the engine
    has a handler, the kept list is never empty, and ``Engine._fire_event`` runs the engine's current list.
    :meth:`refresh` (when a run starts) drops lists replaced so.

    Args:
        engine: the engine.
        events: the events fired through this object, in the order of their indices in :meth:`fire`.
    """

    __slots__ = ("engine", "events", "handlers")

    def __init__(self, engine: Engine, events: tuple[Any, ...]) -> None:
        self.engine, self.events = engine, events
        self.handlers: tuple[list, ...] = ()
        self.refresh()

    def refresh(self) -> None:
        """Look each event's handler list up again."""
        lists = self.engine._event_handlers  # a defaultdict: an event without handlers gets the list they will join
        self.handlers = tuple(lists[event] for event in self.events)

    def fire(self, index: int) -> None:
        """Fire ``events[index]``: its handlers run, ``engine.last_event_name`` the event (``_fire_event`` sets it).

        Call it where ``handlers[index]`` is not empty: an event without handlers is not fired at all, since its name
        in ``last_event_name`` could be read by nothing before ignite's next event replaces it.
        """
        self.engine._fire_event(self.events[index])
