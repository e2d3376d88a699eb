"""SGLang: a long non-streamed request is slow, not stalled; a stopped scheduler is stalled (#12).

A non-streamed request reaches our wrapper only when it finishes. Between finishes the sign of
output is the tokenizer manager's own ``last_receive_tstamp``, which the scheduler refreshes at
least every ``SGLANG_FORCE_STREAM_INTERVAL`` (50) tokens: a request running for several stall
timeouts must not be called stalled. The stall is real: the engine's scheduler and detokenizer
processes are stopped with SIGSTOP mid-request and continued with SIGCONT.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from otel_rollout import rollout_step, stalls
from otel_rollout.config import load_config
from otel_rollout.sglang import adapter
from otel_rollout.steps import open_step_progress
from otel_rollout.telemetry import engine_activities
from testkit.processes import descendant_pids
from tests.conftest import OTelHarness
from tests.sglang.conftest import start_engine

pytestmark = pytest.mark.sglang

TOKENS = 1500
TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def engine_and_pids(
    sglang_module: Any, tiny_model: str, instrumented: Any
) -> Iterator[tuple[Any, set[int]]]:
    before = descendant_pids()
    eng = start_engine(sglang_module, tiny_model)
    yield eng, descendant_pids() - before
    eng.shutdown()


@pytest.fixture(autouse=True)
def _default_watch() -> Iterator[None]:
    yield
    stalls.watch(load_config().stall_timeout, engine_activities, open_step_progress)


def _lines(caplog: pytest.LogCaptureFixture, word: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "otel_rollout.stalls" and word in r.getMessage()]


def _generate_in_thread(engine: Any, prompt: str) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        with rollout_step(77):
            out.append(
                engine.generate(
                    prompt, {"max_new_tokens": TOKENS, "ignore_eos": True, "temperature": 0}
                )
            )

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_slow_is_not_stalled_and_a_stopped_scheduler_is(
    engine_and_pids: tuple[Any, set[int]],
    otel: OTelHarness,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine, pids = engine_and_pids
    model = adapter.model_name(engine.tokenizer_manager)
    caplog.set_level(logging.INFO, logger="otel_rollout.stalls")

    # 1. slow, not stuck: one non-streamed request running for several timeouts (after a short
    # one: the engine's first request pays its warm-up, which is not what is measured here)
    engine.generate("warm up", {"max_new_tokens": 4})
    monkeypatch.setenv("OTEL_ROLLOUT_STALL_TIMEOUT", str(TIMEOUT_S))
    stalls.watch(load_config().stall_timeout, engine_activities, open_step_progress)
    began = time.monotonic()
    thread, out = _generate_in_thread(engine, "slow but alive")
    thread.join(timeout=120)
    ran = time.monotonic() - began
    print(f"\none non-streamed request of {TOKENS} tokens: {ran:.2f} s")
    assert out and out[0]["meta_info"]["completion_tokens"] == TOKENS
    assert ran > 2 * TIMEOUT_S, f"the request must outlast the timeout twice ({ran:.2f} s)"
    assert _lines(caplog, "stalled") == []

    # 2. stuck: the engine's processes stopped mid-request
    activity = next(a for _, m, a in engine_activities() if m == model)
    thread, out = _generate_in_thread(engine, "a request that hangs")
    started = time.time()
    while not (activity.active and (activity.probe and (activity.probe() or 0) > started)):
        assert time.time() - started < 30, "the scheduler never sent output"
        time.sleep(0.01)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        while not _lines(caplog, "stalled"):
            assert time.monotonic() - stopped < 2 + 5, "no stall line"
            time.sleep(0.02)
        after = time.monotonic() - stopped
        stalled_gauge = otel.gauge("rollout.engine.stalled", model)
        silence = otel.gauge("rollout.engine.silence", model)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    thread.join(timeout=120)
    print(f"stall reported {after:.2f} s after SIGSTOP (timeout 2 s)")
    assert 2.0 <= after <= 4.0, after
    (line,) = _lines(caplog, "stalled")
    assert f"engine {model!r} stalled" in line.getMessage()
    assert "step 77: 0 of 1 requests done" in line.getMessage()
    assert stalled_gauge == 1.0 and (silence or 0) > 2.0
    assert out and out[0]["meta_info"]["completion_tokens"] == TOKENS  # only stopped, not changed
    deadline = time.monotonic() + 5
    while not _lines(caplog, "again"):
        assert time.monotonic() < deadline, "no resume line"
        time.sleep(0.05)
    assert otel.gauge("rollout.engine.stalled", model) == 0.0
