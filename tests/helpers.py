"""Small builders shared by the simulator tests."""
from __future__ import annotations

import numpy as np

from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.workload.spec import Workload

H100 = resolve_hardware(HardwareConfig(gpu="h100-sxm"))
H200 = resolve_hardware(HardwareConfig(gpu="h200-sxm"))


def workload(arrival, prompt, output) -> Workload:
    return Workload(np.asarray(arrival, dtype=np.float64), np.asarray(prompt, dtype=np.int64),
                    np.asarray(output, dtype=np.int64), name="test")
