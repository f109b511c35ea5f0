"""From token ids to what callers see: output processing beside the step (output_processor),
detokenizing a step at a time, stop rules (stopping), the RequestOutput / CompletionOutput
shapes (request_output) and building them (output_builder)."""
