"""SGLang engines start whatever else holds memory (issue #40 item 4).

A fresh-clone run beside other jobs (10 of 24 GB in use) lost two SGLang suites at set-up: on
CPU SGLang 0.5.23 refuses to start unless, after loading the model, free host memory is at least
``(1 - mem_fraction_static)`` of what it was before, and a fixed 0.05 leaves too little once free
memory is small. Here a second process holds memory until only 6 GiB are free, as on that
machine: the fixed 0.05 is refused with SGLang's own message, the derived fraction starts, with
the same token-bounded pool, and serves.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from testkit.engines import SGLANG_MAX_TOTAL_TOKENS, sglang_mem_fraction
from tests.sglang.conftest import start_engine
from tests.sglang.helpers import params

pytestmark = pytest.mark.sglang

LEFT_FREE = 6 << 30

HOLDER = """
import sys, time
n = int(sys.argv[1])
block = bytearray(n)
block[:: 4096] = b"\\x01" * len(range(0, n, 4096))  # touch every page: really held
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def busy_memory() -> Iterator[int]:
    """Another process holding memory until about :data:`LEFT_FREE` is available."""
    hold = psutil.virtual_memory().available - LEFT_FREE
    if hold <= 0:
        pytest.fail(f"less than {LEFT_FREE >> 30} GiB free before the test: cannot stage it")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(hold)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield psutil.virtual_memory().available
    finally:
        proc.kill()
        proc.wait()


def test_the_engine_starts_and_serves_when_little_memory_is_free(
    sglang_module: Any, tiny_model: str, instrumented: Any, busy_memory: int
) -> None:
    with pytest.raises(Exception, match="Loaded weights leave no GPU memory for the KV cache"):
        start_engine(sglang_module, tiny_model, mem_fraction_static=0.05).shutdown()
    fraction = sglang_mem_fraction()
    assert fraction > 0.05
    engine = start_engine(sglang_module, tiny_model)  # the derived fraction
    try:
        out = engine.generate("a prompt on a busy machine", params(4))
        assert out["meta_info"]["completion_tokens"] == 4
        info = engine.get_server_info()
        assert info["max_total_num_tokens"] <= SGLANG_MAX_TOTAL_TOKENS  # bounded by tokens
    finally:
        engine.shutdown()
