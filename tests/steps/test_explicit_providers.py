"""``instrument(tracer_provider=…, meter_provider=…)`` with no global providers set: request and
step telemetry both go to the providers the instrumentor was given (real vLLM, own process)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from testkit.processes import run_reaped

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]


def test_step_and_request_telemetry_use_the_given_providers(
    tiny_model: str, vllm_module: Any
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    for name in [k for k in env if k.startswith("OTEL_")]:
        env.pop(name)
    out = run_reaped(
        [sys.executable, str(Path(__file__).with_name("explicit_providers_job.py")), tiny_model],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("{")]
    seen = json.loads(line)
    # Nothing global was installed: what arrived can only have come through the given providers.
    assert seen["global_tracer_provider"] == "ProxyTracerProvider"
    assert seen["global_meter_provider"] == "_ProxyMeterProvider"
    assert seen["spans"].count("rollout.step") == 1 and seen["spans"].count("rollout.batch") == 1
    assert len([s for s in seen["spans"] if s.startswith("text_completion")]) == 4
    assert seen["step_requests"] == [4] and seen["stats_requests"] == 4
    assert seen["request_steps"] == [5]
    assert seen["points"]["gen_ai.server.request.duration"] == 4
    assert seen["points"]["rollout.step.duration"] == 1
    assert seen["points"]["rollout.step.requests"] == 1
