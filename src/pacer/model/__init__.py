"""pacer.model: loading checkpoints (HF directories, GGUF), the Llama-family forward on packed
batches with paged KV, the sampler and the tokenizer."""
