"""Rollout actors in a real local Ray cluster: request spans land under the driver's step span.

Each case starts its own cluster (``ray.init(num_cpus=2)``), two actors each with a real vLLM
engine on the tiny model, and a real OTLP gRPC receiver the actors export to.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_rollout import rollout_step
from otel_rollout.ray import SETUP_HOOK, inject_context, runtime_env
from testkit.engines import VLLM_ENV, VLLM_KWARGS, long_tail_lengths
from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.processes import descendant_pids, end_new
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm


@pytest.fixture
def ray_module(vllm_module: Any) -> Iterator[Any]:
    """Ray, and at the end the cluster and every worker it started, gone (they outlive a bare
    ``ray.shutdown()`` for minutes)."""
    ray = pytest.importorskip("ray")
    before = descendant_pids()
    yield ray
    ray.shutdown()
    end_new(before)


def run_step(ray: Any, otel: OTelHarness, tiny_model: str, step: int) -> tuple[Any, list[int]]:
    from tests.steps.ray_actors import RolloutActor

    remote = ray.remote(num_cpus=1)(RolloutActor)
    # named, as verl's and slime's servers are: the name is the replica of their requests
    actors = [
        remote.options(name=f"rollout-{k}-step{step}").remote(tiny_model, VLLM_KWARGS)
        for k in range(2)
    ]
    infos = ray.get([a.describe.remote() for a in actors], timeout=180)
    assert len({i["pid"] for i in infos}) == 2
    assert all(i["instrumented"] and i["tracer_provider"] == "TracerProvider" for i in infos), infos
    lengths = long_tail_lengths(8, seed=step, high=96)
    with rollout_step(step):
        carrier = inject_context()
        counts = ray.get(
            [
                a.generate.remote(lengths, f"actor{k}", otel_context=carrier)
                for k, a in enumerate(actors)
            ],
            timeout=120,
        )
    assert all(ray.get([a.flush.remote() for a in actors], timeout=60))
    (step_span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    assert counts == [lengths, lengths]
    return step_span, lengths


def assert_one_trace(
    receiver: OTLPReceiver, step_span: Any, lengths: list[int], step: int, service: str | None
) -> None:
    def request_spans(r: OTLPReceiver) -> list[Any]:
        return [s for s in r.spans() if s.name.startswith("text_completion")]

    assert receiver.wait_for(lambda r: len(request_spans(r)) >= 2 * len(lengths), timeout=30)
    spans = receiver.spans()
    trace_id = step_span.context.trace_id.to_bytes(16, "big")
    step_id = step_span.context.span_id.to_bytes(8, "big")
    batches = [s for s in spans if s.name == "rollout.batch"]
    requests = request_spans(receiver)
    assert len(batches) == 2 and len(requests) == 2 * len(lengths)
    # One trace: the driver's step span is the batch spans' parent in both actors ...
    # (vLLM's own start-up spans, e.g. "Load weights", are traces of their own and not counted.)
    assert {s.trace_id for s in batches + requests} == {trace_id}
    assert all(b.parent_span_id == step_id for b in batches)
    # ... and every request span is a child of one of those batch spans.
    assert {r.parent_span_id for r in requests} == {b.span_id for b in batches}
    assert all(attr(r.attributes, "rollout.step") == step for r in requests)
    # each request names the actor that served it
    replicas = [attr(r.attributes, "rollout.replica") for r in requests]
    assert sorted(set(replicas)) == [f"rollout-0-step{step}", f"rollout-1-step{step}"]
    assert all(replicas.count(name) == len(lengths) for name in set(replicas))
    assert sorted(attr(r.attributes, "gen_ai.usage.output_tokens") for r in requests) == sorted(
        lengths * 2
    )
    resources = [rs.resource for req in receiver.trace_requests for rs in req.resource_spans]
    assert len({attr(res.attributes, "process.pid") for res in resources}) == 2  # two actors
    if service is not None:
        assert {attr(res.attributes, "service.name") for res in resources} == {service}


def test_runtime_env_configures_actors(
    ray_module: Any,
    otel: OTelHarness,
    tiny_model: str,
    otlp_receiver: OTLPReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Settings reach the workers only through runtime_env: the driver's environment is cleaned
    of them before the cluster starts, as on a multi-node cluster where nothing is inherited."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.grpc_endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "rollout-actor")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    # The driver names itself; copied as is, every worker would claim the same identity and
    # their series would collide in the Collector's Prometheus exporter.
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=driver,deployment.environment=x"
    )
    env = runtime_env({"env_vars": dict(VLLM_ENV)})
    assert env["env_vars"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == otlp_receiver.grpc_endpoint
    assert env["worker_process_setup_hook"] == SETUP_HOOK
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_SERVICE_NAME",
        "OTEL_BSP_SCHEDULE_DELAY",
        "OTEL_RESOURCE_ATTRIBUTES",
    ):
        monkeypatch.delenv(name)
    ray_module.init(num_cpus=2, include_dashboard=False, runtime_env=env)
    step_span, lengths = run_step(ray_module, otel, tiny_model, step=21)
    assert_one_trace(otlp_receiver, step_span, lengths, 21, service="rollout-actor")
    # Each worker process has an identity of its own; the driver's other attributes are kept.
    resources = [rs.resource for req in otlp_receiver.trace_requests for rs in req.resource_spans]
    by_pid = {attr(res.attributes, "process.pid"): res for res in resources}
    instance_ids = {attr(res.attributes, "service.instance.id") for res in by_pid.values()}
    assert len(by_pid) == 2 and len(instance_ids) == 2, instance_ids
    assert None not in instance_ids and "driver" not in instance_ids
    assert {attr(res.attributes, "deployment.environment") for res in resources} == {"x"}


def test_inherited_environment_configures_actors(
    ray_module: Any,
    otel: OTelHarness,
    tiny_model: str,
    otlp_receiver: OTLPReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A local cluster: workers inherit the driver's OTEL_* environment; only the hook is passed."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.grpc_endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    env = runtime_env(environ={})
    assert env == {"env_vars": {}, "worker_process_setup_hook": SETUP_HOOK}
    ray_module.init(num_cpus=2, include_dashboard=False, runtime_env=env)
    step_span, lengths = run_step(ray_module, otel, tiny_model, step=22)
    assert_one_trace(otlp_receiver, step_span, lengths, 22, service=None)


def test_a_method_patched_in_the_worker_runs_there(ray_module: Any) -> None:
    """Ray ships an actor class from the driver by value, each method inside a wrapper of Ray's
    that holds the driver's function: a method patched in the worker (as verl's agent loop is,
    zero-code) never ran there. With the Ray instrumentor the actor's methods are looked up in
    the worker's module when called. The control, a class shipped without it, shows the trap."""
    from otel_rollout.ray.instrumentor import RayInstrumentor
    from tests.steps import patched_actor
    from tests.steps.patched_actor import IN_WORKER, WRITTEN, Sample

    ray_module.init(
        num_cpus=1,
        include_dashboard=False,
        runtime_env={
            "worker_process_setup_hook": "tests.steps.patched_actor.patch_in_worker",
            "env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        },
    )
    patched_actor.patch("patched in the driver")  # the driver's instrumentor patched it too
    control = ray_module.remote(num_cpus=0)(Sample).remote()
    assert ray_module.get(control.where.remote(), timeout=60) != IN_WORKER  # Ray's by-value copy
    instrumentor = RayInstrumentor()
    instrumentor.instrument()
    try:
        actor = ray_module.remote(num_cpus=0)(Sample).remote()
        got = ray_module.get(
            [actor.where.remote(), actor.where_async.remote(), actor.calls_itself.remote()],
            timeout=60,
        )
    finally:
        instrumentor.uninstrument()
    assert got == [IN_WORKER, IN_WORKER, IN_WORKER]
    assert Sample.__dict__["where"].__wrapped__(Sample()) == WRITTEN  # the class itself untouched
