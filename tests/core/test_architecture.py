"""The package's shape, checked: imports point one way, and nothing loads an engine by itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "otel_rollout"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """otel_rollout modules imported by ``path`` anywhere: lazy and type-only imports count too,
    since a layer that needs another's types depends on it as much as one that calls it."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "otel_rollout")
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.split(".")[0] == "otel_rollout"
        ):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found


def test_no_import_cycle_in_the_package() -> None:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _imports(path, set(paths)) - {name} for name, path in paths.items()}
    # A package's __init__ re-exporting its own submodules is not a layer pointing back.
    graph = {
        name: {d for d in deps if not name.startswith(d + ".")} for name, deps in graph.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep in graph and state.get(dep) is None:
                visit(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if state.get(name) is None:
            visit(name)
    assert len(graph) > 15  # the walk saw the whole package


def test_analysis_and_reports_do_not_touch_the_sdk() -> None:
    """Pure analysis and the reports stay free of OTel set-up: the CLI renders logs anywhere."""
    for relative in ("analysis.py", "reports/summary.py", "reports/steplog.py", "reports/png.py"):
        text = (PACKAGE / relative).read_text()
        assert "opentelemetry" not in text, relative
        assert "otel_rollout.telemetry" not in text, relative


def test_attribute_builders_are_pure() -> None:
    """What a span or point carries is decided without tracers, meters or context: only the
    semantic-convention names come from OpenTelemetry."""
    tree = ast.parse((PACKAGE / "attributes.py").read_text())
    otel = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and "opentelemetry" in node.module
    }
    assert otel and all(m.startswith("opentelemetry.semconv") for m in otel), otel


def test_importing_the_package_and_instrumenting_loads_no_engine() -> None:
    """Instrumentors patch engines when the program imports them; they never import one."""
    code = (
        "import sys\n"
        "from otel_rollout.vllm import VLLMInstrumentor\n"
        "from otel_rollout.sglang import SGLangInstrumentor\n"
        "VLLMInstrumentor().instrument(); SGLangInstrumentor().instrument()\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('vllm', 'sglang', 'torch', 'ray', 'transformers'))\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
