"""vLLM's own tracing: its ``llm_request`` span joins our trace; a replaced provider is reported."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from testkit.otlp_receiver import OTLPReceiver
from testkit.workload_runner import REPO, workload_env

pytestmark = pytest.mark.vllm


def _job(model: str, endpoint: str, *flags: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.vllm.tracing_job",
            "--model",
            model,
            "--endpoint",
            endpoint,
            *flags,
        ],
        env=workload_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    return proc


def test_vllm_request_span_joins_the_callers_trace(
    otlp_receiver: OTLPReceiver, tiny_model: str, vllm_module: Any
) -> None:
    proc = _job(tiny_model, f"127.0.0.1:{otlp_receiver.grpc_port}", "--user-provider")
    caller_trace = json.loads(
        next(line for line in proc.stdout.splitlines() if line.startswith("{"))
    )["caller_trace_id"]
    otlp_receiver.wait_for(lambda r: any(s.name == "llm_request" for s in r.spans()), timeout=20)
    vllm_spans = [s for s in otlp_receiver.spans() if s.name == "llm_request"]
    assert vllm_spans, "vLLM exported no llm_request span"
    assert {s.trace_id.hex() for s in vllm_spans} == {caller_trace}
    ours = [s for s in otlp_receiver.spans() if s.name.startswith("text_completion ")]
    assert len(ours) == 1 and ours[0].trace_id.hex() == caller_trace


def test_replaced_global_provider_is_reported_once(
    otlp_receiver: OTLPReceiver, tiny_model: str, vllm_module: Any
) -> None:
    proc = _job(tiny_model, f"127.0.0.1:{otlp_receiver.grpc_port}")
    warnings = [
        line
        for line in proc.stderr.splitlines()
        if "installed its own global TracerProvider" in line
    ]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert "vLLM" in warnings[0]
