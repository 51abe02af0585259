"""What-if on the committed real-vLLM runs: the API server hands requests admitted back to
back to the engine core as one group, as vLLM's `AsyncMicrobatchTokenizer` does (it
tokenises every prompt queued while it ran in one call, up to 32), instead of one by one.

    python benchmarks/frontend_batch_release.py OUT.json [RUN ...]
    python -m simserve.realcheck.tail_bars OUT.json validation/vllm-h200/step_diff/score-tails.json --fit llama-default

Only the release changes: the front end's fitted per-request costs (one FIFO CPU) stay, so a
group leaves when the last of its members' serial admission work is done. It is an
experiment on the structure, not a model: the costs were fitted for one-by-one release and
would need refitting (the probe's `frontend-*` logs time every `tokenize` call) before such
a front end could replace the fitted one.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GROUP_MAX = 32   # vLLM's AsyncMicrobatchTokenizer max_batch_size


def patch() -> None:
    from simserve.policies import vllm_intake
    from simserve.sim.clock import at
    intake = vllm_intake.Intake

    def front_end_done(self, _ev) -> None:
        env, fe, q = self.ctx.env, self.frontend, self._in_frontend
        now = env.now
        if self.engine.leaper.pending is not None:
            self.engine.leaper.deliver_before(now)
        fe.pop(now)
        group = self.__dict__.setdefault("_group", [])
        group.append(q.popleft())
        if not q or len(group) >= GROUP_MAX:   # the queue ran dry: the group leaves
            t = now + fe.in_delay_s
            for r in group:
                self._admitting.append(t)
                at(env, t).callbacks.append(lambda _ev, r=r: self._admitted(r))
            self._group = []
        if q:
            at(env, fe.head_done).callbacks.append(self._front_end_done)

    def num_in_frontend(self) -> int:
        return len(self._in_frontend) + len(self._admitting) + len(self.__dict__.get("_group", ()))

    intake._front_end_done = front_end_done
    intake.num_in_frontend = num_in_frontend


def main() -> int:
    from simserve.realcheck import serve_score
    patch()
    runs = [os.path.join(serve_score.ROOT, r) for r in sys.argv[2:]] or None
    rows = serve_score.score(serve_score.ROOT, "vllm", runs)
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
