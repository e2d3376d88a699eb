"""The hook layer on real (stdlib) modules: lazy application, version gates, exact undo.

``LibraryInstrumentor`` is engine-neutral; a stdlib module stands in for "a library the program
may or may not import", so these run without any engine. (The engine instrumentors are tested the
same way on the real engines in tests/vllm, tests/sglang, tests/steps.)
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _run(body: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent("""
        import logging, sys
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="LOG %(message)s")
        from otel_rollout.instrumentation import LibraryInstrumentor, Target
        import otel_rollout.instrumentation as layer

        calls = []
        def wrapper(wrapped, instance, args, kwargs):
            calls.append(args)
            return wrapped(*args, **kwargs)

        class Colors(LibraryInstrumentor):
            engine_module = "colorsys"
            engine_name = "colorsys"
            min_version = (1,)
            max_tested = (2, 0)
            def _targets(self):
                return [Target("colorsys", "rgb_to_hsv", wrapper)]
        """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_applied_only_when_the_program_imports_the_module() -> None:
    out = _run("""
        layer.module_version = lambda name: "1.5"
        Colors().instrument()
        assert "colorsys" not in sys.modules          # instrumenting imported nothing
        import colorsys
        colorsys.rgb_to_hsv(0.1, 0.2, 0.3)
        print("calls", len(calls))
        Colors().uninstrument()
        colorsys.rgb_to_hsv(0.1, 0.2, 0.3)
        print("after", len(calls), hasattr(colorsys.rgb_to_hsv, "__wrapped__"))
    """)
    assert out.returncode == 0, out.stderr
    assert "calls 1" in out.stdout and "after 1 False" in out.stdout


def test_uninstrument_before_import_retires_the_hook() -> None:
    out = _run("""
        layer.module_version = lambda name: "1.5"
        Colors().instrument(); Colors().uninstrument()
        import colorsys
        colorsys.rgb_to_hsv(0.1, 0.2, 0.3)
        print("calls", len(calls))
    """)
    assert out.returncode == 0, out.stderr
    assert "calls 0" in out.stdout


@pytest.mark.parametrize(
    "version, patched, message",
    [
        ("0.9", False, "older than the supported 1"),
        ("3.1", True, "newer than the newest tested (2.0)"),
        ("2.0.7", True, None),
        # read as pip reads them: a pre-release, post-release, dev or local build of the tested
        # release is that release (once "0.32.0rc1" read as 0.32.1, newer than tested)
        ("2.0.0rc1", True, None),
        ("2.0.0.post2", True, None),
        ("2.0.0.dev3", True, None),
        ("2.0.0+cpu", True, None),
        ("0.9.1rc12", False, "older than the supported 1"),
        ("2.1rc1", True, "newer than the newest tested (2.0)"),
        ("main-g1234", True, "not a PEP 440 version"),
    ],
)
def test_version_gates(version: str, patched: bool, message: str | None) -> None:
    out = _run(f'''
        layer.module_version = lambda name: "{version}"
        import colorsys
        Colors().instrument()
        colorsys.rgb_to_hsv(0.1, 0.2, 0.3)
        print("calls", len(calls))
    ''')
    assert out.returncode == 0, out.stderr
    assert f"calls {int(patched)}" in out.stdout
    logs = [line for line in out.stdout.splitlines() if line.startswith("LOG ")]
    if message is None:
        assert logs == []
    else:
        assert len(logs) == 1 and message in logs[0]


@pytest.mark.parametrize(
    "version, release",
    [
        ("0.32.0rc1", (0, 32, 0)),
        ("0.11.1rc2", (0, 11, 1)),
        ("0.32.0+cpu", (0, 32, 0)),
        ("0.10.1.post1", (0, 10, 1)),
        ("0.33.0.dev12+g1a2b", (0, 33, 0)),
        ("dev", None),
    ],
)
def test_version_tuple_reads_versions_like_pip(
    version: str, release: tuple[int, ...] | None
) -> None:
    from otel_rollout.instrumentation import version_tuple

    assert version_tuple(version) == release


def test_argument_reads_a_call_as_the_signature_allows() -> None:
    from otel_rollout.instrumentation import argument

    assert argument(("p", "s"), {}, 1, "sampling_params") == "s"
    assert argument(("p",), {"sampling_params": "s"}, 1, "sampling_params") == "s"
    assert argument((), {"messages": "m"}, 0, "prompts", "messages") == "m"
    assert argument((), {"prompts": None, "messages": "m"}, 0, "prompts", "messages") is None
    assert argument((), {}, 0, "engine_core_outputs", default=()) == ()


@pytest.mark.parametrize(
    "distributions, floor, refused",
    [
        (("packaging",), "999", True),  # installed below the range: contrib's check refuses
        (("no-such-distribution-x", "packaging"), "1", False),  # any one of them satisfies
        (("no-such-distribution-x",), "1", False),  # none installed: the module's version decides
    ],
)
def test_the_declared_range_is_checked_as_any_of(
    distributions: tuple[str, ...], floor: str, refused: bool
) -> None:
    """A manual ``instrument()`` runs BaseInstrumentor's dependency check on the declared range
    (real distribution metadata: ``packaging`` is installed here)."""
    out = _run(f"""
        class Declared(Colors):
            distributions = {distributions!r}
            min_version = ({floor},)
        layer.module_version = lambda name: "{floor}.5"
        print("deps", Declared().instrumentation_dependencies())
        Declared().instrument()
        import colorsys
        colorsys.rgb_to_hsv(0.1, 0.2, 0.3)
        print("calls", len(calls))
    """)
    assert out.returncode == 0, out.stderr
    assert f"deps {tuple(f'{d} >= {floor}' for d in distributions)!r}" in out.stdout
    assert ("calls 0" if refused else "calls 1") in out.stdout
    assert ("fall outside of that range" in out.stdout) is refused
