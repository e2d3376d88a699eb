"""What-if estimates (``otel_rollout.whatif``), engine-free: timelines written down by hand and
each estimate worked out beside them."""

from __future__ import annotations

import pytest

from otel_rollout.whatif import what_if
from tests.core.test_attribution import request


def step() -> list:
    """38 requests of 10 tokens done by 100 ms; two of 100 tokens decoding 100 → 1,000 ms."""
    short = [request(0, 100, 10, 0, 10) for _ in range(38)]
    return short + [request(0, 1_000, 100, 0, 100), request(0, 900, 100, 0, 100)]


def test_a_cap_at_p95_cuts_the_two_long_ones_at_their_own_pace() -> None:
    estimate = what_if(step())
    assert estimate is not None
    p95, p99 = estimate.caps
    # p95 of 40 lengths (nearest rank 38) is 10: the long ones end at their 10th token —
    # 100 + 900 × 10/100 = 190 ms and 100 + 800 × 10/100 = 180 ms; the step's generation at 190
    assert (p95.quantile, p95.tokens, p95.truncated) == (0.95, 10, 2)
    assert p95.saved_s == pytest.approx(0.810)
    # p99 (nearest rank 40) is the longest: nothing cut, nothing saved
    assert (p99.tokens, p99.truncated, p99.saved_s) == (100, 0, 0.0)


def test_a_stop_at_90_and_95_percent_loses_the_two() -> None:
    estimate = what_if(step())
    assert estimate is not None
    at_90, at_95 = estimate.stops
    # 90 % of 40 is the 36th finish, 95 % the 38th: both at 100 ms, two still running
    assert (at_90.quantile, at_90.lost) == (0.9, 2) and at_90.saved_s == pytest.approx(0.9)
    assert (at_95.quantile, at_95.lost) == (0.95, 2) and at_95.saved_s == pytest.approx(0.9)


def test_a_cap_never_saves_more_than_the_step_waited_and_no_requests_no_estimate() -> None:
    # one request without a first-token stamp (an HTTP client's record): paced from its arrival
    records = [request(0, 1_000, 100), *[request(0, 50, 1) for _ in range(99)]]
    estimate = what_if(records)
    assert estimate is not None
    p95 = estimate.caps[0]
    assert p95.tokens == 1 and p95.truncated == 1
    assert p95.saved_s == pytest.approx(1.0 - 0.050)  # its end 10 ms, the others' 50 ms
    assert what_if([]) is None
