"""Command-line options every example shares, checked as they are read.

Each example's parser is built by :func:`example_parser`: its usage names the command that runs it
(``python -m ignite_tbptt.examples.NAME``) and its help gives every option's default. A value that cannot be right
(a count of 0, a missing file, a device torch does not see) is refused by argparse as it is read, with exit status 2
and one line that names the option and the fix, before any data loads or any model is built.

Nothing here imports torch at module level, and neither does an example's command-line module, so that ``--help``
and a refused option need not load it (the package's root imports its public names on first use). Torch is
imported once the options are read: to check ``--device``, and to choose its default (:func:`parse`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "example_parser",
    "parse",
    "positive_int",
    "non_negative_int",
    "positive_float",
    "non_negative_float",
    "fraction",
    "existing_file",
    "add_device_option",
    "add_cuda_graphs_option",
    "add_threads_option",
    "job_attribute",
    "busy_cores_note",
    "torch_threads",
    "running_now",
    "tell_if_cores_are_busy",
]

PACKAGE = "ignite_tbptt.examples"


class HelpFormatter(argparse.HelpFormatter):
    """Help text wrapped, line breaks in it kept, and each option's default after it, unless it says its own."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return [line for part in text.splitlines() for line in (textwrap.wrap(part, width) or [""])]

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unshown = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if "default" in text or unshown or not action.option_strings:
            return text  # a flag (off unless given), or a default the help names in words
        return f"{text} (default: %(default)s)"


def example_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m ignite_tbptt.examples.NAME``, described by the first paragraph of ``doc``."""
    return argparse.ArgumentParser(
        prog=f"python -m {PACKAGE}.{name}", description=doc.split("\n\n")[0], formatter_class=HelpFormatter
    )


def parse(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``p.parse_args(argv)``, with ``--device``'s default chosen once the options are read (torch imported then)."""
    args = p.parse_args(argv)
    if getattr(args, "device", "") is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def _number(text: str, kind: type) -> Any:
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"got {text}; pass a finite number")
    return value


def positive_int(text: str) -> int:
    """An ``int`` of 1 or more: a size, a count of steps, epochs, processes or threads."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {value}; pass a whole number of 1 or more")
    return value


def non_negative_int(text: str) -> int:
    """An ``int`` of 0 or more, where 0 turns something off."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"got {value}; pass a whole number of 0 or more")
    return value


def positive_float(text: str) -> float:
    """A finite ``float`` above 0: a learning rate, a bias bound."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"got {text}; pass a number above 0")
    return value


def non_negative_float(text: str) -> float:
    """A finite ``float`` of 0 or more, where 0 turns something off."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"got {text}; pass 0 or more")
    return value


def fraction(text: str) -> float:
    """A ``float`` strictly between 0 and 1: a share of the data, a relative bias."""
    value = _number(text, float)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"got {text}; pass a number between 0 and 1, such as 0.05")
    return value


def existing_file(text: str) -> Path:
    """The path of a file that exists and can be read."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; pass a file")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file; check the path")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text} cannot be read; check its permissions")
    return path


def add_device_option(p: argparse.ArgumentParser, runs: str = "the model, the batches and the evaluation") -> None:
    """``--device``: where ``runs`` run; default ``cuda`` where torch sees one, else ``cpu`` (chosen by :func:`parse`).

    A device that is not one, or a CUDA device torch does not see, is refused as the options are read, with the
    devices there are, rather than by CUDA once the model moves.
    """
    p.add_argument(
        "--device", default=None, type=_device, help=f"where {runs} run (default: cuda where torch sees one, else cpu)"
    )


def _device(text: str) -> str:
    import torch  # here, not at the top: --help and the other options answer without torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: pass cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise argparse.ArgumentTypeError(f"torch {torch.__version__} sees no CUDA device: pass --device cpu")
        if device.index is not None and device.index >= count:
            last = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
            raise argparse.ArgumentTypeError(f"torch sees {count} CUDA device(s): pass {last}, or cuda")
    return text


def add_cuda_graphs_option(p: argparse.ArgumentParser) -> None:
    """``--cuda-graphs``: capture the windows in CUDA graphs (``cuda_graphs=True``: a CUDA device, k2 >= k1)."""
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="capture each window in a CUDA graph once per shape and replay it, and the optimizer's step after it "
        "(a fused optimizer; a CUDA device, k2 >= k1)",
    )


def add_threads_option(p: argparse.ArgumentParser) -> None:
    """``--threads``: torch's CPU threads; default torch's own, one per core."""
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch's CPU threads (default: torch's, one per core); 1 where other processes share the cores: "
        "several threads spin while they wait for each other, which beside other jobs can be many times slower",
    )


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block on ``threads`` of torch's CPU threads (``--threads``; None: torch's own), then restore them.

    An example called from Python (a test, a notebook) leaves the caller's setting as it found it.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def job_attribute(module: str, name: str) -> Any:
    """``name`` of the example's job ``module`` (its model, data and training), imported, with torch, when first asked.

    The command-line module of an example forwards the names it does not define here (PEP 562), so that
    ``from ignite_tbptt.examples.char_lm import CharLSTM`` works while ``--help`` imports nothing heavy.
    """
    if name.startswith("__"):  # the interpreter's and tools' own probes: not the job's
        raise AttributeError(name)
    job = importlib.import_module(module)  # outside the try: an error while the job loads must show as itself
    try:
        return getattr(job, name)
    except AttributeError:
        raise AttributeError(f"module {module.replace('._', '.')!r} has no attribute {name!r}") from None


def busy_cores_note(fix: str, threads: int | None = None) -> str | None:
    """One line for the user where other processes keep the cores busy and torch would run several threads on them.

    Torch's CPU threads spin while they wait for each other: on idle cores the fastest way, but beside other
    processes each spinning thread takes turns with them, and the main job ran 6 to 90 times slower (the table in
    docs/howto/shared-cores.md). Letting them sleep instead (``OMP_WAIT_POLICY=PASSIVE``) cost 1.5 times on idle
    cores (6-7 times for the system-identification example's tiny operations), and one thread was as fast as any on
    busy cores and 10-25% slower on idle ones: so the default stays torch's, and a command tells the user, once, as
    it starts, where the load average says other processes are running.

    Args:
        fix: what to pass, e.g. ``"pass --threads 1"``.
        threads: the threads the run will use; default torch's.

    Returns:
        The note, or None where the cores look free, the run uses one thread, or the system gives no load average.
    """
    import torch

    threads = threads or torch.get_num_threads()
    try:
        others = os.getloadavg()[0]  # this run has only just started: the load is the others'
    except (AttributeError, OSError):
        return None
    cores = os.cpu_count() or 1
    if threads < 2 or others < 0.75 or others + threads <= cores:
        return None
    if running_now() == 0:  # the load average still counts a job that has just ended, for a minute or so
        return None
    return (
        f"note: other processes keep these {cores} cores busy (load average {others:.1f}), and torch's {threads} "
        f"threads spin while they wait for each other, which can make this run many times slower: {fix}, or set "
        "OMP_WAIT_POLICY=PASSIVE."
    )


def running_now() -> int | None:
    """How many other threads run or wait to run at this instant (Linux's ``/proc/loadavg``); None elsewhere."""
    try:
        runnable = Path("/proc/loadavg").read_text().split()[3].partition("/")[0]
    except (OSError, IndexError):
        return None
    return max(int(runnable) - 1, 0)  # less this process, which is running as it reads


def tell_if_cores_are_busy(fix: str = "run it with OMP_NUM_THREADS=1", threads: int | None = None) -> None:
    """Print :func:`busy_cores_note` to standard error, if there is one: called once by an example run as a command."""
    note = busy_cores_note(fix, threads)
    if note is not None:
        print(note, file=sys.stderr, flush=True)
