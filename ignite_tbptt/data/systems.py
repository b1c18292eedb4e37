"""Simulated nonlinear systems to identify: recordings ``(u, y)`` of the Silverbox and Wiener-Hammerstein kinds.

Two systems of the benchmarks nonlinear system identification measures against, simulated here so that their data
ships with the package (no download):

- :func:`duffing`: a Duffing oscillator, the structure of the Silverbox benchmark (an electronic mass-spring-damper
  with a cubic spring; Wigren and Schoukens, "Three free data sets for development and benchmarking in nonlinear
  system identification", ECC 2013): ``y'' + 2 zeta omega y' + omega^2 y + alpha y^3 = u``, integrated with the
  classical fourth-order Runge-Kutta method, the input held over each sampling interval (zero-order hold).
- :func:`wiener_hammerstein`: a linear filter, a static nonlinearity, a second linear filter, the structure of the
  Wiener-Hammerstein benchmark (Schoukens, Suykens and Ljung, "Wiener-Hammerstein benchmark", SYSID 2009), here with
  two second-order resonant filters and a saturating nonlinearity.

Both are excited by :func:`multisine`, a random-phase multisine: a sum of equal-amplitude cosines at the harmonics
of ``1 / steps`` inside a band, with independent uniform phases (Pintelon and Schoukens, "System Identification: A
Frequency Domain Approach", 2nd ed., 2012, section 2.4), the input of both benchmarks' estimation data. The
parameters are this module's, stated in each function's defaults; the figures of the benchmarks themselves come
from measured circuits and are not reproduced.
"""

from __future__ import annotations

import math

import torch

from ..checks import positive_int

__all__ = ["multisine", "duffing", "wiener_hammerstein"]


def multisine(steps: int, band: tuple[float, float] = (0.0, 0.1), rms: float = 1.0, seed: int = 0) -> torch.Tensor:
    """A random-phase multisine of ``steps`` samples: one period, equal amplitudes in ``band``, RMS ``rms``.

    Args:
        steps: samples ``N`` (the period: harmonics of ``1 / N`` cycles per sample).
        band: the excited frequencies, in cycles per sample, ``0 <= low < high <= 0.5``; the harmonics
            ``k / N`` with ``low < k / N <= high``.
        rms: the signal's root mean square.
        seed: the seed of the phases.

    Returns:
        ``(N,)`` float64.

    Raises:
        ValueError: if ``band`` holds no harmonic of ``1 / steps``, or is not inside ``[0, 0.5]``.
    """
    steps = positive_int("steps", steps, "samples")
    low, high = band
    if not 0 <= low < high <= 0.5:
        raise ValueError(f"band must be (low, high) with 0 <= low < high <= 0.5 cycles per sample, got {band}.")
    harmonics = torch.arange(math.floor(low * steps) + 1, math.floor(high * steps) + 1, dtype=torch.float64)
    if harmonics.numel() == 0:
        raise ValueError(f"band {band} holds no harmonic of 1/{steps}: widen it, or take more steps.")
    phases = (
        2 * math.pi * torch.rand(harmonics.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    )
    t = torch.arange(steps, dtype=torch.float64)
    u = torch.cos(2 * math.pi * harmonics[:, None] * t[None, :] / steps + phases[:, None]).sum(0)
    return u * (rms / u.pow(2).mean().sqrt())


def duffing(
    u: torch.Tensor,
    dt: float = 0.1,
    *,
    omega: float = 1.0,
    zeta: float = 0.05,
    alpha: float = 1.0,
    substeps: int = 4,
) -> torch.Tensor:
    """The displacement of a Duffing oscillator driven by ``u``: ``y'' + 2 zeta omega y' + omega^2 y + alpha y^3 = u``.

    Starts at rest (``y = y' = 0``); the force is held over each sampling interval ``dt`` (zero-order hold), each
    interval integrated by ``substeps`` steps of the classical Runge-Kutta method.

    Args:
        u: the force, ``(T,)``.
        dt: the sampling interval, in the units of ``1 / omega``.
        omega: the linear natural frequency (radians per unit time).
        zeta: the damping ratio.
        alpha: the cubic stiffness (0: a linear oscillator).
        substeps: Runge-Kutta steps per sampling interval.

    Returns:
        ``(T,)`` float64, the displacement at each sample, before that sample's force acts.
    """
    substeps = positive_int("substeps", substeps, "Runge-Kutta steps per sample")
    h = dt / substeps

    def accel(y: float, v: float, force: float) -> float:
        return force - 2 * zeta * omega * v - omega * omega * y - alpha * y * y * y

    y = v = 0.0
    out = []
    for force in u.double().tolist():
        out.append(y)
        for _ in range(substeps):
            k1y, k1v = v, accel(y, v, force)
            k2y, k2v = v + h / 2 * k1v, accel(y + h / 2 * k1y, v + h / 2 * k1v, force)
            k3y, k3v = v + h / 2 * k2v, accel(y + h / 2 * k2y, v + h / 2 * k2v, force)
            k4y, k4v = v + h * k3v, accel(y + h * k3y, v + h * k3v, force)
            y += h / 6 * (k1y + 2 * k2y + 2 * k3y + k4y)
            v += h / 6 * (k1v + 2 * k2v + 2 * k3v + k4v)
    return torch.tensor(out, dtype=torch.float64)


def _resonator(frequency: float, damping: float) -> tuple[list[float], list[float]]:
    # A second-order resonant low-pass of unit gain at 0: poles at r e^{+-i 2 pi f}, r = exp(-2 pi f damping).
    r = math.exp(-2 * math.pi * frequency * damping)
    a = [1.0, -2 * r * math.cos(2 * math.pi * frequency), r * r]
    return [sum(a)], a  # b0 = a0 + a1 + a2: a gain of 1 at zero frequency


def _filter(b: list[float], a: list[float], x: list[float]) -> list[float]:
    # y[n] = (sum b[k] x[n-k] - sum_{k>0} a[k] y[n-k]) / a[0], from rest.
    y: list[float] = []
    for n in range(len(x)):
        acc = sum(b[k] * x[n - k] for k in range(len(b)) if n >= k)
        acc -= sum(a[k] * y[n - k] for k in range(1, len(a)) if n >= k)
        y.append(acc / a[0])
    return y


def wiener_hammerstein(
    u: torch.Tensor,
    *,
    first: tuple[float, float] = (0.05, 0.2),
    second: tuple[float, float] = (0.08, 0.3),
    saturation: float = 0.5,
) -> torch.Tensor:
    """``u`` through a resonant filter, a saturation and a second resonant filter: ``y = G2(f(G1(u)))``.

    ``G1`` and ``G2`` are second-order low-pass filters of unit gain at zero frequency, each given as ``(frequency,
    damping)``: poles at ``r e^{+-i 2 pi frequency}``, ``r = exp(-2 pi frequency damping)``, frequency in cycles per
    sample. ``f(v) = saturation * tanh(v / saturation)``, linear for small ``v`` and bounded by ``saturation``.
    Both filters start at rest.

    Args:
        u: the input, ``(T,)``.
        first: ``G1``'s resonance frequency and damping.
        second: ``G2``'s.
        saturation: the nonlinearity's bound.

    Returns:
        ``(T,)`` float64.
    """
    b1, a1 = _resonator(*first)
    b2, a2 = _resonator(*second)
    inner = _filter(b1, a1, u.double().tolist())
    bent = [saturation * math.tanh(v / saturation) for v in inner]
    return torch.tensor(_filter(b2, a2, bent), dtype=torch.float64)
