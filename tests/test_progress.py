"""Cumulative token progress (simserve/policies/dualpace/progress.py) on hand-made records."""
import numpy as np

from simserve.policies.dualpace.progress import cpu_progress_stalls, token_progress
from simserve.sim.records import RequestRecords


def _records(times, on_cpu):
    times = np.asarray(times, dtype=float)
    n = len(times)
    return RequestRecords(np.zeros(1), np.ones(1, dtype=int), np.array([n]), times[:1],
                          times[-1:], np.array([0, n]), times, np.zeros(1, dtype=int),
                          np.asarray(on_cpu, dtype=bool))


def test_counts_at_given_times():
    rec = _records([1.0, 2.0, 2.0, 5.0], [False, True, True, False])
    p = token_progress(rec, [0.5, 1.0, 2.0, 4.0, 6.0])
    assert p["tokens_total"].tolist() == [0, 1, 3, 3, 4]
    assert p["tokens_cpu"].tolist() == [0, 0, 2, 2, 2]
    assert token_progress(rec)["t_s"].tolist() == [1.0, 2.0, 5.0]


def test_stalls_between_cpu_tokens():
    rec = _records([0.0, 1.0, 1.5, 9.5], [True, True, True, True])
    assert cpu_progress_stalls(rec, 2.0).tolist() == [8.0]
