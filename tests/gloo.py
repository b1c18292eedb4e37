"""A gloo process group started once and given one function after another, for the tests that need processes.

Starting a group (spawning its processes, importing torch and the package in each, the rendezvous) costs several
seconds, more than most of the cases run in it; ``idist.Parallel`` per test paid it twenty times. A :class:`Group`
keeps its processes: :meth:`Group.run` sends them a function, each calls it with its local rank, as
``idist.Parallel.run`` does, and the call returns once every process has returned. A function that raises, or a
group that does not answer in time (a process waiting in a collective that the others never make), ends the group;
the next test starts a fresh one.

Each function leaves the process as it found it (what it patches it restores): the next test's runs there.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import queue
import socket
import traceback
from datetime import timedelta

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(rank: int, size: int, port: int, tasks, results) -> None:
    import ignite.distributed as idist

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(size), LOCAL_WORLD_SIZE=str(size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    idist.initialize("gloo", timeout=timedelta(seconds=120))
    try:
        while (task := tasks.get()) is not None:
            fn, args = task
            try:
                fn(rank, *args)
                # FSDP2 keeps its last asynchronous collectives' work objects on the model: freed at exit, after the
                # group, gloo's threads now and then abort the process. The trainer holds the model in reference
                # cycles, so the collector must run while the group is alive.
                gc.collect()
                results.put((rank, None))
            except BaseException:
                results.put((rank, traceback.format_exc()))
    finally:
        idist.finalize()


class Group:
    """``size`` processes in one gloo group on 127.0.0.1, each waiting for a function to run."""

    def __init__(self, size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.size, self.results = size, context.Queue()
        self.tasks = [context.SimpleQueue() for _ in range(size)]
        port = _free_port()
        self.processes = [
            context.Process(target=_serve, args=(rank, size, port, self.tasks[rank], self.results), daemon=True)
            for rank in range(size)
        ]
        for process in self.processes:
            process.start()
        self.alive = True

    def run(self, fn, *args, timeout: float = 300.0) -> None:
        """Call ``fn(local_rank, *args)`` in every process; return when all have returned.

        Raises:
            AssertionError: a process raised (its traceback is the message), one ended, or the group did not answer
                within ``timeout`` seconds. The group is closed: the next run needs a fresh one.
        """
        for tasks in self.tasks:
            tasks.put((fn, args))
        failures = []
        for _ in range(self.size):
            try:
                # Once one has failed, the others may wait in a collective it never makes: not for long, then.
                rank, failure = self.results.get(timeout=20.0 if failures else timeout)
            except queue.Empty:
                self.close()
                failures.append(f"the group of {self.size} processes did not answer in time")
                break
            if failure is not None:
                failures.append(f"process {rank}:\n{failure}")
        if failures:
            self.close()
            raise AssertionError("\n".join(failures))

    def stop(self) -> None:
        """Ask the processes to end, without waiting for them (:meth:`close` waits)."""
        if not self.alive:
            return
        self.alive = False
        for tasks, process in zip(self.tasks, self.processes):
            if process.is_alive():
                tasks.put(None)

    def close(self) -> None:
        """End the processes: asked to stop, then killed if they do not."""
        self.stop()
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()


@pytest.fixture(scope="session")
def gloo():
    """``gloo(size=2)``: this pytest process's group of ``size`` processes, started on first use and kept."""
    groups: dict[int, Group] = {}

    def get(size: int = 2) -> Group:
        if size not in groups or not groups[size].alive:
            groups[size] = Group(size)
        return groups[size]

    yield get
    for group in groups.values():  # every group asked first, so that their processes end side by side
        group.stop()
    for group in groups.values():
        group.close()
