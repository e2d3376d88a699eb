"""TRL's own trainers, zero-code (issue #41): ``GRPOTrainer`` and ``RLOOTrainer`` under
``opentelemetry-instrument`` with real vLLM colocated, three training steps and one evaluation
(``tests/trl/trl_job.py``; TRL's code untouched, what makes it run on CPU is named there).

What is compared, per generation round, against what TRL itself did and measured (the job
records TRL's ``global_step`` and mode at each round, and every reading of TRL's own
``profiling_context`` timers):

* one step span per round, numbered by TRL's ``global_step``, eval rounds ``validate``;
* every request of the round (TRL's generation batch: 4 completions) in that step's trace and
  counted by the step;
* each of TRL's timers inside the round is a phase of the step — a child span of the step (or of
  the enclosing timer's phase) lasting what TRL measured (TRL's timer runs inside the span);
* the weights each round generated with are named after its step (TRL syncs them first).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.processes import run_reaped

pytestmark = pytest.mark.trl

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "trl" / "trl_job.py"
STEPS = 3
PER_ROUND = 4  # per_device_train_batch_size: one prompt × num_generations 4
TIMEOUT_S = 600
OUTSIDE_ROUND = {"_prepare_inputs", "compute_loss"}
"""TRL timers that run around or after the round (``_prepare_inputs`` wraps it; the loss runs on
the round's output), not inside it: no step is open there."""


def launch(job: list[str], endpoint: str, ranks: int = 1, **extra_env: str) -> None:
    """The job zero-code: ``opentelemetry-instrument python …``, or with ``ranks`` > 1
    ``opentelemetry-instrument torchrun --standalone --nproc_per_node RANKS …`` (each rank
    instrumented: ``opentelemetry-instrument`` reaches the processes it starts)."""
    bin_dir = Path(sys.executable).parent
    python = [sys.executable]
    if ranks > 1:
        python = [str(bin_dir / "torchrun"), "--standalone", f"--nproc_per_node={ranks}"]
    env = {**job_env(endpoint), **extra_env}
    if ranks > 1:
        env["ACCELERATE_USE_CPU"] = "true"  # accelerate's CPU backend (gloo) in every rank
    done = run_reaped(
        [str(bin_dir / "opentelemetry-instrument"), *python, str(JOB), *job],
        env=env,
        cwd=REPO,
        timeout=TIMEOUT_S,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-4000:]


def job_env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "OTEL_SERVICE_NAME": "trl-trainer",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
    )
    return env


@pytest.fixture(scope="module", params=["grpo", "rloo"])
def run(
    request: pytest.FixtureRequest, trl_module: Any, tiny_model: str, tmp_path_factory: Any
) -> dict[str, Any]:
    kind = request.param
    out = tmp_path_factory.mktemp(f"trl-{kind}") / "trl.json"
    receiver = OTLPReceiver().start()
    try:
        launch([tiny_model, str(out), kind, str(STEPS)], receiver.grpc_endpoint)
        time.sleep(0.5)
        spans = receiver.spans()
    finally:
        receiver.stop()
    return {"kind": kind, "trl": json.loads(out.read_text()), "spans": spans}


def _steps(spans: list[Any]) -> list[Any]:
    return sorted(
        (s for s in spans if s.name == "rollout.step"), key=lambda s: s.start_time_unix_nano
    )


def _requests(spans: list[Any]) -> list[Any]:
    return [s for s in spans if attr(s.attributes, "gen_ai.usage.output_tokens") is not None]


def test_each_generation_round_is_a_step_numbered_by_trl(run: dict[str, Any]) -> None:
    rounds = run["trl"]["rounds"]
    assert [r["train"] for r in rounds][:STEPS] == [True] * STEPS and not rounds[-1]["train"]
    steps = _steps(run["spans"])
    assert [attr(s.attributes, "rollout.step") for s in steps] == [r["step"] for r in rounds]
    assert [attr(s.attributes, "rollout.step.validate") is True for s in steps] == [
        not r["train"] for r in rounds
    ]
    assert len({s.trace_id for s in steps}) == len(steps)  # one trace per round
    assert {attr(s.attributes, "rollout.step.framework") for s in steps} == {"trl"}
    assert {attr(s.attributes, "rollout.step.algorithm") for s in steps} == {run["kind"]}
    # the proposed rl.* names only under their opt-in (test_rl_conventions_opt_in)
    assert not [s.name for s in run["spans"] if s.name.startswith("rl.")]
    assert not [k for s in run["spans"] for k in _keys(s) if k.startswith("rl.")]


def _keys(span: Any) -> list[str]:
    return [a.key for a in span.attributes]


def test_every_request_of_a_round_is_in_its_steps_trace_and_counted(run: dict[str, Any]) -> None:
    steps = _steps(run["spans"])
    requests = _requests(run["spans"])
    assert len(requests) == PER_ROUND * len(steps)
    by_trace = Counter(s.trace_id for s in requests)
    for step in steps:
        assert by_trace[step.trace_id] == PER_ROUND
        assert attr(step.attributes, "rollout.step.requests") == PER_ROUND
    number = {s.trace_id: attr(s.attributes, "rollout.step") for s in steps}
    assert all(attr(r.attributes, "rollout.step") == number[r.trace_id] for r in requests)
    # vLLM's own times: TRL's LLM runs with stats off, so read off its engine steps
    assert {attr(r.attributes, "rollout.timing.source") for r in requests} == {"engine_steps"}


def test_trls_own_timers_are_the_steps_phases(run: dict[str, Any]) -> None:
    """Every phase is one of TRL's readings of that step, lasting at least what TRL measured and
    at most 50 ms more (our span opens before TRL's timer and closes after it); every reading of
    a timer that only runs inside a round is a phase."""
    spans = run["spans"]
    steps = {s.trace_id: s for s in _steps(spans)}
    phases = [s for s in spans if s.name.startswith("rollout.phase")]
    readings: dict[tuple[str, int], list[float]] = defaultdict(list)
    for timer in run["trl"]["timers"]:
        readings[(timer["name"].split(".", 1)[1], timer["step"])].append(timer["s"])
    by_id = {s.span_id: s for s in spans}
    inside = Counter()
    for phase in sorted(phases, key=lambda s: s.start_time_unix_nano):
        assert attr(phase.attributes, "rollout.phase.framework") == "trl"
        name = attr(phase.attributes, "rollout.phase.framework_name")
        step = steps[phase.trace_id]
        parent = by_id[phase.parent_span_id]
        assert parent is step or parent.name.startswith("rollout.phase")
        seconds = (phase.end_time_unix_nano - phase.start_time_unix_nano) / 1e9
        key = (name, attr(step.attributes, "rollout.step"))
        matches = [s for s in readings[key] if s <= seconds + 1e-6 and seconds - s <= 0.05]
        assert matches, (key, seconds, readings[key])
        readings[key].remove(matches[0])
        inside[name] += 1
    assert {"vLLM.generate", "sync_weights", "_calculate_rewards"} <= set(inside)
    assert not OUTSIDE_ROUND & set(inside)
    for (name, _step), left in readings.items():
        if name in {"vLLM.generate", "sync_weights", "_calculate_rewards"}:
            assert not left, (name, left)  # each reading of it was a phase
    generation = [p for p in phases if attr(p.attributes, "rollout.phase.name") == "generation"]
    assert len(generation) == len(steps)  # TRL's vLLM.generate, once a round


def test_the_weights_of_each_round_are_named_after_its_step(run: dict[str, Any]) -> None:
    """TRL syncs the policy into the colocated engine at the start of each round whose step it
    has not loaded: the round's requests ran on the step's weights."""
    steps = {s.trace_id: attr(s.attributes, "rollout.step") for s in _steps(run["spans"])}
    for request in _requests(run["spans"]):
        assert attr(request.attributes, "rollout.weight.version") == steps[request.trace_id]
        assert attr(request.attributes, "rollout.weight.version_source") == "named"


@pytest.fixture(scope="module")
def rl_run(trl_module: Any, tiny_model: str, tmp_path_factory: Any) -> dict[str, Any]:
    """GRPO, two steps and one evaluation, with OTEL_SEMCONV_STABILITY_OPT_IN=rl_latest_experimental."""
    out = tmp_path_factory.mktemp("trl-rl") / "trl.json"
    receiver = OTLPReceiver().start()
    try:
        launch(
            [tiny_model, str(out), "grpo", "2"],
            receiver.grpc_endpoint,
            OTEL_SEMCONV_STABILITY_OPT_IN="rl_latest_experimental",
            OTEL_ROLLOUT_RUN_ID="grpo-run-1",
        )
        time.sleep(0.5)
        spans = receiver.spans()
    finally:
        receiver.stop()
    return {"trl": json.loads(out.read_text()), "spans": spans}


def test_rl_conventions_opt_in(rl_run: dict[str, Any]) -> None:
    """The same trainer under the opt-in: each round an ``rl.loop`` span with the run, TRL,
    GRPO and the model; TRL's generation, reward and weight-sync timers as ``rl.sample``,
    ``rl.reward``, ``rl.sync`` under it; every request in its loop's trace, counted; our own
    attributes kept."""
    spans, rounds = rl_run["spans"], rl_run["trl"]["rounds"]
    assert not [s for s in spans if s.name == "rollout.step"]
    loops = sorted((s for s in spans if s.name == "rl.loop"), key=lambda s: s.start_time_unix_nano)
    assert [attr(s.attributes, "rollout.step") for s in loops] == [r["step"] for r in rounds]
    [model] = {attr(s.attributes, "gen_ai.request.model") for s in _requests(spans)}
    for loop in loops:
        assert {k: attr(loop.attributes, k) for k in _keys(loop) if k.startswith("rl.")} == {
            "rl.run.id": "grpo-run-1",
            "rl.system": "trl",
            "rl.algorithm": "grpo",
            "rl.model.name": model,  # the model that served the round
        }
        assert attr(loop.attributes, "rollout.step.requests") == PER_ROUND
    requests = Counter(s.trace_id for s in _requests(spans))
    assert [requests[s.trace_id] for s in loops] == [PER_ROUND] * len(loops)
    by_trace = {s.trace_id: s for s in loops}
    named = Counter()
    for span in spans:
        if span.name in ("rl.sample", "rl.reward", "rl.sync", "rl.train"):
            assert span.trace_id in by_trace
            named[(span.name, attr(span.attributes, "rollout.phase.framework_name"))] += 1
    assert named[("rl.sample", "vLLM.generate")] == len(loops)  # once a round
    assert named[("rl.reward", "_calculate_rewards")] == len(loops)
    assert named[("rl.sync", "sync_weights")] >= 1


RANKS = 2


@pytest.fixture(scope="module")
def ranks_run(trl_module: Any, tiny_model: str, tmp_path_factory: Any) -> dict[str, Any]:
    """GRPO on two ranks (``torchrun``), one colocated engine each, two steps and one evaluation."""
    out = tmp_path_factory.mktemp("trl-ranks") / "trl.json"
    receiver = OTLPReceiver().start()
    try:
        launch([tiny_model, str(out), "grpo", "2"], receiver.grpc_endpoint, ranks=RANKS)
        time.sleep(0.5)
        spans = receiver.spans()
    finally:
        receiver.stop()
    ranks = [json.loads(out.with_name(f"trl.rank{r}.json").read_text()) for r in range(RANKS)]
    return {"ranks": ranks, "spans": spans}


def test_the_ranks_of_one_round_are_one_trace(ranks_run: dict[str, Any]) -> None:
    """Each rank runs the round with an engine of its own; their step spans share one trace:
    rank 0's the root, the other's its child, and every rank's requests are in it."""
    rounds = ranks_run["ranks"][0]["rounds"]
    assert rounds == ranks_run["ranks"][1]["rounds"]  # one schedule
    steps = _steps(ranks_run["spans"])
    assert len(steps) == RANKS * len(rounds)
    traces: dict[bytes, list[Any]] = defaultdict(list)
    for step in steps:
        traces[step.trace_id].append(step)
    assert len(traces) == len(rounds)  # one trace a round, not one a rank
    requests = Counter(s.trace_id for s in _requests(ranks_run["spans"]))
    pids = {r["pid"] for r in ranks_run["ranks"]}
    assert len(pids) == RANKS
    for members in traces.values():
        by_rank = {attr(s.attributes, "rollout.step.rank"): s for s in members}
        assert sorted(by_rank) == list(range(RANKS))
        assert {attr(s.attributes, "rollout.step.ranks") for s in members} == {RANKS}
        root = by_rank[0]
        assert not root.parent_span_id
        assert all(by_rank[r].parent_span_id == root.span_id for r in range(1, RANKS))
        assert len({attr(s.attributes, "rollout.step") for s in members}) == 1
        # each rank's step counts its own requests; the trace holds every rank's
        assert all(attr(s.attributes, "rollout.step.requests") == PER_ROUND for s in members)
        assert requests[root.trace_id] == RANKS * PER_ROUND
