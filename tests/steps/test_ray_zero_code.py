"""Zero-code Ray (verl's agent-loop layout): driver → 2 worker actors → 1 server actor (AsyncLLM).

The driver runs under ``opentelemetry-instrument`` and passes no ``runtime_env`` of ours; the actors
contain no OpenTelemetry. Every request span must land in its step's trace and each step's
analytics must count exactly that step's requests — equal to an independent computation from the
exported request spans — and a worker killed mid-step gives a partial step, not a held one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.processes import run_reaped
from tests.steps.expected import Request, expected

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("ray_zero_code_job.py")


def run_job(
    receiver: OTLPReceiver, model: str, *extra: str, env_extra: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint,
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": "zero-code-ray",
            **(env_extra or {}),
        }
    )
    started = time.monotonic()
    out = run_reaped(
        [
            str(Path(sys.executable).parent / "opentelemetry-instrument"),
            sys.executable,
            str(JOB),
            model,
            *extra,
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    return lines, time.monotonic() - started


def as_request(span: Any) -> Request:
    reasons = list(attr(span.attributes, "gen_ai.response.finish_reasons") or ["?"])
    return Request(
        span.start_time_unix_nano,
        span.end_time_unix_nano,
        int(attr(span.attributes, "gen_ai.usage.output_tokens")),
        reasons[0],
    )


def test_steps_span_ray_actors_without_code_changes(
    otlp_receiver: OTLPReceiver, tiny_model: str, vllm_module: Any
) -> None:
    lines, _ = run_job(otlp_receiver, tiny_model)
    check_steps(lines, otlp_receiver)


def test_steps_span_ray_tasks_without_code_changes(
    otlp_receiver: OTLPReceiver, tiny_model: str, vllm_module: Any
) -> None:
    """The same fan-out as Ray tasks (plain functions): Ray gives them no context parameter of
    their own, ours carries the step through them to the server actor."""
    lines, _ = run_job(otlp_receiver, tiny_model, "-", "tasks")
    check_steps(lines, otlp_receiver)


def check_steps(lines: list[dict[str, Any]], otlp_receiver: OTLPReceiver) -> None:
    steps_out = [x for x in lines if "step" in x]
    assert [x["step"] for x in steps_out] == [1, 2, 3]
    total = sum(len(x["results"]) for x in steps_out)
    is_request = lambda r: attr(r.attributes, "gen_ai.usage.output_tokens") is not None  # noqa: E731
    assert otlp_receiver.wait_for(
        lambda r: (
            sum(1 for s in r.spans() if is_request(s)) >= total
            and sum(1 for s in r.spans() if s.name == "rollout.step") >= 3
        ),
        timeout=30,
    ), (
        lines,
        sorted({s.name for s in otlp_receiver.spans()}),
        sum(1 for s in otlp_receiver.spans() if is_request(s)),
    )
    spans = otlp_receiver.spans()
    step_spans = {attr(s.attributes, "rollout.step"): s for s in spans if s.name == "rollout.step"}
    requests = [s for s in spans if is_request(s)]
    assert len(requests) == total == 36
    for out in steps_out:
        step_span = step_spans[out["step"]]
        mine = [r for r in requests if r.trace_id == step_span.trace_id]
        # Every request of the step is in its trace, with its step number and exact tokens ...
        assert sorted(attr(r.attributes, "gen_ai.response.id") for r in mine) == sorted(
            x["request_id"] for x in out["results"]
        )
        assert all(attr(r.attributes, "rollout.step") == out["step"] for r in mine)
        assert sorted(attr(r.attributes, "gen_ai.usage.output_tokens") for r in mine) == sorted(
            x["tokens"] for x in out["results"]
        )
        # ... and the driver's analytics counted exactly those, as anyone would from the spans.
        exp = expected([as_request(r) for r in mine])
        assert attr(step_span.attributes, "rollout.step.requests") == out["requests"] == 12
        assert attr(step_span.attributes, "rollout.step.partial") is None
        assert attr(step_span.attributes, "rollout.step.tail.duration_s") == pytest.approx(
            exp.tail_duration_s, abs=1e-6
        )
        assert attr(step_span.attributes, "rollout.step.latency.max_s") == pytest.approx(
            exp.latency_max_s, abs=1e-6
        )
        assert attr(step_span.attributes, "rollout.step.output_tokens.max") == exp.output_tokens_max
    # The requests ran in the server actor, not in the driver.
    servers = {
        attr(rs.resource.attributes, "process.pid")
        for req in otlp_receiver.trace_requests
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
        if is_request(s)
    }
    assert servers == {lines[0]["pids"][0]}


def test_a_worker_killed_mid_step_gives_a_partial_step(
    otlp_receiver: OTLPReceiver, tiny_model: str, vllm_module: Any
) -> None:
    lines, _ = run_job(otlp_receiver, tiny_model, "2", env_extra={"OTEL_ROLLOUT_STEP_WAIT": "2"})
    by_step = {x["step"]: x for x in lines if "step" in x}
    assert by_step[1]["partial"] is False and by_step[1]["requests"] == 12
    killed = by_step[2]
    assert killed["partial"] is True
    # What is known is counted: the surviving worker's requests (and any of the dead one's that
    # the server finished and reported before the kill), never more than the step sent.
    assert len(killed["results"]) <= killed["requests"] <= 12
    assert otlp_receiver.wait_for(
        lambda r: sum(1 for s in r.spans() if s.name == "rollout.step") >= 3, timeout=30
    )
    step2 = [
        s
        for s in otlp_receiver.spans()
        if s.name == "rollout.step" and attr(s.attributes, "rollout.step") == 2
    ][0]
    assert attr(step2.attributes, "rollout.step.partial") is True
    assert attr(step2.attributes, "rollout.step.missing_calls") >= 1
    # The step was not held past the wait: it ended within OTEL_ROLLOUT_STEP_WAIT of its requests.
    assert (step2.end_time_unix_nano - step2.start_time_unix_nano) / 1e9 < 60
