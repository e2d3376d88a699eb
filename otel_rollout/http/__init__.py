"""``HTTPClientInstrumentor``: engine servers' requests, sent with httpx or requests, join the
client's step.

httpx is what the ``openai`` client (sync and async) and slime's rollout use to reach vLLM's and
SGLang's servers — ``httpx`` itself, or its fork ``httpx2``, which ``openai`` 3.x ships on. Per
library two targets, ``Client.send`` and ``AsyncClient.send`` — every request of either client
ends there — drive wrap and unwrap; the translation lives in :mod:`.adapter`. ``requests`` is
what TRL's server mode uses (``VLLMClient``: one POST of a batch of prompts to vLLM's
``/v1/completions``): its ``Session.send``, where every request of a session ends, for responses
read whole (``stream=False``, TRL's); a streamed ``requests`` response is left alone. A request is
touched only when it is a POST to an engine endpoint (``OTEL_ROLLOUT_HTTP_PATHS``) made inside a
step: its headers get the context, and its response becomes the step's record. Every other
request passes through as it came.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from otel_rollout.config import load_config
from otel_rollout.guard import LogOnce
from otel_rollout.http.adapter import ClientCall, stream_classes
from otel_rollout.instrumentation import LibraryInstrumentor, Target, argument, should_observe

__all__ = ["HTTPClientInstrumentor"]


def _compressed(response: Any) -> bool:
    """A raw stream we would have to decompress to read (``Content-Encoding`` other than none)."""
    encoding = str(response.headers.get("content-encoding", "identity")).strip().lower()
    return encoding not in ("identity", "")


class _ClientLibrary(LibraryInstrumentor):
    """One HTTP client library: which requests are engine calls made inside a step."""

    def _prepare(self, **kwargs: Any) -> LogOnce:
        self._log = LogOnce()
        self._paths = load_config(warn=False).http_paths
        return self._log

    def _begin(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ClientCall | None:
        if not should_observe():
            return None
        with self._log.guard("http client request"):
            return ClientCall.start(argument(args, kwargs, 0, "request"), self._paths)
        return None


class _Requests(_ClientLibrary):
    """``requests``: ``Session.send(request, stream=…)``, responses read whole."""

    engine_module = "requests"
    engine_name = "requests"
    min_version = (2, 0)

    def _targets(self) -> list[Target]:
        return [Target("requests.sessions", "Session.send", self._send)]

    def _send(
        self,
        wrapped: Callable[..., Any],
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        call = None if kwargs.get("stream") else self._begin(args, kwargs)
        if call is None:
            return wrapped(*args, **kwargs)
        try:
            response = wrapped(*args, **kwargs)  # read whole: requests reads it before returning
        except BaseException as exc:
            with self._log.guard("http client request"):
                call.end(exc)
            raise
        with self._log.guard("http client response"):
            call.finished(response)
        return response


class _HttpxLibrary(_ClientLibrary):
    """One httpx-shaped library: its two ``send`` methods. Subclassed per module name."""

    min_version = (0, 23)

    def _targets(self) -> list[Target]:
        # Built once the program has imported the library: importing it here loads nothing new.
        library = importlib.import_module(self.engine_module)
        sync_stream, async_stream = stream_classes(
            library.SyncByteStream, library.AsyncByteStream, self._log
        )
        module = f"{self.engine_module}._client"
        return [
            Target(module, "Client.send", self._sync_send(sync_stream)),
            Target(module, "AsyncClient.send", self._async_send(async_stream)),
        ]

    def _received(self, call: ClientCall, response: Any, stream: bool, observed: type) -> None:
        """The response's headers are in (``stream``) or its whole body is (else)."""
        with self._log.guard("http client response"):
            if not stream:
                call.finished(response)
                return
            if _compressed(response):
                call.readable = False
            response.stream = observed(response.stream, call)

    def _sync_send(self, observed: type) -> Callable[..., Any]:
        def wrapper(
            wrapped: Callable[..., Any],
            instance: Any,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Any:
            call = self._begin(args, kwargs)
            if call is None:
                return wrapped(*args, **kwargs)
            try:
                response = wrapped(*args, **kwargs)
            except BaseException as exc:  # cancelled too: the request still ended, as an abort
                with self._log.guard("http client request"):
                    call.end(exc)
                raise
            self._received(call, response, bool(kwargs.get("stream")), observed)
            return response

        return wrapper

    def _async_send(self, observed: type) -> Callable[..., Any]:
        async def wrapper(
            wrapped: Callable[..., Any],
            instance: Any,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Any:
            call = self._begin(args, kwargs)
            if call is None:
                return await wrapped(*args, **kwargs)
            try:
                response = await wrapped(*args, **kwargs)
            except BaseException as exc:  # cancelled too: the request still ended, as an abort
                with self._log.guard("http client request"):
                    call.end(exc)
                raise
            self._received(call, response, bool(kwargs.get("stream")), observed)
            return response

        return wrapper


class _Httpx(_HttpxLibrary):
    engine_module = "httpx"
    engine_name = "httpx"


class _Httpx2(_HttpxLibrary):
    engine_module = "httpx2"
    engine_name = "httpx2"
    min_version = (2, 0)


class HTTPClientInstrumentor(BaseInstrumentor):
    """Context out, records back, for engine requests sent over HTTP with httpx, httpx2 or
    requests.

    Each library is patched only once the program imports it (a process that never sends an
    HTTP request pays nothing).
    """

    _libraries = (_Httpx, _Httpx2, _Requests)

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        for library in self._libraries:
            library().instrument(**kwargs)

    def _uninstrument(self, **kwargs: Any) -> None:
        for library in self._libraries:
            library().uninstrument(**kwargs)
