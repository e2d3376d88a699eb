"""slime's rollout layout, zero-code (issue #41): slime's driver loop (``slime_job.py``) calls
a ``RolloutManager`` Ray actor once per step, whose rollout POSTs every sample with ``httpx`` to
the real sglang-router, which forwards it to a real SGLang server — all under
``opentelemetry-instrument``, the server too, with no otel_rollout code in the job.

The actor is a TEST STAND-IN (tests/slime/standin: slime is not on PyPI) of the shape
``test_slime_contract.py`` reads from slime's released source. Compared with what slime saw (the
job records each call's rollout id and SGLang's id of each sample):

* one step span per call, numbered by slime's ``rollout_id``, the evaluation marked ``validate``;
* the step counts every sample (the HTTP client hook in the actor's process, engine-reported
  token counts);
* every sample's SGLang request span is in its step's trace *and carries the step's number*,
  although sglang-router forwards no baggage: the number rode in ``tracestate``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.processes import run_reaped
from testkit.servers import free_port, request_spans, sglang_server, stop_server

pytestmark = pytest.mark.slime

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "slime" / "standin"
JOB = REPO / "tests" / "slime" / "slime_job.py"
STEPS = 2
PER_STEP = 6  # slime_job.LENGTHS
PER_EVAL = 2
TIMEOUT_S = 420
ROUTER_START_S = 60.0


@pytest.fixture(scope="module")
def router_and_server(
    slime_layout: Any, tiny_model: str, tmp_path_factory: Any
) -> Iterator[tuple[str, OTLPReceiver]]:
    logs = tmp_path_factory.mktemp("slime-servers")
    receiver = OTLPReceiver().start()
    server = sglang_server(tiny_model, receiver, logs / "sglang.log")
    port = free_port()
    with (logs / "router.log").open("wb") as out:
        router = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_router.launch_router",
                "--worker-urls",
                server.url,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_router(url, router, logs / "router.log")
        yield url, receiver
    finally:
        os.killpg(router.pid, signal.SIGKILL)
        router.wait(timeout=30)
        stop_server(server)
        receiver.stop()


def _wait_for_router(url: str, router: subprocess.Popen[bytes], log: Path) -> None:
    """Until the router counts the SGLang server as a healthy worker (it registers it in the
    background after start-up)."""
    deadline = time.monotonic() + ROUTER_START_S
    while time.monotonic() < deadline:
        if router.poll() is not None:
            pytest.fail(f"sglang-router exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            ready = requests.get(f"{url}/readiness", timeout=2)
            if ready.status_code == 200 and ready.json().get("healthy_workers"):
                return
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.5)
    pytest.fail(f"sglang-router not ready:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def run(router_and_server: tuple[str, OTLPReceiver], tmp_path_factory: Any) -> dict[str, Any]:
    router_url, receiver = router_and_server
    out = tmp_path_factory.mktemp("slime") / "job.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), str(STANDIN)]),
        RAY_AUTH_MODE="disabled",
        OTEL_SERVICE_NAME="slime-trainer",
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
            router_url,
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
    calls = json.loads(out.read_text())["calls"]
    samples = sum(len(c["ids"]) for c in calls)
    receiver.wait_for(lambda r: len(request_spans(r, "sglang")) >= samples, timeout=30)
    time.sleep(1.0)  # > the batch processors' 200 ms delay: a span too many would be here by now
    return {"calls": calls, "spans": receiver.spans()}


def _steps(spans: list[Any]) -> list[Any]:
    return sorted(
        (s for s in spans if s.name == "rollout.step"), key=lambda s: s.start_time_unix_nano
    )


def test_each_call_is_the_step_of_its_rollout_id(run: dict[str, Any]) -> None:
    calls = run["calls"]
    steps = _steps(run["spans"])
    assert [(c["rollout_id"], c["eval"]) for c in calls] == [(0, True), (0, False), (1, False)]
    assert [attr(s.attributes, "rollout.step") for s in steps] == [c["rollout_id"] for c in calls]
    assert [attr(s.attributes, "rollout.step.validate") is True for s in steps] == [
        c["eval"] for c in calls
    ]


def test_every_sample_through_the_router_is_in_its_step(run: dict[str, Any]) -> None:
    calls = run["calls"]
    steps = _steps(run["spans"])
    served = request_spans_of(run["spans"])
    by_trace = Counter(s.trace_id for s in served)
    assert [len(c["ids"]) for c in calls] == [PER_EVAL, PER_STEP, PER_STEP]
    for step, call in zip(steps, calls, strict=True):
        assert attr(step.attributes, "rollout.step.requests") == len(call["ids"])
        assert by_trace[step.trace_id] == len(call["ids"])
        mine = [s for s in served if s.trace_id == step.trace_id]
        # SGLang's own ids of the samples slime got back: the server spans are those requests
        assert sorted(str(attr(s.attributes, "gen_ai.response.id")) for s in mine) == sorted(
            call["ids"]
        )
        # the step number reached the server through the router, which drops baggage
        assert {attr(s.attributes, "rollout.step") for s in mine} == {call["rollout_id"]}
    # and nothing else: the router's health checks of the server (SGLang generates a token for
    # each) are SGLang's probes, not requests
    assert len(served) == sum(len(c["ids"]) for c in calls)


def request_spans_of(spans: list[Any]) -> list[Any]:
    """The SGLang server's request spans among ``spans``."""
    return [
        s
        for s in spans
        if attr(s.attributes, "gen_ai.provider.name") == "sglang"
        and attr(s.attributes, "gen_ai.operation.name") is not None
    ]
