"""A streamed point's `ChunkDigest` in a child process.

`add(records, start)` pickles the retired chunk down the child's standard input and returns:
the child derives the latencies, keeps what the summary needs and appends the labelled rows to
the CSV file while the parent simulates on. `result()` waits for the child to finish every
chunk and returns its `ChunkDigest.result()`. The chunks go in order down one pipe to one
child, so the rows are written in the order an in-process digest writes them. A child that
fails ends the run with its traceback at the next `add` or at `result`; `close()` stops it if
the run fails first.

The child is `python -m simserve.runner.digest_process` with this simserve on its path (not a
multiprocessing child: that would re-import the caller's main script, which a user's unguarded
script cannot take). It answers on a duplicate of its standard output and sends anything
printed to standard error.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import traceback
from pathlib import Path

_PROTOCOL = pickle.HIGHEST_PROTOCOL


class DigestProcess:
    def __init__(self, slo, path, header: bool, label: tuple):
        import site

        import simserve
        env = dict(os.environ)
        root = str(Path(simserve.__file__).resolve().parent.parent)
        if root not in site.getsitepackages():  # a checkout: the child imports this simserve
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen([sys.executable, "-m", "simserve.runner.digest_process"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._send((slo, None if path is None else str(path), header, label))

    def _send(self, msg) -> None:
        try:
            pickle.dump(msg, self._proc.stdin, protocol=_PROTOCOL)
            self._proc.stdin.flush()
        except OSError:  # the child ended: it failed
            self._fail()

    def add(self, records, start: int) -> None:
        self._send((records, start))

    def result(self):
        self._send(None)
        try:
            self._proc.stdin.close()
            status, payload = pickle.load(self._proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            self._fail()
        self.close()
        if status != "ok":
            raise RuntimeError(f"the streamed records' digest process failed:\n{payload}")
        return payload

    def _fail(self):
        try:
            status, payload = pickle.load(self._proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            payload = f"it exited with status {self._proc.wait()}"
        self.close()
        raise RuntimeError(f"the streamed records' digest process failed:\n{payload}")

    def close(self) -> None:
        """Stop the child if it still runs (the run failed first) and release its pipes."""
        p = self._proc
        if p.poll() is None and not p.stdin.closed:
            p.kill()
        p.wait()
        for f in (p.stdin, p.stdout):
            try:
                f.close()
            except OSError:  # a broken pipe's unflushed bytes: the child is gone anyway
                pass


def _serve(inp, out) -> None:
    try:
        from simserve.metrics_stream import ChunkDigest
        from simserve.runner.record_sink import CsvAppender
        slo, path, header, label = pickle.load(inp)
        digest = ChunkDigest(slo, None if path is None else CsvAppender(path, header, label))
        while (msg := pickle.load(inp)) is not None:
            digest.add(*msg)
        reply = ("ok", digest.result())
    except BaseException:  # noqa: BLE001 - handed to the parent, which raises it
        reply = ("error", traceback.format_exc())
    pickle.dump(reply, out, protocol=_PROTOCOL)
    out.flush()


if __name__ == "__main__":
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the answer
    _serve(sys.stdin.buffer, answer)
