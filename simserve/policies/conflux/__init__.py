"""ConfluxServe's scheduling algorithms as pure functions (policies.md §7): the latency estimator
(`estimator`), waterfill prefill dispatch (`dispatch`), dual-mode decode placement (`placement`),
and Moore–Hodgson TTFT-aware admission with the per-iteration scheduler (`admission`).

The engine: `plan` (Alg. 1 against real KV pools), `engine` (one XP instance), `policy`
(registration and the global router), `fit` (the estimator fitted from `simserve.cost.sp`).
"""
