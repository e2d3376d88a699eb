"""Engine servers started as their users start them: under ``opentelemetry-instrument``.

Used by the server suite (tests/servers) and by framework suites that talk to a server (TRL's
server mode). A server is started with OTLP exporting to a real receiver, waited for on
``/health``, and its whole process group killed at the end. The server's log goes to a file that
is shown when start-up fails.

``OTEL_ROLLOUT_SERVER_PYTHON`` (a Python of another engine environment, e.g. one with an older
vLLM) starts the server there instead of in the test's own environment; the client side stays
in the test process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from testkit.engines import SGLANG_MAX_TOTAL_TOKENS, VLLM_DTYPE, sglang_mem_fraction
from testkit.otlp_receiver import OTLPReceiver, attr

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "testkit" / "sgl_kernel_standin"
START_TIMEOUT_S = 240.0


@dataclass
class Server:
    url: str
    model: str
    log: Path
    proc: subprocess.Popen[bytes]

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def server_python() -> Path:
    """The interpreter that runs the server (its ``bin/`` holds ``opentelemetry-instrument``)."""
    return Path(os.environ.get("OTEL_ROLLOUT_SERVER_PYTHON") or sys.executable)


def require_in_server(module: str) -> None:
    """Skip unless the server's environment can import ``module``."""
    probe = subprocess.run(
        [str(server_python()), "-c", f"import {module}"], capture_output=True, timeout=120
    )
    if probe.returncode != 0:
        pytest.skip(f"{module} is not installed in {server_python()}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(receiver: OTLPReceiver, *, fastapi: bool, **extra: str) -> dict[str, str]:
    """OTel settings as a user would export them, OTLP to ``receiver``.

    ``fastapi=False`` disables the FastAPI instrumentation where it is installed, so one
    environment covers servers with and without it.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    paths = [str(REPO), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(paths),
            "OTEL_SERVICE_NAME": "rollout-server",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
    )
    if not fastapi:
        env["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = "fastapi"
    env.update(extra)
    return env


def start_server(args: list[str], env: dict[str, str], model: str, port: int, log: Path) -> Server:
    """``opentelemetry-instrument python -m <server> …``; returns once ``/health`` answers 200."""
    python = server_python()
    command = [str(python.parent / "opentelemetry-instrument"), str(python), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", model, log, proc)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            if requests.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except requests.RequestException:
            pass
        time.sleep(0.5)
    stop_server(server)
    pytest.fail(f"server not healthy after {START_TIMEOUT_S:.0f} s:\n{server.log_tail()}")


def stop_server(server: Server) -> None:
    """SIGTERM, then SIGKILL, to the server's own process group (the engine's children too)."""
    if server.proc.poll() is None:
        try:
            os.killpg(server.proc.pid, signal.SIGTERM)
            server.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(server.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.proc.wait(timeout=30)


def vllm_server(
    model: str,
    receiver: OTLPReceiver,
    log: Path,
    *,
    fastapi: bool = False,
    engine_tracing: bool = False,
) -> Server:
    """vLLM's OpenAI server; ``engine_tracing`` turns on vLLM's own ``llm_request`` spans."""
    port = free_port()
    args = [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--enforce-eager",
        "--dtype",
        VLLM_DTYPE,  # not bfloat16: see testkit/engines.py
        "--max-model-len",
        "2048",
        "--distributed-executor-backend",
        "uni",
    ]
    if engine_tracing:
        # The scheme matters: vLLM 0.12's gRPC exporter tries TLS without http:// (0.32 forces
        # insecure either way).
        args += ["--otlp-traces-endpoint", receiver.grpc_endpoint]
    env = server_env(
        receiver,
        fastapi=fastapi,
        VLLM_CPU_KVCACHE_SPACE="1",
        OMP_NUM_THREADS="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    return start_server(args, env, model, port, log)


def sglang_server(
    model: str,
    receiver: OTLPReceiver,
    log: Path,
    *,
    fastapi: bool = False,
    engine_tracing: bool = False,
) -> Server:
    """SGLang's HTTP server on the CPU engine (settings of tests/sglang/conftest.py)."""
    port = free_port()
    args = [
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--dtype",
        "bfloat16",
        "--mem-fraction-static",
        str(sglang_mem_fraction()),  # derived from free memory: see testkit/engines.py
        "--max-total-tokens",
        str(SGLANG_MAX_TOTAL_TOKENS),
        "--disable-cuda-graph",
        "--skip-server-warmup",
    ]
    if engine_tracing:
        args += ["--enable-trace", "--otlp-traces-endpoint", f"127.0.0.1:{receiver.grpc_port}"]
    env = server_env(receiver, fastapi=fastapi, SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), env["PYTHONPATH"]])
    return start_server(args, env, model, port, log)


def request_spans(receiver: OTLPReceiver, provider: str) -> list[Any]:
    """Our request spans: the ones carrying ``gen_ai.provider.name`` = ``provider``."""
    return [
        s
        for s in receiver.spans()
        if attr(s.attributes, "gen_ai.provider.name") == provider
        and attr(s.attributes, "gen_ai.operation.name") is not None
    ]
