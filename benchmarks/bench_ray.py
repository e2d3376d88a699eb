"""Cost of the cross-process step path per Ray actor call (issue #11), next to the bare call.

A real local Ray cluster, one async actor whose method does nothing (so only Ray and our wrappers
are measured): N calls from the driver inside ``rollout_step`` — each call carries the context
(caller side), continues it in the actor and reports to the step collector before returning
(callee side) — against the same N calls with the Ray instrumentor off, alternating rounds in one
process. The in-process path has no such cost: a step there is a context variable.

    $VPY benchmarks/bench_ray.py --calls 300 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any


class Echo:
    async def ping(self, x: int) -> int:
        return x


async def _burst(actor: Any, calls: int) -> float:
    start = time.perf_counter()
    await asyncio.gather(*[actor.ping.remote(i) for i in range(calls)])
    return time.perf_counter() - start


def run(calls: int, rounds: int) -> dict[str, Any]:
    import ray
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from otel_rollout import rollout_step
    from otel_rollout.ray.instrumentor import RayInstrumentor

    trace.set_tracer_provider(TracerProvider())
    instrumentor = RayInstrumentor()
    instrumentor.instrument()
    ray.init(num_cpus=2, include_dashboard=False)
    actor = ray.remote(num_cpus=0)(Echo).remote()
    ray.get(actor.ping.remote(0))
    on: list[float] = []
    off: list[float] = []
    for _ in range(rounds):
        with rollout_step(1):
            on.append(asyncio.run(_burst(actor, calls)))
        instrumentor.uninstrument()
        off.append(asyncio.run(_burst(actor, calls)))
        instrumentor.instrument()
    ray.shutdown()
    per_on = statistics.median(on) / calls * 1e6
    per_off = statistics.median(off) / calls * 1e6
    return {
        "calls": calls,
        "rounds": rounds,
        "instrumented_us_per_call": per_on,
        "bare_us_per_call": per_off,
        "added_us_per_call": per_on - per_off,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(json.dumps(run(args.calls, args.rounds)))


if __name__ == "__main__":
    main()
