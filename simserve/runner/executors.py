"""Where sweep points run: a local process pool (default) or a Dask distributed cluster.

An executor maps a picklable top-level function over a list of items and yields
`(index, result)` as results arrive, in any order. Each point is seeded by its own config only,
so results are identical whatever the executor, the worker count or the finishing order.

Why Dask distributed rather than Ray: it installs from pip as pure Python wheels (no C++ core,
no platform-specific wheel to wait for on a new Python); `distributed.LocalCluster` starts a
scheduler and workers in a second, even inside the test process (`processes=False`), so CI
tests the same code path that talks to a remote `dask scheduler`; and it needs no separate
object store or per-node daemons. Our tasks are coarse (a point takes ~0.5–2 s) with small
results (~200 KB of CSV), so Ray's shared-memory object store and actors would buy nothing.
Workers need simserve installed (same version): tasks are pickled by reference.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable, Iterator

from simserve.errors import ConfigError, SimserveError

EXECUTORS = ("local", "dask")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """Worker initializer: end this worker when the sweep process that started it dies, even
    by SIGKILL (which runs no clean-up, so the pool cannot stop its workers). On Linux the
    kernel sends SIGKILL (prctl PR_SET_PDEATHSIG); elsewhere, and as a second line, a daemon
    thread polls the parent's pid and exits when the worker has been re-parented."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="simserve-parent-watch", daemon=True).start()


class LocalExecutor:
    """A `ProcessPoolExecutor` with `workers` processes (default: all cores). One worker runs
    the items in this process, one after another (handy for debugging and profiling)."""

    def __init__(self, workers: int | None = None):
        self.workers = workers or available_cores()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map_unordered(self, fn: Callable, items: list) -> Iterator[tuple[int, object]]:
        if self.workers == 1 or len(items) <= 1:
            for i, item in enumerate(items):
                yield i, fn(item)
            return
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(items)),
                                   initializer=die_with_parent, initargs=(os.getpid(),))
        try:
            index = {pool.submit(fn, item): i for i, item in enumerate(items)}
            pending = set(index)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in sorted(done, key=index.get):
                    yield index[fut], fut.result()
        finally:  # an error, Ctrl-C, or the consumer stopped: drop what has not started
            pool.shutdown(wait=True, cancel_futures=True)


class DaskExecutor:
    """One `client.submit` per item on a Dask distributed cluster, gathered as they finish.
    With no scheduler address and no client, starts a `LocalCluster` of `workers` processes."""

    def __init__(self, scheduler: str | None = None, workers: int | None = None, client=None):
        distributed = import_distributed()
        self._as_completed = distributed.as_completed
        self._own, self._cluster = client is None, None
        if client is not None:
            self.client = client
            return
        try:
            if scheduler:
                self.client = distributed.Client(scheduler, timeout="10s")
            else:
                self._cluster = distributed.LocalCluster(
                    n_workers=workers or available_cores(), threads_per_worker=1,
                    dashboard_address=None)
                self.client = distributed.Client(self._cluster)
        except (OSError, TimeoutError) as exc:
            raise SimserveError(f"--scheduler {scheduler}: cannot connect to the Dask "
                                f"scheduler: {exc}") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        if self._own:
            self.client.close()
            if self._cluster is not None:
                self._cluster.close()

    def map_unordered(self, fn: Callable, items: list) -> Iterator[tuple[int, object]]:
        futures = [self.client.submit(fn, item, pure=False) for item in items]
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for fut in self._as_completed(futures):
                yield index[fut.key], fut.result()
        finally:
            self.client.cancel([f for f in futures if not f.done()])


def import_distributed():
    try:
        import distributed
    except ImportError:
        raise SimserveError("--executor dask needs Dask distributed: pip install "
                            "'simserve[dist]' (or pip install 'distributed>=2024.1')") from None
    return distributed


def check_executor(name: str, workers: int | None = None, scheduler: str | None = None) -> None:
    if name not in EXECUTORS:
        raise ConfigError(f"--executor: unknown executor {name!r}; known: {', '.join(EXECUTORS)}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"--workers: expected a positive integer, got {workers}")
    if name == "local" and scheduler:
        raise ConfigError("--scheduler is for --executor dask")
    if name == "dask":
        import_distributed()


def make_executor(name: str = "local", workers: int | None = None, scheduler: str | None = None,
                  client=None):
    """A context manager with `map_unordered(fn, items)`; see the module docstring."""
    check_executor(name, workers, scheduler)
    if name == "local":
        return LocalExecutor(workers)
    return DaskExecutor(scheduler, workers, client)
