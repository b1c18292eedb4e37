"""The simulated systems against closed forms: a multisine's spectrum, the damped oscillator's step response, the
static deflection of a hardening spring, and the steady state of the Wiener-Hammerstein chain."""

import math

import pytest
import torch

from ignite_tbptt.data.systems import duffing, multisine, wiener_hammerstein


def test_a_multisine_excites_its_band_alone_with_equal_amplitudes_and_the_rms_asked():
    u = multisine(1000, band=(0.02, 0.1), rms=0.7, seed=3)
    assert u.pow(2).mean().sqrt().item() == pytest.approx(0.7, rel=1e-12)
    spectrum = torch.fft.rfft(u).abs()
    inside = spectrum[21:101]  # harmonics k / 1000 with 0.02 < k / 1000 <= 0.1
    assert inside.min() == pytest.approx(inside.max().item(), rel=1e-9)
    assert spectrum[:21].max() < 1e-9 * inside.max() and spectrum[101:].max() < 1e-9 * inside.max()
    assert torch.equal(u, multisine(1000, band=(0.02, 0.1), rms=0.7, seed=3))
    assert not torch.equal(u, multisine(1000, band=(0.02, 0.1), rms=0.7, seed=4))


def test_the_linear_oscillator_follows_the_damped_step_response():
    # alpha = 0, a constant force c from rest: y(t) = c / w^2 (1 - e^(-z w t) (cos wd t + z / sqrt(1 - z^2) sin wd t)).
    c, omega, zeta, dt = 0.5, 1.3, 0.1, 0.05
    y = duffing(torch.full((400,), c), dt, omega=omega, zeta=zeta, alpha=0.0)
    t = torch.arange(400, dtype=torch.float64) * dt
    wd = omega * math.sqrt(1 - zeta**2)
    decay = torch.exp(-zeta * omega * t)
    exact = c / omega**2 * (1 - decay * (torch.cos(wd * t) + zeta / math.sqrt(1 - zeta**2) * torch.sin(wd * t)))
    torch.testing.assert_close(y, exact, rtol=0, atol=1e-7)


def test_the_hardening_spring_settles_where_its_static_equation_says():
    # w^2 y + alpha y^3 = c at rest: y = 1 for w = 1, alpha = 2, c = 3.
    y = duffing(torch.full((3000,), 3.0), 0.1, omega=1.0, zeta=0.3, alpha=2.0)
    assert y[-1].item() == pytest.approx(1.0, abs=1e-9)


def test_the_chain_settles_at_the_saturated_input():
    # Unit gains at zero frequency: a constant c settles at s tanh(c / s).
    y = wiener_hammerstein(torch.full((2000,), 0.8, dtype=torch.float64), saturation=0.5)
    assert y[-1].item() == pytest.approx(0.5 * math.tanh(0.8 / 0.5), abs=1e-9)
    linear = wiener_hammerstein(torch.full((2000,), 0.8, dtype=torch.float64), saturation=1e6)
    assert linear[-1].item() == pytest.approx(0.8, abs=1e-9)


def test_a_band_without_a_harmonic_is_refused():
    with pytest.raises(ValueError, match=r"holds no harmonic of 1/100"):
        multisine(100, band=(0.011, 0.019))
    with pytest.raises(ValueError, match=r"0 <= low < high <= 0.5"):
        multisine(100, band=(0.2, 0.6))
