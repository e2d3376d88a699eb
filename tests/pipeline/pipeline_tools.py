"""Helpers for the pipeline tests: locate required tools (failing loudly, never skipping) and
install the npm TraceQL parser into a cache directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

PROMTOOL_HINT = (
    "promtool is required (CI installs it): apt-get install -y --no-install-recommends prometheus"
)
NODE_HINT = (
    "node and npm (Node.js >= 18) are required (CI installs them): apt-get install -y nodejs npm"
)

# Pinned npm packages that parse TraceQL exactly as Grafana's editor does.
TRACEQL_NPM_PACKAGES = {"@grafana/lezer-traceql": "1.0.0", "@lezer/lr": "1.4.13"}


def require_tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH. {hint}", pytrace=False)
    return path


def npm_cache_dir() -> Path:
    """Where the TraceQL parser is installed: $OTEL_ROLLOUT_NPM_CACHE or <repo>/.cache/traceql-node."""
    return Path(os.environ.get("OTEL_ROLLOUT_NPM_CACHE", REPO / ".cache" / "traceql-node"))


def ensure_traceql_parser() -> Path:
    """Install the pinned @grafana/lezer-traceql + @lezer/lr into the cache dir if missing.

    Returns the directory holding node_modules. Fails the test (with how to fix) when node/npm
    are missing or the install fails.
    """
    require_tool("node", NODE_HINT)
    npm = require_tool("npm", NODE_HINT)
    cache = npm_cache_dir()
    stamp = cache / "installed.json"
    if (
        stamp.exists()
        and json.loads(stamp.read_text()) == TRACEQL_NPM_PACKAGES
        and all(
            (cache / "node_modules" / name / "package.json").exists()
            for name in TRACEQL_NPM_PACKAGES
        )
    ):
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "package.json").write_text(
        json.dumps({"private": True, "name": "otel-rollout-traceql-check"})
    )
    specs = [f"{name}@{version}" for name, version in TRACEQL_NPM_PACKAGES.items()]
    proc = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(cache), *specs],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"npm install {' '.join(specs)} into {cache} failed:\n{proc.stdout}\n{proc.stderr}",
            pytrace=False,
        )
    stamp.write_text(json.dumps(TRACEQL_NPM_PACKAGES))
    return cache


def parse_traceql(queries: list[str]) -> list[dict]:
    """Parse each query with the real TraceQL grammar; one {query, ok, errors} per query."""
    cache = ensure_traceql_parser()
    node = require_tool("node", NODE_HINT)
    proc = subprocess.run(
        [node, str(HERE / "traceql_parse.mjs"), str(cache)],
        input=json.dumps(queries),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        pytest.fail(f"traceql_parse.mjs failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return json.loads(proc.stdout)
