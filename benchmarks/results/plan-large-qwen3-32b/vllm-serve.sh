vllm serve Qwen/Qwen3-32B \
    --tensor-parallel-size 1 \
    --data-parallel-size 2 \
    --max-num-batched-tokens 2048 \
    # sarathi: reserve whole prompts (vLLM has no such flag)
