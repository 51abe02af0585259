"""Calibration: measure real kernels on the machine at hand.

PyTorch (and Triton) are optional and imported only by this package's submodules, never here,
so the rest of simserve stays importable without them. `python3 -m simserve.calibrate.run_all`
runs the measurement parts and writes tidy CSVs plus a `meta.json` to one folder.
"""
