"""A Chrome trace-event sink (the JSON that Perfetto and chrome://tracing open): one track per
engine, GPU rank, CPU engine and link; each iteration (or leap of k identical decode steps) a
complete event ("X") with its batch composition and KV blocks in use; each transfer a complete
event on its link's track; optionally each request's queue / prefill / decode as async spans.

The recorder holds it as `Recorder.trace` (None unless asked for: engines test that one
attribute per iteration, so a run without it pays nothing else). Times are simulated seconds,
written in microseconds as the format wants.
"""
from __future__ import annotations

import json

# process ids of the track groups, in the order a viewer lists them
GROUPS = {"gpu": (1, "GPU engines and ranks"), "cpu": (2, "CPU engines"),
          "link": (3, "links (PCIe, NVLink)"), "request": (4, "requests")}


class TraceEvents:
    def __init__(self, requests: bool = False):
        self.events: list[dict] = []
        self.requests = requests
        self._tracks: dict[str, tuple[int, int]] = {}
        self.num_steps = 0            # iterations the events cover (a leap counts k)

    def track(self, name: str, group: str = "gpu") -> tuple[int, int]:
        """(pid, tid) of a named track, announced to the viewer the first time it is used."""
        key = self._tracks.get(name)
        if key is None:
            pid, pname = GROUPS[group]
            if not any(p == pid for p, _ in self._tracks.values()):
                self.events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                    "args": {"name": pname}})
                self.events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                                    "tid": 0, "args": {"sort_index": pid}})
            key = self._tracks[name] = (pid, len(self._tracks) + 1)
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": key[1],
                                "args": {"name": name}})
        return key

    def iteration(self, track: str, start_s: float, end_s: float, name: str, steps: int = 1,
                  group: str = "gpu", counted: bool = True, **args) -> None:
        """One iteration (or `steps` leapt ones) on `track` from start_s to end_s; `counted`
        False for the other ranks' share of an iteration already counted on one rank."""
        pid, tid = self.track(track, group)
        if counted:
            self.num_steps += steps
        args["steps"] = steps
        self.events.append({"ph": "X", "name": name, "cat": "iteration", "pid": pid, "tid": tid,
                            "ts": start_s * 1e6, "dur": (end_s - start_s) * 1e6,
                            "args": _plain(args)})

    def transfer(self, link: str, start_s: float, dur_s: float, nbytes: float) -> None:
        pid, tid = self.track(link, "link")
        self.events.append({"ph": "X", "name": "transfer", "cat": "transfer", "pid": pid,
                            "tid": tid, "ts": start_s * 1e6, "dur": dur_s * 1e6,
                            "args": {"bytes": int(nbytes)}})

    def request_spans(self, table) -> None:
        """Each finished request as two async spans: arrival to first token (queue and
        prefill), first token to finish (decode)."""
        if not self.requests:
            return
        import numpy as np
        pid, _ = self.track("requests", "request")
        arr, first, fin = table.arrival, table.first_token, table.finish
        for rid in np.flatnonzero(np.isfinite(fin)).tolist():
            for name, a, b in (("waiting + prefill", arr[rid], first[rid]),
                               ("decode", first[rid], fin[rid])):
                common = {"cat": "request", "name": name, "pid": pid, "id": rid}
                self.events.append({**common, "ph": "b", "ts": float(a) * 1e6})
                self.events.append({**common, "ph": "e", "ts": float(b) * 1e6})

    def to_json(self) -> dict:
        return {"traceEvents": self.events, "displayTimeUnit": "ms",
                "otherData": {"source": "simserve", "time_unit": "simulated us"}}

    def write(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, separators=(",", ":"))


def _plain(args: dict) -> dict:
    """numpy scalars and arrays as JSON numbers and lists."""
    out = {}
    for k, v in args.items():
        if hasattr(v, "tolist"):
            v = v.tolist()
        elif isinstance(v, (list, tuple)):
            v = [x.tolist() if hasattr(x, "tolist") else x for x in v]
        out[k] = v
    return out
