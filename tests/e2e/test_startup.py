"""Under ``opentelemetry-instrument`` a process pays only for what it imports (issue #11).

Every process of a job inherits the start-up hook; before lazy instrumentation each one imported
vLLM and torch (10–13 s here) and ``ray.init()`` timed out in 3 of 4 tries on this 2-core machine.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from testkit.processes import run_reaped

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


def _ray_start(instrumented: bool) -> tuple[bool, float, str]:
    """One ``ray.init()`` + task + shutdown: (started, seconds, stderr tail)."""
    code = (
        "import ray; ray.init(num_cpus=1, include_dashboard=False); "
        "print(ray.get(ray.remote(lambda: 'ok').remote(), timeout=120)); ray.shutdown()"
    )
    prefix = [str(BIN / "opentelemetry-instrument")] if instrumented else []
    started = time.monotonic()
    try:
        out = run_reaped(
            [*prefix, sys.executable, "-c", code],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as exc:
        return False, time.monotonic() - started, str(exc.stderr or "")[-2000:]
    ok = out.returncode == 0 and out.stdout.strip().endswith("ok")
    return ok, time.monotonic() - started, out.stderr[-2000:]


def test_ray_init_starts_under_opentelemetry_instrument_as_without(vllm_module: Any) -> None:
    """Measured against Ray itself on the same machine at the same moment, not an absolute.

    On a loaded 2-core box Ray's own node start-up can time out with or without us; what we
    must not do is add failures or seconds. Plain and instrumented starts alternate, so both
    see the same load; each kind gets three tries.
    """
    runs: dict[bool, list[tuple[bool, float, str]]] = {False: [], True: []}
    for _ in range(3):
        for instrumented in (False, True):
            runs[instrumented].append(_ray_start(instrumented))
    plain_ok = sum(ok for ok, _, _ in runs[False])
    ours_ok = sum(ok for ok, _, _ in runs[True])
    if plain_ok == 0:
        pytest.skip(f"Ray itself did not start here now (load): {runs[False][-1][2][-500:]}")
    failures = [err for ok, _, err in runs[True] if not ok]
    assert ours_ok >= plain_ok, f"{ours_ok}/3 instrumented vs {plain_ok}/3 plain: {failures}"
    plain_s = statistics.median(t for ok, t, _ in runs[False] if ok)
    ours_s = statistics.median(t for ok, t, _ in runs[True] if ok)
    # opentelemetry-instrument loads the SDK and the distro (~1 s here); engines are not loaded
    assert ours_s - plain_s < max(5.0, plain_s), (plain_s, ours_s)
