"""The Ray executor: one remote task per item on a Ray cluster (`address`, the runtime this
process already started with `ray.init`, or a local instance of `workers` CPUs started here),
the shared inputs put in Ray's object store once."""
from __future__ import annotations

import socket
from typing import Callable, Iterator

from simserve.errors import SimserveError

CONNECT_TIMEOUT_S = 10  # an unreachable address fails in this long (ray.init retries for minutes)


def import_ray():
    try:
        import ray
    except ImportError:
        raise SimserveError("--executor ray needs Ray: pip install 'simserve[ray]' (or pip "
                            "install 'ray>=2.9')") from None
    return ray


def check_reachable(address: str) -> None:
    """`HOST:PORT` or `ray://HOST:PORT` answers TCP; anything else (`auto`) is left to Ray."""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        if address.startswith("ray://") or ":" in address:
            raise SimserveError(f"--address {address}: expected HOST:PORT, ray://HOST:PORT "
                                "or auto")
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise SimserveError(f"--address {address}: cannot connect to the Ray cluster: "
                            f"{exc}") from None


class RayExecutor:
    def __init__(self, address: str | None = None, workers: int = 1):
        self._ray = ray = import_ray()
        self._own = not ray.is_initialized()
        if not self._own:
            return
        opts = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": False}
        try:
            if address:
                check_reachable(address)
                ray.init(address=address, **opts)
            else:
                ray.init(num_cpus=workers, **opts)
        except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
            where = f"--address {address}" if address else "ray.init"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SimserveError(f"{where}: cannot start or reach Ray: {first}") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._own:
            self._ray.shutdown()
        return False

    def map_unordered(self, fn: Callable, items: list,
                      shared=None) -> Iterator[tuple[int, object]]:
        ray = self._ray
        remote = ray.remote(num_cpus=1)(fn)  # retried if its node dies (points are pure)
        on_workers = ray.put(shared)  # one copy in the object store, not one per task
        refs = [remote.remote(item, on_workers) for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        # the worker's own exception (a SimserveError is one line), not Ray's
                        # wrapper with the remote traceback in its message
                        cause = getattr(exc, "cause", None)
                        raise (cause if isinstance(cause, Exception) else exc) from None
                    yield index[ref], result
        finally:
            for ref in pending:
                ray.cancel(ref)
