"""Where sweep points run: a local process pool (default), a Dask distributed cluster, or a
Ray cluster. Each executor maps a picklable top-level `fn(item, shared)` over a list of items
and yields `(index, result)` as results arrive, in any order; `shared` (the files every point
reads, resolved here: `sweep_task.SweepInputs`) goes to each worker once (the pool's
initializer; Dask scatters it; Ray puts it in its object store). Each point is seeded by its
own config only, so results are byte-identical whatever the executor, the worker count or the
finishing order.

Which one:
- `local` (default): the cores of this machine; nothing to install or start.
- `dask` (`pip install 'simserve[dist]'`): pure-Python wheels, starts in about a second, and
  reaches the clusters Dask reaches: a `dask scheduler` with `dask worker`s, Slurm / PBS / SGE
  / LSF through `dask-jobqueue`, Kubernetes through `dask-kubernetes`
  (docs/how-to/scale-out.md).
- `ray` (`pip install 'simserve[ray]'`): for a cluster that already runs Ray (`ray start
  --head`, KubeRay, a cloud's Ray; Vidur's users have one). Heavier: ~80 MB wheel, ~240 MB
  installed, ~6 s to start a local instance here. With no `--address` it starts one on this
  machine; in a process that already called `ray.init`, it uses that.
Tasks are coarse (a point takes ~0.5–2 s, ~200 KB of CSV back), so neither engine's
scheduling overhead matters; pick the one your cluster runs. Workers need simserve installed
(the same version): the task function is pickled by reference.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable, Iterator

from simserve.errors import ConfigError

EXECUTORS = ("local", "dask", "ray")


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


_worker_shared = None  # in a pool worker: the `shared` of the sweep it serves, set at start


def start_worker(parent: int, shared) -> None:
    """Pool worker initializer: `die_with_parent`, and keep `shared` (sent once per worker,
    not with every task: a Mooncake trace with its hash_ids takes ~0.1 s to unpickle)."""
    global _worker_shared
    _worker_shared = shared
    die_with_parent(parent)


def _call(fn: Callable, item):
    return fn(item, _worker_shared)


class LocalExecutor:
    """A `ProcessPoolExecutor` with `workers` processes (default: all cores). One worker runs
    the items in this process, one after another (handy for debugging and profiling)."""

    def __init__(self, workers: int | None = None):
        self.workers = workers or available_cores()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map_unordered(self, fn: Callable, items: list,
                      shared=None) -> Iterator[tuple[int, object]]:
        if self.workers == 1 or len(items) <= 1:
            for i, item in enumerate(items):
                yield i, fn(item, shared)
            return
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(items)),
                                   initializer=start_worker, initargs=(os.getpid(), shared))
        try:
            index = {pool.submit(_call, fn, item): i for i, item in enumerate(items)}
            pending = set(index)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in sorted(done, key=index.get):
                    yield index[fut], fut.result()
        finally:  # an error, Ctrl-C, or the consumer stopped: drop what has not started
            pool.shutdown(wait=True, cancel_futures=True)


def check_executor(name: str, workers: int | None = None, scheduler: str | None = None,
                   address: str | None = None) -> None:
    """Bad options, or the engine not installed: a one-line error before anything runs."""
    if name not in EXECUTORS:
        raise ConfigError(f"--executor: unknown executor {name!r}; known: {', '.join(EXECUTORS)}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ConfigError(f"--workers: expected a positive integer, got {workers}")
    if scheduler and name != "dask":
        raise ConfigError("--scheduler is for --executor dask (Ray takes --address)")
    if address and name != "ray":
        raise ConfigError("--address is for --executor ray (Dask takes --scheduler)")
    if name == "dask":
        from simserve.runner.executor_dask import import_distributed
        import_distributed()
    if name == "ray":
        from simserve.runner.executor_ray import import_ray
        import_ray()


def make_executor(name: str = "local", workers: int | None = None, scheduler: str | None = None,
                  client=None, address: str | None = None):
    """A context manager with `map_unordered(fn, items, shared)`; see the module docstring.
    `client`: a `distributed.Client` to use (dask); `address`: a Ray cluster's (ray)."""
    check_executor(name, workers, scheduler, address)
    if name == "dask":
        from simserve.runner.executor_dask import DaskExecutor
        return DaskExecutor(scheduler, workers or available_cores(), client)
    if name == "ray":
        from simserve.runner.executor_ray import RayExecutor
        return RayExecutor(address, workers or available_cores())
    return LocalExecutor(workers)
