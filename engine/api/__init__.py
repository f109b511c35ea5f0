"""The engine's entry points and what callers see of it: the offline LLM, the async engine
and the EngineClient protocol, the one request object every hop passes on (engine_request),
EngineArgs and the frozen EngineConfig, prompts checked into token ids (input_processor),
results crossing to an asyncio loop (thread_bridge), the model's description (model_info),
stats snapshots (engine_stats) and the plain data plugin hooks take (plugin_data)."""
