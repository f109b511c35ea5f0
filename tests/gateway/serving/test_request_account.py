"""One request's accounting lives in one object, its RequestAccount (issue 44): for a request
that ends at each stage (refused by the queue before admission, cancelled while queued,
mid-stream, after the last token), the usage recorded, the tokens the quota lease is given
back with and what the metrics are told equal what the client was sent, read from that one
object's records, and each collaborator saw exactly those numbers; the queue is empty after.

The engine is a script (each output one token more, released by the test), the quotas, usage
meter and metrics record what they are given; the account and the queue are the real ones.
The client is `run_generations` and the stream as a route drives them, disconnecting through
the ASGI `receive` the way a client that goes away does.
"""

from __future__ import annotations

import asyncio

import pytest

from loragate.adapters import LoRARequest
from loragate.engine import (
    CompletionOutput,
    EngineDeadError,
    EngineRequest,
    RequestOutput,
    RequestOutputKind,
    SamplingParams,
)
from loragate.gateway.errors import EngineUnavailableError, QueueFullError
from loragate.gateway.serving.accounting import Accounting, RequestAccount
from loragate.gateway.serving.admission import Admission
from loragate.gateway.serving.disconnect import ClientDisconnectedError
from loragate.gateway.serving.generation import outputs_of
from loragate.gateway.serving.run import RESENDS, run_generations
from loragate.gateway.tenancy.principal import Principal
from loragate.gateway.tenancy.request_cost import RequestCost
from loragate.registry import UsageCounts

PROMPT = [1, 2, 3, 4, 5]
LORA = LoRARequest("acme/sql", 7, "/adapters/sql")
CALLER = Principal(tenant="acme", cache_salt="acme")
COST = RequestCost(tokens=len(PROMPT) + 6, sequences=1, prompt_tokens=len(PROMPT))
TOKENS = 6
WAIT_S = 10


class ScriptedEngine:
    """Each request yields TOKENS outputs, one new token each (deltas, as the gateway asks the
    engine for them); `release(n)` lets n more out.
    Records the requests it was handed (`was_handed` is set at the first) and those that
    ended unfinished (aborted)."""

    is_running = True
    dead_error = None

    def __init__(self):
        self.allowed = asyncio.Semaphore(0)
        self.handed: list[str] = []
        self.was_handed = asyncio.Event()
        self.aborted: list[str] = []
        self.requests: list[EngineRequest] = []  # each generate_request's, as it came

    def release(self, n: int) -> None:
        for _ in range(n):
            self.allowed.release()

    def generate_request(self, request):
        """What the account calls: the request whole (EngineRequest)."""
        self.requests.append(request)
        return self.generate(
            request.prompt, request.sampling_params, request.request_id, request.lora_request
        )

    async def generate(self, prompt, params, request_id, lora_request=None, **options):
        self.handed.append(request_id)
        self.was_handed.set()
        finished = False
        try:
            for n in range(1, TOKENS + 1):
                await self.allowed.acquire()
                finished = n == TOKENS
                assert params.output_kind == RequestOutputKind.DELTA
                out = CompletionOutput(0, "x", [n - 1], None, None)
                yield RequestOutput(request_id, None, PROMPT, [out], finished, lora_request)
        finally:
            if not finished:
                self.aborted.append(request_id)


class Quotas:
    def __init__(self):
        self.leases: dict[str, int | None] = {}  # lease -> tokens it was given back with

    async def admit(self, caller, cost):
        lease = f"lease-{len(self.leases)}"
        self.leases[lease] = None
        return lease

    async def finish(self, caller, lease, tokens):
        assert self.leases[lease] is None, "a lease given back twice"
        self.leases[lease] = tokens


class Usage:
    def __init__(self):
        self.total = UsageCounts()
        self.writes = []

    async def record(self, tenant, adapter, counts):
        self.writes.append((tenant, adapter, counts))
        self.total = UsageCounts(
            self.total.prompt_tokens + counts.prompt_tokens,
            self.total.completion_tokens + counts.completion_tokens,
            self.total.requests + counts.requests,
        )


class Metrics:
    def __init__(self):
        self.rejected: list[str] = []
        self.observed: list[tuple[str, int, str | None, str | None]] = []

    def count_rejected(self, reason):
        self.rejected.append(reason)

    def count_rate_limited(self, tenant, reason):
        self.rejected.append(f"{tenant}: {reason}")

    def observe_generation(self, gen, lora, tenant):
        name = lora.lora_name if lora is not None else None
        self.observed.append((gen.request_id, gen.num_output_tokens, name, tenant))


class Opened(Accounting):
    """The accounting, keeping each account it opens for the test to read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.accounts: list[RequestAccount] = []

    async def open(self, caller, lora, cost):
        account = await super().open(caller, lora, cost)
        self.accounts.append(account)
        return account


class Client:
    """The ASGI `receive` of one HTTP request: a disconnect once `leave()` is called."""

    def __init__(self):
        self.gone = asyncio.Event()

    def leave(self):
        self.gone.set()

    async def receive(self):
        await self.gone.wait()
        return {"type": "http.disconnect"}


def parts(max_queue: int = 4):
    engine, quotas, usage, metrics = ScriptedEngine(), Quotas(), Usage(), Metrics()
    admission = Admission(max_running=1, max_queue=max_queue)
    accounting = Opened(engine, admission, quotas, usage, metrics)
    return accounting, engine, quotas, usage, metrics


async def start(accounting, client):
    params = SamplingParams(max_tokens=TOKENS)
    return await run_generations(
        accounting, client, CALLER, LORA, COST, [(PROMPT, "r-0")], params, field_names={}
    )


async def settled(accounting) -> None:
    """The accounting under way is done."""
    if accounting.under_way:
        await asyncio.wait(accounting.under_way, timeout=WAIT_S)


def sent_usage(tokens_sent: int | None) -> UsageCounts:
    """What a client that got outputs up to `tokens_sent` tokens was sent (None: nothing)."""
    if tokens_sent is None:
        return UsageCounts()
    return UsageCounts(len(PROMPT), tokens_sent, 1)


def check(account: RequestAccount, tokens_sent: int | None, quotas, usage, metrics, admission):
    """The account's records equal what was sent, and so does every collaborator."""
    sent = sent_usage(tokens_sent)
    records = account.records
    assert records.ended
    assert records.recorded == sent
    assert records.quota_tokens == sent.prompt_tokens + sent.completion_tokens
    assert records.admitted_seqs == records.released_seqs
    expected_observed = [] if tokens_sent is None else [("r-0", tokens_sent)]
    assert records.observed == expected_observed
    # Each collaborator saw the account's numbers, no more.
    assert usage.total == records.recorded
    assert all(write[:2] == ("acme", "sql") for write in usage.writes)
    assert quotas.leases == {records.lease: records.quota_tokens}
    assert [(rid, n) for rid, n, _, _ in metrics.observed] == records.observed
    assert all(obs[2:] == ("acme/sql", "acme") for obs in metrics.observed)
    assert admission.in_flight == 0


def test_refused_by_the_queue_before_admission():
    async def scenario():
        accounting, engine, quotas, usage, metrics = parts(max_queue=0)
        accounting.admission.in_flight = 1  # the one running place is taken
        with pytest.raises(QueueFullError):
            await start(accounting, Client())
        accounting.admission.in_flight = 0
        (account,) = accounting.accounts
        assert account.records.admitted_seqs == 0 and engine.handed == []
        assert metrics.rejected == ["queue_full"]
        check(account, None, quotas, usage, metrics, accounting.admission)

    asyncio.run(scenario())


def test_cancelled_while_queued():
    async def scenario():
        accounting, engine, quotas, usage, metrics = parts()
        client = Client()
        run = asyncio.create_task(start(accounting, client))
        await asyncio.wait_for(engine.was_handed.wait(), WAIT_S)  # no output yet: queued
        (account,) = accounting.accounts
        assert engine.handed == ["r-0"] and account.records.admitted_seqs == 1
        assert accounting.admission.in_flight == 1
        client.leave()
        with pytest.raises(ClientDisconnectedError):
            await asyncio.wait_for(run, WAIT_S)
        await settled(accounting)
        assert engine.aborted == ["r-0"]
        check(account, None, quotas, usage, metrics, accounting.admission)

    asyncio.run(scenario())


async def stream_until(accounting, engine, leave_after: int) -> tuple[RequestAccount, int]:
    """Stream the request as a route does, the client reading `leave_after` events and then
    going away (the stream's cleanup ends the account): the account and the tokens sent."""
    client = Client()
    engine.release(1)
    run = await start(accounting, client)
    account = run.account
    gen = run.generations[0]

    async def events():
        async for out in outputs_of(gen):
            engine.release(1)
            yield str(len(out.outputs[0].token_ids)).encode()

    stream = account.counted(events())
    sent = 0
    try:
        async for event in stream:
            sent = int(event)  # what the client got: the output so far
            if sent == leave_after:
                break
    finally:
        await stream.aclose()
        await account.end()  # the stream's cleanup
        await account.end()  # and a second call changes nothing
    await settled(accounting)
    return account, sent


def test_cancelled_mid_stream():
    async def scenario():
        accounting, engine, quotas, usage, metrics = parts()
        account, sent = await stream_until(accounting, engine, leave_after=3)
        assert sent == 3 and engine.aborted == ["r-0"]
        assert len(usage.writes) == 3  # each event counted before it left; nothing after
        check(account, sent, quotas, usage, metrics, accounting.admission)

    asyncio.run(scenario())


def test_cancelled_after_the_last_token():
    async def scenario():
        accounting, engine, quotas, usage, metrics = parts()
        account, sent = await stream_until(accounting, engine, leave_after=TOKENS)
        assert sent == TOKENS and engine.aborted == []
        check(account, sent, quotas, usage, metrics, accounting.admission)

    asyncio.run(scenario())


class LosingEngine(ScriptedEngine):
    """A ScriptedEngine whose first `losses` requests stop after `lost_after` outputs with
    EngineDeadError, as a replica's calls do when its node is lost; `running` says whether
    the engine itself still runs (replicas left) or stopped with them (one engine)."""

    def __init__(self, losses: int, lost_after: int = 2, running: bool = True):
        super().__init__()
        self.losses, self.lost_after, self.is_running = losses, lost_after, running

    async def generate(self, prompt, params, request_id, lora_request=None, **options):
        losing = self.losses > 0
        self.losses -= 1
        sent = 0
        async for out in super().generate(prompt, params, request_id, lora_request):
            yield out
            sent += len(out.outputs[0].token_ids)
            if losing and sent == self.lost_after:
                raise EngineDeadError("the replica serving it stopped: its node was lost")


def losing_parts(engine: LosingEngine):
    _, _, quotas, usage, metrics = parts()
    accounting = Opened(engine, Admission(max_running=1, max_queue=4), quotas, usage, metrics)
    return accounting, quotas, usage, metrics


def test_a_whole_answer_lost_mid_request_is_sent_again_and_counted_once():
    async def scenario():
        engine = LosingEngine(losses=1)
        accounting, quotas, usage, metrics = losing_parts(engine)
        engine.release(2 + TOKENS)  # the lost request's two outputs, then the whole answer
        run = await start(accounting, Client())
        (final,) = await asyncio.wait_for(run.collect(), WAIT_S)
        await settled(accounting)
        assert final.finished and final.outputs[0].token_ids == list(range(TOKENS))
        assert engine.handed == ["r-0", "r-0"] and run.account.records.resent == 1
        # Built once by the account, with the caller's tenancy, and sent again as it was.
        first, again = engine.requests
        assert again is first
        assert (first.prompt, first.request_id, first.lora_request) == (PROMPT, "r-0", LORA)
        assert (first.tenant, first.cache_salt, first.tenant_weight) == ("acme", "acme", 1.0)
        assert first.sampling_params.output_kind == RequestOutputKind.DELTA
        # The lost request's two tokens reached no client: only the answer is counted.
        check(run.account, TOKENS, quotas, usage, metrics, accounting.admission)

    asyncio.run(scenario())


def test_an_answer_lost_more_often_than_it_is_resent_is_a_503():
    async def scenario():
        engine = LosingEngine(losses=RESENDS + 1)
        accounting, quotas, usage, metrics = losing_parts(engine)
        engine.release(2 * (RESENDS + 1))
        run = await start(accounting, Client())
        with pytest.raises(EngineUnavailableError) as raised:
            await asyncio.wait_for(run.collect(), WAIT_S)
        await settled(accounting)
        assert raised.value.code == "engine_unavailable"
        assert engine.handed == ["r-0"] * (RESENDS + 1)
        assert run.account.records.resent == RESENDS
        # Nothing was sent: nothing counted, the lease given back with nothing, no place held.
        check(run.account, None, quotas, usage, metrics, accounting.admission)

    asyncio.run(scenario())


def test_a_stopped_engine_is_not_sent_the_request_again():
    async def scenario():
        engine = LosingEngine(losses=1)
        accounting, quotas, usage, metrics = losing_parts(engine)
        engine.release(2)
        run = await start(accounting, Client())
        engine.is_running = False  # one engine, and it stopped: no replica to send it to
        with pytest.raises(EngineUnavailableError, match="stopped mid-request"):
            await asyncio.wait_for(run.collect(), WAIT_S)
        await settled(accounting)
        assert engine.handed == ["r-0"] and run.account.records.resent == 0
        check(run.account, None, quotas, usage, metrics, accounting.admission)

    asyncio.run(scenario())
