"""Source-level contract between our SGLang adapter and SGLang releases we cannot run here.

RL frameworks pin older SGLang releases (verl's images: 0.4.9.post6, 0.4.10.post2, 0.5.5,
0.5.6.post2, 0.5.8); only 0.5.23 runs on this CPU machine. Their wheels are pure Python, so this
test reads each released wheel as a zip archive with :mod:`ast` (nothing is imported or
installed) and checks, per version:

* every target :class:`SGLangInstrumentor` wraps exists, with the shape the wrapper relies on
  (``generate_request`` an async generator taking ``obj``; ``Engine.async_generate`` a coroutine
  the marker can await; ``Engine.generate`` a plain function);
* the ``GenerateReqInput`` fields ``request_shape`` reads are declared;
* every ``meta_info`` key the adapter reads (taken from ``otel_rollout/sglang/adapter.py`` itself,
  so the contract follows the adapter) is written somewhere into a ``meta_info`` by that release;
  a figure the adapter can read in several ways (the first token, the forward entry: its
  ``FIRST_TOKEN_SOURCES`` / ``SCHEDULED_SOURCES``) holds when the release writes every key of
  one of them;
* the instrumentor's version gate accepts the release.

0.5.23 (the tested release) is the control: everything must hold there. What an older release
lacks is marked ``xfail(strict=True)`` with the gap's name, so the file is the matrix, and a fix
in the adapter (reading another field, lowering the gate) flips it. Wheels are downloaded once into
``$OTEL_ROLLOUT_CACHE/wheels/sglang`` (default ``~/.cache/otel-rollout``), never into git.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from otel_rollout.instrumentation import version_tuple
from otel_rollout.sglang import SGLangInstrumentor
from otel_rollout.sglang.adapter import FIRST_TOKEN_SOURCES, SCHEDULED_SOURCES

REPO = Path(__file__).resolve().parents[2]
ADAPTER = REPO / "otel_rollout" / "sglang" / "adapter.py"
TESTED = "0.5.23"
VERSIONS = ("0.4.9.post6", "0.4.10.post2", "0.5.5", "0.5.6.post2", "0.5.8", TESTED)

# Known gaps, read off the wheels (file:line in the report of issue #14). Each one is an xfail
# that must keep failing; when the adapter stops depending on the missing piece it flips.
_NO_TTFT = (
    "0.4.x write neither first_token_latency, prefill_finished_ts nor decode_throughput: "
    "no engine TTFT"
)
_NO_RECEIVED = (
    "request_received_ts is not in meta_info before 0.5.5: with enable_metrics the "
    "span cannot be placed on the engine's arrival, only e2e_latency is exact"
)
_NO_FORWARD = (
    "0.4.x write neither forward_entry_time, forward_time nor inference_time: no queue time"
)
_NO_SENT = (
    "response_sent_to_client_ts is not in meta_info before 0.5.6: a stats-off span is "
    "anchored on when we saw the final chunk, and a stream's first token on our clock"
)
_NO_TRACE_HEADER = (
    "GenerateReqInput.external_trace_header exists only from 0.5.8: SGLang's own "
    "request spans cannot join our trace on older releases"
)
_NO_RETRACTIONS = (
    "meta_info has no num_retractions through 0.5.8: those releases' requests carry no "
    "preemption count (rollout.request.preemptions absent, never 0)"
)
_NO_SPEC_COUNTS = (
    "meta_info has no spec_num_proposed_drafts / spec_num_correct_drafts through 0.5.8 (only "
    "spec_verify_ct): their requests carry no speculative-decoding counts"
)
_NO_WEIGHT_VERSIONS = (
    "meta_info has no weight_versions through 0.5.8: those releases' requests carry the "
    "version we name or count (rollout.weight.version_source named / counted), never the "
    "engine's own per-token versions"
)
KNOWN_GAPS: dict[tuple[str, str], str] = {
    **{(v, "figure:first_token"): _NO_TTFT for v in ("0.4.9.post6", "0.4.10.post2")},
    **{(v, "meta:request_received_ts"): _NO_RECEIVED for v in ("0.4.9.post6", "0.4.10.post2")},
    **{(v, "figure:scheduled"): _NO_FORWARD for v in ("0.4.9.post6", "0.4.10.post2")},
    **{
        (v, "meta:response_sent_to_client_ts"): _NO_SENT
        for v in ("0.4.9.post6", "0.4.10.post2", "0.5.5")
    },
    **{
        (v, "field:external_trace_header"): _NO_TRACE_HEADER
        for v in ("0.4.9.post6", "0.4.10.post2", "0.5.5", "0.5.6.post2")
    },
    **{(v, "meta:num_retractions"): _NO_RETRACTIONS for v in VERSIONS if v != TESTED},
    **{(v, "meta:weight_versions"): _NO_WEIGHT_VERSIONS for v in VERSIONS if v != TESTED},
    **{
        (v, f"meta:{key}"): _NO_SPEC_COUNTS
        for v in VERSIONS
        if v != TESTED
        for key in ("spec_num_proposed_drafts", "spec_num_correct_drafts")
    },
}

# GenerateReqInput fields the adapter reads: request_shape (text, input_ids, sampling_params;
# input_embeds by getattr), RequestGroup (stream, rid), tracing interop (external_trace_header).
REQ_FIELDS = (
    "text",
    "input_ids",
    "input_embeds",
    "sampling_params",
    "rid",
    "stream",
    "external_trace_header",
)
# The engine operations (weight sync, memory release / resume, pause / continue) wrapped on
# TokenizerManager (otel_rollout.engine_ops): coroutines the offline Engine and the server await.
ENGINE_OPERATIONS = {
    f"TokenizerManager.{m}"
    for m in (
        "update_weights_from_disk",
        "update_weights_from_tensor",
        "update_weights_from_distributed",
        "update_weights_from_ipc",
        "release_memory_occupation",
        "resume_memory_occupation",
        "pause_generation",
        "continue_generation",
    )
}
# Calls that name the weights' version without loading any (otel_rollout.engine_ops
# version_name_wrapper): coroutines; read after they return.
VERSION_NAMES = {"TokenizerManager.update_weight_version"}
# Attributes of TokenizerManager read for the model label (one of them suffices).
MODEL_ATTRS = ("served_model_name", "model_path")


def _cache_dir() -> Path:
    root = Path(os.environ.get("OTEL_ROLLOUT_CACHE") or Path.home() / ".cache" / "otel-rollout")
    return root / "wheels" / "sglang"


@cache
def _wheel(version: str) -> Path:
    """The released wheel of ``version``, downloaded once (pip, no dependencies, no install)."""
    folder = _cache_dir()
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                f"sglang=={version}",
                "-d",
                str(folder),
            ],
            capture_output=True,
            text=True,
        )
        found = sorted(folder.glob(f"sglang-{version}-*.whl"))
        if not found:
            pytest.fail(f"cannot download sglang=={version}: {done.stderr[-2000:]}")
    return found[-1]


class Release:
    """One SGLang release, read as source from its wheel."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.zip = zipfile.ZipFile(_wheel(version))
        self.names = set(self.zip.namelist())

    def source(self, path: str) -> str | None:
        return self.zip.read(path).decode() if path in self.names else None

    @cache  # noqa: B019 - one Release per version for the whole session
    def module(self, dotted: str) -> ast.Module | None:
        path = dotted.replace(".", "/") + ".py"
        text = self.source(path)
        if text is None:
            text = self.source(dotted.replace(".", "/") + "/__init__.py")
        return None if text is None else ast.parse(text)

    def declared_version(self) -> str:
        """The wheel's own metadata version (sglang/version.py is generated in newer releases)."""
        (meta,) = [n for n in self.names if n.endswith(".dist-info/METADATA")]
        for line in self.zip.read(meta).decode().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
        raise AssertionError("no Version in METADATA")

    def fields(self, dotted: str, cls_name: str, depth: int = 0) -> set[str]:
        """Annotated fields of a (data)class, with those of its sglang base classes."""
        cls = self.find_class(dotted, cls_name)
        if cls is None or depth > 3:
            return set()
        out = {
            n.target.id
            for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        tree = self.module(dotted)
        imports = _imports(tree) if tree is not None else {}
        for base in cls.bases:
            if isinstance(base, ast.Name):
                out |= self.fields(imports.get(base.id, dotted), base.id, depth + 1)
        return out

    def find_class(self, dotted: str, name: str, depth: int = 0) -> ast.ClassDef | None:
        """Class ``name`` as the module exposes it: defined there or imported from sglang."""
        tree = self.module(dotted)
        if tree is None or depth > 3:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.find_class(node.module, alias.name, depth + 1)
        return None

    def find_method(
        self,
        dotted: str,
        cls_name: str,
        method: str,
    ) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """``cls_name.method`` in its class body or in a base class (mixin) found in sglang."""
        cls = self.find_class(dotted, cls_name)
        if cls is None:
            return None
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == method:
                return node
        tree = self.module(dotted)
        imports = _imports(tree) if tree is not None else {}
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in imports:
                found = self.find_method(imports[base.id], base.id, method)
                if found is not None:
                    return found
        return None

    def python_files(self, prefixes: tuple[str, ...]) -> Iterator[tuple[str, ast.Module]]:
        for name in sorted(self.names):
            if name.endswith(".py") and name.startswith(prefixes):
                yield name, ast.parse(self.zip.read(name).decode())


def _imports(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                out[alias.asname or alias.name] = node.module
    return out


@cache
def release(version: str) -> Release:
    return Release(version)


# --- what the adapter reads ----------------------------------------------------------------


def adapter_meta_keys() -> set[str]:
    """Keys the adapter reads from ``meta_info``: ``meta.get("…")`` calls in adapter.py."""
    keys = set()
    for node in ast.walk(ast.parse(ADAPTER.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "meta"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            keys.add(node.args[0].value)
    return keys


# --- what a release writes into meta_info ---------------------------------------------------

_META_NAMES = ("meta_info", "meta_data")


def _mentions_meta(node: ast.AST) -> bool:
    return any(name in ast.unparse(node) for name in _META_NAMES)


@cache
def produced_meta_keys(rel: Release) -> dict[str, str]:
    """``key -> file:line`` of every string key a release writes into a ``meta_info`` dict.

    Counted: ``<…meta_info…>["k"] = v``; ``{"k": v}`` assigned to, updating, or stored as a
    ``meta_info``; ``"k"`` passed with ``meta_info`` to a helper (``_add_metric_if_present``);
    and subscript stores inside a function whose name says it builds meta info.
    """
    found: dict[str, str] = {}

    def add(key: object, where: str) -> None:
        if isinstance(key, str):
            found.setdefault(key, where)

    for path, tree in rel.python_files(
        (
            "sglang/srt/managers/",
            "sglang/srt/observability/",
            "sglang/srt/entrypoints/engine.py",
            "sglang/srt/utils/weight_versions.py",  # 0.5.23: meta_info["weight_versions"]
        )
    ):
        functions = [
            n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        meta_builders = {
            id(sub) for fn in functions if "meta_info" in fn.name for sub in ast.walk(fn)
        }
        for node in ast.walk(tree):
            where = f"{path}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if (
                        isinstance(target, ast.Subscript)
                        and isinstance(target.slice, ast.Constant)
                        and (_mentions_meta(target.value) or id(target) in meta_builders)
                    ):
                        add(target.slice.value, where)
                    if isinstance(node.value, ast.Dict) and _mentions_meta(target):
                        for key in node.value.keys:
                            if isinstance(key, ast.Constant):
                                add(key.value, where)
            elif isinstance(node, ast.Call):
                func = node.func
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr == "update"
                    and _mentions_meta(func.value)
                ):
                    for arg in node.args:
                        if isinstance(arg, ast.Dict):
                            for key in arg.keys:
                                if isinstance(key, ast.Constant):
                                    add(key.value, where)
                    for kw in node.keywords:
                        add(kw.arg, where)
                elif any(isinstance(a, ast.Name) and a.id in _META_NAMES for a in node.args):
                    for arg in node.args:
                        if isinstance(arg, ast.Constant):
                            add(arg.value, where)
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if (
                        isinstance(key, ast.Constant)
                        and key.value == "meta_info"
                        and isinstance(value, ast.Dict)
                    ):
                        for inner in value.keys:
                            if isinstance(inner, ast.Constant):
                                add(inner.value, where)
    return found


# --- the contract ---------------------------------------------------------------------------


FIGURES = {"first_token": FIRST_TOKEN_SOURCES, "scheduled": SCHEDULED_SOURCES}
"""Figures the adapter reads in one of several ways: each holds when one way's keys all do."""


def _items() -> list[object]:
    alternative = {key for sources in FIGURES.values() for keys in sources for key in keys}
    meta = sorted(adapter_meta_keys() - alternative)
    out: list[object] = []
    for version in VERSIONS:
        items = [
            "targets",
            *(f"field:{f}" for f in REQ_FIELDS),
            "model_attr",
            *(f"meta:{k}" for k in meta),
            *(f"figure:{name}" for name in FIGURES),
            "version_gate",
        ]
        for item in items:
            reason = KNOWN_GAPS.get((version, item))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(version, item, marks=marks, id=f"{version}-{item}"))
    return out


def test_adapter_reads_the_fields_this_contract_covers() -> None:
    """The key list comes from the adapter; make sure the scan still finds its reads."""
    keys = adapter_meta_keys()
    assert {"e2e_latency", "finish_reason", "completion_tokens", "request_received_ts"} <= keys


def test_known_gaps_name_real_items() -> None:
    """A gap entry for an item the contract no longer checks would silently stop meaning anything."""
    items = {p.values[1] for p in _items()}  # type: ignore[attr-defined]
    for version, item in KNOWN_GAPS:
        assert version in VERSIONS and version != TESTED
        assert item in items, item


@pytest.mark.parametrize(("version", "item"), _items())
def test_sglang_release_contract(version: str, item: str) -> None:
    rel = release(version)
    assert rel.declared_version() == version
    if item == "targets":
        for target in SGLangInstrumentor().targets(None):  # type: ignore[arg-type]
            cls_name, method = target.name.split(".")
            assert rel.module(target.module) is not None, f"{version}: no module {target.module}"
            fn = rel.find_method(target.module, cls_name, method)
            if fn is None and target.optional:
                continue  # a newer API: where it is absent there is nothing to observe
            assert fn is not None, f"{version}: no {target.module}.{target.name}"
            has_yield = any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in _own_nodes(fn))
            if target.name in ENGINE_OPERATIONS or target.name in VERSION_NAMES:
                # Timed from its first step to its end: a coroutine (its arguments are not
                # read; 0.4.x-0.5.5 take none for pause/continue).
                assert isinstance(fn, ast.AsyncFunctionDef) and not has_yield, target.name
            elif target.name == "TokenizerManager.generate_request":
                assert isinstance(fn, ast.AsyncFunctionDef) and has_yield, "not an async generator"
                assert [a.arg for a in fn.args.args[:2]] == ["self", "obj"]
            elif target.name == "Engine.async_generate":
                assert isinstance(fn, ast.AsyncFunctionDef) and not has_yield, "not a coroutine"
            elif method != "__init__":
                assert isinstance(fn, ast.FunctionDef), f"{target.name} is not a plain function"
    elif item.startswith("field:"):
        fields = rel.fields("sglang.srt.managers.io_struct", "GenerateReqInput")
        assert "sampling_params" in fields, "no GenerateReqInput dataclass"
        assert item.removeprefix("field:") in fields
    elif item == "model_attr":
        cls = rel.find_class("sglang.srt.managers.tokenizer_manager", "TokenizerManager")
        assert cls is not None
        assigned = {
            t.attr
            for n in ast.walk(cls)
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Attribute)
            and isinstance(t.value, ast.Name)
            and t.value.id == "self"
        }
        assert assigned & set(MODEL_ATTRS), f"none of {MODEL_ATTRS} set on TokenizerManager"
    elif item.startswith("meta:"):
        key = item.removeprefix("meta:")
        assert key in produced_meta_keys(rel), f"{version} never writes meta_info[{key!r}]"
    elif item.startswith("figure:"):
        produced = produced_meta_keys(rel)
        sources = FIGURES[item.removeprefix("figure:")]
        assert any(all(k in produced for k in keys) for keys in sources), (
            f"{version} writes no complete set of {sources}"
        )
    elif item == "version_gate":
        assert (version_tuple(version) or ()) >= SGLangInstrumentor.min_version
    else:  # pragma: no cover - _items() makes only the cases above
        raise AssertionError(item)


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """Nodes of ``fn`` without those of functions nested in it."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


if __name__ == "__main__":  # print the matrix: python tests/compat/test_sglang_contract.py
    keys = sorted(adapter_meta_keys())
    for v in VERSIONS:
        produced = produced_meta_keys(release(v))
        print(v, {k: produced.get(k, "MISSING") for k in keys})
