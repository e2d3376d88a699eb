"""verl's own agent-loop rollout under ``opentelemetry-instrument``: verl's step number, zero-code.

``verl_job.py`` runs verl 0.9.1 in standalone rollout mode (driver → AgentLoopManager →
AgentLoopWorker actors → vLLMHttpServer actor → AsyncLLM) for three steps, with no OpenTelemetry
code. Everything asserted here arrived over real OTLP from those processes:

- the driver exports one ``rollout.step`` span per ``generate_sequences`` call, numbered by verl's
  ``meta_info["global_steps"]`` (the ``verl`` instrumentor);
- the vLLM server actor exports one request span per sample (the ``vllm`` instrumentor, loaded in
  that Ray worker by the inherited ``opentelemetry-instrument`` environment), with the response
  lengths verl reported;
- each ``AgentLoopWorker`` actor exports one ``invoke_agent`` trajectory span per sample, and the
  driver's step span counts them (the Ray step channel carries trajectories as well as requests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from testkit.engines import VLLM_ENV
from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.processes import run_reaped

pytestmark = pytest.mark.verl

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "verl_job.py"
STEPS = 3
BATCH = 8


def job_env(endpoint: str) -> dict[str, str]:
    """The job's environment: OTel settings only through OTEL_* variables, as a user sets them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "OTEL_SERVICE_NAME": "verl-job",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            # process.pid on each exporter's resource: which process sent which span.
            "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "otel,process",
            # The CPU engine's fast settings (testkit.engines); no in-process engine here: verl's
            # server actor starts AsyncLLM, which runs its engine core in a child process anyway.
            **{k: v for k, v in VLLM_ENV.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"},
        }
    )
    return env


@pytest.fixture(scope="module")
def verl_run(
    verl_module: Any,
    tiny_model: str,
    module_receiver: OTLPReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """One run of the job under opentelemetry-instrument; returns what verl itself reported."""
    out = tmp_path_factory.mktemp("verl") / "job.json"
    command = [
        str(Path(sys.executable).parent / "opentelemetry-instrument"),
        sys.executable,
        str(JOB),
        "--model",
        tiny_model,
        "--steps",
        str(STEPS),
        "--batch",
        str(BATCH),
        "--out",
        str(out),
    ]
    started = time.monotonic()
    proc = run_reaped(
        command,
        env=job_env(module_receiver.grpc_endpoint),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    truth: dict[str, Any] = json.loads(out.read_text())
    truth["job_wall_s"] = round(time.monotonic() - started, 1)
    samples = sum(s["samples"] for s in truth["steps"])
    module_receiver.wait_for(
        lambda r: (
            len(request_spans(r)) >= samples
            and len(step_spans(r)) >= STEPS
            and sum(1 for s in r.spans() if s.name.startswith("invoke_agent")) >= samples
        ),
        timeout=30,
    )
    print("verl job:", json.dumps(truth), file=sys.stderr)
    for pid, names in exporters(module_receiver).items():
        print(f"spans from pid {pid}: {dict(names)}", file=sys.stderr)
    return truth


def exporters(receiver: OTLPReceiver) -> dict[Any, Counter[str]]:
    """Which process (``process.pid`` resource attribute) exported which spans: for diagnosis."""
    out: dict[Any, Counter[str]] = {}
    for req in receiver.trace_requests:
        for rs in req.resource_spans:
            pid = attr(rs.resource.attributes, "process.pid")
            out.setdefault(pid, Counter()).update(s.name for ss in rs.scope_spans for s in ss.spans)
    return out


def step_spans(receiver: OTLPReceiver) -> list[Any]:
    return [s for s in receiver.spans() if s.name == "rollout.step"]


def request_spans(receiver: OTLPReceiver) -> list[Any]:
    return [
        s for s in receiver.spans() if attr(s.attributes, "gen_ai.usage.output_tokens") is not None
    ]


def test_verl_steps_and_requests_are_exported(
    verl_run: dict[str, Any], module_receiver: OTLPReceiver
) -> None:
    steps = verl_run["steps"]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all(s["samples"] == BATCH for s in steps)
    # verl's rollout really produced a long tail (prompt length sets max_tokens; ignore_eos).
    lengths = [n for s in steps for n in s["response_tokens"]]
    cap, budget = verl_run["response_length"], verl_run["max_model_len"]
    for s in steps:
        assert s["response_tokens"] == [min(cap, budget - p) for p in s["prompt_tokens"]]
    assert max(lengths) == cap and min(lengths) < cap // 4

    # One step span per generate_sequences call, numbered by verl's global_steps, from the driver.
    spans = step_spans(module_receiver)
    assert sorted(attr(s.attributes, "rollout.step") for s in spans) == list(range(1, STEPS + 1))
    driver = [
        rs
        for req in module_receiver.trace_requests
        for rs in req.resource_spans
        if any(s.name == "rollout.step" for ss in rs.scope_spans for s in ss.spans)
    ]
    assert {attr(rs.resource.attributes, "process.pid") for rs in driver} == {verl_run["pid"]}

    # One request span per sample, exported by the vLLM server actor, with verl's lengths.
    requests = request_spans(module_receiver)
    assert Counter(attr(s.attributes, "gen_ai.usage.output_tokens") for s in requests) == Counter(
        lengths
    )
    server = {
        attr(rs.resource.attributes, "process.pid")
        for req in module_receiver.trace_requests
        for rs in req.resource_spans
        if any(
            attr(s.attributes, "gen_ai.usage.output_tokens") is not None
            for ss in rs.scope_spans
            for s in ss.spans
        )
    }
    assert len(server) == 1 and verl_run["pid"] not in server


def test_verl_requests_join_their_step(
    verl_run: dict[str, Any], module_receiver: OTLPReceiver
) -> None:
    steps = {attr(s.attributes, "rollout.step"): s for s in step_spans(module_receiver)}
    samples = {s["step"]: s["samples"] for s in verl_run["steps"]}
    tokens = {s["step"]: Counter(s["response_tokens"]) for s in verl_run["steps"]}
    by_step: dict[int, list[Any]] = {}
    for span in request_spans(module_receiver):
        by_step.setdefault(attr(span.attributes, "rollout.step"), []).append(span)
    assert sorted(by_step) == sorted(samples)
    for number, step in steps.items():
        assert all(r.trace_id == step.trace_id for r in by_step[number])
        assert (
            Counter(attr(r.attributes, "gen_ai.usage.output_tokens") for r in by_step[number])
            == tokens[number]
        )
        assert attr(step.attributes, "rollout.step.requests") == samples[number]


def test_verl_server_requests_carry_the_engines_step_times(
    verl_run: dict[str, Any], module_receiver: OTLPReceiver
) -> None:
    """verl builds ``AsyncLLM`` with stats off: the spans carry the engine core's step stamps
    (issue #14), each first token inside its span, not the caller's clock."""
    requests = request_spans(module_receiver)
    assert {attr(s.attributes, "rollout.timing.source") for s in requests} == {"engine_steps"}
    for span in requests:
        (first,) = [e for e in span.events if e.name == "gen_ai.first_token"]
        assert span.start_time_unix_nano <= first.time_unix_nano <= span.end_time_unix_nano


def test_each_sample_is_one_trajectory_of_its_step(
    verl_run: dict[str, Any], module_receiver: OTLPReceiver
) -> None:
    """verl's agent loop, zero-code (issue #17): every sample's ``_run_agent_loop`` in the
    ``AgentLoopWorker`` actor is an ``invoke_agent`` span under verl's step, its turn is the
    request the server actor served, its scoring a child, and the step — in the driver — counts
    the trajectories of the worker process."""
    steps = {attr(s.attributes, "rollout.step"): s for s in step_spans(module_receiver)}
    spans = module_receiver.spans()
    trajectories = [
        s for s in spans if attr(s.attributes, "gen_ai.operation.name") == "invoke_agent"
    ]
    assert len(trajectories) == STEPS * BATCH
    assert {s.name for s in trajectories} == {"invoke_agent single_turn_agent"}
    requests = {s.parent_span_id: s for s in request_spans(module_receiver)}
    scoring = {s.parent_span_id for s in spans if s.name == "rollout.scoring"}
    tokens = {s["step"]: Counter(s["response_tokens"]) for s in verl_run["steps"]}
    by_step: dict[int, list[Any]] = {}
    for t in trajectories:
        number = attr(t.attributes, "rollout.step")
        by_step.setdefault(number, []).append(t)
        assert t.trace_id == steps[number].trace_id
        assert attr(t.attributes, "rollout.trajectory.turns") == 1
        (request,) = [requests[t.span_id]]  # the server's request span is the turn's child
        assert attr(t.attributes, "rollout.trajectory.output_tokens") == attr(
            request.attributes, "gen_ai.usage.output_tokens"
        )
        # the turn is timed by verl's client around the Ray call: it contains the engine's span
        generation = attr(t.attributes, "rollout.trajectory.generation_s")
        engine_s = (request.end_time_unix_nano - request.start_time_unix_nano) / 1e9
        assert (
            engine_s - 0.002 <= generation <= (t.end_time_unix_nano - t.start_time_unix_nano) / 1e9
        )
        assert attr(t.attributes, "rollout.trajectory.turn_timing") == "client_call"
        assert t.span_id in scoring
        assert attr(t.attributes, "rollout.trajectory.status") == "completed"
    for number, step in steps.items():
        mine = by_step[number]
        assert (
            Counter(attr(t.attributes, "rollout.trajectory.output_tokens") for t in mine)
            == (tokens[number])
        )
        ids = [attr(t.attributes, "rollout.trajectory.sample_id") for t in mine]
        assert len(set(ids)) == BATCH
        # the driver's step span counts the worker's trajectories (the Ray step channel)
        assert attr(step.attributes, "rollout.step.trajectories") == BATCH
        assert attr(step.attributes, "rollout.step.trajectory.turns.max") == 1
        slowest = list(attr(step.attributes, "rollout.step.trajectory.slowest"))
        longest = max(mine, key=lambda t: t.end_time_unix_nano - t.start_time_unix_nano)
        assert slowest[0] == longest.span_id.hex()
    workers = {
        attr(rs.resource.attributes, "process.pid")
        for req in module_receiver.trace_requests
        for rs in req.resource_spans
        if any(s.name.startswith("invoke_agent") for ss in rs.scope_spans for s in ss.spans)
    }
    assert verl_run["pid"] not in workers
