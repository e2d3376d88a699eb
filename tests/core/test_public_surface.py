"""What users may import is explicit: the public modules below, each with ``__all__``.

Every entry point, every import in the README, in docs/ and in examples/ names a module of that
list and a name of its ``__all__``; docs/ARCHITECTURE.md lists the same modules. Anything else
under ``otel_rollout`` is internal and may change without notice.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[2]
PUBLIC = (
    "otel_rollout",
    "otel_rollout.vllm",
    "otel_rollout.sglang",
    "otel_rollout.ray",
    "otel_rollout.ray.instrumentor",
    "otel_rollout.http",
    "otel_rollout.frameworks.verl",
    "otel_rollout.frameworks.trl",
    "otel_rollout.frameworks.openrlhf",
    "otel_rollout.frameworks.slime",
    "otel_rollout.steps",
    "otel_rollout.phases",
    "otel_rollout.trajectories",
    "otel_rollout.sdk",
    "otel_rollout.exposition",
    "otel_rollout.ids",
)


@pytest.mark.parametrize("name", PUBLIC)
def test_a_public_module_declares_its_names(name: str) -> None:
    module = importlib.import_module(name)
    names = getattr(module, "__all__", None)
    assert names, f"{name} has no __all__"
    for item in names:
        assert getattr(module, item, None) is not None, f"{name}.{item}"


def _documented_imports() -> list[tuple[str, str, str | None]]:
    """(where, module, name or None) for every otel_rollout import in docs and examples."""
    sources: list[tuple[str, str]] = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in re.findall(r"```python\n(.*?)```", path.read_text(), re.S):
            sources.append((path.name, block))
    for path in sorted((REPO / "examples").glob("*.py")):
        sources.append((path.name, path.read_text()))
    found = []
    for where, code in sources:
        try:
            tree = ast.parse(code)
        except SyntaxError:  # a fragment with "…": its import lines still count
            tree = ast.parse(
                "\n".join(x for x in code.splitlines() if x.startswith(("from ", "import ")))
            )
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("otel_rollout"):
                found += [(where, str(node.module), a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found += [
                    (where, a.name, None) for a in node.names if a.name.startswith("otel_rollout")
                ]
    return found


def test_docs_and_examples_use_only_the_public_surface() -> None:
    found = _documented_imports()
    assert len(found) >= 5  # the README's own examples were seen
    outside = []
    for where, module, name in found:
        if module not in PUBLIC:
            if name is None or f"{module}.{name}" not in PUBLIC:
                outside.append(f"{where}: {module} {name or ''}")
            continue
        if name is not None and name not in importlib.import_module(module).__all__:
            outside.append(f"{where}: {module}.{name}")
    assert not outside, outside


def test_entry_points_are_public() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    targets = [t for group in project["entry-points"].values() for t in group.values()]
    targets += list(project.get("scripts", {}).values())
    assert len(targets) >= 6
    for target in targets:
        module, _, name = target.partition(":")
        if module == "otel_rollout.cli":  # the console script, not an import
            continue
        assert module in PUBLIC, target
        assert name.split(".")[0] in importlib.import_module(module).__all__, target


def test_architecture_lists_the_public_modules() -> None:
    text = (REPO / "docs/ARCHITECTURE.md").read_text()
    section = text.split("## Public surface", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`(otel_rollout(?:\.[a-z_]+)*)`", section))
    assert listed == set(PUBLIC)
