"""The engine: requests in, one scheduled forward pass per step, outputs back.

`step()` is vLLM V1's: the scheduler's `schedule()` says what runs (one SchedulerOutput),
the runner's `execute()` runs and samples it (a ModelRunnerOutput), and the scheduler's
`update_from_output()`, the one writer of every sequence's computed tokens, output tokens,
stops and frees, takes the result; the engine hands the touched requests' tokens on to
output processing. Everything a request can get wrong is checked where its EngineRequest is
built or in `add`, before any KV block is touched. Adapter weights not in memory are read on
loader threads (engine/lora/adapter_residency.py) while the step goes on without their requests.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, replace
from itertools import count
from pathlib import Path

import torch

from loragate.adapters import LoRARequest, WeightsIdentity
from loragate.adapters.identity import SYSTEM_CLOCK, StampClock
from loragate.adapters.store import AdapterFetcher
from loragate.engine.api import engine_stats
from loragate.engine.api.chat_prompt import ChatPrompt
from loragate.engine.api.config import EngineConfig
from loragate.engine.api.engine_args import engine_config_from
from loragate.engine.api.engine_request import EngineRequest
from loragate.engine.api.input_processor import InputProcessor, PromptInput, check_request
from loragate.engine.api.plugin_data import (
    model_info,
    preemption_victim,
    request_info,
    waiting_victim,
)
from loragate.engine.core import beam_search
from loragate.engine.core.admission_order import AdmissionOrder
from loragate.engine.core.block_manager import BlockManager
from loragate.engine.core.fair_share import FairShare
from loragate.engine.core.scheduler import PROTECT_STEPS, Scheduler
from loragate.engine.core.sequence import Request, Sequence, sample_generator
from loragate.engine.core.startup_heap import release_freed_heap
from loragate.engine.core.step_budget import step_budget_for
from loragate.engine.core.step_output import RequestTokens, SeqStop, SeqTokens, StepOutput
from loragate.engine.core.step_record import StepClock, StepRecords, mark_scheduled
from loragate.engine.core.swap import KVSwapper
from loragate.engine.loading.cpu_features import warn_if_emulated_bf16
from loragate.engine.loading.model_loader import (
    load_config,
    load_tokenizer,
    load_weights,
    resolve_model,
)
from loragate.engine.loading.special_tokens import special_token_rule
from loragate.engine.lora.adapter_residency import make_adapter_residency
from loragate.engine.lora.lora_capacity import lora_capacity
from loragate.engine.models import build_model
from loragate.engine.outputs.output_builder import prompt_logprobs
from loragate.engine.outputs.output_processor import OutputProcessor
from loragate.engine.outputs.request_output import RequestOutput
from loragate.engine.runner import sizing
from loragate.engine.runner.cuda_graphs import decode_graphs_for
from loragate.engine.runner.kv_cache import KVCache
from loragate.engine.runner.model_runner import ModelRunner
from loragate.engine.sampling.sampler import Sampler
from loragate.engine.sampling.sampling_params import SamplingParams
from loragate.engine.speculation import Speculator
from loragate.engine.speculation.draft_model import DraftModel
from loragate.plugins import PluginManager

log = logging.getLogger(__name__)

__all__ = ["LLMEngine", "PromptInput"]


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        adapter_fetcher: AdapterFetcher | None = None,
        stamp_clock: StampClock = SYSTEM_CLOCK,
    ):
        """The engine for ``config``; ``adapter_fetcher`` finds adapters named by their
        adapter store object (engine/lora/stored_adapters.py)."""
        self.config = config
        self.plugins = PluginManager.create(plugins=config.plugins)
        device, dtype = config.torch_device, config.torch_dtype
        warn_if_emulated_bf16(device, dtype)
        source = resolve_model(config.model, config.weights_cache_dir, not config.gguf_dequantize)
        self.model_name = config.served_model_name or source.name
        self.base_model_name = source.name  # what adapters trained on these weights record
        self.hf_dir = source.hf_dir
        self.model_config = load_config(source.hf_dir)
        tokenizer_dir = Path(source.hf_dir if config.tokenizer is None else config.tokenizer)
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.special_token_rule = special_token_rule(self.tokenizer, tokenizer_dir)
        log.info("tokenizer: %s", self.special_token_rule.describe(self.tokenizer))
        self.max_model_len = sizing.resolve_max_model_len(config, self.model_config)
        self.model = build_model(self.model_config, device, dtype)
        log.info("model: %s", self.model.describe())
        self.model.load_weights(
            load_weights(source.hf_dir, config.quantization),
            self.max_model_len,
            checkpoint=source.hf_dir,
            quantization=config.quantization,
            activation_quantization=config.activation_quantization,
        )
        # An adapter's life (tiers, loads, holds, requests in flight, fetch by hash) has
        # this one owner; None without LoRA. Made before the KV cache is sized: on a GPU the
        # slots' stacks are allocated here, and the KV budget counts what is in use.
        self.residency = None
        self._step_thread: int | None = None  # the thread running steps (loads on it: unpaced)
        if config.enable_lora:
            spec = self.model.lora_spec(self.base_model_name)
            capacity = lora_capacity(config, spec, device, dtype)
            log.info("LoRA: %s", capacity.describe())
            config = self.config = replace(
                config, max_loras=capacity.max_loras, max_cpu_loras=capacity.max_cpu_loras
            )
            self.residency = make_adapter_residency(
                spec,
                config,
                self.plugins,
                self.model,
                steps_running=self._steps_running,
                fetcher=adapter_fetcher,
                stamp_clock=stamp_clock,
            )
        num_blocks = sizing.num_kv_blocks(config, self.model, self.max_model_len)
        self.kv_cache = KVCache.for_model(self.model, num_blocks, config.block_size)
        self.block_manager = BlockManager(
            num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        cpu_blocks = sizing.swap_blocks(config, self.kv_cache)
        self.swapper = (
            KVSwapper(self.kv_cache, self.block_manager, cpu_blocks) if cpu_blocks else None
        )
        self.step_budget = step_budget_for(config, self.model, self.kv_cache, self.max_model_len)
        log.info("step budget: %s", self.step_budget.describe())
        self.step_records = StepRecords()  # what each step ran (tests assert on it)
        # Service per tenant: the `fair` policy and metrics.
        self.fair_share = FairShare(config.fair_prompt_token_cost, config.fair_output_token_cost)
        self.eos_token_ids = sizing.eos_token_ids(self.hf_dir, self.tokenizer)
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=self.step_budget.tokens,
            enable_chunked_prefill=config.enable_chunked_prefill,
            adapter_slots=self.residency,
            swapper=self.swapper,
            choose_preemption_victim=preemption_victim(self.plugins.choose_preemption_victim),
            admission_order=AdmissionOrder(
                config.scheduling_policy, self.plugins.order_waiting, self.fair_share
            ),
            fair_share=self.fair_share,
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
            new_sequence=self._new_sequence,
            speculator=self._speculator(config),
            preempt_for=waiting_victim(
                self.plugins.preempt_for_waiting,
                self.fair_share,
                config.scheduling_policy,
                PROTECT_STEPS,
            ),
        )
        sampler = Sampler(
            self.model.vocab_size, self.eos_token_ids, torch.Generator().manual_seed(config.seed)
        )
        self.runner = ModelRunner(
            self.model,
            self.kv_cache,
            self.residency,
            sampler=sampler,
            plugins=self.plugins,
            max_num_seqs=config.max_num_seqs,
            max_model_len=self.max_model_len,
        )
        self.runner.decode_graphs = decode_graphs_for(config, self.runner, self.max_model_len)
        self.inputs = InputProcessor(
            self.tokenizer, self.special_token_rule, self.model.vocab_size, self.max_model_len
        )
        self._model_info = model_info(self.tokenizer, self.model.vocab_size, self.eos_token_ids)
        self.requests: dict[str, Request] = {}
        # Requests added and aborted since the last step, for output processing (in order).
        self._events: list[tuple[bool, Request]] = []
        # Text, stop strings and outputs: run inline by step(), beside the step by
        # AsyncLLMEngine (which calls step_tokens()).
        self.output_processor = OutputProcessor(self.tokenizer, self.eos_token_ids)
        self._seq_ids = count()
        self.num_prompt_tokens = 0
        # What reading the weights' file and timing the first steps freed goes back.
        release_freed_heap()

    def _speculator(self, config: EngineConfig) -> Speculator | None:
        """Speculative decoding's step policy, with the proposer its config names."""
        spec = config.speculative_config
        if spec is None:
            return None
        draft_cost = 0.0
        if spec.method == "draft_model":
            draft = DraftModel(
                spec.model,
                target_vocab_size=self.model.vocab_size,
                device=config.torch_device,
                dtype=config.torch_dtype,
                max_model_len=self.max_model_len,
                max_num_seqs=config.max_num_seqs,
                weights_cache_dir=config.weights_cache_dir,
                draft_adapters=spec.draft_adapters,
            )
            proposer = draft.propose
            # A decode's cost is its weights read: the draft's against the target's.
            draft_cost = sum(draft.model.weight_bytes().values()) / sum(
                self.model.weight_bytes().values()
            )
        else:
            _, proposer = self.plugins.proposer(spec.method)
        log.info("speculative decoding: %s", spec)
        return Speculator(
            spec,
            proposer,
            self.max_model_len,
            self.model.vocab_size,
            self.step_budget,
            proposal_cost=draft_cost,
        )

    @property
    def num_generation_tokens(self) -> int:
        """Tokens sampled so far (the scheduler takes each)."""
        return self.scheduler.num_generation_tokens

    @property
    def dispatcher(self):
        """The runner's sampler dispatch (tests swap its sampler)."""
        return self.runner.dispatcher

    @classmethod
    def from_engine_args(cls, engine_args) -> LLMEngine:
        """vLLM's constructor: an engine from EngineArgs."""
        return cls(engine_config_from(engine_args))

    # ---- requests -----------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
        *,
        tenant: str | None = None,
        adapter_identity: WeightsIdentity | None = None,
        priority: int = 0,
        tenant_weight: float = 1.0,
    ) -> Request:
        """vLLM's call shape: `add` of the EngineRequest these values make
        (engine/api/engine_request.py says what each is)."""
        request = EngineRequest(
            prompt, params, request_id, lora_request, cache_salt, tenant, priority, tenant_weight
        )
        return self.add(request, adapter_identity)

    def add(
        self, engine_request: EngineRequest, adapter_identity: WeightsIdentity | None = None
    ) -> Request:
        """Queue a request (checked where it was built; what depends on this engine is checked
        here, before any KV block is touched). `adapter_identity` admits it under weights a
        loader thread already read (AsyncLLMEngine's); without it the adapter's files are
        checked here (one stat when unchanged since read), an adapter store object's fetched
        first (the request then runs, and its outputs name, the object's verified local
        directory)."""
        request_id, prompt = engine_request.request_id, engine_request.prompt
        params = engine_request.sampling_params
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        text, token_ids = self.inputs.tokenize(prompt)
        lora_request, adapter_identity = self._validate(
            token_ids, params, engine_request.lora_request, adapter_identity
        )
        if params.max_tokens is None:
            params = replace(params, max_tokens=self.max_model_len - len(token_ids))
        request = Request(
            request_id,
            text,
            token_ids,
            params,
            lora_request,
            adapter_identity,
            engine_request.cache_salt,
            engine_request.tenant,
        )
        request.priority = engine_request.priority
        if params.prompt_logprobs is not None:
            request.prompt_logprobs = [None]
        request.logits_processors = self.plugins.logits_processors(asdict(params), self._model_info)
        width = 1 if params.use_beam_search else params.best_of
        for index in range(width):
            request.seqs.append(self._new_sequence(request, index))
        if params.use_beam_search:  # before anything is queued: a refusal leaves no trace
            max_tokens = min(params.max_tokens, self.max_model_len - len(token_ids))
            beam_search.start(request, self.plugins, self.eos_token_ids, max_tokens)
        # One sequence computes the prompt; the others fork from it and share its blocks.
        self.scheduler.add(request.seqs[0])
        request.pending_forks = request.seqs[1:]
        self.requests[request_id] = request
        self._events.append((True, request))
        self.fair_share.arrive(request, engine_request.tenant_weight)
        if adapter_identity is not None:  # its weights stay loadable until it ends
            self.residency.hold(request)
        self.num_prompt_tokens += len(token_ids)
        self.plugins.request_started(request_info(request))
        return request

    def abort_request(self, request_id: str) -> bool:
        """Stop a request at once and free its blocks; False if it is unknown or done."""
        request = self._forget(request_id)
        if request is None:
            return False
        self.scheduler.finish_request(request, "abort")
        self._events.append((False, request))
        self.plugins.request_finished(request_info(request))
        return True

    def stop_sequences(self, stops: list[SeqStop]) -> None:
        """Finish the samples output processing stopped (a stop string, or text that failed),
        freeing their blocks; each keeps the tokens its output kept. A request all of whose
        samples are done ends here."""
        for stop in stops:
            request = stop.request
            if self.requests.get(request.request_id) is not request:
                continue  # it ended already
            seq = request.seqs[stop.index]
            self.scheduler.stop(seq, stop.num_output_tokens, stop.finish_reason, stop.stop_reason)
            if request.finished:
                self._forget(request.request_id)
                self.plugins.request_finished(request_info(request))

    def _forget(self, request_id: str) -> Request | None:
        """Drop a request from the engine's books; its adapter weights may then age out."""
        request = self.requests.pop(request_id, None)
        if request is not None:
            self.fair_share.leave(request)
        if request is not None and request.adapter_identity is not None:
            self.residency.release(request)
        return request

    def _steps_running(self) -> bool:
        """Whether sequences are running whose steps an adapter load would slow (asked from
        loader threads: a list's length and a thread id). Never on the thread that runs the
        steps: no step runs while it loads (the offline engine reads a cold adapter in
        `add_request`), so a pause there would only hold up every running sequence (issue
        47: a rank-64 cold adapter's first token took 4.3 s there, 1.6-2.0 s unpaced)."""
        scheduler = getattr(self, "scheduler", None)
        if scheduler is None or not scheduler.running:
            return False
        return threading.get_ident() != self._step_thread

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- the step -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step and its outputs (output processing inline: the offline LLM's way)."""
        return self.process_outputs(self.step_tokens())

    def process_outputs(self, step: StepOutput) -> list[RequestOutput]:
        """Text, stop strings and outputs of a step; samples stopped by a stop string are
        finished (their blocks freed) before the next step."""
        outputs, stops = self.output_processor.process(step)
        self.stop_sequences(stops)
        return [out for _, out in outputs]

    def step_tokens(self) -> StepOutput:
        """Schedule, execute, update from the output: each touched request's new token ids,
        before any text (engine/core/step_output.py)."""
        self._step_thread = threading.get_ident()  # loads on this thread are not paced
        if self.residency is not None:
            self.residency.new_step()
        start, clock, window_ms = time.perf_counter(), StepClock(), 0.0
        scheduled = self.scheduler.schedule()
        if not scheduled.empty:
            mark_scheduled(scheduled)
            clock.lap("schedule")
            if self.residency is not None and self.residency.lend_window() > 0:
                window_ms = clock.set_aside()
        result = self.runner.execute(scheduled, clock)
        records = self._records(self.scheduler.update_from_output(scheduled, result))
        if scheduled.empty:
            if not records and self.residency is not None:
                self.residency.wait(timeout=0.05)  # all that is left waits on a load
            return self.step_output(records)
        clock.lap("output")
        ms = (time.perf_counter() - start) * 1e3 - window_ms
        self._record_step(scheduled, ms, clock, window_ms)
        return self.step_output(records)

    def step_output(self, records: list[RequestTokens] | None = None) -> StepOutput:
        """The step's records after the requests added and aborted since the last one."""
        events, self._events = self._events, []
        return StepOutput(events, records or [])

    def _record_step(self, scheduled, ms: float, clock: StepClock, window_ms: float) -> None:
        """Keep the step's record; its timing keeps the next step's budget current."""
        budget = self.scheduler.max_num_batched_tokens
        record = self.step_records.add(scheduled, budget, ms, clock, window_ms)
        if self.residency is not None:  # a load's window between steps is a share of them
            self.residency.step_took(ms / 1e3)
        self.step_budget.observe(record.num_tokens, ms)
        self.scheduler.max_num_batched_tokens = self.step_budget.tokens

    def _records(self, touched: list[Request]) -> list[RequestTokens]:
        """What the step hands on of each request it touched."""
        records = []
        for request in touched:
            record = self._record(request)
            if record is not None:
                records.append(record)
        return records

    def _new_sequence(self, request: Request, index: int) -> Sequence:
        params = request.params
        return Sequence(next(self._seq_ids), request, index, sample_generator(params.seed, index))

    def _record(self, request: Request) -> RequestTokens | None:
        """What output processing needs of a request this step touched, copied."""
        finished = request.finished
        if request.beam is not None and not finished:
            return None  # beam search answers once, at the end
        if finished:
            self._forget(request.request_id)
            self.plugins.request_finished(request_info(request))
        seqs = []
        if request.beam is None:
            for seq in request.seqs:
                results, seq.unreported = seq.unreported, []
                seqs.append(SeqTokens(seq.index, results, seq.finish_reason, seq.stop_reason))
        beam = request.beam
        return RequestTokens(
            request,
            seqs,
            finished,
            request.error,
            request.error_type,
            request.first_token_time,
            request.first_scheduled_time,
            prompt_logprobs(request) if request.prompt_logprobs is not None else None,
            [(list(t), score) for t, score in beam.results] if beam is not None else None,
        )

    def apply_chat_template(self, chat: ChatPrompt) -> list[int]:
        return self.inputs.apply_chat_template(chat)

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """A text's prompt token ids, with the model's special tokens unless told not to."""
        return self.inputs.encode(text, add_special_tokens)

    # ---- checks -------------------------------------------------------------------------
    def _validate(
        self, token_ids, params: SamplingParams, lora_request, identity
    ) -> tuple[LoRARequest | None, WeightsIdentity | None]:
        """Raise for anything wrong; return the LoRARequest the request runs with (a store
        object's local directory) and the weights it is admitted under (the adapter files'
        content now, unless a loader read them already), which scope its KV."""
        check_request(self.inputs, self.plugins, token_ids, params)
        if lora_request is not None:
            if self.residency is None:
                raise ValueError(
                    f"request names LoRA adapter {lora_request.lora_name!r} "
                    "but the engine was started without enable_lora=True"
                )
            return self.residency.admit(lora_request, identity)
        return None, None

    def add_adapter(self, lora_request: LoRARequest):
        """Read and validate the adapter's files into the CPU tier (one stat when they are
        unchanged since read): its LoRAAdapter. AdapterError for a bad one."""
        return self._residency().preload(lora_request)

    def remove_adapter(self, lora_request: LoRARequest) -> bool:
        """Drop the adapter's weights from every tier; True if any were cached. ValueError,
        changing nothing, while running sequences use its slot; weights that admitted
        requests still need stay in the CPU tier until those requests end."""
        return self._residency().remove(lora_request, self.scheduler.busy_adapter_slots())

    def pin_adapter(self, lora_request: LoRARequest, pinned: bool = True) -> None:
        """Pin (or unpin) an adapter: eviction candidates say so, LRU evicts it last."""
        self._residency().pin(lora_request, pinned)

    def _residency(self):
        if self.residency is None:
            raise ValueError("the engine was started without enable_lora=True")
        return self.residency

    # ---- stats --------------------------------------------------------------------------
    def get_memory_stats(self) -> dict:
        return engine_stats.memory_stats(self.scheduler, self.swapper, self.config.block_size)

    def check_integrity(self) -> None:
        """Every KV block free, cached or owned, with consistent reference counts."""
        engine_stats.check_integrity(self.scheduler, self.swapper)
