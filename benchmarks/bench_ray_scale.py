"""The Ray step channel at RL scale (issue #40 item 7): verl's layout, one Ray call per sample.

Driver → 2 worker actors → 1 server actor holding a real vLLM ``AsyncLLM`` (tests/steps/
agent_loop_actors.py, as the zero-code Ray test), steps of N one-token requests — the worst case
for per-call costs: the engine's own work per request is smallest. The same job runs twice, one
process each, in this sitting: bare (plain ``python``), and zero-code under
``opentelemetry-instrument`` with spans over OTLP to a receiver here. Reported per step: wall
time (the median over the steady steps, the first step warms up), the driver's step close, and
what the instrumented run's steps counted and exported.

    $VPY benchmarks/bench_ray_scale.py --requests 4096 --steps 4 [--before REV]

``--before REV`` runs the instrumented job a third time with the otel_rollout package as of
commit REV (from a temporary git worktree, first on ``PYTHONPATH``, removed after; the job and
its actors stay today's), for a before/after in one sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

JOB = """
import json, os, sys, time
import psutil
import ray
from testkit.engines import VLLM_ENV, VLLM_KWARGS
from tests.steps.agent_loop_actors import ServerActor, WorkerActor

model, n, steps, instrumented = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
natural = sys.argv[5] == "1"
ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": dict(VLLM_ENV)})
server = ray.remote(num_cpus=1)(ServerActor).remote(model, VLLM_KWARGS)
workers = [ray.remote(num_cpus=1)(WorkerActor).remote(server) for _ in range(2)]
pids = ray.get([server.pid.remote()] + [w.pid.remote() for w in workers], timeout=600)
server_proc = psutil.Process(pids[0])
roles = {
    "driver": [psutil.Process()],
    "server": [server_proc],
    "engine": server_proc.children(recursive=True),
    "workers": [psutil.Process(pid) for pid in pids[1:]],
}


def cpu_s():
    # CPU seconds (user + system) so far of each role's processes (the engine: the server's
    # children, vLLM's engine core): where a step's time goes with fewer cores than processes
    out = {role: sum(sum(p.cpu_times()[:2]) for p in group) for role, group in roles.items()}
    everything = psutil.Process()
    out["all"] = sum(
        sum(p.cpu_times()[:2]) for p in [everything] + everything.children(recursive=True)
    )
    return out


if instrumented:
    from otel_rollout import rollout_step
for step in range(1, steps + 1):
    half = [1] * (n // 2)
    cpu_before = cpu_s()
    start = time.perf_counter()
    if instrumented:
        with rollout_step(step) as scope:
            refs = [w.run.remote(f"s{step}w{k}", half, natural) for k, w in enumerate(workers)]
            done = sum(len(r) for r in ray.get(refs))
            body = time.perf_counter()
        counted = scope.stats.requests if scope.stats else 0
    else:
        refs = [w.run.remote(f"s{step}w{k}", half, natural) for k, w in enumerate(workers)]
        done = sum(len(r) for r in ray.get(refs))
        body = time.perf_counter()
        counted = None
    end = time.perf_counter()
    cpu = {k: round(v - cpu_before[k], 3) for k, v in cpu_s().items()}
    print(json.dumps({"step": step, "s": end - start, "close_s": end - body, "done": done,
                      "counted": counted, "cpu_s": cpu}), flush=True)
ray.shutdown()
"""


def run_job(
    model: str, requests: int, steps: int, instrumented: bool, env: dict[str, str], natural: bool
) -> Any:
    python = sys.executable
    flags = ["1" if instrumented else "0", "1" if natural else "0"]
    cmd = [python, "-c", JOB, model, str(requests), str(steps), *flags]
    if instrumented:
        cmd = [str(Path(python).parent / "opentelemetry-instrument"), *cmd]
    out = subprocess.run(
        cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]


def main() -> None:
    sys.path.insert(0, str(REPO))
    from testkit.otlp_receiver import OTLPReceiver, attr

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=4096, help="one-token requests a step")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--model", default=os.environ.get("OTEL_ROLLOUT_TINY_MODEL"))
    ap.add_argument("--out")
    ap.add_argument("--before", help="also run the instrumented job at this commit")
    ap.add_argument(
        "--natural",
        action="store_true",
        help="requests stop on their own after their first token (finish_reason stop), as most "
        "RL samples do; default: exactly one token, each ending at max_tokens (a truncation)",
    )
    args = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    base.update(PYTHONPATH=os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")]))
    base.update(RAY_worker_niceness="0", RAY_AUTH_MODE="disabled")
    receiver = OTLPReceiver().start()
    try:
        bare = run_job(args.model, args.requests, args.steps, False, base, args.natural)
        env = dict(
            base,
            OTEL_SERVICE_NAME="bench-ray-scale",
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint,
            OTEL_PYTHON_ID_GENERATOR="rollout_urandom",
        )
        ours = run_job(args.model, args.requests, args.steps, True, env, args.natural)
        time.sleep(2)
        spans = receiver.spans()
        before = None
        if args.before:
            tree = Path("/tmp") / f"otel-rollout-before-{args.before}"
            subprocess.run(
                ["git", "worktree", "add", "-f", str(tree), args.before],
                cwd=REPO,
                check=True,
                capture_output=True,
            )
            only = Path("/tmp") / f"otel-rollout-before-{args.before}-package"
            only.mkdir(exist_ok=True)
            link = only / "otel_rollout"
            if not link.exists():
                link.symlink_to(tree / "otel_rollout")  # the package only: the job stays today's
            try:
                old = dict(env, PYTHONPATH=os.pathsep.join([str(only), env["PYTHONPATH"]]))
                before = run_job(args.model, args.requests, args.steps, True, old, args.natural)
            finally:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(tree)],
                    cwd=REPO,
                    check=False,
                    capture_output=True,
                )
    finally:
        receiver.stop()
    requests = [s for s in spans if attr(s.attributes, "gen_ai.usage.output_tokens") is not None]
    steady = slice(1, None)  # the first step warms the engine and the actors up
    bare_s = statistics.median(x["s"] for x in bare[steady])
    ours_s = statistics.median(x["s"] for x in ours[steady])
    result = {
        "requests_per_step": args.requests,
        "natural_stops": args.natural,
        "steps": args.steps,
        "bare_step_s": [round(x["s"], 3) for x in bare],
        "instrumented_step_s": [round(x["s"], 3) for x in ours],
        "ratio_steady_median": round(ours_s / bare_s, 3),
        "added_per_request_ms": round((ours_s - bare_s) / args.requests * 1e3, 3),
        "close_s": [round(x["close_s"], 3) for x in ours],
        "counted": [x["counted"] for x in ours],
        "done": [x["done"] for x in ours],
        "request_spans": len(requests),
        "request_spans_share": round(len(requests) / (args.requests * args.steps), 4),
        "sampling_reasons": dict(
            Counter(str(attr(s.attributes, "rollout.sampling.reason")) for s in requests)
        ),
    }
    for name, job in (("bare", bare), ("instrumented", ours)):
        result[f"cpu_s_{name}"] = {
            role: round(statistics.median(x["cpu_s"][role] for x in job[steady]), 2)
            for role in job[0]["cpu_s"]
        }
    if before is not None:
        before_s = statistics.median(x["s"] for x in before[steady])
        result["before"] = {
            "commit": args.before,
            "step_s": [round(x["s"], 3) for x in before],
            "ratio_steady_median": round(before_s / bare_s, 3),
        }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
