"""An actor class whose methods an instrumentor patches in every process, as verl's
``AgentLoopWorker`` is patched by ours: kept in a module of its own so Ray workers import it by
name, with the worker set-up hook that patches it there."""

from __future__ import annotations

from typing import Any

import wrapt

WRITTEN = "as written"
IN_WORKER = "patched in the worker"


class Sample:
    def where(self) -> str:
        return WRITTEN

    async def where_async(self) -> str:
        return WRITTEN

    def calls_itself(self) -> str:
        return self.where()  # an actor method reaching another: verl's generate → _run_agent_loop


def patch(result: str) -> None:
    """Patch ``Sample``'s methods as an instrumentor does: in place, on the module's class."""

    def sync_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> str:
        wrapped(*args, **kwargs)
        return result

    async def async_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> str:
        await wrapped(*args, **kwargs)
        return result

    wrapt.wrap_function_wrapper(__name__, "Sample.where", sync_wrapper)
    wrapt.wrap_function_wrapper(__name__, "Sample.where_async", async_wrapper)


def patch_in_worker() -> None:
    """Ray's ``worker_process_setup_hook``: what ``otel_rollout.ray.setup_worker`` does to an
    engine's module in a worker."""
    patch(IN_WORKER)
