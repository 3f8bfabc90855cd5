"""CPU cost of vLLM's per-token log-prob path, per rollout request variant (the train-inference mismatch
metrics ask for log-probs). Needs a real vLLM (0.26 / 0.29; no GPU: it runs vLLM's own CPU code on synthesised
engine outputs).

With ``SamplingParams.logprobs`` set, vLLM V1 does, for every generated token of every request, work in Python that
a request without log-probs skips: the engine core slices the step's log-prob arrays per request and msgpack-encodes
three small numpy arrays (``EngineCoreOutput.new_logprobs``); the frontend (``AsyncLLM``'s output handler, in the
Ray actor's process) decodes them and runs ``LogprobsProcessor._update_sample_logprobs``: ``tolist`` of the arrays,
one ``tokenizer.decode([id])`` (plus a leading-space probe and UTF-8 repair) per returned entry when the request is
detokenised, a ``{id: Logprob}`` dict per position. With ``logprobs=1`` (upstream's IS-correction request) each
position carries two entries (the sampled token and the top-1), with ``logprobs=0`` one. Independently, a
``CUMULATIVE`` request (vLLM's default) gets a ``RequestOutput`` built and delivered after every token;
``FINAL_ONLY`` only at the end. This script times each part on synthesised outputs of ``--requests`` concurrent
requests x ``--tokens`` decode steps (the step-time bench's 256 x 512 by default), for:

* ``upstream``: upstream's rollout request without IS correction (no log-probs, detokenised, cumulative);
* ``upstream_is``: upstream's request with ``--algo.advantage.is_correction_level`` (``logprobs=1``);
* ``mismatch``: the launcher's default on vLLM (``logprobs=0``, ``detokenize=False``, ``FINAL_ONLY``,
  ``flat_logprobs``: ``openrlhf_classmate/integration/rollout/mismatch.py``), plus ablations of its settings.

Prints one JSON line per variant (seconds and µs per generated token, minimum over ``--repeats``) and a table. The
GPU side (one ``log_softmax`` over the vocabulary and a gather per decode step) is not in these numbers: the GPU
before/after pair is ``bench/step_time.py --mismatch on|off`` (README).

    python bench/vllm_logprobs_overhead.py [--tokenizer DIR] [--requests 256] [--tokens 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import openrlhf_classmate  # noqa: E402,F401

VARIANTS = {  # name -> SamplingParams keywords on top of upstream's
    "upstream": {},
    "upstream_is": {"logprobs": 1},
    "lp0": {"logprobs": 0},
    "lp0_nodetok": {"logprobs": 0, "detokenize": False},
    "mismatch": {"logprobs": 0, "detokenize": False, "output_kind": "FINAL_ONLY", "flat_logprobs": True},
    "mismatch_noflat": {"logprobs": 0, "detokenize": False, "output_kind": "FINAL_ONLY"},
    "upstream_final": {"output_kind": "FINAL_ONLY"},
}


def qwen_sized_tokenizer(path: str) -> str:
    """The step-time bench's word-level tokenizer of exactly 151,936 entries (Qwen2.5's embedding size)."""
    from openrlhf_classmate.testing.e2e import WORDS
    from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

    overhead = len(build_word_tokenizer(WORDS)) - len(WORDS)
    tok = build_word_tokenizer(WORDS + [f"w{i}" for i in range(151_936 - overhead - len(WORDS))])
    tok.save_pretrained(path)
    return path


def request_params(kwargs: dict, **base):
    """``SamplingParams(**base)`` plus a variant's keywords (``VARIANTS``; ``output_kind`` given by name)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    kwargs = dict(kwargs)
    if "output_kind" in kwargs:
        kwargs["output_kind"] = RequestOutputKind[kwargs["output_kind"]]
    return SamplingParams(**base, **kwargs)


def sampled_logprobs(completion) -> list[float]:
    """What upstream's executor reads from a finished request: the sampled token's log-prob at every position."""
    return [d.get(tok).logprob for tok, d in zip(completion.token_ids, completion.logprobs)]


def run_variant(tokenizer, kwargs: dict, requests: int, tokens: int, seed: int = 0) -> dict:
    import numpy as np
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.outputs import LogprobsLists
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    params = request_params(kwargs, temperature=1.0, max_tokens=tokens, min_tokens=1, skip_special_tokens=False)
    processor = OutputProcessor(tokenizer, log_stats=False)
    for i in range(requests):
        processor.add_request(EngineCoreRequest(
            request_id=f"r{i}", external_req_id=f"r{i}", prompt_token_ids=[5, 6, 7, 8], mm_features=None,
            sampling_params=params, pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None,
            data_parallel_rank=None), None)
    rng = np.random.default_rng(seed)
    vocab = len(tokenizer)
    sampled = rng.integers(20, vocab - 1, size=(requests, tokens))
    width = None if params.logprobs is None else params.logprobs + 1  # the sampler's [sampled, top-k...] columns
    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
    # engine core (its own process in vLLM, whose heap never holds the frontend's outputs): every step's outputs are
    # built and encoded first, then the frontend decodes and processes them
    core, steps = 0.0, []
    gc.collect()
    for t in range(tokens):
        lists = None
        if width is not None:  # what the model runner hands the scheduler per step (numpy, on the CPU)
            ids = np.concatenate([sampled[:, t:t + 1], rng.integers(0, vocab, (requests, width - 1))], axis=1)
            lists = LogprobsLists(ids.astype(np.int32), -rng.random((requests, width), dtype=np.float32),
                                  np.ones(requests, dtype=np.int64), None)
        t0 = time.perf_counter()
        outs = [EngineCoreOutput(request_id=f"r{i}", new_token_ids=[int(sampled[i, t])],
                                 new_logprobs=None if lists is None else lists.slice_request(i, 1),
                                 finish_reason=FinishReason.LENGTH if t == tokens - 1 else None)
                for i in range(requests)]
        steps.append([bytes(b) for b in encoder.encode(EngineCoreOutputs(outputs=outs))])
        core += time.perf_counter() - t0
    wire = front = 0.0
    finals = {}
    gc.collect()
    for buffers in steps:
        t1 = time.perf_counter()
        outs = decoder.decode(buffers).outputs
        t2 = time.perf_counter()
        for out in processor.process_outputs(outs).request_outputs:
            if out.finished:
                finals[out.request_id] = out
        t3 = time.perf_counter()
        wire, front = wire + t2 - t1, front + t3 - t2
    t4 = time.perf_counter()
    if width is not None:  # upstream's executor: the sampled token's log-prob of every position
        for out in finals.values():
            assert len(sampled_logprobs(out.outputs[0])) == tokens
    read = time.perf_counter() - t4
    n = requests * tokens
    parts = {"engine_core_s": core, "transport_decode_s": wire, "frontend_s": front, "executor_read_s": read}
    return {**{k: round(v, 3) for k, v in parts.items()},
            "total_us_per_token": round(sum(parts.values()) / n * 1e6, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: build the 151,936-word one)")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    a = p.parse_args()
    import vllm

    if getattr(vllm, "__openrlhf_classmate_shim__", False):
        raise SystemExit("error: this benchmark runs vLLM's own output path: install vLLM (the CPU import shim has "
                         "none); on the GPU machine put the carried vLLM on PYTHONPATH")
    from vllm.tokenizers import get_tokenizer

    path = a.tokenizer or qwen_sized_tokenizer(tempfile.mkdtemp(prefix="qwen_sized_tok_"))
    tokenizer = get_tokenizer(path)
    names = a.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: --variants: unknown {unknown} (known: {', '.join(VARIANTS)})")
    best: dict[str, dict] = {}
    for _ in range(a.repeats):  # interleaved, so that a busy machine slows every variant alike
        for name in names:
            row = run_variant(tokenizer, VARIANTS[name], a.requests, a.tokens)
            if name not in best or row["total_us_per_token"] < best[name]["total_us_per_token"]:
                best[name] = row
    base = best.get("upstream", {}).get("total_us_per_token")
    print(f"vLLM {vllm.__version__}, {a.requests} requests x {a.tokens} tokens, min of {a.repeats}")
    for name in names:
        row = best[name]
        extra = row["total_us_per_token"] - base if base is not None else None
        row["extra_s_per_batch"] = round(extra * a.requests * a.tokens / 1e6, 2) if extra is not None else None
        print(json.dumps({"variant": name, "kwargs": VARIANTS[name], **row}), flush=True)


if __name__ == "__main__":
    main()
