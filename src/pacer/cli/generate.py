"""`pacer generate PROMPT`: one prompt through the offline API (`LLM.generate`, or `LLM.chat` with
`--chat`), printing each sample, its logprobs when asked, and its TTFT / TPOT."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pacer.config.args import add_engine_args, engine_kwargs_from_args

__all__ = ["add_args", "run"]


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="prompt text")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64,
                   help="most tokens to generate per sample (default 64)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 is greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="sample from the most likely tokens whose probabilities sum to this, in (0, 1]; "
                        "1 is off")
    p.add_argument("--top-k", type=int, default=0, help="sample from the K most likely tokens; 0 is off")
    p.add_argument("--seed", dest="sample_seed", type=int, default=None, help="per-request sampling seed")
    p.add_argument("--n", type=int, default=1, help="samples of the prompt (each printed under its index)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="generate max_tokens even past end-of-sequence")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="OpenAI's, in [-2, 2]: subtracted from the logit of every token generated at least "
                        "once; 0 is off")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="OpenAI's, in [-2, 2]: times a token's count among the generated tokens, subtracted "
                        "from its logit; 0 is off")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="vLLM's, > 0: divides positive and multiplies negative logits of prompt and output "
                        "tokens; 1 is off")
    p.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help="print each output token's logprob and the K most likely alternatives")
    add_engine_args(p, skip=("seed",))


def run(args: argparse.Namespace) -> int:
    from pacer.llm import LLM
    from pacer.request import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.sample_seed, n=args.n, stop=tuple(args.stop),
                            ignore_eos=args.ignore_eos, presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty,
                            repetition_penalty=args.repetition_penalty, logprobs=args.logprobs)
    llm = LLM(**engine_kwargs_from_args(args))
    if args.chat:
        out = llm.chat([{"role": "user", "content": args.prompt}], params)[0]
    else:
        out = llm.generate(args.prompt, params)[0]
    for sample in out.outputs:
        if args.n > 1:
            print(f"--- sample {sample.index}")
        print(sample.text)
        if sample.logprobs is not None:
            _print_logprobs(llm.tokenizer, sample.token_ids, sample.logprobs)
        m = sample.metrics
        tpot = f"{m.tpot * 1000:.1f} ms" if m.tpot is not None else "n/a"
        ttft = m.ttft if m.ttft is not None else float("nan")
        print(f"[pacer] ttft {ttft * 1000:.1f} ms, tpot {tpot}, prompt {m.prompt_tokens} tokens, "
              f"output {len(sample.token_ids)} tokens, finish {sample.finish_reason}", file=sys.stderr)
    return 0


def _print_logprobs(tokenizer: Any, token_ids: list[int], logprobs: list[dict[int, float]]) -> None:
    """One line per output token: the token, its logprob, then the top alternatives."""
    def show(t: int) -> str:
        return repr(tokenizer.decode([t])) if tokenizer is not None else str(t)

    for t, lp in zip(token_ids, logprobs):
        top = ", ".join(f"{show(a)} {v:.3f}" for a, v in list(lp.items())[1:])
        print(f"  {show(t):>16} {lp.get(t, float('nan')):8.3f}" + (f"   top: {top}" if top else ""))
