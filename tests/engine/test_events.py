"""The trainer's events fire as ignite's do: filters on their counters, handlers added mid-run, last_event_name."""

import torch
from ignite.contrib.engines.tbptt import Tbptt_Events

from ignite_tbptt import TBPTTEvents, create_tbptt_trainer

from ..helpers import make_batches, sgd
from ..reference import Net, cross_entropy


def test_filters_counters_and_handlers_added_mid_run():
    torch.manual_seed(0)
    model = Net().double()
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 2, 4, gradient_accumulation_steps=2)
    seen = {"every 3": [], "once 5": [], "steps": [], "chunks": 0, "late": [], "names": set()}

    def record(key):
        return lambda e: seen[key].append(e.state.window)

    trainer.add_event_handler(TBPTTEvents.WINDOW_COMPLETED(every=3), record("every 3"))
    trainer.add_event_handler(TBPTTEvents.WINDOW_STARTED(once=5), record("once 5"))
    trainer.add_event_handler(
        TBPTTEvents.OPTIMIZER_STEP_COMPLETED(every=2), lambda e: seen["steps"].append(e.state.optimizer_step)
    )
    trainer.add_event_handler(Tbptt_Events.TIME_ITERATION_STARTED, lambda e: seen.update(chunks=seen["chunks"] + 1))
    trainer.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_STARTED, lambda e: seen["names"].add(e.last_event_name))

    @trainer.on(TBPTTEvents.WINDOW_COMPLETED(once=2))
    def attach_late(engine):  # a handler attached while the trainer runs fires from the next window on
        engine.add_event_handler(TBPTTEvents.WINDOW_STARTED, record("late"))

    state = trainer.run(make_batches([8, 8]))  # 4 windows of 2 steps a batch, a step every 2 windows
    assert (state.window, state.optimizer_step) == (8, 4)
    assert seen["every 3"] == [3, 6] and seen["once 5"] == [5] and seen["steps"] == [2, 4]
    assert seen["chunks"] == 8
    assert seen["late"] == [3, 4, 5, 6, 7, 8]
    assert seen["names"] == {TBPTTEvents.OPTIMIZER_STEP_STARTED}


def test_handlers_removed_and_attached_mid_run_fire_as_on_ignite_events():
    # The trainer keeps each event's handler list; ignite's remove_event_handler replaces that list. A handler
    # removed mid-run must stop, and one attached after the removal must run, from the next window on.
    torch.manual_seed(0)
    model = Net().double()
    trainer = create_tbptt_trainer(model, sgd(model), cross_entropy, 2, 2)
    seen = {"first": [], "second": [], "unheard": []}

    def first(engine):
        seen["first"].append(engine.state.window)

    def second(engine):
        seen["second"].append(engine.state.window)

    trainer.add_event_handler(TBPTTEvents.WINDOW_STARTED, first)

    @trainer.on(TBPTTEvents.WINDOW_COMPLETED(once=2))
    def swap(engine):
        if not engine.has_event_handler(first, TBPTTEvents.WINDOW_STARTED):
            return  # the second run: swapped already
        engine.remove_event_handler(first, TBPTTEvents.WINDOW_STARTED)
        engine.add_event_handler(TBPTTEvents.WINDOW_STARTED, second)
        # An event nothing listened to until now.
        engine.add_event_handler(TBPTTEvents.OPTIMIZER_STEP_COMPLETED, lambda e: seen["unheard"].append(e.state.window))

    state = trainer.run(make_batches([8]))  # 4 windows of 2 steps, a step each
    assert state.window == 4
    assert seen["first"] == [1, 2] and seen["second"] == [3, 4] and seen["unheard"] == [3, 4]
    # A second run starts from the engine's current lists.
    seen.update(first=[], second=[], unheard=[])
    trainer.run(make_batches([4]), max_epochs=1)
    assert seen["first"] == [] and seen["second"] == [1, 2] and seen["unheard"] == [1, 2]
