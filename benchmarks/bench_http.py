"""Cost of the HTTP client path per engine request (issue #11), next to the same bare request.

The client side only: what ``HTTPClientInstrumentor`` adds to one ``httpx.Client.post`` to an
engine endpoint inside ``rollout_step`` — headers injected, the response read back into a
``client``-timed record for the step. The server is a stand-in (a stdlib HTTP server on loopback
in a thread of this process, answering with a fixed OpenAI-shaped body: a whole completion, or a
stream of server-sent events) because only the client's own thread is measured
(``time.thread_time``), and an engine would only add noise there. Rounds alternate hook on / off
in one process; the figure is the median per-request difference and the ratio to the bare
request.

    $VPY benchmarks/bench_http.py                  # 400 requests x 7 rounds per kind
    $VPY benchmarks/bench_http.py --smoke          # CI size
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_WHOLE = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "model": "tiny",
        "choices": [{"index": 0, "text": "x" * 400, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 32, "completion_tokens": 128, "total_tokens": 160},
    }
).encode()


def _event(text: str, reason: str | None) -> bytes:
    chunk = {
        "id": "cmpl-bench",
        "object": "text_completion",
        "model": "tiny",
        "choices": [{"index": 0, "text": text, "finish_reason": reason}],
        "usage": None,
    }
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


EVENTS = 64
_STREAM = (
    b"".join(_event("tok", None) for _ in range(EVENTS - 1))
    + _event("end", "length")
    + b'data: {"id":"cmpl-bench","choices":[],"usage":{"prompt_tokens":32,"completion_tokens":64}}\n\n'
    + b"data: [DONE]\n\n"
)


class _Engine(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        stream = self.path.endswith("stream")
        body = _STREAM if stream else _WHOLE
        self.send_response(200)
        self.send_header("content-type", "text/event-stream" if stream else "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _round(client: Any, url: str, requests: int, stream: bool) -> float:
    """Client-thread CPU seconds for ``requests`` requests inside one step."""
    from otel_rollout import rollout_step

    body = {"model": "tiny", "prompt": "p", "max_tokens": 128}
    with rollout_step(1):
        start = time.thread_time()
        for _ in range(requests):
            if stream:
                with client.stream("POST", url, json=body) as response:
                    for _chunk in response.iter_bytes():
                        pass
            else:
                client.post(url, json=body).content  # noqa: B018 (read, as a client does)
        return time.thread_time() - start


def run(smoke: bool, requests: int = 400, rounds: int = 7) -> dict[str, Any]:
    import httpx
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from otel_rollout.http import HTTPClientInstrumentor

    if smoke:
        requests, rounds = 40, 2
    trace.set_tracer_provider(TracerProvider())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    hook = HTTPClientInstrumentor()
    out: dict[str, Any] = {"requests": requests, "rounds": rounds, "stream_events": EVENTS}
    try:
        with httpx.Client() as client:
            for kind, path, stream in (
                ("whole", "/v1/completions", False),
                # An engine path with "stream" in it: the stand-in streams, the hook matches it.
                ("stream", "/v1/completions", True),
            ):
                url = base + path + ("?stream" if stream else "")
                on: list[float] = []
                off: list[float] = []
                _round(client, url, 5, stream)  # warm the connection
                for i in range(rounds):
                    for active in (i % 2 == 0, i % 2 == 1):  # alternate which goes first
                        if active:
                            hook.instrument()
                            on.append(_round(client, url, requests, stream))
                            hook.uninstrument()
                        else:
                            off.append(_round(client, url, requests, stream))
                per_on = statistics.median(on) / requests * 1e6
                per_off = statistics.median(off) / requests * 1e6
                out[kind] = {
                    "instrumented_us": round(per_on, 1),
                    "bare_us": round(per_off, 1),
                    "added_us": round(per_on - per_off, 1),
                    "ratio": round(per_on / per_off, 3),
                    "rounds_us": {
                        "on": [round(x / requests * 1e6, 1) for x in on],
                        "off": [round(x / requests * 1e6, 1) for x in off],
                    },
                }
    finally:
        server.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = run(args.smoke, args.requests, args.rounds)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
