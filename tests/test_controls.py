"""DualPace's profile-guided controls on synthetic profiles with known answers."""
from __future__ import annotations

import numpy as np

from simserve.policies.dualpace.controls import (RouteTimes, assist_thresholds, cpu_batch_limit,
                                                 gpu_token_limit, route, route_scores)


def test_gpu_token_limit_is_first_point_within_delta_of_plateau():
    n = np.array([64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768])
    # a saturating throughput: n / (t0 + n c) -> 1/c; plateau = mean of last 5 values
    thr = n / (2.0 + n * 0.01)
    plateau = thr[-5:].mean()
    expect = n[np.argmax(thr >= 0.99 * plateau)]
    assert gpu_token_limit(n, thr) == expect
    # noise that breaks monotonicity is smoothed by the isotonic fit, repeats are averaged
    noisy = thr * np.where(np.arange(len(n)) % 2, 1.004, 0.996)
    assert gpu_token_limit(np.repeat(n, 2), np.repeat(noisy, 2)) in (expect, n[list(n).index(expect) + 1])


def test_cpu_batch_limit_takes_the_throughput_maximum():
    b = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    thr = [1, 2, 4, 7, 12, 20, 28, 33, 35, 31]
    assert cpu_batch_limit(b, thr) == 256


def test_route_boundaries():
    assert list(route(32, 16, [1, 16, 17, 32, 33])) == [0, 0, 1, 1, 2]
    assert list(route(0, 0, [1, 8])) == [2, 2]


def test_assist_thresholds_recover_crossovers_and_prefer_fewer_calls():
    B = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256])
    # full best up to 16, split best 17..32, fused best beyond (clear margins)
    full = B * 1.0
    split = np.full(len(B), 20.0) + B * 0.4
    fused = np.full(len(B), 30.0) + B * 0.1
    S = np.stack([full, split, fused])
    assert assist_thresholds(B, S, num_layers=32, eps=0.0) == (32, 16)
    # a split route only 0.1% worse than full at small b: with eps 0.25% the rule keeps
    # Full-CPU longer (fewer assist calls), as DualPace's (32, 0) -> (32, 16) choice did
    S2 = np.stack([full * 1.001, full, fused + 1e9 * (B <= 32)])
    assert assist_thresholds(B, S2, 32, eps=0.0) == (32, 0)
    assert assist_thresholds(B, S2, 32, eps=0.0025) == (32, 16)


def test_route_scores_follow_eq_6_to_8():
    one = np.ones(3)
    rt = RouteTimes(t_p=one, t_l=2 * one, tw_p=0.5 * one, tw_ls=0.7 * one, tw_la=0.6 * one,
                    d_p=0.1 * one, d_ls=0.2 * one, d_la=0.3 * one)
    S = route_scores(rt, num_layers=10, lam=1.0)
    assert np.allclose(S[0], 10 * 1 + 2)
    assert np.allclose(S[1], 10 * 1 + 0.7 + 0.2)
    assert np.allclose(S[2], 9 * 0.5 + 0.6 + 9 * 0.1 + 0.3)
