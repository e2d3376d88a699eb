"""Fixtures for OpenRLHF's own rollout (its Ray rollout actor and samples generator)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import require_module


@pytest.fixture(scope="module")
def openrlhf_module() -> Any:
    """OpenRLHF itself (the openrlhf env: scripts/engine-env openrlhf); skipped elsewhere unless
    required."""
    return require_module("openrlhf")
