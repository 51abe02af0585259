"""Fidelity against real hardware (DESIGN "Validation ladder" steps 3-4): random held-out
batches and a trace replay, timed by the real executor (`simserve.calibrate.executor`, torch)
and predicted by the cost model. Everything here but `device_run` is torch-free, so stored
measurements can be re-scored anywhere."""
