"""Source-level contract between our slime hook and slime's released source.

slime is not on PyPI (the PyPI name ``slime`` is another project) and its repository cannot be
reached from the machines that run this suite, so what the hook relies on was read from slime's
released source once, with the reader below, and is kept in
``tests/data/slime-v0.3.1-contract.json`` (the tag, its commit, the facts). Regenerate it from a
checkout of slime (``git clone https://github.com/THUDM/slime; git checkout v0.3.1``) with::

    python tests/compat/test_slime_contract.py /path/to/slime > tests/data/slime-v0.3.1-contract.json

Checked here, with no slime and no engine:

* the hook's key — module, class, methods, the step argument — is what slime defines:
  ``RolloutManager`` in ``slime/ray/rollout.py``, decorated ``@ray.remote`` where it is defined
  (why the hook goes through :mod:`otel_rollout.ray.actor_hooks`), a synchronous actor,
  ``generate(self, rollout_id)`` / ``eval(self, rollout_id)``;
* slime's drivers call those methods with ``.remote()``, passing ``rollout_id`` positionally or
  by that keyword, both of which the hook reads;
* the rollout posts with ``httpx.AsyncClient`` (the HTTP client hook's library) to the router's
  native ``/generate``;
* the suite's stand-in (tests/slime/standin, run against the real router and SGLang in
  tests/slime) has the same shape, read by the same reader.

``OTEL_ROLLOUT_SLIME_SRC`` (a slime checkout) also re-reads the real source and compares.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from otel_rollout.frameworks import slime

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "tests" / "data" / "slime-v0.3.1-contract.json"
STANDIN = REPO / "tests" / "slime" / "standin"
ROLLOUT = "slime/ray/rollout.py"
DRIVERS = ("train.py", "train_async.py")
HTTP = "slime/utils/http_utils.py"
SGLANG_ROLLOUT = "slime/rollout/sglang_rollout.py"


def actor_shape(source: str, class_name: str = slime.ROLLOUT_CLASS) -> dict[str, Any]:
    """The class's decorators, whether any method is ``async`` (an async actor), and the
    parameters of the methods the hook wraps."""
    tree = ast.parse(source)
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    assert len(found) == 1, f"{class_name} is not defined once at module level"
    cls = found[0]
    functions = [f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
    hooked = {name for name, _ in slime.HOOKS}
    return {
        "decorators": [ast.unparse(d) for d in cls.decorator_list],
        "async_methods": sorted(f.name for f in functions if isinstance(f, ast.AsyncFunctionDef)),
        "methods": {
            f.name: [a.arg for a in f.args.posonlyargs + f.args.args]
            for f in functions
            if f.name in hooked
        },
    }


def driver_calls(source: str) -> list[list[str]]:
    """Every ``<handle>.generate.remote(…)`` / ``<handle>.eval.remote(…)``: the method and how
    the step argument is passed (``positional`` or ``keyword <name>``)."""
    calls = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        method = node.func.value
        if node.func.attr != "remote" or not isinstance(method, ast.Attribute):
            continue
        if method.attr not in dict(slime.HOOKS):
            continue
        how = "positional" if node.args else f"keyword {node.keywords[0].arg}"
        calls.append([method.attr, how])
    return calls


def read_contract(read: Callable[[str], str]) -> dict[str, Any]:
    """The facts the hook relies on, from a source tree (``read(path)`` gives a file's text)."""
    return {
        "module": ROLLOUT.removesuffix(".py").replace("/", "."),
        "class": slime.ROLLOUT_CLASS,
        "actor": actor_shape(read(ROLLOUT)),
        "driver_calls": {path: driver_calls(read(path)) for path in DRIVERS},
        "http_client": "httpx.AsyncClient(" in read(HTTP),
        "posts_to_router_generate": (
            "args.sglang_router_ip}:{args.sglang_router_port}/generate" in read(SGLANG_ROLLOUT)
        ),
    }


def _contract() -> dict[str, Any]:
    return dict(json.loads(CONTRACT.read_text())["contract"])


def test_the_hook_keys_on_what_slime_defines() -> None:
    contract = _contract()
    assert (slime.ROLLOUT_MODULE, slime.ROLLOUT_CLASS) == (contract["module"], contract["class"])
    actor = contract["actor"]
    # decorated where defined: the module's name is Ray's ActorClass, the class goes by value
    assert actor["decorators"] == ["ray.remote"]
    assert actor["async_methods"] == []  # a synchronous actor: the hook's sync path runs
    for method, _ in slime.HOOKS:
        assert actor["methods"][method] == ["self", slime.STEP_ARGUMENT]


def test_slimes_drivers_pass_the_step_argument_as_the_hook_reads_it() -> None:
    calls = _contract()["driver_calls"]
    seen = {how for found in calls.values() for _, how in found}
    assert seen <= {"positional", f"keyword {slime.STEP_ARGUMENT}"}
    assert {m for found in calls.values() for m, _ in found} == {"generate", "eval"}


def test_slimes_rollout_posts_where_the_http_hook_looks() -> None:
    contract = _contract()
    assert contract["http_client"] and contract["posts_to_router_generate"]


def test_the_suites_stand_in_has_slimes_shape() -> None:
    standin = (STANDIN / ROLLOUT).read_text()
    assert actor_shape(standin) == _contract()["actor"]


@pytest.mark.skipif(not os.environ.get("OTEL_ROLLOUT_SLIME_SRC"), reason="no slime checkout given")
def test_the_kept_contract_is_what_the_source_says() -> None:
    root = Path(os.environ["OTEL_ROLLOUT_SLIME_SRC"])
    assert read_contract(lambda path: (root / path).read_text()) == _contract()


if __name__ == "__main__":  # regenerate: python tests/compat/test_slime_contract.py <checkout>
    source = Path(sys.argv[1])
    kept = json.loads(CONTRACT.read_text()) if CONTRACT.exists() else {}
    kept["contract"] = read_contract(lambda path: (source / path).read_text())
    print(json.dumps(kept, indent=2))
