"""Under ``opentelemetry-instrument`` a process pays only for what it imports (issue #11).

Every process of a job inherits the start-up hook; before lazy instrumentation each one imported
vLLM and torch (10–13 s here) and ``ray.init()`` timed out in 3 of 4 tries on this 2-core machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm
BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    return env


def test_a_process_without_engines_loads_none(vllm_module: Any) -> None:
    code = (
        "import sys; print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'vllm', 'sglang', 'torch', 'ray', 'transformers'}))"
    )
    out = subprocess.run(
        [str(BIN / "opentelemetry-instrument"), sys.executable, "-c", code],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


def test_ray_init_starts_every_time_under_opentelemetry_instrument(vllm_module: Any) -> None:
    code = (
        "import ray; ray.init(num_cpus=1, include_dashboard=False); "
        "print(ray.get(ray.remote(lambda: 'ok').remote(), timeout=120)); ray.shutdown()"
    )
    for attempt in range(3):
        out = subprocess.run(
            [str(BIN / "opentelemetry-instrument"), sys.executable, "-c", code],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert out.returncode == 0 and out.stdout.strip().endswith("ok"), (
            f"attempt {attempt}: {out.stderr[-3000:]}"
        )
