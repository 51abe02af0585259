"""Policy `dualpace` (DualPace, shared/seeds/dualpace.txt §4, App. A–B; policies.md §8).

Modules, and the paper step each holds:
- `config`: the YAML parameters, with defaults and where each came from (§4.3, §6).
- `engine`: `build` — pools, cost models, profile-derived controls (§4.3: GPU batched-token
  limit, CPU decode batch limit, Dense Assist thresholds by Algorithm 1), the processes.
- `state`: what the engines share (App. A): ownership, readiness, swap-in marks, host blocks,
  finish peaks b̂, the published B_migration, the CPU queues.
- `envelope`: Eq. 2–4 and FIFO prefill placement as pure functions.
- `gpu_schedule`: GPU round steps 2–6 (App. A.1); `gpu_engine`: steps 1 and 7, swap-out /
  swap-in transfers; `copies`: the Prefill-to-CPU per-layer copies of a batch.
- `gpu_worker`: GPU-main batches as stages with Dense Assist served at stage boundaries
  (§4.2, §5), or whole-forward when C ≤ F.
- `cpu_engine`: the CPU round's five steps (App. A.2); `assist`: the three routes of Eq. 5 for
  one CPU batch and the App. B threshold fit.
- `gpu_leap`: exact event leaping over decode-only GPU rounds (with the assists in them).
With `leap: true` (the default) leaps, assists and copies are worked out in closed form
whenever nothing else can interfere, with the same float operations as the events; `leap:
false` steps every event (tests/test_dualpace_leap.py checks the two agree to the bit).
"""
