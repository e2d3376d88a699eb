"""Figure 12: what a step's end costs — the analysis of its records, with and without "why".

A step's end runs the pure analysis (:func:`otel_rollout.analysis.analyze`) over its records once;
issue #42 added the causes (:mod:`otel_rollout.attribution`), the what-if estimates
(:mod:`otel_rollout.whatif`) and the replica figures (:mod:`otel_rollout.replica_load`). Measured
here on synthetic, real-shaped records (long-tailed lengths, four replicas, engine stamps, one
agentic trajectory per 8 requests) at 1,000 and 10,000 requests: each part alone, and the whole
analysis without the step's own interval (no causes; the what-if and replica figures still run)
and with it. ``thread_time``, median of
rounds. Nothing per request changes: all of it runs once, at the step's end.

    $VPY benchmarks/bench_step_end.py            # 1,000 and 10,000 requests, 15 rounds
    $VPY benchmarks/bench_step_end.py --smoke    # 1,000 requests, 3 rounds
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import _common as C

from otel_rollout.analysis import analyze
from otel_rollout.attribution import attribute
from otel_rollout.record import RequestRecord, TrajectoryRecord
from otel_rollout.replica_load import analyze_replicas
from otel_rollout.whatif import what_if
from testkit.engines import long_tail_lengths

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def step(n: int, seed: int = 0) -> tuple[list[RequestRecord], list[TrajectoryRecord], int]:
    """``n`` requests arriving over 50 ms on four replicas, decoding 1 ms a token; the step's end."""
    rng = random.Random(seed)
    records = []
    for i, tokens in enumerate(long_tail_lengths(n, seed=seed)):
        arrival = T0 + rng.randrange(50) * MS
        scheduled = arrival + rng.randrange(20) * MS
        first = scheduled + 5 * MS
        records.append(
            RequestRecord(
                provider="vllm",
                model="m",
                operation="text_completion",
                arrival_ns=arrival,
                finish_ns=first + tokens * MS,
                scheduled_ns=scheduled,
                first_token_ns=first,
                output_tokens=tokens,
                finish_reasons=("length",) if tokens == 256 else ("stop",),
                preemptions=0,
                replica=f"server-{i % 4}",
                trace_id=i + 1,
                span_id=i + 1,
            )
        )
    trajectories = []
    for k in range(0, n, 8):
        turns = tuple((r.arrival_ns, r.finish_ns) for r in records[k : k + 8 : 4])
        tools = tuple((end, end + MS) for _, end in turns)
        trajectories.append(
            TrajectoryRecord(
                agent="a",
                start_ns=turns[0][0],
                end_ns=tools[-1][1],
                status="completed",
                turns=turns,
                output_tokens=0,
                tools=tools,
                scoring=(),
                generation_s=0.0,
                tool_s=0.0,
                scoring_s=0.0,
                waiting_s=0.0,
            )
        )
    end = max(r.finish_ns for r in records) + 10 * MS
    return records, trajectories, end


def timed(fn: Any, rounds: int) -> dict[str, float]:
    samples = []
    for _ in range(rounds):
        start = time.thread_time_ns()
        fn()
        samples.append((time.thread_time_ns() - start) / 1e6)
    return {"median_ms": round(statistics.median(samples), 3), "min_ms": round(min(samples), 3)}


def measure(n: int, rounds: int) -> dict[str, Any]:
    records, trajectories, end = step(n)
    start = T0
    duration = (end - start) / 1e9
    phases = [("reward", end - 5 * MS, end)]
    return {
        "analysis_without_causes": timed(
            lambda: analyze(records, duration, trajectories=trajectories), rounds
        ),
        "analysis_with_causes": timed(
            lambda: analyze(
                records, duration, trajectories=trajectories, step_ns=(start, end), phases=phases
            ),
            rounds,
        ),
        "attribution": timed(
            lambda: attribute(records, start, end, phases, None, trajectories), rounds
        ),
        "whatif": timed(lambda: what_if(records, analyze_replicas(records)), rounds),
        "replicas": timed(lambda: analyze_replicas(records), rounds),
    }


def run(smoke: bool) -> dict[str, Any]:
    rounds = 3 if smoke else 15
    sizes = (1_000,) if smoke else (1_000, 10_000)
    return {
        "machine": C.machine(),
        "rounds": rounds,
        "sizes": {str(n): measure(n, rounds) for n in sizes},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    C.write(args.out, run(args.smoke))


if __name__ == "__main__":
    main()
