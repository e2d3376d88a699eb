"""Starts the e2e workload (``tests/e2e/workload.py``) under ``opentelemetry-instrument``: shared by
the e2e and vLLM suites."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testkit.processes import run_reaped

REPO = Path(__file__).resolve().parents[1]


def instrument_command(*args: str) -> list[str]:
    bindir = Path(sys.executable).parent
    return [
        str(bindir / "opentelemetry-instrument"),
        sys.executable,
        "-m",
        "tests.e2e.workload",
        *args,
    ]


def workload_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "OTEL_SERVICE_NAME": "rollout-e2e",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
    )
    env.update(overrides)
    return env


def run_workload(model: str, env: dict[str, str], *args: str, timeout: float = 240) -> list[Any]:
    """Run to completion; returns the per-request truth lines the workload printed."""
    proc = run_reaped(
        instrument_command("--model", model, *args),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@contextmanager
def lingering_workload(model: str, env: dict[str, str], *args: str) -> Iterator[list[Any]]:
    """Run with ``--linger``: yields the per-request truth lines once the workload printed
    ``DONE`` and stays alive (a scraper can still read its metrics endpoint); ends it on exit."""
    proc = subprocess.Popen(
        instrument_command("--model", model, *args, "--linger"),
        env=env,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    truth: list[Any] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                truth.append(json.loads(line))
            if line.strip() == "DONE":
                break
        assert proc.poll() is None, "workload exited before lingering"
        yield truth
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=60)
