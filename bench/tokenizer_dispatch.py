"""How long a rollout batch's prompt groups take to reach the engine actor: upstream's dispatch, which sends the
tokenizer with every prompt's call, against ours, which gives each engine the tokenizer once
(``openrlhf_classmate/integration/rollout/tokenizer_handle.py``).

Both go through the real ``_dispatch_prompts_to_vllm`` of OpenRLHF's ``SamplesGenerator`` (ours:
``ClassmateSamplesGenerator``'s, which wraps it) to one real Ray async actor with the engine's call signature. The
actor's ``generate_responses`` returns the moment it starts, so the figure is the dispatch alone: from the call to
the start of the last prompt group's call on the engine (Ray pickles each call's arguments in the driver and
unpickles them in the actor, one call after the other). The tokenizer is the step-time benchmark's: a word-level
tokenizer of Qwen2.5's 151,936 entries (2.4 MB pickled). The two ways run interleaved, ``--rounds`` times each after
one untimed round each (ours gives the engine its tokenizer in that round); the report gives medians, min and max.

    python bench/tokenizer_dispatch.py [--prompts 16] [--rounds 7] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import openrlhf_classmate  # noqa: E402,F401  (CPU shims before openrlhf imports)


class ProbeEngine:
    """The engine actor's call surface; ``generate_responses`` reports when it started."""

    def __init__(self):
        import openrlhf_classmate  # noqa: F401,F811  (in the actor: the CPU vLLM shim, to unpickle the requests)

        self.calls = 0

    def get_num_unfinished_requests(self) -> int:
        return 0

    def remember_tokenizer(self, key: str, tokenizer) -> None:
        from openrlhf_classmate.integration.rollout import tokenizer_handle

        tokenizer_handle.remember(key, tokenizer)

    async def generate_responses(self, prompt, label, sampling_params, max_length, hf_tokenizer, num_samples=1,
                                 images=None):
        self.calls += 1
        return time.time(), len(hf_tokenizer)


def step_time_tokenizer():
    """The step-time benchmark's tokenizer of Qwen2.5-0.5B's vocabulary size."""
    from bench.step_time import QWEN25_05B, WORDS
    from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

    overhead = len(build_word_tokenizer(WORDS)) - len(WORDS)
    return build_word_tokenizer(WORDS + [f"w{i}" for i in range(QWEN25_05B["vocab_size"] - overhead - len(WORDS))])


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "runs": [round(v, 4) for v in values]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16, help="prompt groups per rollout batch (calls)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of each way")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    import ray
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    from openrlhf_classmate.integration.launch.args import parse_args
    from openrlhf_classmate.integration.rollout.samples_generator import ClassmateSamplesGenerator

    tokenizer = step_time_tokenizer()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": REPO}})
    try:
        engine = ray.remote(ProbeEngine).options(max_concurrency=1000).remote()
        run_args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl"])
        generators = {}
        for name, cls in (("upstream", SamplesGenerator), ("handle", ClassmateSamplesGenerator)):
            generator = cls.__new__(cls)
            generator.args, generator.tokenizer, generator.vllm_engines = run_args, tokenizer, [engine]
            generators[name] = generator
        prompts = [f"prompt {i}" for i in range(args.prompts)]
        kwargs = dict(temperature=1.0, max_new_tokens=512, n_samples_per_prompt=8, max_len=576)

        def dispatch(name: str) -> float:
            start = time.time()
            refs = generators[name]._dispatch_prompts_to_vllm(prompts, ["l"] * len(prompts), **kwargs)
            started = ray.get(refs)
            assert all(size == len(tokenizer) for _, size in started)  # the engine read the real tokenizer
            return max(t for t, _ in started) - start

        first = {name: dispatch(name) for name in generators}  # untimed; "handle" gives the engine its tokenizer
        times: dict[str, list[float]] = {name: [] for name in generators}
        for r in range(args.rounds):
            for name in (list(generators) if r % 2 == 0 else list(generators)[::-1]):
                times[name].append(dispatch(name))
    finally:
        ray.shutdown()
    result = {"prompts": args.prompts, "tokenizer_entries": len(tokenizer), "rounds": args.rounds,
              "first_round_s": {k: round(v, 4) for k, v in first.items()},
              "last_group_started_s": {name: summary(v) for name, v in times.items()}}
    up, ours = (result["last_group_started_s"][k]["median"] for k in ("upstream", "handle"))
    result["upstream_over_handle"] = round(up / ours, 1)
    print(f"{args.prompts} prompt groups to one engine actor, tokenizer of {len(tokenizer)} entries; seconds from "
          f"the dispatch to the start of the last group's call, median [min, max] of {args.rounds} rounds:")
    for name, s in result["last_group_started_s"].items():
        print(f"  {name:8s} {s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]  (first round {first[name]:.3f})")
    print(f"  upstream / handle = {result['upstream_over_handle']}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
