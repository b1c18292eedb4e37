"""The picture of TBPTT(k1, k2): which steps each window computes losses on, and how far back it reaches."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .checks import positive_int
from .schedule import Schedule

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn, not with the package
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_schedule"]

_REACH, _LOSS, _OWN, _CUT = "#9ecae1", "#08519c", "#fdae6b", "#cb181d"


def plot_schedule(k1: int, k2: int, n_steps: int, ax: Axes | None = None) -> Figure:
    """Draw the windows of TBPTT(k1, k2) over a stream of ``n_steps`` steps, one row per window.

    Each row shows the steps whose losses the window computes (dark), the steps its backward pass reaches,
    from its cut to its end (light), and the cut (red line: the hidden state entering that step is treated as
    a constant). With ``k2 < k1`` the steps before the cut are drawn in orange: each gets only the gradient of
    its own loss. The semantics are those of :class:`~ignite_tbptt.Schedule` (Williams & Peng 1990;
    Sutskever 2013, section 2.8.6).

    Args:
        k1: steps between backward passes.
        k2: steps a full window's backward pass reaches back from its end.
        n_steps: length of the stream; the last window may be shorter.
        ax: matplotlib axes to draw into; default: a new figure.

    Returns:
        The matplotlib figure (``ax.figure`` when ``ax`` is given). Patches carry ``gid`` ``"reach-w"``,
        ``"losses-w"`` and ``"own-w-t"`` for window ``w`` (from 0) and step ``t``.

    Raises:
        TypeError: if ``k1``, ``k2`` or ``n_steps`` is not an int.
        ValueError: if ``k1``, ``k2`` or ``n_steps`` is not positive.

    Examples:
        >>> fig = plot_schedule(k1=2, k2=5, n_steps=10)
        >>> fig.savefig("schedule.png")  # doctest: +SKIP
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    schedule = Schedule(k1, k2)
    positive_int("n_steps", n_steps, "steps of the stream")
    starts = list(range(0, n_steps, k1))
    own_figure = ax is None
    if ax is None:
        fig = Figure(figsize=(min(18.0, 5.5 + 0.3 * n_steps), 1.4 + 0.4 * len(starts)), layout="constrained")
        ax = fig.add_subplot()
    for w, start in enumerate(starts):
        end = schedule.window_end(start, n_steps)
        cut = schedule.cut(start, end)
        ax.add_patch(Rectangle((cut, w - 0.35), end - cut, 0.7, color=_REACH, gid=f"reach-{w}"))
        ax.add_patch(Rectangle((start, w - 0.18), end - start, 0.36, color=_LOSS, gid=f"losses-{w}"))
        for t in range(start, cut):
            ax.add_patch(Rectangle((t, w - 0.35), 1, 0.7, color=_OWN, gid=f"own-{w}-{t}", ec="white"))
            ax.add_patch(Rectangle((t, w - 0.18), 1, 0.36, color=_LOSS, ec="white"))
        ax.plot([cut, cut], [w - 0.45, w + 0.45], color=_CUT, lw=2)
    ax.set_xlim(0, n_steps)
    ax.set_ylim(len(starts) - 0.5, -0.5)
    ax.set_yticks(range(len(starts)), [str(w + 1) for w in range(len(starts))])
    ax.set_xlabel("step of the stream")
    ax.set_ylabel("window")
    ax.set_title(f"TBPTT(k1={k1}, k2={k2})")
    handles = [
        Patch(color=_LOSS, label="losses computed"),
        Patch(color=_REACH, label="reached by the backward pass"),
        Line2D([], [], color=_CUT, lw=2, label="cut"),
    ]
    if k2 < k1:
        handles.insert(2, Patch(color=_OWN, label="own loss only"))
    if own_figure:
        ax.figure.legend(handles=handles, loc="outside right upper", frameon=False)
    else:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax.figure
