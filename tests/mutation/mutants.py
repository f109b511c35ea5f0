"""Small targeted engine bugs, applied at run time by rewriting one snippet of one function.

Each mutant is a bug class that speed work on the engine can introduce. Its snippet must
occur exactly once in the current source, or the mutant is stale and the run fails: when
the engine changes, the mutant is updated with it, never silently dropped.
"""

from __future__ import annotations
import __future__

import importlib
import inspect
import textwrap
from dataclasses import dataclass


class StaleMutant(Exception):
    pass


@dataclass(frozen=True)
class Patch:
    module: str
    function: str  # "Class.method" or "function"
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    patches: tuple[Patch, ...]
    first: str = ""  # the test expected to catch it, run first to keep the check short


RUNNER = "loragate.engine.runner.model_runner"
SWAP = "loragate.engine.core.swap"
BLOCKS = "loragate.engine.core.block_manager"
SWAP_COPY = "self.kv_cache.data[:, :, dst] = self.cpu[:, :, seq.swapped_blocks].to(dst.device)"
INPUT_BATCH = "loragate.engine.runner.input_batch"
SLOT_OFFSET = "return blocks * block_size + positions % block_size"
BLOCK_INDEX = "blocks = tables[rows, positions // block_size].to(torch.long)"
ROW_SLOTS = "[item.seq.lora_slot for item in items]"
RETURN_BATCH = "    return batch, sampled\n"
MAKE_BATCH = "    batch = ForwardBatch(\n"

OUTPUTS = "loragate.engine.outputs.output_processor"
MASKS = "loragate.engine.sampling.grammar_masks"
STREAMED = (
    "tests/engine/test_output_processing.py::test_streamed_text_and_stops_equal_the_step_threads"
)
ONE_CALL_ROWS = (
    "tests/engine/test_grammar_masks.py::"
    "test_several_constrained_rows_take_one_call_and_free_rows_are_untouched"
)
STAGGERED = "tests/engine/test_staggered_equality.py::"
SLOT_COPIES = "loragate.adapters.slot_copies"
COPY_ORDER = "tests/adapters/test_slot_copies.py::"
COPY_ORDER += "test_a_write_goes_a_layer_at_a_time_and_ends_as_a_write_at_once"
RELEASED = (
    "tests/engine/test_adapter_files_change.py::"
    "test_finished_and_aborted_requests_release_their_weights"
)
COPY_WAITS = "tests/engine/test_slot_copies_in_step.py::"
COPY_WAITS += "test_the_forward_reads_each_layer_after_its_copy_and_answers_as_peft"
PREEMPT_SWAP = STAGGERED + "test_preemption_under_tight_kv_matches_hf[swap]"
JOINING = STAGGERED + "test_requests_joining_running_decodes_match_hf"
EVICTED = STAGGERED + "test_prefix_cache_evicted_blocks_are_not_reused_stale"
CHUNKED = STAGGERED + "test_chunked_prefill_matches_unchunked_and_hf"
LORA = "tests/engine/test_staggered_lora.py"
DORA = "tests/engine/test_dora_and_bias.py"
VOCAB = "tests/engine/test_vocab_adapters.py"
RANKS = "tests/engine/test_mixed_ranks.py"
FORKS = "tests/engine/test_sequence_sharing.py"
ROWS = "tests/engine/test_input_batch.py"
SAMPLING_ROWS = "tests/engine/test_sampling_batch.py"
PENALTY_COUNTS = "tests/engine/test_penalty_counts.py"
SAMPLING_BATCH = "loragate.engine.sampling.sampling_batch"
SCHEDULER = "loragate.engine.core.scheduler"
STEP_RULES = "tests/engine/test_scheduler_update.py"
PREEMPT_RECOMPUTE = STAGGERED + "test_preemption_under_tight_kv_matches_hf[recompute]"
COUNTS = "loragate.engine.sampling.penalty_counts"

MUTANTS = [
    Mutant(
        "swap_in_skips_copy",
        "swap-in takes fresh blocks but never copies the KV back (stale blocks)",
        (Patch(SWAP, "KVSwapper.swap_in", SWAP_COPY, "pass"),),
        first=PREEMPT_SWAP,
    ),
    Mutant(
        "swap_in_reversed_blocks",
        "swapped blocks are restored in reversed order",
        (
            Patch(
                SWAP, "KVSwapper.swap_in", "seq.swapped_blocks].to", "seq.swapped_blocks[::-1]].to"
            ),
        ),
        first=PREEMPT_SWAP,
    ),
    Mutant(
        "swap_in_random_kv",
        "swap-in fills the restored blocks with noise",
        (
            Patch(
                SWAP,
                "KVSwapper.swap_in",
                SWAP_COPY,
                "self.kv_cache.data[:, :, dst] = torch.randn_like(self.kv_cache.data[:, :, dst])",
            ),
        ),
        first=PREEMPT_SWAP,
    ),
    Mutant(
        "decode_context_cut_in_mixed_steps",
        "decodes lose their last 8 context tokens, only in steps that also prefill",
        (
            Patch(
                RUNNER,
                "ModelRunner.prepare",
                RETURN_BATCH,
                "    if batch.prefill is not None and batch.decode is not None:\n"
                "        batch.decode.seq_lens = (batch.decode.seq_lens - 8).clamp(min=1)\n"
                + RETURN_BATCH,
            ),
        ),
        first=JOINING,
    ),
    Mutant(
        "decode_attends_one_token",
        "decode attention reads one token of context",
        (
            Patch(
                RUNNER,
                "ModelRunner._decode_attention",
                "[i.seq.num_computed_tokens + 1 for i in items]",
                "[1 for i in items]",
            ),
        ),
        first=JOINING,
    ),
    Mutant(
        "lora_skipped_in_decode",
        "decode tokens run on the base model (adapter slot -1)",
        (
            Patch(
                RUNNER,
                "ModelRunner.prepare",
                ROW_SLOTS,
                "[item.seq.lora_slot if item in prefills else -1 for item in items]",
            ),
        ),
        first=LORA,
    ),
    Mutant(
        "copy_on_write_skipped",
        "a shared, partly filled block is written in place (no copy on write)",
        (Patch(RUNNER, "ModelRunner._copy_on_write", "if copies:", "if False:"),),
        first=FORKS,
    ),
    Mutant(
        "slot_mapping_off_by_one",
        "steps where every sequence adds one token write their K/V one slot further on",
        (
            Patch(
                RUNNER,
                "slot_mapping",
                SLOT_OFFSET,
                "return blocks * block_size + (positions + int(rows.numel() == int(rows.max()) "
                "+ 1)) % block_size",
            ),
        ),
        first=JOINING,
    ),
    Mutant(
        "block_index_off_by_one",
        "K/V of every block after a sequence's first is written into the block before it",
        (
            Patch(
                RUNNER,
                "slot_mapping",
                BLOCK_INDEX,
                "blocks = tables[rows, positions // block_size - (positions >= block_size).long()]"
                ".to(torch.long)",
            ),
        ),
        first=JOINING,
    ),
    Mutant(
        "input_batch_stale_row",
        "a sequence that leaves the persistent batch leaves its row's table behind",
        (Patch(INPUT_BATCH, "InputBatch.sync", "self._clear(row)", "pass"),),
        first=ROWS,
    ),
    Mutant(
        "sampling_row_stale_after_leave",
        "a sequence that leaves the persistent batch leaves its sampling parameters behind",
        (Patch(INPUT_BATCH, "InputBatch.sync", "self.sampling.clear(row)", "pass"),),
        first=SAMPLING_ROWS,
    ),
    Mutant(
        "penalty_counts_kept_after_leave",
        "a sequence that leaves its row leaves its penalty counts for the next one to add to",
        (Patch(SAMPLING_BATCH, "SamplingBatch.clear", "self.counts.forget(row)", "pass"),),
        first=PENALTY_COUNTS,
    ),
    Mutant(
        "penalty_counts_not_zeroed_on_rebuild",
        "a row's penalty counts are rebuilt on top of its previous sequence's",
        (
            Patch(
                COUNTS,
                "PenaltyCounts.gather",
                "self.output_counts.index_fill_(0, index, 0)",
                "pass",
            ),
        ),
        first=PENALTY_COUNTS,
    ),
    Mutant(
        "block_table_row_not_updated",
        "a sequence's row in the persistent batch is not rewritten when it grows a block",
        (
            Patch(
                BLOCKS,
                "BlockManager._grow",
                "self.changed_tables[seq.seq_id] = seq",
                "pass",
            ),
        ),
        first=JOINING,
    ),
    Mutant(
        "adapter_slot_mixup",
        "two requests with different adapters run with each other's weights",
        (
            Patch(
                RUNNER,
                "ModelRunner.prepare",
                MAKE_BATCH,
                "    pair = sorted({int(s) for s in lora_slots if s >= 0})[:2]\n"
                "    if len(pair) == 2:\n"
                "        swap = {pair[0]: pair[1], pair[1]: pair[0]}\n"
                "        swapped = [swap.get(int(s), int(s)) for s in lora_slots]\n"
                "        lora_slots = torch.tensor(swapped)\n" + MAKE_BATCH,
            ),
        ),
        first=LORA,
    ),
    Mutant(
        "lora_scale_ignored",
        "LoRA output is not scaled by lora_alpha / r",
        (
            Patch(
                "loragate.engine.models.decoder",
                "_add_lora",
                "lora.weights.scales,",
                "torch.ones_like(lora.weights.scales),",
            ),
        ),
        first=LORA,
    ),
    Mutant(
        "lora_module_columns_shifted",
        "every module of a fused projection adds its LoRA to the first module's columns",
        (
            Patch(
                "loragate.kernels.lora_modules",
                "LoRAModules._native_table",
                "bt.shape[2], columns.start",
                "bt.shape[2], 0",
            ),
        ),
        first=LORA,
    ),
    Mutant(
        "borrowed_slot_not_placed",
        "a CPU slot that borrows its adapter's rows is never pointed at them",
        (
            Patch(
                "loragate.adapters.slots",
                "DeviceSlots._borrow",
                "modules.place(slot, self._placement(layer, group, slot))",
                "modules.place(slot, None)",
            ),
        ),
        first=LORA,
    ),
    Mutant(
        "held_weights_evicted_for_a_load",
        "weights an admitted request holds leave the CPU tier for another request's weights",
        (
            Patch(
                "loragate.adapters.cpu_tier",
                "CpuTier.insert",
                "droppable = [held for held in self._weights if not self._holds.get(held)]",
                "droppable = list(self._weights)",
            ),
        ),
        first="tests/adapters/test_held_weights_stay.py",
    ),
    Mutant(
        "busy_slot_evicted",
        "the device tier offers the eviction plugin slots running sequences use",
        (
            Patch(
                "loragate.adapters.device_tier",
                "DeviceTier.victims",
                "if slot not in busy_slots and owner not in victims",
                "if owner not in victims",
            ),
        ),
        first="tests/adapters/test_adapter_tiers.py::test_busy_slots_are_never_evicted",
    ),
    Mutant(
        "one_release_drops_every_hold",
        "one request that ends drops the holds of every request admitted under its weights",
        (
            Patch(
                "loragate.adapters.cpu_tier",
                "CpuTier.release",
                "self._holds[identity] -= 1",
                "self._holds[identity] = 0",
            ),
        ),
        first=RELEASED,
    ),
    Mutant(
        "ended_request_keeps_its_hold",
        "the residency never releases the weights a request that ended was admitted under",
        (
            Patch(
                "loragate.engine.lora.adapter_residency",
                "AdapterResidency.release",
                "self.release_weights(request.adapter_identity)",
                "pass",
            ),
        ),
        first=RELEASED,
    ),
    Mutant(
        "vouched_read_trusts_changed_files",
        "weights read back for an admitted request skip their hash though the files changed",
        (
            Patch(
                "loragate.adapters.loader",
                "vouched_identity",
                "return identity if trusted.trusted and trusted.same_files(stamp) else None",
                "return identity if trusted.trusted else None",
            ),
        ),
        first="tests/adapters/test_vouched_reload.py",
    ),
    Mutant(
        "store_check_in_a_book_of_its_own",
        "the fetcher's check vouches in a book the engine's cache never reads: fetched files "
        "are hashed twice",
        (
            Patch(
                "loragate.engine.lora.adapter_residency",
                "identity_book",
                "return fetcher.book",
                "return IdentityBook(stamp_clock)",
            ),
        ),
        first="tests/engine/test_stored_adapter_vouch.py::"
        "test_the_check_and_the_engine_read_write_one_book",
    ),
    Mutant(
        "store_check_stands_for_a_read",
        "a stat admits files on a store's check alone, though they were never read and "
        "validated as an adapter",
        (
            Patch(
                "loragate.adapters.identity",
                "IdentityBook.known",
                "entry = None if directory in self._unread else self._entries.get(directory)",
                "entry = self._entries.get(directory)",
            ),
        ),
        first="tests/adapters/test_adapter_identity.py::"
        "test_a_store_check_vouches_without_standing_for_a_read",
    ),
    Mutant(
        "read_into_viewed_memory",
        "a read's mapping is kept for the next read though an adapter's rows still view it",
        (
            Patch(
                "loragate.adapters.read_buffers",
                "unviewed",
                "return False",
                "return True",
            ),
        ),
        first="tests/adapters/test_read_buffers.py",
    ),
    Mutant(
        "load_window_before_a_join",
        "the machine is lent to adapter loads before a step that brings an adapter into a slot",
        (
            Patch(
                "loragate.engine.lora.adapter_residency",
                "AdapterResidency.lend_window",
                "if self._copied_this_step:",
                "if False:",
            ),
        ),
        first="tests/engine/test_load_pacing.py",
    ),
    Mutant(
        "load_window_outlasts_its_loads",
        "a window lent to adapter loads runs its whole length after the last load ended",
        (
            Patch(
                "loragate.adapters.pacing",
                "LoadWindows.lend",
                "while self._loads > 0:",
                "while True:",
            ),
        ),
        first="tests/adapters/test_load_windows.py",
    ),
    Mutant(
        "dora_scale_from_another_slot",
        "a DoRA row takes another adapter's column scales (and lora_B biases)",
        (
            Patch(
                "loragate.engine.models.decoder",
                "_add_lora",
                "    rows, slots = extras\n",
                "    rows, slots = extras[0], extras[1].flip(0)\n",
            ),
        ),
        first=DORA,
    ),
    Mutant(
        "embedding_lora_row_for_the_wrong_token",
        "an embedding LoRA adds the row of another token of the batch",
        (
            Patch(
                "loragate.engine.models.decoder",
                "_embed_rows",
                "(a_t[tokens] @ b.T)",
                "(a_t[tokens.flip(0)] @ b.T)",
            ),
        ),
        first=VOCAB,
    ),
    Mutant(
        "lm_head_rows_given_the_base_logits",
        "the rows of an adapter with an lm_head LoRA or its own lm_head get the base's logits",
        (
            # One patch: a function is patched from its source once (a second patch of the
            # same function would look for the source of the first one's result).
            Patch(
                "loragate.engine.models.decoder",
                "PagedDecoder.compute_logits",
                "logits[rows] = _head_rows(logits[rows], hidden[rows], vocab)\n"
                "    if lora is not None:\n"
                "        _add_head_lora(lora, batch.sample_indices, hidden, logits)",
                "logits[rows] = logits[rows]\n    if lora is not None:\n        pass",
            ),
        ),
        first=VOCAB,
    ),
    Mutant(
        "slot_read_at_another_rank",
        "each slot's rows read at the smallest adapter's rank instead of its own",
        (
            Patch(
                "loragate.kernels.lora_modules",
                "_checked",
                "entry[1].data_ptr(), len(entry[0]))",
                "entry[1].data_ptr(), min(len(entry[0]), 8))",
            ),
        ),
        first=RANKS,
    ),
    Mutant(
        "stale_prefix_cache_after_eviction",
        "a cached block handed out again keeps its prefix-cache entry",
        (
            Patch(
                BLOCKS,
                "BlockManager.take_free_block",
                "h = self.hash_of_block.pop(block, None)",
                "h = None",
            ),
        ),
        first=EVICTED,
    ),
    Mutant(
        "chunk_ignores_earlier_context",
        "a prefill chunk (or prefix-cache hit) attends only to its own new tokens",
        (
            Patch(
                RUNNER,
                "ModelRunner._prefill_attention",
                "[i.seq.num_computed_tokens + i.num_new_tokens for i in items]",
                "[i.num_new_tokens for i in items]",
            ),
        ),
        first=CHUNKED,
    ),
    Mutant(
        "stop_string_not_sent_to_engine",
        "a sample stopped by a stop string beside the step is never stopped in the engine",
        (
            Patch(
                OUTPUTS,
                "OutputProcessor._take",
                "return by_token is None and tokens.finish_reason is None",
                "return False",
            ),
        ),
        first=STREAMED,
    ),
    Mutant(
        "tokens_after_stop_kept",
        "tokens the step took after a stop string join the finished sample's output",
        (
            Patch(
                OUTPUTS,
                "OutputProcessor._process_request",
                "if not sample.finished and self._take(",
                "if self._take(",
            ),
        ),
        first=STREAMED,
    ),
    Mutant(
        "grammar_masks_on_wrong_rows",
        "the step's constrained rows take each other's grammar masks",
        (
            Patch(
                MASKS,
                "GrammarMasks.apply_",
                "index = torch.tensor(filled, dtype=torch.int64)",
                "index = torch.tensor(filled[::-1], dtype=torch.int64)",
            ),
        ),
        first=ONE_CALL_ROWS,
    ),
    Mutant(
        "fork_computed_tokens_not_advanced",
        "samples 2..n forked in a step do not advance with their parent (issue 58: the one "
        "writer of computed tokens skips the step's forks)",
        (
            Patch(
                SCHEDULER,
                "Scheduler.update_from_output",
                "for item in out.prefills + out.decodes + out.forks:",
                "for item in out.prefills + out.decodes:",
            ),
        ),
        first=FORKS,
    ),
    Mutant(
        "preempted_keeps_computed_tokens",
        "a sequence preempted to recompute keeps its computed-token count though its blocks "
        "are freed",
        (Patch(SCHEDULER, "Scheduler._preempt", "seq.num_computed_tokens = 0", "pass"),),
        first=PREEMPT_RECOMPUTE,
    ),
    Mutant(
        "prefix_hit_not_counted_as_computed",
        "the scheduler takes a prefix-cache hit's blocks but does not count their tokens as "
        "computed (so the hit's tokens run again)",
        (
            Patch(
                SCHEDULER,
                "Scheduler._schedule_waiting",
                "seq.num_computed_tokens = hit.num_tokens",
                "pass",
            ),
        ),
        first=STEP_RULES,
    ),
    Mutant(
        "stopped_sample_keeps_dropped_tokens",
        "a sample stopped by a stop string keeps the tokens past the stop in its sequence",
        (
            Patch(
                SCHEDULER,
                "Scheduler.stop",
                "del seq.token_ids[seq.prompt_len + num_output_tokens :]",
                "pass",
            ),
        ),
        first=STEP_RULES,
    ),
    Mutant(
        "slot_copy_read_unwaited",
        "the step reads a layer's slots without waiting for its copy on the side stream",
        (Patch(SLOT_COPIES, "SlotCopies.ready", "self.streams.wait(event)", "pass"),),
        first=COPY_WAITS,
    ),
    Mutant(
        "slot_copy_marked_before_written",
        "a layer's copy is marked done before its rows are written",
        (
            Patch(
                SLOT_COPIES,
                "SlotCopies.run",
                "write_layers(range(layer, layer + 1))\n"
                "            self._pending[layer] = self.streams.mark()",
                "self._pending[layer] = self.streams.mark()\n"
                "            write_layers(range(layer, layer + 1))",
            ),
        ),
        first=COPY_ORDER,
    ),
    Mutant(
        "full_slots_never_freed_for_a_waiting_tenant",
        "with every adapter slot held, fairness never preempts to free one",
        (
            Patch(
                SCHEDULER,
                "Scheduler._free_adapter_slot",
                "return sum(self._give_up(s, out) for s in group)",
                "return None",
            ),
        ),
        first="tests/engine/test_fair_slot_preemption.py::"
        "test_a_tenant_waiting_for_a_slot_gets_one_under_fair_and_waits_under_fcfs",
    ),
]
BY_NAME = {m.name: m for m in MUTANTS}


def apply(mutant: Mutant) -> None:
    """Replace each patched function by its mutated source, compiled in its own module."""
    for patch in mutant.patches:
        module = importlib.import_module(patch.module)
        owner_name, _, name = patch.function.rpartition(".")
        owner = getattr(module, owner_name) if owner_name else module
        source = textwrap.dedent(inspect.getsource(getattr(owner, name)))
        if source.count(patch.old) != 1:
            raise StaleMutant(f"{mutant.name}: {patch.old!r} not found once in {patch.function}")
        flags = __future__.annotations.compiler_flag
        code = compile(
            source.replace(patch.old, patch.new), f"<mutant {mutant.name}>", "exec", flags
        )
        scope: dict = {}
        exec(code, module.__dict__, scope)  # our own source, one snippet changed
        setattr(owner, name, scope[name])
