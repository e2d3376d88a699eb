"""Fixtures for verl's real agent-loop rollout: one job run per module, one OTLP receiver for it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from testkit.otlp_receiver import OTLPReceiver
from tests.conftest import require_module


@pytest.fixture(scope="module")
def verl_module() -> Any:
    """verl itself (the verl env: scripts/engine-env verl); skipped elsewhere unless required."""
    return require_module("verl")


@pytest.fixture(scope="module")
def module_receiver() -> Iterator[OTLPReceiver]:
    receiver = OTLPReceiver().start()
    yield receiver
    receiver.stop()
