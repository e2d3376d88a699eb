"""A stalled engine is reported while it is stalled; a slow one is not (#12 item 3).

The stall is real: the ``AsyncLLM``'s engine-core process is stopped with SIGSTOP mid-request
(a hung engine core, as a deadlocked collective or a stuck kernel leaves it), and continued with
SIGCONT. The stall watch runs as an instrumentor starts it, with the timeout of the
configuration of then (``OTEL_ROLLOUT_STALL_TIMEOUT=2``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any

import pytest

from otel_rollout import stalls
from otel_rollout.config import load_config
from otel_rollout.steps import open_step_progress, rollout_step
from otel_rollout.telemetry import engine_activities
from otel_rollout.vllm.adapter import model_name
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm

TIMEOUT_S = 2.0
TOKENS = 1500


def _lines(caplog: pytest.LogCaptureFixture, word: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "otel_rollout.stalls" and word in r.getMessage()]


def test_a_stopped_engine_core_is_stalled_while_stopped_and_resumes(
    engine: Any,
    loop: asyncio.AbstractEventLoop,
    vllm_module: Any,
    otel: OTelHarness,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("OTEL_ROLLOUT_STALL_TIMEOUT", str(TIMEOUT_S))
    watch = stalls.watch(load_config().stall_timeout, engine_activities, open_step_progress)
    assert watch is not None and watch.timeout_s == TIMEOUT_S
    (core,) = engine.engine_core.resources.engine_manager.processes
    model = model_name(engine)
    params = vllm_module.SamplingParams(max_tokens=TOKENS, ignore_eos=True, temperature=0.0)
    timeline: dict[str, float] = {}

    async def scenario() -> list[Any]:
        outputs: list[Any] = []

        async def consume() -> None:
            async for out in engine.generate("a request that hangs", params, "stall-1"):
                outputs.append(out)

        with rollout_step(41):
            task = asyncio.ensure_future(consume())
            while not outputs:
                await asyncio.sleep(0.005)
            os.kill(core.pid, signal.SIGSTOP)
            timeline["stopped"] = time.monotonic()
            try:
                while not _lines(caplog, "stalled"):
                    assert time.monotonic() - timeline["stopped"] < TIMEOUT_S + 5, "no stall line"
                    await asyncio.sleep(0.02)
                timeline["reported"] = time.monotonic()
                timeline["gauge_stalled"] = otel.gauge("rollout.engine.stalled", model) or 0.0
                timeline["gauge_silence"] = otel.gauge("rollout.engine.silence", model) or 0.0
                timeline["gauge_oldest"] = otel.gauge("rollout.requests.oldest_age", model) or 0.0
            finally:
                os.kill(core.pid, signal.SIGCONT)
            await task
        return outputs

    with caplog.at_level(logging.INFO, logger="otel_rollout.stalls"):
        outputs = loop.run_until_complete(scenario())
        began = time.monotonic()
        while not _lines(caplog, "again"):
            assert time.monotonic() - began < 5, "no resume line"
            time.sleep(0.05)

    after = timeline["reported"] - timeline["stopped"]
    print(f"\nstall reported {after:.2f} s after SIGSTOP (timeout {TIMEOUT_S} s): {timeline}")
    assert TIMEOUT_S <= after <= TIMEOUT_S + 2.0, after  # within the configured time (+ a tick)
    (line,) = _lines(caplog, "stalled")
    assert line.levelno == logging.WARNING
    message = line.getMessage()
    assert f"engine {model!r} stalled" in message and "1 request(s) in flight" in message
    assert "step 41: 0 of 1 requests done" in message
    assert timeline["gauge_stalled"] == 1.0
    assert timeline["gauge_silence"] > TIMEOUT_S
    assert timeline["gauge_oldest"] >= timeline["gauge_silence"]
    # the engine was only stopped, never changed: the request ran to its end
    assert len(outputs[-1].outputs[0].token_ids) == TOKENS and outputs[-1].finished
    assert otel.gauge("rollout.engine.stalled", model) == 0.0
    assert otel.gauge("rollout.engine.silence", model) == 0.0


def test_a_slow_step_that_keeps_producing_is_not_stalled(
    engine: Any,
    loop: asyncio.AbstractEventLoop,
    vllm_module: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Longer than the stall timeout, output all along: the watch stays quiet."""
    monkeypatch.setenv("OTEL_ROLLOUT_STALL_TIMEOUT", "1")
    stalls.watch(load_config().stall_timeout, engine_activities, open_step_progress)
    params = vllm_module.SamplingParams(max_tokens=TOKENS, ignore_eos=True, temperature=0.0)

    async def scenario() -> float:
        began = time.monotonic()
        while time.monotonic() - began < 3.0:  # ≥ 3 timeouts of generating
            async for _ in engine.generate("slow but alive", params, f"slow-{began}"):
                pass
        return time.monotonic() - began

    with caplog.at_level(logging.INFO, logger="otel_rollout.stalls"):
        ran = loop.run_until_complete(scenario())
    assert ran >= 3.0
    assert _lines(caplog, "stalled") == []


@pytest.fixture(autouse=True)
def _default_watch() -> Any:
    """Each test sets the process's watch to its own timeout; the suite's default after."""
    yield
    stalls.watch(load_config().stall_timeout, engine_activities, open_step_progress)
