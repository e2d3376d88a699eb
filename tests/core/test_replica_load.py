"""Replica identity (``otel_rollout.replicas``) and the step's spread over replicas
(``otel_rollout.replica_load``), engine-free; real engines: tests/vllm/test_replica_imbalance.py."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from otel_rollout import replicas
from otel_rollout.analysis import analyze
from otel_rollout.replica_load import analyze_replicas
from otel_rollout.reports.summary import format_causes, format_whatif
from otel_rollout.whatif import what_if
from tests.core.test_attribution import MS, S, request


def one_to_three() -> list:
    """a: 4 requests done at 100 ms; b: 12 in three waves, done at 300 ms."""
    a = [request(0, 100, 10, 0, 10, replica="a") for _ in range(4)]
    b = [request(0, 100 * (1 + i // 4), 10, replica="b") for i in range(12)]
    return a + b


def test_ends_spread_and_balance_estimates() -> None:
    stats = analyze_replicas(one_to_three())
    assert stats is not None
    assert [(x.replica, x.requests, x.output_tokens) for x in stats.loads] == [
        ("a", 4, 40),
        ("b", 12, 120),
    ]
    assert [x.end_s for x in stats.loads] == pytest.approx([0.1, 0.3])
    assert stats.busiest.replica == "b" and stats.count == 2
    assert stats.spread_s == pytest.approx(0.2)
    # balanced, both end at the mean of their ends (200 ms): 100 ms sooner
    assert stats.balanced_saved_s == pytest.approx(0.1)
    # the work (400 ms of replica time) needs two replicas to end by 300 ms
    assert stats.fewest == 2


def test_idle_replicas_are_capacity_to_give_back() -> None:
    """Four replicas, three done at 100 ms, one at 300 ms: 600 ms of work fits two by 300 ms."""
    records = [request(0, 100, 10, replica=r) for r in "abc"] + [request(0, 300, 10, replica="d")]
    stats = analyze_replicas(records)
    assert stats is not None
    assert stats.fewest == 2
    assert stats.balanced_saved_s == pytest.approx(0.3 - 0.15)
    estimate = what_if(records, stats)
    assert estimate is not None and estimate.balance is not None
    assert (estimate.balance.replicas, estimate.balance.fewest) == (4, 2)


def test_one_replica_or_none_named_has_no_replica_figures() -> None:
    assert (
        analyze_replicas([request(0, 100, 10, replica="a"), request(0, 200, 10, replica="a")])
        is None
    )
    assert analyze_replicas([request(0, 100, 10), request(0, 200, 10)]) is None
    estimate = what_if([request(0, 100, 10)])
    assert estimate is not None and estimate.balance is None


def test_the_step_summary_names_the_busiest_replica_and_the_estimates() -> None:
    stats = analyze(one_to_three(), 0.3, step_ns=(S, S + 300 * MS))
    assert stats is not None and stats.replicas is not None
    why = format_causes(stats)
    assert why is not None
    assert (
        "67% replica_imbalance (b ended 0.20 s after the first of 2 replicas, with 12 requests)"
        in why
    )
    estimate = format_whatif(stats)
    assert estimate is not None and "balanced replicas → 0.10 s sooner" in estimate
    assert "replicas would have sufficed" not in estimate  # both were needed


def test_a_process_and_its_engines_are_named_once_each() -> None:
    here = f"{socket.gethostname()}:{os.getpid()}"
    assert replicas.process_replica() == here

    class Engine:
        pass

    first, second = Engine(), Engine()
    names = [replicas.engine_replica(e) for e in (first, second, first)]
    assert names[0] == names[2] and names[0] != names[1]
    assert {n.split("#")[0] for n in names} == {here}
    # an object without weak references is kept by id
    number = 1.5
    assert replicas.engine_replica(number) == replicas.engine_replica(number)


def test_an_endpoint_is_its_host_and_port() -> None:
    import httpx

    assert (
        replicas.endpoint_replica(httpx.URL("http://127.0.0.1:8000/v1/completions"))
        == "127.0.0.1:8000"
    )
    assert replicas.endpoint_replica("http://engine-3:30000/generate") == "engine-3:30000"


def test_the_step_picture_draws_a_lane_per_replica(tmp_path: Path) -> None:
    """From the step log entry: the cause band, then one lane per replica from its first arrival
    to its last finish, the busiest (latest end) last; the PNG is written with them."""
    from matplotlib.figure import Figure

    from otel_rollout.reports.png import write_png
    from otel_rollout.reports.steplog import step_entry
    from otel_rollout.reports.timeline import replica_lanes, timeline_lane

    records = one_to_three()
    stats = analyze(records, 0.3, step_ns=(S, S + 300 * MS))
    assert stats is not None
    entry = json.loads(json.dumps(step_entry(7, stats, records)))  # as read back from the log
    assert {r["replica"] for r in entry["requests"]} == {"a", "b"}
    lanes = replica_lanes(entry["requests"])
    assert [(label, busy["start_ns"], busy["end_ns"]) for label, busy in lanes] == [
        ("a (4)", 0, 100 * MS),
        ("b (12)", 0, 300 * MS),
    ]
    lane, below = Figure().subplots(2, 1)
    timeline_lane(lane, below, entry["phases"], entry["causes"], lanes)
    assert [t.get_text() for t in lane.get_yticklabels()] == ["b (12)", "a (4)", "why"]
    assert len([p for c in lane.collections for p in c.get_paths()]) == len(entry["causes"]) + 2
    assert Path(write_png(entry, tmp_path)).stat().st_size > 10_000
    # one replica, or none named: no lanes
    assert replica_lanes([{**r, "replica": "a"} for r in entry["requests"]]) == []
