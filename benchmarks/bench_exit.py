"""How long a process takes to exit after a huge ``generate``, and what arrives (issue #26 item 10).

One RL-sized offline call, then the process exits at once: under ``opentelemetry-instrument``, over
real OTLP/gRPC to a loopback receiver (``testkit.otlp_receiver``), with the SDK's defaults
(BatchSpanProcessor queue 2,048, batch 512). The job is ``testkit/burst_job.py``:
``--standin N`` hands the instrumentor's own offline wrapper N real ``RequestOutput`` objects (the
CPU engine would take many minutes for 327,680 prompts); ``--prompts N`` runs the real engine.
Reported per size: seconds from ``generate`` returning to the process being gone, and the request
spans and duration counts the receiver got. A bounded exit may drop spans (a stuck exporter),
never counts.

    $VPY benchmarks/bench_exit.py                       # 32,768 and 327,680 (engine-free)
    $VPY benchmarks/bench_exit.py --sizes 32768 --real  # the real engine, 32,768 prompts
    $VPY benchmarks/bench_exit.py --smoke               # CI size
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(1, str(REPO))


def measure(size: int, real: bool, model: str | None) -> dict[str, Any]:
    from testkit.burst_job import run_burst
    from testkit.otlp_receiver import OTLPReceiver, attr

    receiver = OTLPReceiver().start()
    try:
        job = ["--model", str(model), "--prompts", str(size)] if real else ["--standin", str(size)]
        proc, exit_s = run_burst(receiver.grpc_endpoint, *job, timeout=3600, service="bench-exit")
        time.sleep(2.0)  # the receiver's threads decode what the job sent before it exited
        spans = sum(
            1 for s in receiver.spans() if attr(s.attributes, "gen_ai.response.id") is not None
        )
        durations = [m for m in receiver.metrics() if m.name == "gen_ai.server.request.duration"]
        counted = sum(p.count for p in durations[-1].histogram.data_points) if durations else 0
        return {
            "requests": size,
            "engine": "real vLLM" if real else "stand-in outputs",
            "exit_s": round(exit_s, 2),
            "spans": spans,
            "counted": counted,
            "warnings": [line for line in proc.stderr.splitlines() if "otel_rollout:" in line],
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        receiver.stop()


def run(smoke: bool, sizes: list[int] | None = None, real: bool = False) -> dict[str, Any]:
    sizes = sizes or ([1024] if smoke else [32_768, 327_680])
    model = os.environ.get("MODEL") or os.environ.get("OTEL_ROLLOUT_TINY_MODEL")
    results = [measure(n, real, model) for n in sizes]
    for r in results:
        print(
            f"{r['requests']:>8} requests ({r['engine']}): exit {r['exit_s']:.1f} s after "
            f"generate returned; spans {r['spans']}, counted {r['counted']}",
            flush=True,
        )
    return {"exit": results, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--sizes", help="comma-separated request counts")
    ap.add_argument("--real", action="store_true", help="the real engine (needs MODEL)")
    ap.add_argument("--out")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else None
    out = run(args.smoke, sizes, args.real)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
