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
    for relative in (
        "analysis.py",
        "engine_analysis.py",
        "quantiles.py",
        "reports/summary.py",
        "reports/steplog.py",
        "reports/png.py",
    ):
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


LONG_MODULE_LINES = 400
REASON = "Why one module of this size:"


def test_a_long_module_says_why_at_its_top() -> None:
    """A room that grows past ~400 lines is split, or says in its docstring why it is one room."""
    silent = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > LONG_MODULE_LINES and REASON not in (
            ast.get_docstring(ast.parse(text)) or ""
        ):
            silent.append(str(path.relative_to(PACKAGE.parent)))
    assert not silent, (
        f"over {LONG_MODULE_LINES} lines without {REASON!r} in the docstring: {silent}"
    )


def _sdk_private_names() -> set[str]:
    """Underscore names of the SDK's classes and of its providers, tracers and meters."""
    import importlib
    import inspect
    import pkgutil

    import opentelemetry.sdk
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    names: set[str] = set()
    for info in pkgutil.walk_packages(opentelemetry.sdk.__path__, "opentelemetry.sdk."):
        try:
            module = importlib.import_module(info.name)
        except Exception:  # an optional extra of the SDK that is not installed
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__.startswith("opentelemetry.sdk"):
                names |= {n for n in dir(cls) if n.startswith("_") and not n.startswith("__")}
    tracers, meters = TracerProvider(shutdown_on_exit=False), MeterProvider(shutdown_on_exit=False)
    for obj in (tracers, meters, tracers.get_tracer("t"), meters.get_meter("m")):
        names |= {n for n in vars(obj) if n.startswith("_")}
    meters.shutdown()
    return names


def _own_attribute_names() -> set[str]:
    """Names our own classes define (``self.x = …``, ``def x``): those are ours, not the SDK's."""
    own: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if path.name == "sdk_internals.py":  # what it defines there is the SDK's protocol
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    own.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                own.add(node.name)
    return own


def test_sdk_privates_are_touched_only_in_the_seam() -> None:
    """Every reach past the SDK's public API lives in ``sdk_internals.py``, whose tests run on
    each declared SDK version; anywhere else an SDK upgrade could break us unseen."""
    private = _sdk_private_names() - _own_attribute_names()
    assert {"_atexit_handler", "_create_aggregation"} <= _sdk_private_names()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "sdk_internals.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in private:
                name = node.attr
            elif isinstance(node, ast.Constant) and node.value in private:
                name = str(node.value)  # getattr(provider, "_x")
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("opentelemetry.sdk") and (
                    "._" in node.module or any(a.name.startswith("_") for a in node.names)
                ):
                    name = node.module
            if name:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {name}")
    assert not found, found


def test_suites_share_helpers_only_through_testkit() -> None:
    """A suite imports from its own folder, ``tests.conftest`` (the root fixtures) and
    ``testkit``; a helper two suites need moves to ``testkit/`` (docs/ARCHITECTURE.md)."""
    tests = PACKAGE.parent / "tests"
    crossing = []
    for path in sorted(tests.rglob("*.py")):
        suite = path.relative_to(tests).parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                parts = node.module.split(".")
                if parts[0] == "tests" and len(parts) > 1 and parts[1] not in (suite, "conftest"):
                    crossing.append(f"{path.relative_to(tests)}: {node.module}")
    assert not crossing, crossing
