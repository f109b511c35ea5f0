"""Choosing each next token: per-request sampling settings (sampling_params,
structured_outputs, beam_search_params), their per-row tensors beside the persistent batch
(sampling_batch, penalty_counts), the sampler and its top-p without a sort (wide_nucleus),
which sampler each row uses (sample_dispatch), and one grammar mask per step
(grammar_masks)."""
