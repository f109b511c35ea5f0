"""Running the scheduler's choice on the device: the model runner, its persistent batch
(input_batch), the one flat batch a forward pass takes (forward_batch), the paged KV cache
tensors, CUDA graphs for decode steps, and the sizes fixed at start-up (sizing)."""
