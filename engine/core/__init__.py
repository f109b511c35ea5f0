"""The step itself: the engine (llm_engine), the scheduler and its admission and prefill
orders, fair shares per tenant, the step budget and its start-up timing, what a step ran
(step_record) and hands on (step_output), sequences, KV blocks (block_manager), swap
preemption, beam search's bookkeeping, and the process settings that keep a step quick
(startup_heap, gil_handoff)."""
