"""Start-up cost of ``opentelemetry-instrument`` for a process that never uses an engine (issue #11).

Every Python process of a job inherits the auto-instrumentation hook (Ray's helper processes and
workers included), so what our instrumentors add at start-up is paid many times over. Measured in
one run, interleaved, as medians of ``--runs`` fresh interpreters:

* ``plain``: ``python -c pass``;
* ``otel``: ``opentelemetry-instrument python -c pass`` with ours disabled
  (``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=vllm,sglang,ray``) — OpenTelemetry's own cost;
* ``ours``: the same with ours enabled. ``ours - otel`` is what otel_rollout adds (goal < 100 ms).

    $VPY benchmarks/bench_startup.py --runs 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
CHECK = (
    "import sys; heavy = [m for m in sys.modules if m.split('.')[0] in "
    "('vllm', 'sglang', 'torch', 'ray')]; assert not heavy, heavy"
)


def _once(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def measure(runs: int) -> dict[str, float]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    base.update(
        OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none"
    )
    instrument = [str(BIN / "opentelemetry-instrument"), sys.executable, "-c", CHECK]
    cases = {
        "plain": ([sys.executable, "-c", CHECK], base),
        "otel": (instrument, {**base, "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "vllm,sglang,ray"}),
        "ours": (instrument, base),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):  # interleaved: machine load drifts equally over the three
        for name, (command, env) in cases.items():
            samples[name].append(_once(command, env))
    result = {f"{name}_s": statistics.median(values) for name, values in samples.items()}
    result["ours_added_ms"] = (result["ours_s"] - result["otel_s"]) * 1000
    result["runs"] = runs
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    print(json.dumps(measure(ap.parse_args().runs)))


if __name__ == "__main__":
    main()
