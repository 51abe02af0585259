"""Workloads: trace readers, synthetic generators, arrival normalisation, caps."""
from simserve.workload.spec import Workload

__all__ = ["Workload"]
