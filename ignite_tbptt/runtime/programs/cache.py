"""The programs a trainer keeps, at most a limit of them, and the counts of how its programs ran.

A program stands for one shape of window or optimizer step. Shapes that stop coming (sequence starts at
places that do not recur, a batch length seen once) must not hold their slot: the least recently used program is
dropped for a new one, its graph freed, and the drop counted. A user reads the counts as ``engine.state.programs``;
:func:`~ignite_tbptt.attach_tensorboard` logs them under ``train/programs/``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from ...planning import Eager

__all__ = ["ProgramCounts", "ProgramCache"]


@dataclass
class ProgramCounts:
    """How a trainer's programs ran so far (``cuda_graphs``), summed over window and step programs."""

    #: Programs captured (a CUDA graph, or a recording with ``cuda_graphs="replayed"``).
    captures: int = 0
    #: Replays of captured programs.
    replays: int = 0
    #: Eager runs of programs before their capture, as CUDA's warm-up asks.
    warmups: int = 0
    #: Windows that ran eagerly, segment by segment, outside any program (a stream's first, one the batch ends
    #: inside, ...).
    eager_windows: int = 0
    #: Optimizer steps taken eagerly, outside any program (an optimizer that cannot skip on the device, ...).
    eager_steps: int = 0
    #: Programs dropped, least recently used first, to make room for a new one.
    evictions: int = 0
    #: The windows that ran eagerly by reason (:class:`~ignite_tbptt.planning.Eager`'s values), and the steps as
    #: ``step/<reason>``, those with any.
    eager: dict[str, int] = field(default_factory=dict)
    #: The warm-ups, captures and replays by kind of program (``"window"``: window and sweep programs, ``"step"``:
    #: step programs), those with any: what a run on a GPU certifies is that each kind was captured and replayed.
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)

    def ran(self, kind: str, how: str) -> None:
        """A program of ``kind`` ran ``how`` (``"warmups"``, ``"captures"``, ``"replays"``): counted, and by kind."""
        setattr(self, how, getattr(self, how) + 1)
        by_kind = self.kinds.setdefault(kind, {})
        by_kind[how] = by_kind.get(how, 0) + 1

    def ran_eagerly(self, reason: Eager, kind: str = "window") -> None:
        """A window runs segment by segment, or an optimizer step (``kind="step"``) eagerly, for ``reason``."""
        name = reason.value
        if kind == "step":
            self.eager_steps += 1
            name = f"step/{name}"
        else:
            self.eager_windows += 1
        self.eager[name] = self.eager.get(name, 0) + 1

    def as_dict(self) -> dict[str, int]:
        """The counts by name; the reasons as ``eager/<reason>``, the kinds' as ``<kind>/<count>``."""
        counts = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("eager", "kinds")}
        by_kind = {f"{kind}/{how}": n for kind, ns in self.kinds.items() for how, n in ns.items()}
        return {**counts, **{f"eager/{reason}": n for reason, n in self.eager.items()}, **by_kind}


class ProgramCache:
    """Programs by key, at most ``limit``; a new one drops the least recently used.

    Args:
        limit: the most programs kept.
        counts: where the drops are counted.
    """

    def __init__(self, limit: int, counts: ProgramCounts) -> None:
        self.limit, self.counts = limit, counts
        self._programs: OrderedDict[Hashable, Any] = OrderedDict()

    def fetch(self, key: Hashable, make: Callable[[], Any], valid: Callable[[Any], bool] | None = None) -> Any:
        """The program of ``key``, now the most recently used; made by ``make()`` where there is none or it is stale.

        ``valid(program)``: whether it is still valid (what it was made for is unchanged). A new program drops the
        least recently used where the cache is full.
        """
        program = self._programs.get(key)
        if program is not None and (valid is None or valid(program)):
            self._programs.move_to_end(key)
            return program
        self._programs.pop(key, None)
        while len(self._programs) >= self.limit:
            self._programs.popitem(last=False)
            self.counts.evictions += 1
        program = self._programs[key] = make()
        return program

    def drop(self, program: Any) -> None:
        """Forget ``program`` (what it was captured for changed)."""
        for key in [k for k, p in self._programs.items() if p is program]:
            del self._programs[key]

    def clear(self) -> None:
        """Forget every program."""
        self._programs.clear()

    def __len__(self) -> int:
        return len(self._programs)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._programs)

    def values(self) -> list[Any]:
        """The programs, least recently used first."""
        return list(self._programs.values())
