"""The light exporter-trouble job: the package's own telemetry under ``opentelemetry-instrument``.

``opentelemetry-instrument`` builds the global providers and OTLP exporters from the environment
(the engine instrumentors are disabled so no engine is imported); the job emits request records
through the same ``build_telemetry`` path the vLLM instrumentor uses, prints its RSS, then
``LAST_GENERATE_DONE <epoch>`` and returns. The parent times the process's exit.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1.0


def main() -> None:
    logging.basicConfig(
        level=logging.DEBUG, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("job").debug("debug logging is on")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from otel_rollout.instrumentation import build_telemetry
    from otel_rollout.record import RequestRecord
    from otel_rollout.sdk import bound_exit

    telemetry = build_telemetry("vllm", {})
    bound_exit(telemetry.config.exit_timeout)  # the instrumentor's explicit set-up step

    rounds = int(os.environ.get("JOB_ROUNDS", "10"))
    per_round = int(os.environ.get("JOB_PER_ROUND", "2000"))
    start = time.monotonic()
    rss = []
    for r in range(rounds):
        now = time.time_ns()
        records = [
            RequestRecord(
                provider="vllm",
                model="job",
                operation="text_completion",
                arrival_ns=now - 10**9,
                first_token_ns=now - 5 * 10**8,
                finish_ns=now,
                request_id=f"{r}-{i}",
                prompt_tokens=12,
                output_tokens=1 + i % 64,
                finish_reasons=("length",),
                prompt_text="job prompt",
            )
            for i in range(per_round)
        ]
        telemetry.requests_started("job", "text_completion", per_round)
        telemetry.emit_all(records)
        telemetry.requests_ended("job", "text_completion", per_round)
        rss.append(_rss_mb())
    print(
        json.dumps(
            {"records": rounds * per_round, "seconds": time.monotonic() - start, "rss_mb": rss}
        ),
        flush=True,
    )
    print(f"LAST_GENERATE_DONE {time.time():.6f}", flush=True)


if __name__ == "__main__":
    main()
