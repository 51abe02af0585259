"""ConfluxServe's scheduling algorithms as pure functions (policies.md §7): the latency estimator
(`estimator`), waterfill prefill dispatch (`dispatch`), dual-mode decode placement (`placement`),
and Moore–Hodgson TTFT-aware admission with the per-iteration scheduler (`admission`).

No policy is registered here yet: the SimPy engine that drives these functions comes later.
"""
