"""Fair share across tenants (issue 17), on the engine's own steps with the tiny model: a
flood from one tenant does not starve another under `fair` (it does under `fcfs`), the
service counters of two backlogged tenants stay within VTC's bound at shares 1:2, outputs
are the same under every policy, adapter slots drain for a tenant waiting on one, and
`priority` admits lower values first. Queue times are counted in engine steps."""

from __future__ import annotations

import logging

import pytest
from fair_share_testlib import Arrival, run
from tiny_llama import ALL_MODULES, make_adapters

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.engine.core.fair_share import FairShare, fair_share_key
from loragate.engine.core.sequence import Request
from loragate.plugins import hookimpl


def prompt(i: int, length: int) -> list[int]:
    return [1] + [(700 + 37 * i + 13 * j * (i + 3)) % 40000 + 300 for j in range(length - 1)]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    specs = {"a": (8, list(ALL_MODULES), False), "b": (8, ["q_proj", "v_proj"], False)}
    paths = make_adapters(model_dir, tmp_path_factory.mktemp("adapters"), specs)
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    return str(model_dir), loras


def engine_for(setup, make_llm, policy: str, **overrides):
    model_dir, loras = setup
    options = dict(
        model=model_dir,
        max_model_len=256,
        num_kv_blocks=512,
        max_num_seqs=40,
        max_num_batched_tokens=64,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
        scheduling_policy=policy,
    )
    engine = make_llm(**{**options, **overrides}).engine
    warm = [Arrival(0, f"warm-{name}", prompt(99, 4), "warm", lora) for name, lora in loras.items()]
    run(engine, warm, greedy(1))  # both adapters in memory: no step waits on a file
    return engine


def flood(loras, with_a: bool = True) -> list[Arrival]:
    """Tenant A sends 32 requests of 24 tokens at once; B sends 4 of 8 tokens two steps on."""
    a = [Arrival(0, f"A{i:02d}", prompt(i, 24), "A", loras["a"]) for i in range(32)]
    b = [Arrival(2, f"B{i}", prompt(100 + i, 8), "B", loras["b"]) for i in range(4)]
    return (a if with_a else []) + b


@pytest.fixture(scope="module")
def flood_runs(setup, make_llm):
    """The flood under fcfs and fair, and B alone."""
    _, loras = setup
    return {
        name: run(engine_for(setup, make_llm, policy), flood(loras, with_a), greedy(8))
        for name, policy, with_a in (
            ("fcfs", "fcfs", True),
            ("fair", "fair", True),
            ("alone", "fair", False),
        )
    }


def test_a_flood_does_not_starve_the_quiet_tenant_under_fair(flood_runs):
    """Must-show 1: with `fair`, B's mean queue time is at most twice what it is with A
    absent, and every B request goes before A's queue drains past its fair share; with
    `fcfs`, B waits behind all of A."""
    alone, fair, fcfs = flood_runs["alone"], flood_runs["fair"], flood_runs["fcfs"]
    assert fair.mean_queue_steps("B") <= 2 * alone.mean_queue_steps("B")
    last_b = max(fair.admitted[f"B{i}"] for i in range(4))
    assert fair.admitted_by("A", last_b) <= 16, "A's queue drained past its share first"
    # fcfs: every B request is admitted after the last of A's.
    last_a = max(fcfs.admitted[f"A{i:02d}"] for i in range(32))
    assert all(fcfs.admitted[f"B{i}"] >= last_a for i in range(4))
    assert fcfs.mean_queue_steps("B") > 2 * alone.mean_queue_steps("B")


def test_fairness_never_changes_outputs(flood_runs):
    """Must-show 3: greedy outputs, under two adapters, equal under fcfs and fair, while
    the two policies really batched the requests differently."""
    fair, fcfs = flood_runs["fair"], flood_runs["fcfs"]
    assert fair.admission_order() != fcfs.admission_order()
    assert len(fair.outputs) == len(fcfs.outputs) == 36
    assert fair.outputs == fcfs.outputs
    assert len({tuple(o) for o in fair.outputs.values()}) > 30  # distinct, not one echo


STEPS = 120


def test_backlogged_tenants_with_weights_1_and_2_share_1_to_2(setup, make_llm):
    """Must-show 2: two tenants that always have requests waiting, weights 1 and 2, prompts
    of 4-20 tokens and 2-8 outputs: their virtual counters stay within VTC's bound (twice
    the largest request's cost) at every step, and their token shares approach 1:2."""
    _, loras = setup
    engine = engine_for(setup, make_llm, "fair", max_num_seqs=4)
    weights = {"X": 1.0, "Y": 2.0}
    made = {"X": 0, "Y": 0}
    largest = 20 + 2 * 8  # prompt tokens cost 1, generated tokens 2

    def request(tenant: str, step: int) -> Arrival:
        i = made[tenant]
        made[tenant] += 1
        length, n = 4 + (i * 7) % 17, 2 + (i * 5) % 7
        lora = loras["a" if tenant == "X" else "b"]
        return Arrival(
            step,
            f"{tenant}{i}",
            prompt(i + (500 if tenant == "Y" else 0), length),
            tenant,
            lora,
            greedy(n),
            weight=weights[tenant],
        )

    gaps = []

    def keep_backlogged(step, trace):
        if step >= STEPS:  # both stop sending; the rest drains
            return []
        tenants = engine.fair_share.tenants()
        if step >= 1:
            gaps.append(abs(tenants["X"]["service"] - tenants["Y"]["service"]))
        waiting = {t: 0 for t in weights}
        for seq in engine.scheduler.waiting:
            waiting[seq.request.tenant] += 1
        return [request(t, step + 1) for t in weights for _ in range(3 - waiting[t])]

    start = [request(t, 0) for t in weights for _ in range(3)]
    served_before = dict(engine.fair_share.served)
    run(engine, start, greedy(4), on_step=keep_backlogged)
    assert len(gaps) == STEPS - 1
    assert max(gaps) <= 2 * largest, max(gaps)
    served = {t: engine.fair_share.served[t] - served_before.get(t, 0.0) for t in weights}
    assert served["X"] > 0
    share = served["Y"] / served["X"]
    assert 1.8 <= share <= 2.2, served


def test_a_flooding_tenants_slot_drains_for_a_tenant_waiting_on_one(setup, make_llm):
    """One adapter slot: A floods on adapter a, then B asks for adapter b. Under `fair`, A's
    requests stop taking the slot while B waits for it, so B runs long before A's queue
    drains; under `fcfs` B gets the slot only when A has none left to admit."""
    _, loras = setup
    runs = {
        policy: run(engine_for(setup, make_llm, policy, max_loras=1), flood(loras), greedy(8))
        for policy in ("fair", "fcfs")
    }
    fair, fcfs = runs["fair"], runs["fcfs"]
    last_b = max(fair.admitted[f"B{i}"] for i in range(4))
    assert fair.admitted_by("A", last_b) <= 20
    last_a = max(fcfs.admitted[f"A{i:02d}"] for i in range(32))
    assert min(fcfs.admitted[f"B{i}"] for i in range(4)) > last_a
    assert fair.outputs == fcfs.outputs


def test_a_request_waiting_for_a_slot_is_not_passed_over_forever(setup, make_llm):
    """Under `priority`, A keeps sending priority-0 requests on adapter a (one slot); B's
    priority-1 request on adapter b is refused the slot and, without a bound, passed over
    while A keeps sending. After `max_slot_wait_steps` steps it goes first: A's new
    requests wait, the slot drains, and B runs while A is still sending."""
    _, loras = setup

    def stream(bound: int):
        engine = engine_for(setup, make_llm, "priority", max_loras=1)
        engine.scheduler.admission_order.max_slot_wait_steps = bound
        a = [Arrival(s, f"A{s:03d}", prompt(s, 6), "A", loras["a"]) for s in range(30)]
        b = [Arrival(3, "B", prompt(999, 6), "B", loras["b"], priority=1)]
        return run(engine, a + b, greedy(4))

    bounded, unbounded = stream(4), stream(10**9)
    assert unbounded.admitted["B"] >= 29  # passed over until A stopped sending
    assert bounded.admitted["B"] <= 3 + 4 + 2 * 4 + 2  # the bound, then A's running drain
    assert bounded.admitted_by("A", bounded.admitted["B"]) < 25
    assert bounded.outputs == unbounded.outputs


def test_priority_policy_admits_lower_values_first(setup, make_llm):
    model_dir, _ = setup
    llm = make_llm(
        model=model_dir,
        max_model_len=128,
        num_kv_blocks=64,
        max_num_seqs=1,
        max_num_batched_tokens=64,
        scheduling_policy="priority",
    )
    outs = llm.generate(
        [{"prompt_token_ids": prompt(i, 6)} for i in range(4)],
        greedy(3),
        priority=[5, 0, 3, 0],
        use_tqdm=False,
    )
    started = [out.metrics.first_scheduled_time for out in outs]
    assert sorted(range(4), key=lambda i: started[i]) == [1, 3, 2, 0]


class NewestFirst:
    @hookimpl
    def loragate_order_waiting(self, waiting):
        return [e["seq_id"] for e in sorted(waiting, key=lambda e: -e["arrival_time"])]


class BrokenOrder:
    @hookimpl
    def loragate_order_waiting(self, waiting):
        return [entry["seq_id"] for entry in waiting[1:]]  # leaves one out


def test_a_plugin_orders_admission_and_a_bad_answer_is_ignored(setup, make_llm, caplog):
    model_dir, _ = setup
    prompts = [{"prompt_token_ids": prompt(i, 6)} for i in range(3)]

    def order_with(plugin):
        llm = make_llm(
            model=model_dir,
            max_model_len=128,
            num_kv_blocks=64,
            max_num_seqs=1,
            max_num_batched_tokens=64,
            scheduling_policy="fcfs",
            plugins=(plugin,),
        )
        outs = llm.generate(prompts, greedy(3), use_tqdm=False)
        started = [out.metrics.first_scheduled_time for out in outs]
        return sorted(range(3), key=lambda i: started[i]), [o.outputs[0].token_ids for o in outs]

    newest_order, newest_outputs = order_with(NewestFirst())
    assert newest_order == [2, 1, 0]
    with caplog.at_level(logging.ERROR, logger="loragate.engine.core.admission_order"):
        broken_order, broken_outputs = order_with(BrokenOrder())
    assert broken_order == [0, 1, 2]  # arrival order kept
    assert "loragate_order_waiting must return every waiting seq_id" in caplog.text
    assert newest_outputs == broken_outputs


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"priority": "high"}, "priority must be an integer"),
        ({"priority": True}, "priority must be an integer"),
        ({"tenant_weight": 0}, "tenant_weight must be a number > 0"),
        ({"tenant_weight": float("inf")}, "tenant_weight must be finite"),
    ],
)
def test_bad_priority_or_weight_is_refused_and_nothing_else_changes(
    setup, make_llm, kwargs, message
):
    model_dir, _ = setup
    engine = make_llm(model=model_dir, max_model_len=128, num_kv_blocks=64).engine
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", {"prompt_token_ids": prompt(1, 5)}, greedy(2), **kwargs)
    assert not engine.has_unfinished_requests()
    assert engine.fair_share.tenants() == {}


def test_unknown_scheduling_policy_is_refused(setup, make_llm):
    model_dir, _ = setup
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        make_llm(model=model_dir, scheduling_policy="lottery")


def tenant_request(request_id: str, tenant: str | None, lora=None) -> Request:
    return Request(request_id, None, [1, 2, 3], greedy(1), lora_request=lora, tenant=tenant)


def test_a_tenant_back_from_idle_starts_at_the_lowest_active_counter():
    """Idle time is not banked: a newcomer, or a tenant returning after others were served,
    starts at the least-served active tenant's counter, never below it; a returning tenant
    that had been served more keeps its own. With nobody active the counters are dropped."""
    share = FairShare()
    a1, b1, a2 = tenant_request("a1", "A"), tenant_request("b1", "B"), tenant_request("a2", "A")
    share.arrive(a1)
    share.charge(a1, prompt_tokens=100)
    share.arrive(b1, weight=2.0)  # B is new: it starts level with A, not at 0
    assert share.tenants() == {
        "A": {"service": 100.0, "weight": 1.0},
        "B": {"service": 100.0, "weight": 2.0},
    }
    share.charge(b1, output_tokens=10)  # 20 tokens of cost at weight 2: +10
    share.leave(a1)
    share.charge(b1, prompt_tokens=300)  # B is served alone while A is idle: +150
    share.arrive(a2)  # A comes back at B's counter, not with 160 banked
    assert share.tenants()["A"]["service"] == share.tenants()["B"]["service"] == 260.0
    assert share.served == {"A": 100.0, "B": 320.0}
    share.leave(a2)
    share.leave(b1)
    assert share.tenants() == {} and share.virtual == {}
    assert share.served == {"A": 100.0, "B": 320.0}  # what metrics read stays


def test_requests_without_a_tenant_share_by_adapter():
    lora = LoRARequest("sql", 1, "/adapters/sql")
    assert fair_share_key(tenant_request("r", None, lora)) == "adapter:sql"
    assert fair_share_key(tenant_request("r", None)) == "base"
    assert fair_share_key(tenant_request("r", "acme", lora)) == "acme"
