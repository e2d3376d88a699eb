"""The id generator: ids nobody else's ``random.seed`` repeats, in every process, forked ones too."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from otel_rollout.ids import UrandomIdGenerator

DRAW = """
import json, random
random.seed(0)  # as vLLM does when an engine starts
from otel_rollout.ids import UrandomIdGenerator
random.seed(0)
ids = UrandomIdGenerator()
print(json.dumps([ids.generate_trace_id() for _ in range(4)]))
"""


def test_engines_seeding_random_do_not_repeat_ids_across_processes() -> None:
    """Two workers that both seed ``random`` with 0 (the SDK's stock generator then gives both the
    same trace ids) draw different ids."""
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", DRAW], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(2)
    ]
    assert not set(runs[0]) & set(runs[1])


def test_seeding_random_in_this_process_does_not_reach_the_ids() -> None:
    ids = UrandomIdGenerator()
    random.seed(0)
    first = [ids.generate_span_id() for _ in range(4)]
    random.seed(0)
    again = [ids.generate_span_id() for _ in range(4)]
    assert first != again


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    ids = UrandomIdGenerator()
    ids.generate_span_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, json.dumps([ids.generate_span_id() for _ in range(8)]).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        child = json.loads(pipe.read())
    parent = [ids.generate_span_id() for _ in range(8)]
    assert not set(child) & set(parent)


def test_ids_are_valid_and_of_their_width() -> None:
    ids = UrandomIdGenerator()
    spans = [ids.generate_span_id() for _ in range(2000)]
    traces = [ids.generate_trace_id() for _ in range(2000)]
    assert all(0 < s < 2**64 for s in spans) and len(set(spans)) == len(spans)
    assert all(0 < t < 2**128 for t in traces) and len(set(traces)) == len(traces)
    assert max(traces) >= 2**120  # the whole width is drawn, not 64 bits of it
