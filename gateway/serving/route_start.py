"""The front half every generating route shares (POST /v1/completions, /v1/chat/completions,
and TGI's /, /generate and /generate_stream): `start_route`.

A route first builds its SamplingParams from its own fields (so a bad parameter is answered
before a bad model name, as vLLM answers), then calls `start_route` once with what is its
own: the model (or adapter) name and the field it came in, its prompts, its field-name map
(engine field -> the name its client sent, for the errors' `param`), its priority and the
prefix of its request ids. In this order, each step's refusal answered before the next
begins: the name is resolved to the caller's adapter (404), the route's prompts are made
(its own 400s: a chat template, TGI's truncate), they are measured against the context and
the caller's quotas (serving/served_model.py), the request gets its id, and its engine
requests start (serving/run.py: the account opened, each started and primed). The route's
back half then collects or streams the `Run` under that id.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from litestar import Request

from loragate.engine import SamplingParams
from loragate.gateway.serving.accounting import Accounting
from loragate.gateway.serving.run import Run, run_generations
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.tenancy.principal import Principal


@dataclass(frozen=True)
class RouteStart:
    """What a route's back half needs: its started run, the request's id (the response's
    `id`), and its prompts as the engine got them (token ids where measured here)."""

    run: Run
    request_id: str
    prompts: list


async def start_route(
    served_model: ServedModel,
    accounting: Accounting,
    request: Request,
    caller: Principal,
    *,
    model: str | None,
    prompts: Callable[[], list | Awaitable[list]],
    params: SamplingParams,
    field_names: dict[str, str],
    id_prefix: str,
    model_param: str = "model",
    priority: int = 0,
    numbered_ids: bool = False,
) -> RouteStart:
    """Resolve `model` (named by the client's field `model_param`), make the engine prompts
    with `prompts()` (called once the model is known; may be async), measure them, and
    start one engine request each. `numbered_ids`: prompt i's engine request is
    `<request id>-<i>` (a completion's list of prompts); otherwise the route has one prompt
    and its engine request carries the request's id."""
    lora = await served_model.resolve_model(model, param=model_param, caller=caller)
    made = prompts()
    if inspect.isawaitable(made):
        made = await made
    measured, cost = await served_model.measure(caller, made, params, field_names)
    request_id = accounting.new_request_id(id_prefix)
    if numbered_ids:
        ids = [f"{request_id}-{i}" for i in range(len(measured))]
    else:
        assert len(measured) == 1, "one prompt, or numbered engine request ids"
        ids = [request_id]
    run = await run_generations(
        accounting,
        request,
        caller,
        lora,
        cost,
        list(zip(measured, ids, strict=True)),
        params,
        field_names=field_names,
        adapter_param=model_param,
        priority=priority,
    )
    return RouteStart(run, request_id, measured)
