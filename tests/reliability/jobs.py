"""The exporter-trouble jobs: subprocesses under ``opentelemetry-instrument`` (see the tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.engines import VLLM_ENV
from tests.reliability.faults import FaultyCollector, closed_port

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
SECRET = "SECRET-TOKEN-9c41"


class Job:
    def __init__(self, name: str, script: str, env: dict[str, str]) -> None:
        self.name = name
        self.started = time.time()
        self.proc = subprocess.Popen(
            [str(BIN / "opentelemetry-instrument"), sys.executable, str(HERE / script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(HERE.parent.parent),
        )
        self.stdout = self.stderr = ""
        self.ended = 0.0

    def wait(self, timeout: float) -> Job:
        if not self.ended:
            try:
                self.stdout, self.stderr = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.stdout, self.stderr = self.proc.communicate()
            self.ended = time.time()
        return self

    @property
    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]

    @property
    def exit_s(self) -> float:
        (last,) = [ln for ln in self.stdout.splitlines() if ln.startswith("LAST_GENERATE_DONE")]
        return self.ended - float(last.split()[1])


EXPORTER_TIMEOUT_S = 10
"""The OTLP exporter's own per-export timeout in the jobs (the SDK's default)."""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(VLLM_ENV)
    env.update(
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_LOGS_EXPORTER="none",
        OTEL_SERVICE_NAME="exporter-trouble",
        OTEL_METRIC_EXPORT_INTERVAL="500",
        OTEL_BSP_SCHEDULE_DELAY="200",
        OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer {SECRET}",
        # the SDK's default, set so the exit test's bound is stated against it
        OTEL_EXPORTER_OTLP_TIMEOUT=str(EXPORTER_TIMEOUT_S),
        VLLM_LOGGING_LEVEL="INFO",
        JOB_ROUNDS="5",
        JOB_PER_ROUND="1000",
        JOB_PROMPT="exporter trouble",
    )
    env.update(extra)
    return env


PROTOCOLS = {"grpc": "grpc", "http": "http/protobuf"}


@pytest.fixture(scope="session")
def exporter_jobs(tiny_model: str) -> Iterator[dict[str, Job]]:
    slow, error = FaultyCollector("slow").start(), FaultyCollector("error").start()
    refused = f"http://127.0.0.1:{closed_port()}"
    light = {"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "vllm,sglang"}
    jobs = {
        "bare": Job(
            "bare",
            "telemetry_job.py",
            _env(**light, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none"),
        )
    }
    for proto, value in PROTOCOLS.items():
        for fault, endpoint in (
            ("refused", refused),
            ("slow", slow.endpoint(proto)),
            ("error", error.endpoint(proto)),
        ):
            jobs[f"{fault}-{proto}"] = Job(
                f"{fault}-{proto}",
                "telemetry_job.py",
                _env(
                    **light, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL=value
                ),
            )
    jobs["vllm-error-http"] = Job(
        "vllm-error-http",
        "exporter_job.py",
        _env(
            JOB_MODEL=tiny_model,
            JOB_BATCHES="3",
            OTEL_EXPORTER_OTLP_ENDPOINT=error.endpoint("http"),
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        ),
    )
    try:
        for job in jobs.values():
            job.wait(timeout=240)
        jobs["_error_collector"] = error  # type: ignore[assignment]
        yield jobs
    finally:
        slow.stop()
        error.stop()
