"""What a verl user meets on day one (issue #20): model labels from Hugging Face cache paths, step
numbers that follow the trainer, idle-capacity buckets that hold real steps, and worker identity
through ``runtime_env()``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import baggage
from opentelemetry import context as otel_context

from otel_rollout import set_step, steps
from otel_rollout.config import IDLE_CAPACITY_BUCKETS, RolloutConfig
from otel_rollout.ray import runtime_env
from otel_rollout.record import model_label
from otel_rollout.steps import StepScope, batch_in_step
from otel_rollout.telemetry import Telemetry
from testkit.records import make_record
from tests.conftest import OTelHarness

# --- model label -------------------------------------------------------------------------------

SNAPSHOT = (
    "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/"
    "a09a35458c702b33eeacc393d103063234e8bc28"
)


@pytest.mark.parametrize(
    ("name", "label"),
    [
        (SNAPSHOT, "Qwen/Qwen2.5-7B-Instruct"),
        (SNAPSHOT + "/", "Qwen/Qwen2.5-7B-Instruct"),
        ("/hub/models--Qwen--Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
        ("/hub/models--gpt2/snapshots/abc123", "gpt2"),
        ([SNAPSHOT, "other"], "Qwen/Qwen2.5-7B-Instruct"),
        ("/data/checkpoints/my-sft-model", "my-sft-model"),
        ("/data/checkpoints/my-sft-model/", "my-sft-model"),
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),  # a Hub id stays as given
        (None, "unknown"),
    ],
)
def test_model_label(name: object, label: str) -> None:
    assert model_label(name) == label


# --- step numbers under OTEL_ROLLOUT_BATCH_AS_STEP ---------------------------------------------


@pytest.fixture(autouse=True)
def _restore_step_numbering() -> Iterator[None]:
    """set_step is process-wide: leave the numbering as found for tests that count from 1."""
    saved = steps._AUTO_STEPS._next
    yield
    steps._AUTO_STEPS.set(saved)


def _batch_calls(telemetry: Telemetry, model: str, calls: int) -> None:
    for _ in range(calls):
        with batch_in_step(telemetry, model, "text_completion", 1) as ctx:
            telemetry.emit(make_record(model), ctx)


def _step_numbers(otel: OTelHarness) -> list[int]:
    spans = sorted(
        (s for s in otel.finished_spans() if s.name == "rollout.step"), key=lambda s: s.start_time
    )
    return [s.attributes["rollout.step"] for s in spans]


def test_set_step_numbers_the_next_batch_steps(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry], model: str
) -> None:
    telemetry = make_telemetry(RolloutConfig(batch_as_step=True))
    set_step(1200)  # e.g. the trainer resumed at global step 1200
    _batch_calls(telemetry, model, 2)
    set_step(1500)
    _batch_calls(telemetry, model, 1)
    assert _step_numbers(otel) == [1200, 1201, 1500]
    requests = [s for s in otel.finished_spans() if s.name.startswith("text_completion")]
    assert sorted(s.attributes["rollout.step"] for s in requests) == [1200, 1201, 1500]


def test_propagated_step_baggage_wins(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry], model: str
) -> None:
    telemetry = make_telemetry(RolloutConfig(batch_as_step=True))
    set_step(5)
    token = otel_context.attach(baggage.set_baggage("rollout.step", "77"))
    try:
        _batch_calls(telemetry, model, 1)
    finally:
        otel_context.detach(token)
    _batch_calls(telemetry, model, 1)  # no baggage: counting goes on from the trainer's number
    assert _step_numbers(otel) == [77, 78]


def test_malformed_step_baggage_falls_back_to_counting(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry], model: str
) -> None:
    telemetry = make_telemetry(RolloutConfig(batch_as_step=True))
    set_step(9)
    token = otel_context.attach(baggage.set_baggage("rollout.step", "not-a-number"))
    try:
        _batch_calls(telemetry, model, 1)
    finally:
        otel_context.detach(token)
    assert _step_numbers(otel) == [9]


# --- idle capacity has buckets of its own --------------------------------------------------------


def test_idle_capacity_of_a_long_step_lands_in_a_finite_bucket(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry], model: str
) -> None:
    """64 requests, 63 done after 1 s and one after 1000 s: 63 × 999 ≈ 62,937 request-seconds
    unused — far past the latency buckets' top (7200 s), which made it an overflow count."""
    telemetry = make_telemetry()
    base = make_record(model)
    records = [
        make_record(
            model,
            arrival_ns=base.arrival_ns,
            scheduled_ns=None,
            first_token_ns=None,
            finish_ns=base.arrival_ns + (1000 if k == 0 else 1) * 1_000_000_000,
        )
        for k in range(64)
    ]
    with StepScope(1, config=RolloutConfig(), telemetry=telemetry) as scope:
        for record in records:
            telemetry.emit(record)
    assert scope.stats is not None
    assert scope.stats.idle_capacity_s == pytest.approx(63 * 999, rel=1e-6)
    (point,) = otel.metric_points("rollout.step.idle_capacity")
    bounds = list(point.point.explicit_bounds)
    assert bounds == list(IDLE_CAPACITY_BUCKETS)
    assert point.bucket_counts[-1] == 0, "idle capacity overflowed the top bucket"
    index = next(i for i, b in enumerate(bounds) if scope.stats.idle_capacity_s <= b)
    assert point.bucket_counts[index] == 1
    # The latency buckets are unchanged for the step's durations.
    (duration,) = otel.metric_points("rollout.step.duration")
    assert list(duration.point.explicit_bounds) == list(RolloutConfig().latency_buckets)


# --- replica identity through runtime_env() ------------------------------------------------------


@pytest.mark.parametrize(
    ("driver", "workers"),
    [
        ("service.instance.id=driver,deployment.environment=x", "deployment.environment=x"),
        (
            "deployment.environment=x, service.instance.id = driver ,team=rl",
            "deployment.environment=x,team=rl",
        ),
        ("service.instance.id=driver", ""),
        ("deployment.environment=x", "deployment.environment=x"),
    ],
)
def test_runtime_env_strips_the_drivers_instance_id(driver: str, workers: str) -> None:
    env: dict[str, Any] = runtime_env(
        environ={"OTEL_RESOURCE_ATTRIBUTES": driver, "OTEL_SERVICE_NAME": "trainer"}
    )
    assert env["env_vars"]["OTEL_RESOURCE_ATTRIBUTES"] == workers
    assert env["env_vars"]["OTEL_SERVICE_NAME"] == "trainer"


def test_runtime_env_keeps_an_instance_id_the_user_sets_for_workers() -> None:
    """An explicit per-job value in env_vars= is the user's choice, not the driver's leak."""
    env = runtime_env(
        environ={"OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=driver"},
        env_vars={"OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=pool-a"},
    )
    assert env["env_vars"]["OTEL_RESOURCE_ATTRIBUTES"] == "service.instance.id=pool-a"


# --- a step channel that fails at the step's end -------------------------------------------------


class _FailingChannel:
    """A fake, named as such: a channel whose close raises. The real failure (the Ray collector
    not answering within its wait) needs a stalled actor; what matters here is the step's view."""

    def open(self, scope: StepScope, ctx: Any) -> Any:
        return ctx

    def close(self, scope: StepScope, wait_s: float) -> None:
        raise TimeoutError("collector did not answer")


def test_a_failed_channel_makes_the_step_partial_not_complete(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry], model: str
) -> None:
    telemetry = make_telemetry()
    channel = _FailingChannel()
    steps.register_channel(channel)
    try:
        with StepScope(3, telemetry=telemetry) as scope:
            telemetry.emit(make_record(model))
    finally:
        steps.unregister_channel(channel)
    assert scope.partial is True
    assert scope.stats is not None and scope.stats.requests == 1  # what this process saw
    step = next(s for s in otel.finished_spans() if s.name == "rollout.step")
    assert step.attributes["rollout.step.partial"] is True


# --- step telemetry names its real source ----------------------------------------------------------


def test_steps_come_out_under_the_steps_scope_not_an_engines(otel: OTelHarness) -> None:
    """Instrument vLLM then SGLang where neither is installed (this environment): neither may
    register, and the step's span and metric points name ``otel_rollout.steps``."""
    import importlib.util

    from otel_rollout import SGLangInstrumentor, VLLMInstrumentor
    from otel_rollout.telemetry import _ENGINES, STEP_SCOPE, job_step_telemetry

    if importlib.util.find_spec("vllm") or importlib.util.find_spec("sglang"):
        pytest.skip("needs an environment without the engines (the core one)")
    before = list(_ENGINES)
    vllm, sglang = VLLMInstrumentor(), SGLangInstrumentor()
    vllm.instrument()
    sglang.instrument()
    try:
        assert _ENGINES == before  # an engine that is not installed registers nothing
        with StepScope(11):
            pass
        step = next(s for s in otel.finished_spans() if s.name == "rollout.step")
        assert step.instrumentation_scope.name == STEP_SCOPE
        assert job_step_telemetry().tracer is not None
    finally:
        sglang.uninstrument()
        vllm.uninstrument()


def test_an_engines_steps_go_to_its_providers_under_the_steps_scope(
    otel: OTelHarness, model: str
) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_rollout.telemetry import STEP_SCOPE, create_telemetry

    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    mp = MeterProvider(metric_readers=[reader])
    engine = create_telemetry("vllm", tp, mp)
    with StepScope(4, telemetry=engine):
        engine.emit(make_record(model))
    engine.flush()
    scopes = {s.name: s.instrumentation_scope.name for s in spans.get_finished_spans()}
    assert scopes["rollout.step"] == STEP_SCOPE
    assert scopes[f"text_completion {model}"] == "otel_rollout.vllm"
    metric_scopes = {
        m.name: sm.scope.name
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert metric_scopes["rollout.step.requests"] == STEP_SCOPE
    assert metric_scopes["gen_ai.server.request.duration"] == "otel_rollout.vllm"


def test_the_decorator_keeps_the_telemetry_it_was_given(model: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_rollout.telemetry import create_telemetry

    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    engine = create_telemetry("vllm", tp)

    @StepScope(telemetry=engine)
    def step() -> None:
        pass

    step()
    step()
    steps = [s for s in spans.get_finished_spans() if s.name == "rollout.step"]
    assert [s.attributes["rollout.step"] for s in steps] == [1, 2]
