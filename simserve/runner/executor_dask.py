"""The Dask distributed executor: one `client.submit` per item on a cluster (a scheduler's
address, a `Client` handed in, or a `LocalCluster` of worker processes started here), the
shared inputs scattered to every worker once."""
from __future__ import annotations

from typing import Callable, Iterator

from simserve.errors import SimserveError


def import_distributed():
    try:
        import distributed
    except ImportError:
        raise SimserveError("--executor dask needs Dask distributed: pip install "
                            "'simserve[dist]' (or pip install 'distributed>=2024.1')") from None
    return distributed


class DaskExecutor:
    """With no scheduler address and no client, starts a `LocalCluster` of `workers`
    processes."""

    def __init__(self, scheduler: str | None = None, workers: int = 1, client=None):
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
                    n_workers=workers, threads_per_worker=1,
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
        if self._own:  # bounded: a worker stuck in a point must not hang the sweep's exit
            self.client.close(timeout=30)
            if self._cluster is not None:
                self._cluster.close(timeout=30)

    def map_unordered(self, fn: Callable, items: list,
                      shared=None) -> Iterator[tuple[int, object]]:
        # one copy of `shared` on every worker, not one in every task's message (workers that
        # join later fetch it from a peer); scatter needs a worker, and a batch system's may
        # still be queued
        self.client.wait_for_workers(1)
        try:  # a value Dask cannot serialise is logged there and never arrives: say so here
            import cloudpickle
            cloudpickle.dumps(shared)
        except Exception as exc:
            raise SimserveError(f"--executor dask: the sweep's shared inputs cannot be sent to "
                                f"the workers ({type(exc).__name__}: {exc})") from None
        [on_workers] = self.client.scatter([shared], broadcast=True, hash=False)
        futures = [self.client.submit(fn, item, on_workers, pure=False) for item in items]
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for fut in self._as_completed(futures):
                yield index[fut.key], fut.result()
        finally:
            self.client.cancel([f for f in futures if not f.done()])
            self.client.cancel([on_workers])
