"""The routes' shared front half (gateway/serving/route_start.py), on its own: the model is
resolved before the route's prompts are made, they are measured before the request gets an
id, each refusal stops what follows, the field names given once name the field in both the
measuring's 400 and the engine's, and the engine requests carry the request's id (numbered
for a list of prompts).

The served model is the real one over a scripted engine (each request one finished token)
and an adapter manager that knows one adapter; the accounting is the real one.
"""

from __future__ import annotations

import asyncio

import pytest

from loragate.adapters import LoRARequest
from loragate.engine import (
    CompletionOutput,
    InvalidParam,
    ModelInfo,
    RequestOutput,
    SamplingParams,
)
from loragate.gateway.errors import InvalidRequestError, NotFoundError
from loragate.gateway.serving.accounting import Accounting
from loragate.gateway.serving.admission import Admission
from loragate.gateway.serving.route_start import start_route
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.tenancy.principal import Principal

CALLER = Principal(tenant="acme", cache_salt="acme")
LORA = LoRARequest("acme/sql", 7, "/adapters/sql")
MAX_MODEL_LEN = 32


class Engine:
    is_running = True
    dead_error = None
    model_info = ModelInfo("base", "base", MAX_MODEL_LEN, 4, True, tokenizer=None)

    def __init__(self):
        self.requests = []

    def generate_request(self, request):
        self.requests.append(request)
        return self._outputs(request)

    async def _outputs(self, request):
        if request.sampling_params.temperature == 1.5:  # what this test's engine refuses
            raise InvalidParam("temperature", "not here")
        out = CompletionOutput(0, "x", [9], None, "length")
        prompt = request.prompt["prompt_token_ids"]
        yield RequestOutput(request.request_id, None, prompt, [out], True, request.lora_request)


class Adapters:
    async def lookup(self, name, param, caller):
        if name != "sql":
            raise NotFoundError(f"the model or adapter {name!r} does not exist", param=param)
        return type("Record", (), {"lora_request": LORA})()


class Quotas:
    async def admit(self, caller, cost):
        return None

    async def finish(self, caller, lease, tokens):
        pass


class Usage:
    async def record(self, tenant, adapter, counts):
        pass


class Observer:
    def count_rejected(self, reason):
        pass

    def count_rate_limited(self, tenant, reason):
        pass

    def observe_generation(self, gen, lora, tenant):
        pass


class Client:
    async def receive(self):
        await asyncio.Event().wait()


def parts():
    engine = Engine()
    served = ServedModel(engine, Adapters())
    admission = Admission(max_running=4, max_queue=4)
    return engine, served, Accounting(engine, admission, Quotas(), Usage(), Observer())


async def start(served, accounting, model="sql", prompts=None, **options):
    options = {
        "params": SamplingParams(max_tokens=4),
        "field_names": {},
        "id_prefix": "t",
    } | options
    return await start_route(
        served,
        accounting,
        Client(),
        CALLER,
        model=model,
        prompts=prompts or (lambda: [{"prompt_token_ids": [1, 2, 3]}]),
        **options,
    )


async def test_one_prompt_runs_under_the_request_id():
    engine, served, accounting = parts()
    started = await start(served, accounting)
    (final,) = await started.run.collect()
    assert [r.request_id for r in engine.requests] == [started.request_id]
    assert started.request_id.startswith("t-")
    assert engine.requests[0].lora_request == LORA
    assert final.outputs[0].token_ids == [9]
    assert started.prompts == [{"prompt_token_ids": [1, 2, 3]}]


async def test_a_list_of_prompts_numbers_its_engine_requests():
    engine, served, accounting = parts()

    async def two():  # a route's prompts may be made asynchronously (TGI's truncate)
        return [{"prompt_token_ids": [1]}, {"prompt_token_ids": [2, 3]}]

    started = await start(served, accounting, model=None, prompts=two, numbered_ids=True)
    await started.run.collect()
    rid = started.request_id
    assert [r.request_id for r in engine.requests] == [f"{rid}-0", f"{rid}-1"]
    assert all(r.lora_request is None for r in engine.requests)


async def test_a_bad_model_wins_over_the_prompts_and_takes_no_id():
    engine, served, accounting = parts()
    made = []
    with pytest.raises(NotFoundError) as refused:
        await start(
            served, accounting, model="nope", prompts=made.append, model_param="parameters.x"
        )
    assert refused.value.param == "parameters.x"
    assert made == [] and engine.requests == []
    assert accounting.new_request_id("t").endswith("000000")  # no id was taken


async def test_the_prompts_refusal_wins_over_measuring():
    engine, served, accounting = parts()

    def refused():
        raise InvalidRequestError("messages: bad", param="messages")

    long = SamplingParams(max_tokens=MAX_MODEL_LEN)  # would not fit the context either
    with pytest.raises(InvalidRequestError) as error:
        await start(served, accounting, prompts=refused, params=long)
    assert error.value.param == "messages"
    assert engine.requests == []


async def test_field_names_given_once_name_the_measuring_and_the_engine_errors():
    names = {"max_tokens": "max_completion_tokens", "temperature": "parameters.temperature"}
    engine, served, accounting = parts()
    with pytest.raises(InvalidRequestError) as too_long:
        await start(served, accounting, params=SamplingParams(max_tokens=30), field_names=names)
    assert too_long.value.param == "max_completion_tokens"
    assert engine.requests == []
    with pytest.raises(InvalidRequestError) as refused:
        await start(served, accounting, params=SamplingParams(temperature=1.5), field_names=names)
    assert refused.value.param == "parameters.temperature"
    assert accounting.admission.in_flight == 0  # the refused request's account ended
