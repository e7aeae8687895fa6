"""vLLM (CPU) batch-1 decode ms/token, run in vLLM's own venv by offline_throughput.py.

One 32-token prompt generates 1 token and then 1 + N tokens (greedy, ignore_eos); the
difference of the two times over N is the decode time per token, without the prefill.
`--repeats` timed runs each, after an untimed warm-up; prints every run in a RESULT line of
JSON, and offline_throughput.py reduces them with the statistic it uses for pacer too.
"""

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(os.path.dirname(args.model), ".vllm-cache"))

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=2048, max_num_seqs=8, seed=0,
              enable_prefix_caching=False)
    prompt = [TokensPrompt(prompt_token_ids=list(range(200, 232)))]

    def runs(n: int) -> list[float]:
        params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0.0)
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            out = llm.generate(prompt, params, use_tqdm=False)
            times.append(time.perf_counter() - t)
            assert len(out[0].outputs[0].token_ids) == n
        return times

    runs(4)   # warm-up
    one, many = runs(1), runs(1 + args.tokens)
    print("RESULT", json.dumps({"engine": "vllm-cpu", "dtype": args.dtype, "tokens": args.tokens,
                                "runs_one_s": one, "runs_many_s": many}))


if __name__ == "__main__":
    main()
