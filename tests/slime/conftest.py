"""Fixtures for slime's rollout layout: Ray and sglang-router beside SGLang (the slime env)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import require_module


@pytest.fixture(scope="module")
def slime_layout() -> Any:
    """sglang-router, Ray and SGLang (scripts/engine-env slime); skipped elsewhere unless
    required."""
    require_module("sglang")
    require_module("ray")
    return require_module("sglang_router")
