"""Agentic trajectories on the real SGLang CPU engine: the same ``examples/agent_loop.py`` and
the same check as on vLLM (``testkit/agent_loop.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.agent_loop import load_example, run_and_check
from tests.conftest import OTelHarness
from tests.sglang.conftest import start_engine

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def engine(sglang_module: Any, tiny_model: str, instrumented: Any) -> Iterator[Any]:
    eng = start_engine(sglang_module, tiny_model)
    yield eng
    eng.shutdown()


def test_each_sample_is_one_trajectory_of_its_turns_tool_and_reward(
    otel: OTelHarness,
    engine: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    generate = load_example().sglang_generate(engine)
    run_and_check(otel, generate, monkeypatch, tmp_path, capsys)
