"""Regenerate the schedule pictures used in the README and the docs: ``python docs/make_figures.py``."""

from pathlib import Path

from ignite_tbptt import plot_schedule

HERE = Path(__file__).parent / "images"

if __name__ == "__main__":
    HERE.mkdir(exist_ok=True)
    for k1, k2, n in [(4, 4, 16), (2, 5, 12), (5, 2, 15)]:
        plot_schedule(k1, k2, n).savefig(HERE / f"schedule_k1-{k1}_k2-{k2}.png", dpi=90)
