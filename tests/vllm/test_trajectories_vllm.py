"""Agentic trajectories on the real vLLM CPU engine: ``examples/agent_loop.py`` (two turns, a
real subprocess tool, a reward per sample) — the spans and the step's trajectory figures equal the
loop's own record (``testkit/agent_loop.py``; the SGLang counterpart is in tests/sglang)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testkit.agent_loop import load_example, run_and_check
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm


def test_each_sample_is_one_trajectory_of_its_turns_tool_and_reward(
    otel: OTelHarness,
    llm: Any,
    vllm_module: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    generate = load_example().vllm_generate(llm, vllm_module)
    run_and_check(otel, generate, monkeypatch, tmp_path, capsys)
