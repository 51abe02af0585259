"""DualPace's scheduling pieces as pure functions (policies.md §8): the KV safety envelope of
Eq. 2–4 and FIFO prefill placement (`envelope`).

No policy is registered here yet: the SimPy GPU and CPU engines that drive these functions
come later.
"""
