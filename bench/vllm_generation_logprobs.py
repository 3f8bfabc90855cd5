"""GPU generation time of one rollout batch per log-prob request variant: what the ``mismatch/*`` metric
costs in the generation phase, measured on a real vLLM engine.

``bench/vllm_logprobs_overhead.py`` times vLLM's CPU path per request variant on synthesised outputs; this script
times the whole thing on a GPU: one ``AsyncLLMEngine`` (upstream's engine class in ``RolloutRayActor``, CUDA graphs,
``logprobs_mode="processed_logprobs"`` as the launcher starts policy engines) serving a random-weight model of
Qwen2.5-0.5B's shapes (151,936-word vocabulary), ``--requests`` concurrent requests of ``--tokens`` new tokens each
(``ignore_eos``, so every variant generates exactly the same number of tokens), sent at once as upstream's rollout
does. Variants (``bench/vllm_logprobs_overhead.py``'s ``VARIANTS``):

* ``upstream``: upstream's rollout request without IS correction (no log-probs; the metric off);
* ``upstream_is``: upstream's request with ``--algo.advantage.is_correction_level`` (``logprobs=1``);
* ``mismatch``: the launcher's default request (``logprobs=0``, no detokenisation, ``FINAL_ONLY``, flat log-probs).

Each request's output is read as upstream's executor reads it (the sampled token's log-prob of every position).
The variants run interleaved, ``--rounds`` times each after one untimed warm-up round, in an order that rotates every
round; the report gives per variant the median, min and max seconds and, against ``upstream``, the median of the
per-round differences. Not included: the Ray actor boundary (the requests come from the same process here).

    python bench/vllm_generation_logprobs.py [--requests 256] [--tokens 512] [--rounds 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import openrlhf_classmate  # noqa: E402,F401
from bench.vllm_logprobs_overhead import VARIANTS, request_params, sampled_logprobs  # noqa: E402

DEFAULT_VARIANTS = ("upstream", "upstream_is", "mismatch")


def sampling_params(name: str, tokens: int):
    # upstream's rollout request (samples_generator): temperature 1, top_p 1, top_k -1, special tokens kept
    return request_params(VARIANTS[name], temperature=1.0, top_p=1.0, top_k=-1, max_tokens=tokens, ignore_eos=True,
                          skip_special_tokens=False)


async def one_request(engine, prompt: list[int], params, request_id: str) -> int:
    from vllm.inputs import TokensPrompt

    final = None
    async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id=request_id):
        final = out
    completion = final.outputs[0]
    if params.logprobs is not None:  # read as upstream's executor reads it
        values = sampled_logprobs(completion)
        if len(values) != len(completion.token_ids):
            raise RuntimeError(f"{request_id}: {len(values)} log-probs for {len(completion.token_ids)} tokens")
    return len(completion.token_ids)


async def one_batch(engine, prompts: list[list[int]], params, tag: str) -> tuple[float, int]:
    start = time.perf_counter()
    counts = await asyncio.gather(*(one_request(engine, p, params, f"{tag}-{i}") for i, p in enumerate(prompts)))
    return time.perf_counter() - start, sum(counts)


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "runs": [round(v, 3) for v in values]}


async def run(a: argparse.Namespace, model: str) -> dict:
    import torch
    import vllm

    engine = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(
        model=model, dtype="bfloat16", seed=0, gpu_memory_utilization=a.gpu_memory_utilization,
        max_model_len=a.prompt_len + a.tokens + 16, enable_prefix_caching=False,
        logprobs_mode="processed_logprobs"))
    rng = random.Random(0)
    prompts = [[rng.randrange(20, 151_000) for _ in range(a.prompt_len)] for _ in range(a.requests)]
    params = {name: sampling_params(name, a.tokens) for name in a.variants}
    times: dict[str, list[float]] = {name: [] for name in a.variants}
    try:
        for name in a.variants:  # warm-up: the first batches of an engine are slower
            await one_batch(engine, prompts, params[name], f"warm-{name}")
        for r in range(a.rounds):
            order = a.variants[r % len(a.variants):] + a.variants[:r % len(a.variants)]
            for name in order:
                seconds, tokens = await one_batch(engine, prompts, params[name], f"r{r}-{name}")
                if tokens != a.requests * a.tokens:
                    raise RuntimeError(f"{name}: {tokens} tokens, expected {a.requests * a.tokens}")
                times[name].append(seconds)
                print(f"round {r + 1}/{a.rounds} {name:12s} {seconds:7.3f} s "
                      f"({tokens / seconds / 1000:.1f}k tokens/s)", flush=True)
    finally:
        engine.shutdown()
    result = {"device": torch.cuda.get_device_name(0), "vllm": vllm.__version__,
              "batch": f"{a.requests} requests x {a.tokens} new tokens, prompts of {a.prompt_len} tokens",
              "model": "random weights, Qwen2.5-0.5B shapes", "rounds": a.rounds, "variants": {}}
    for name, values in times.items():
        row = summary(values)
        row["tokens_per_s"] = round(a.requests * a.tokens / row["median"])
        if name != "upstream" and "upstream" in times:
            diffs = [v - u for v, u in zip(values, times["upstream"])]
            row["extra_vs_upstream_s"] = summary(diffs)
        result["variants"][name] = row
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    p.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    p.add_argument("--models", default=os.path.expanduser("~/bench_models"),
                   help="where the random model is built once (reused when present)")
    p.add_argument("--out", default=None, help="JSON file for the result")
    a = p.parse_args()
    a.variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in a.variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    import vllm

    if getattr(vllm, "__openrlhf_classmate_shim__", False):
        raise SystemExit("error: this benchmark needs a real vLLM and a GPU (the CPU import shim is active)")
    from bench.step_time import QWEN25_05B, build_model

    model = build_model(os.path.join(a.models, "qwen2.5-0.5b-shape_policy"), QWEN25_05B, seed=0)
    result = asyncio.run(run(a, model))
    print(f"\n{result['device']}, vLLM {result['vllm']}, {result['batch']}; median (min-max) of {a.rounds} rounds")
    print("| request | generation s | tokens/s | extra vs upstream s |\n|---|---|---|---|")
    for name, row in result["variants"].items():
        extra = row.get("extra_vs_upstream_s")
        extra_text = f"{extra['median']:+.3f} ({extra['min']:+.3f} to {extra['max']:+.3f})" if extra else "-"
        print(f"| {name} | {row['median']:.3f} ({row['min']:.3f}-{row['max']:.3f}) | {row['tokens_per_s']} | "
              f"{extra_text} |")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
