"""OpenRLHF's rollout, zero-code (issue #41): its ``SamplesGenerator`` driving its
``RolloutRayActor`` (real vLLM ``AsyncLLMEngine`` in a Ray actor) under
``opentelemetry-instrument`` (``tests/openrlhf/openrlhf_job.py``: what is stood in for, and why,
is named there: the trainer's loop and its CUDA-only strategy).

Compared with what OpenRLHF itself did (the job records the ``global_step`` its loop held at
each rollout and how many samples came back):

* one step span per rollout, numbered as OpenRLHF logs the step it feeds (``global_step + 1``),
  the evaluation marked ``validate`` with the step it evaluates;
* every sample's engine request, served in the rollout actor's process, in that step's trace and
  counted by the step (the Ray step channel brought them home).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.processes import run_reaped

pytestmark = pytest.mark.openrlhf

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "openrlhf" / "openrlhf_job.py"
STEPS = 2
PER_STEP = 8  # 4 prompts × 2 samples
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def run(openrlhf_module: Any, tiny_model: str, tmp_path_factory: Any) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("openrlhf") / "job.json"
    receiver = OTLPReceiver().start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(
            PYTHONPATH=str(REPO),
            RAY_AUTH_MODE="disabled",
            OTEL_SERVICE_NAME="openrlhf-trainer",
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint,
            OTEL_BSP_SCHEDULE_DELAY="200",
            OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="otel,process",
        )
        done = run_reaped(
            [
                str(Path(sys.executable).parent / "opentelemetry-instrument"),
                sys.executable,
                str(JOB),
                tiny_model,
                str(out),
                str(STEPS),
            ],
            env=env,
            cwd=REPO,
            timeout=TIMEOUT_S,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        time.sleep(0.5)
        spans = receiver.spans()
        pid_of = {  # which process exported each span (process.pid of its resource)
            s.span_id: attr(rs.resource.attributes, "process.pid")
            for req in receiver.trace_requests
            for rs in req.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        }
    finally:
        receiver.stop()
    return {"job": json.loads(out.read_text()), "spans": spans, "pid_of": pid_of}


def _steps(spans: list[Any]) -> list[Any]:
    return sorted(
        (s for s in spans if s.name == "rollout.step"), key=lambda s: s.start_time_unix_nano
    )


def test_each_rollout_is_the_step_it_feeds(run: dict[str, Any]) -> None:
    rollouts = run["job"]["steps"]
    steps = _steps(run["spans"])
    expected = [r["global_step"] + (0 if r.get("eval") else 1) for r in rollouts]
    assert [attr(s.attributes, "rollout.step") for s in steps] == expected == [1, 2, 2]
    assert [attr(s.attributes, "rollout.step.validate") is True for s in steps] == [
        bool(r.get("eval")) for r in rollouts
    ]
    assert {attr(s.attributes, "rollout.step.framework") for s in steps} == {"openrlhf"}
    assert {attr(s.attributes, "rollout.step.algorithm") for s in steps} == {"group_norm"}


def test_every_sample_served_in_the_rollout_actor_is_in_its_step(run: dict[str, Any]) -> None:
    steps = _steps(run["spans"])
    requests = [s for s in run["spans"] if attr(s.attributes, "gen_ai.usage.output_tokens")]
    by_trace = Counter(s.trace_id for s in requests)
    rollouts = run["job"]["steps"]
    for step, rollout in zip(steps, rollouts, strict=True):
        assert by_trace[step.trace_id] == rollout["samples"]  # each sample one engine request
        assert attr(step.attributes, "rollout.step.requests") == rollout["samples"]
    assert [r["samples"] for r in rollouts[:STEPS]] == [PER_STEP] * STEPS
    assert len(requests) == sum(r["samples"] for r in rollouts)
    # served in the actor's process, not the driver's: the step's count came over Ray
    driver = {run["pid_of"][s.span_id] for s in steps}
    served = {run["pid_of"][s.span_id] for s in requests}
    assert len(driver) == 1 and len(served) == 1 and not driver & served
