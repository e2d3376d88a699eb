"""Driver of the zero-code Ray test, run under ``opentelemetry-instrument`` (no runtime_env given).

Three steps, each a long-tail batch split over two worker actors (or, with ``tasks``, two Ray
tasks) that call one vLLM server actor. Prints one JSON line per step with what the actors returned (the test's independent
truth), then the driver's own view of each step (``rollout_step(...).stats``).
"""

from __future__ import annotations

import json
import sys
import time

import ray

from otel_rollout import rollout_step
from testkit.engines import VLLM_ENV, VLLM_KWARGS, long_tail_lengths


def main(model: str, kill_worker_in_step: int | None, tasks: bool = False) -> None:
    from tests.steps.agent_loop_actors import ServerActor, WorkerActor, run_samples

    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": dict(VLLM_ENV)})
    server = ray.remote(num_cpus=1)(ServerActor).remote(model, VLLM_KWARGS)
    workers = [ray.remote(num_cpus=1)(WorkerActor).remote(server) for _ in range(2)]
    pids = ray.get([server.pid.remote()] + [w.pid.remote() for w in workers], timeout=300)
    print(json.dumps({"pids": pids}), flush=True)
    for step in (1, 2, 3):
        lengths = long_tail_lengths(12, seed=step, high=96)
        halves = [lengths[:6], lengths[6:]]
        with rollout_step(step) as scope:
            if tasks:  # the fan-out as Ray tasks (functions) instead of worker actors
                task = ray.remote(num_cpus=1)(run_samples)
                refs = [task.remote(server, f"s{step}t{k}", half) for k, half in enumerate(halves)]
            else:
                refs = [
                    w.run.remote(f"s{step}w{k}", half)
                    for k, (w, half) in enumerate(zip(workers, halves, strict=False))
                ]
            if step == kill_worker_in_step:
                ray.kill(workers[1])
            done: list[dict[str, object]] = []
            for ref in refs:
                try:
                    done.extend(ray.get(ref, timeout=300))
                except ray.exceptions.RayActorError:
                    pass  # the framework goes on without the dead worker's samples
            body_done = time.monotonic()
        stats = scope.stats
        print(
            json.dumps(
                {
                    "step": step,
                    "results": done,
                    "partial": scope.partial,
                    "requests": stats.requests if stats else 0,
                    "tail_duration_s": stats.tail_duration_s if stats else None,
                    "close_s": time.monotonic() - body_done,
                }
            ),
            flush=True,
        )
    ray.shutdown()


if __name__ == "__main__":
    kill = sys.argv[2] if len(sys.argv) > 2 else "-"
    main(sys.argv[1], None if kill == "-" else int(kill), "tasks" in sys.argv[3:])
