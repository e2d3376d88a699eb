"""Engine requests sent over HTTP, seen by the client: context out, a step record back.

slime, AReaL, prime-rl and TRL's server mode do not call an engine in their own process: rollout
workers POST to vLLM's OpenAI server or SGLang's HTTP server (``/v1/completions``,
``/v1/chat/completions``, SGLang's native ``/generate``). The request span is the server's (our
engine instrumentors there put it in the caller's trace when the headers carry the context); what
the server cannot do is hand the request back to the step, which lives in the client's process
(or in the driver that reached this Ray actor). The client can, from what it already holds:

* **out**: ``traceparent`` and ``baggage`` (``rollout.step``) are added to the request's headers
  when it is sent inside a step — only to the engine endpoints, only where the caller (or another
  instrumentation) set none — and the step number to ``tracestate`` as well, for a router in
  between that forwards the trace context but not baggage (sglang-router);
* **back**: when the response has been read, one :class:`~otel_rollout.record.RequestRecord` per
  engine request goes to the open step — the local ``rollout_step`` or, in a Ray actor, the
  driver's step through the Ray channel — timed by the client (``rollout.timing.source=client``:
  send to last byte, first streamed event as the first token), with the token counts and finish
  reasons the server reported in the body (``usage``, SGLang's ``meta_info``).

No span and no metric point is made here: the server makes those, and one request must never get
two request spans. What the client cannot know is left ``None`` (a stream without
``stream_options.include_usage`` reports no token count; a compressed body is timed, not read).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_rollout.context import RecordCollector, collectors, current_step
from otel_rollout.guard import LogOnce
from otel_rollout.http.bodies import batch_shape, native_finished, records_of, request_body
from otel_rollout.propagation import add_step_tracestate, inject_context
from otel_rollout.record import (
    RequestRecord,
    StreamClosedEarly,
    model_label,
)
from otel_rollout.replicas import endpoint_replica

TIMING_CLIENT = "client"
"""``rollout.timing.source`` of a request timed by the HTTP client: send to the last byte read."""
PROVIDER_OPENAI = "openai"
"""Provider of a request made through the OpenAI-compatible API (vLLM's and SGLang's servers both
speak it; the body does not say which engine answered)."""
PROVIDER_SGLANG = "sglang"
"""Provider of a request to SGLang's native ``/generate``."""
_FINISH = b'"finish_reason":'
_NOT_FINAL = b'"finish_reason":null'
_USAGE = b'"usage":'
_NO_USAGE = b'"usage":null'


class EngineHTTPError(Exception):
    """The record's error when the server answered with an HTTP error status (never raised)."""


def operation_of(path: str, paths: Sequence[str]) -> str | None:
    """The GenAI operation of a request to ``path``, or ``None`` if it is not an engine call
    (``paths`` are path endings: a router may put a prefix before them)."""
    if not path.endswith(tuple(paths)):
        return None
    return "chat" if path.endswith("chat/completions") else "text_completion"


class ClientCall:
    """One engine request on its way: the step it belongs to, its clock, what the body said."""

    __slots__ = (
        "_collectors",
        "operation",
        "native",
        "readable",
        "trace_id",
        "started_ns",
        "first_ns",
        "_partial",
        "_final",
        "_usage",
        "_last",
        "_head",
        "_done",
        "prompts",
        "n",
        "replica",
    )

    def __init__(
        self, collectors: tuple[RecordCollector, ...], operation: str, native: bool, trace_id: int
    ) -> None:
        self._collectors = collectors
        """The step (and the trajectory, if one is open) the request's record goes to."""
        self.operation = operation
        self.native = native
        """SGLang's native API (``meta_info``) rather than the OpenAI format (``usage``)."""
        self.readable = True
        """False for a compressed stream: it is timed, its bytes are not decoded."""
        self.trace_id = trace_id
        self.started_ns = time.time_ns()
        self.first_ns: int | None = None
        self._partial = b""
        self._final: list[dict[str, Any]] = []
        self._usage: dict[str, Any] | None = None
        self._last: bytes | None = None
        self._head: dict[str, Any] | None = None
        self._done = False
        self.prompts = 1
        """Prompts the request sent: a list of them is one engine request each (vLLM's server
        splits it), and the response's choices are split back by prompt."""
        self.n = 1
        self.replica: str | None = None
        """The server's ``host:port``: the replica as the client knows it."""

    # --- request --------------------------------------------------------------------------

    @classmethod
    def start(cls, request: Any, paths: Sequence[str]) -> ClientCall | None:
        """Inject the context into ``request`` and start timing it, if it is an engine call
        made inside a step; ``None`` (and the request untouched) otherwise."""
        if request is None or getattr(request, "method", "") != "POST":
            return None
        ctx = otel_context.get_current()
        step = current_step(ctx)
        if step is None:
            return None
        url = request.url
        path = str(url.path) if hasattr(url, "path") else urlsplit(str(url)).path
        operation = operation_of(path, paths)
        if operation is None:
            return None
        headers = request.headers
        if "traceparent" not in headers:
            for key, value in inject_context(context=ctx).items():
                if key not in headers:
                    headers[key] = value
        if step.step is not None:
            add_step_tracestate(headers, step.step)  # for a router that drops baggage
        span_context = trace.get_current_span(ctx).get_span_context()
        trace_id = span_context.trace_id if span_context.is_valid else 0
        # The OpenAI format for its endpoints (``…completions``), SGLang's native one otherwise.
        native = not path.endswith("completions")
        call = cls(collectors(ctx), operation, native, trace_id)
        call.replica = endpoint_replica(url)
        if not native and operation == "text_completion":
            call.prompts, call.n = batch_shape(request_body(request))
        return call

    # --- response: a whole body -----------------------------------------------------------

    def finished(self, response: Any) -> None:
        """A non-streamed response, already read (httpx's ``content`` is decoded)."""
        status = int(getattr(response, "status_code", 0))
        if status >= 400:
            self.end(EngineHTTPError(f"HTTP {status}"))
            return
        body = json.loads(response.content)
        self._hand_over(records_of(body, self.native, self.prompts, self.n), None)

    # --- response: a stream ---------------------------------------------------------------

    def feed(self, chunk: bytes) -> None:
        """Raw bytes of a server-sent-event stream, as they arrive.

        Only the events that can say how the request ended are decoded: the last one of SGLang's
        cumulative stream; in the OpenAI format, the events that carry a finish reason or usage
        (the others have no finish reason, or ``"finish_reason":null``).
        """
        if not chunk:
            return
        if self.first_ns is None:
            self.first_ns = time.time_ns()
        if not self.readable:
            return
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self._done = True
            elif self.native:
                self._last = payload
            elif (_USAGE in payload and _NO_USAGE not in payload) or (
                _FINISH in payload and _NOT_FINAL not in payload
            ):
                self._openai_event(json.loads(payload))

    def _openai_event(self, event: Any) -> None:
        if not isinstance(event, dict):
            return
        self._head = self._head or {"id": event.get("id"), "model": event.get("model")}
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        for choice in event.get("choices") or ():
            if isinstance(choice, dict) and choice.get("finish_reason") is not None:
                self._final.append(choice)

    def end(self, error: BaseException | None) -> None:
        """The request ended: failed (``error``), or its stream was closed. Once only."""
        if not self._collectors:
            return
        if error is not None:
            self._hand_over([{}], error)
            return
        if self.native:
            body = json.loads(self._last) if self._last else None
            ended = body is not None and native_finished(body)
            records = records_of(body, True)
        else:
            ended = bool(self._final) or self._done
            body = {**(self._head or {}), "usage": self._usage, "choices": self._final}
            records = records_of(body, False, self.prompts, self.n)
        if not ended and self.readable:
            error = StreamClosedEarly("the stream was closed before the server ended it")
        self._hand_over(records, error)

    def _hand_over(self, fields: list[dict[str, Any]], error: BaseException | None) -> None:
        observers, self._collectors = self._collectors, ()
        if not observers:
            return
        finish = time.time_ns()
        provider = PROVIDER_SGLANG if self.native else PROVIDER_OPENAI
        for item in fields:
            record = RequestRecord(
                provider=provider,
                model=model_label(item.get("model") or "unknown"),
                operation=self.operation,
                arrival_ns=self.started_ns,
                finish_ns=finish,
                request_id=item.get("id"),
                prompt_tokens=item.get("prompt_tokens"),
                output_tokens=item.get("output_tokens"),
                cached_tokens=item.get("cached_tokens"),
                finish_reasons=tuple(item.get("finish_reasons") or ()),
                first_token_ns=self.first_ns,
                error=error,
                n=item.get("n"),
                timing_source=TIMING_CLIENT,
                trace_id=self.trace_id,
                replica=self.replica,
            )
            for observer in observers:
                observer.observe(record)


# --- httpx's byte streams, observed ----------------------------------------------------------


def stream_classes(sync_base: type, async_base: type, log: LogOnce) -> tuple[type, type]:
    """Byte streams that feed a :class:`ClientCall` as the caller reads and end it once on close.

    Subclasses of the library's ``SyncByteStream``/``AsyncByteStream`` (httpx checks the type),
    made once when the library is imported — never per request.
    """
    guard = log.guard("http client stream")

    def init(self: Any, inner: Any, call: ClientCall) -> None:
        self._inner, self._call = inner, call

    def iterate(self: Any) -> Iterator[bytes]:
        call = self._call
        try:
            for chunk in self._inner:
                with guard:
                    call.feed(chunk)
                yield chunk
        except Exception as exc:
            with guard:
                call.end(exc)
            raise

    def close(self: Any) -> None:
        try:
            self._inner.close()
        finally:
            with guard:
                self._call.end(None)

    async def aiterate(self: Any) -> AsyncIterator[bytes]:
        call = self._call
        try:
            async for chunk in self._inner:
                with guard:
                    call.feed(chunk)
                yield chunk
        except Exception as exc:
            with guard:
                call.end(exc)
            raise

    async def aclose(self: Any) -> None:
        try:
            await self._inner.aclose()
        finally:
            with guard:
                self._call.end(None)

    observed_sync = type(
        "ObservedSyncStream", (sync_base,), {"__init__": init, "__iter__": iterate, "close": close}
    )
    observed_async = type(
        "ObservedAsyncStream",
        (async_base,),
        {"__init__": init, "__aiter__": aiterate, "aclose": aclose},
    )
    return observed_sync, observed_async
