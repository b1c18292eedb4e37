"""Pictures of TBPTT(k1, k2): each window's losses and reach, and how sequences lie in a stream's columns."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from .checks import positive_int
from .planning import ClosePlan, Schedule, walk

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn, not with the package
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure, SubFigure

__all__ = ["plot_schedule", "plot_columns", "plot_reach"]

_REACH, _LOSS, _OWN, _CUT = "#9ecae1", "#08519c", "#fdae6b", "#cb181d"


def plot_schedule(k1: int, k2: int, n_steps: int, ax: Axes | None = None) -> Figure | SubFigure:
    """Draw the windows of TBPTT(k1, k2) over a stream of ``n_steps`` steps, one row per window.

    Each row shows the steps whose losses the window computes (dark), the steps its backward pass reaches,
    from its cut to its end (light), and the cut (red line: the hidden state entering that step is treated as
    a constant). With ``k2 < k1`` the steps before the cut are drawn in orange: each gets only the gradient of
    its own loss. The windows and cuts are those the trainer plans for :class:`~ignite_tbptt.Schedule`
    (:func:`~ignite_tbptt.planning.walk`; Williams & Peng 1990; Sutskever 2013, section 2.8.6).

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
    closes = [p.plan for p in walk(schedule, n_steps) if isinstance(p.plan, ClosePlan)]  # each window, as it closes
    windows = [(close.start, close.end, close.cut) for close in closes]
    own_figure = ax is None
    if ax is None:
        fig = Figure(figsize=(min(18.0, 5.5 + 0.3 * n_steps), 1.4 + 0.4 * len(windows)), layout="constrained")
        ax = fig.add_subplot()
    for w, (start, end, cut) in enumerate(windows):
        ax.add_patch(Rectangle((cut, w - 0.35), end - cut, 0.7, color=_REACH, gid=f"reach-{w}"))
        ax.add_patch(Rectangle((start, w - 0.18), end - start, 0.36, color=_LOSS, gid=f"losses-{w}"))
        for t in range(start, cut):
            ax.add_patch(Rectangle((t, w - 0.35), 1, 0.7, color=_OWN, gid=f"own-{w}-{t}", ec="white"))
            ax.add_patch(Rectangle((t, w - 0.18), 1, 0.36, color=_LOSS, ec="white"))
        ax.plot([cut, cut], [w - 0.45, w + 0.45], color=_CUT, lw=2)
    ax.set_xlim(0, n_steps)
    ax.set_ylim(len(windows) - 0.5, -0.5)
    ax.set_yticks(range(len(windows)), [str(w + 1) for w in range(len(windows))])
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
    return _legend(ax, handles, own_figure)


def _legend(ax: Axes, handles: list, own_figure: bool) -> Figure | SubFigure:
    """Put the legend right of the plot: outside the axes of a figure drawn here, beside given ``ax`` otherwise."""
    if own_figure:
        ax.figure.legend(handles=handles, loc="outside right upper", frameon=False)
    else:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax.figure


_SEQUENCES, _PADDING = ("#4292c6", "#fd8d3c", "#74c476", "#9e9ac8"), "#e0e0e0"


def plot_columns(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    k1: int | None = None,
    ignore_index: int = -100,
    ax: Axes | None = None,
) -> Figure | SubFigure:
    """Draw how sequences lie in the columns of a stream's ``(x, y, starts)`` batches (time first).

    One row per column, one bar per sequence (alternating shades), from the step where ``starts`` marks it
    to the next start; a black tick where the hidden state is reset; padding (``y == ignore_index``) in grey;
    batch boundaries as solid lines and, with ``k1``, window ends as dashed ones. Windows and cuts lie on the
    stream's time grid whatever the sequences do (SPEC.md, "Sequence starts").

    Args:
        batches: ``(x, y, starts)`` batches of shape ``(T, B)`` each, e.g. from
            :func:`~ignite_tbptt.data.pack_sequences`.
        k1: draw the window ends of TBPTT(k1, ·); default: none.
        ignore_index: the target value of padding steps.
        ax: matplotlib axes to draw into; default: a new figure.

    Returns:
        The matplotlib figure. Bars carry ``gid`` ``"sequence-b-i"`` for the ``i``-th sequence (from 0) of
        column ``b``, and ``"padding-b"`` for column ``b``'s padding.

    Raises:
        ValueError: if there are no batches.

    Examples:
        >>> from ignite_tbptt.data import pack_sequences
        >>> sequences = [torch.arange(n) for n in (9, 4, 6, 7)]
        >>> fig = plot_columns(pack_sequences(sequences, batch_size=2, length=5), k1=3)
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    batches = list(batches)
    if not batches:
        raise ValueError("plot_columns needs at least one (x, y, starts) batch.")
    y = torch.cat([b[1] for b in batches]).cpu()
    starts = torch.cat([b[2] for b in batches]).cpu()
    steps, columns = starts.shape
    own_figure = ax is None
    if ax is None:
        fig = Figure(figsize=(min(18.0, 4.0 + 0.25 * steps), 1.2 + 0.45 * columns), layout="constrained")
        ax = fig.add_subplot()
    for b in range(columns):
        firsts = [*torch.nonzero(starts[:, b]).flatten().tolist(), steps]
        for i, (first, end) in enumerate(zip(firsts, firsts[1:])):
            real = int((y[first:end, b] != ignore_index).sum())  # padding only follows a column's last sequence
            color = _SEQUENCES[(b + i) % len(_SEQUENCES)]
            ax.add_patch(Rectangle((first, b - 0.35), real, 0.7, color=color, gid=f"sequence-{b}-{i}"))
            ax.plot([first, first], [b - 0.45, b + 0.45], color="black", lw=2)
        padding = torch.nonzero(y[:, b] == ignore_index).flatten()
        if len(padding):
            first = int(padding[0])
            ax.add_patch(Rectangle((first, b - 0.35), steps - first, 0.7, color=_PADDING, gid=f"padding-{b}"))
    bounds = torch.tensor([len(batch[2]) for batch in batches]).cumsum(0).tolist()
    for t in bounds[:-1]:
        ax.axvline(t, color="0.3", lw=1.2)
    for t in range(k1, steps, k1) if k1 else ():
        ax.axvline(t, color="0.3", lw=0.8, ls="--")
    ax.set_xlim(0, steps)
    ax.set_ylim(columns - 0.5, -0.5)
    ax.set_yticks(range(columns), [str(b) for b in range(columns)])
    ax.set_xlabel("step of the stream")
    ax.set_ylabel("column")
    handles = [
        Patch(color=_SEQUENCES[0], label="a sequence"),
        Line2D([], [], color="black", lw=2, label="start: hidden state reset"),
        Patch(color=_PADDING, label="padding (ignored targets)"),
        Line2D([], [], color="0.3", lw=1.2, label="batch boundary"),
    ]
    if k1:
        handles.append(Line2D([], [], color="0.3", lw=0.8, ls="--", label=f"window end (k1={k1})"))
    return _legend(ax, handles, own_figure)


def plot_reach(profiles: Iterable[dict[int, float]], ax: Axes | None = None) -> Figure | SubFigure:
    """Draw gradient-reach profiles: the hidden-state gradient norm against the lag, relative to each window's largest.

    Each profile (``engine.state.gradient_reach`` of :class:`~ignite_tbptt.GradientReach`) is a thin line; the
    median over profiles at each lag a thick one, on a log scale. A curve that is still high at its largest
    lag (the cut) says that truncation throws away gradient of the same size as what it keeps: k2 may be too
    short. One that has fallen by orders of magnitude well before the cut says that k2 reaches far enough.

    Args:
        profiles: dicts mapping lag (steps back from the window's end) to a gradient norm.
        ax: matplotlib axes to draw into; default: a new figure.

    Returns:
        The matplotlib figure; the median line carries ``gid`` ``"median"``.

    Raises:
        ValueError: if no profile has an entry.

    Examples:
        >>> fig = plot_reach([{5: 1.0, 10: 0.1, 15: 0.01}, {5: 2.0, 10: 0.4, 15: 0.05}])
    """
    from matplotlib.figure import Figure

    relative = []
    for profile in profiles:
        largest = max(profile.values(), default=0.0)
        if largest > 0:
            relative.append({lag: norm / largest for lag, norm in profile.items()})
    if not relative:
        raise ValueError("plot_reach needs at least one profile with a non-zero gradient norm.")
    if ax is None:
        fig = Figure(figsize=(6.0, 3.6), layout="constrained")
        ax = fig.add_subplot()
    for profile in relative:
        lags = sorted(profile)
        ax.plot(lags, [max(profile[lag], 1e-12) for lag in lags], color="#9ecae1", lw=0.6, alpha=0.6)
    lags = sorted({lag for profile in relative for lag in profile})
    medians = [float(torch.tensor([p[lag] for p in relative if lag in p]).median()) for lag in lags]
    ax.plot(lags, [max(m, 1e-12) for m in medians], color="#08519c", lw=2.5, marker="o", gid="median")
    ax.set_yscale("log")
    ax.set_xlabel("lag: steps back from the window's end")
    ax.set_ylabel("|d loss / d hidden| / window's largest")
    ax.set_title(f"gradient reach ({len(relative)} windows; thick: median)")
    return ax.figure
