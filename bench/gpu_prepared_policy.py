"""Does vLLM load a policy that ``python -m openrlhf_classmate.cli.prepare_policy`` wrote, and see what transformers
sees? (The CPU tests load the prepared folder with transformers, the launcher and ``convert_checkpoint``; vLLM only
runs on a GPU.)

For each case (a Llama-shaped model with an untied head and no spare embedding rows, so the tags force a resize; a
Qwen2-shaped one with a tied head and spare rows, so the tags take spare rows): a small random model over the world
tokenizer without think tags is saved, prepared, then loaded by ``vllm.LLM`` (float32, eager). Checked per case:

* vLLM's tokenizer encodes each tag as the one id that transformers gives it;
* vLLM's prompt log-probs of a text that contains both tags (so the new embedding rows and, untied, the new head
  rows are read) equal transformers' log-probs of the same tokens in the same dtype (largest absolute difference
  printed; at most ``TOLERANCE[dtype]``);
* vLLM generates from a prompt that ends in the open tag (greedy, 16 tokens) the tokens transformers' greedy
  decoding gives (float32 only: in bfloat16 a near tie may go either way, so there it is reported, not checked).

float32 first; if vLLM refuses it (no attention backend for the dtype), bfloat16 on both sides.

Writes ``prepared_policy_vllm.json`` to ``--out`` and exits 1 if a check fails. Run: ``python
bench/gpu_prepared_policy.py --out OUT`` (the ``prepared`` step of ``bench/gpu_validate.sh``); ``--hf-only`` runs
the transformers half alone (the CPU check of this script)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The largest |log-prob vLLM - transformers| a correct load shows. Measured (2026-11-28, H200, vLLM 0.26.0, float32):
# 1.9e-3 (Llama, resized) and 5.8e-3 (Qwen2, tied, spare rows), with every greedy token equal: vLLM's float32 kernels
# are not transformers'. The first run held the check to 2e-3, and the Qwen2 case exceeded it. A tag row read
# wrong (another row, zeros, never written) moves the log-probs after the tag by the logits' scale, O(1) here.
TOLERANCE = {"float32": 1e-2, "bfloat16": 0.1}
TEXT = "<think> let me think step by step: 12 + 7 = 19 </think> the answer is 19"
PROMPT = "what is 12 + 7? <think>"
# name: (architecture, world tokenizer, tied head, spare embedding rows past the tokenizer)
CASES = {"llama_untied_resized": ("llama", "llama3", False, 0), "qwen2_tied_spare_rows": ("qwen2", "qwen3", True, 24)}


def save_untagged(path: str, arch: str, kind: str, tied: bool, spare: int) -> str:
    """A small random ``arch`` model over the ``kind`` world tokenizer without think tags (head size 64: every vLLM
    attention backend takes it)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from openrlhf_classmate.testing.bpe_world import build_tokenizer, stop_token_ids

    tokenizer = build_tokenizer(kind, think_tags=False)
    stops = stop_token_ids(kind, tokenizer)
    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    config = config_class(vocab_size=len(tokenizer) + spare, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                          tie_word_embeddings=tied, eos_token_id=stops[0], torch_dtype="float32")
    torch.manual_seed(0)
    model = model_class(config)
    with torch.no_grad():  # logits that differ visibly between tokens (a freshly initialised model's are near flat)
        model.get_output_embeddings().weight.mul_(5.0)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def hf_side(folder: str, dtype: str = "float32") -> dict:
    """What transformers sees in the prepared folder: the tag ids, the text's ids and the log-probs of each token after
    the first (the model in ``dtype``, on the GPU when there is one), and the greedy continuation of the prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=getattr(torch, dtype)).to(device).eval()
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids], device=device)).logits[0].float(), -1)
        token_logp = [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]
        prompt = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
        out = model.generate(torch.tensor([prompt], device=device), max_new_tokens=16, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    rows = model.get_input_embeddings().weight.shape[0]
    del model  # the GPU memory goes back before vLLM profiles it
    return {"tags": {tag: tokenizer(tag, add_special_tokens=False)["input_ids"] for tag in ("<think>", "</think>")},
            "ids": ids, "logprobs": token_logp, "prompt": prompt, "greedy": out[0, len(prompt):].tolist(),
            "vocab_rows": rows, "tokenizer_len": len(tokenizer)}


def vllm_side(folder: str, hf: dict, dtype: str) -> dict:
    """The same three things through ``vllm.LLM`` in ``dtype``."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=folder, dtype=dtype, enforce_eager=True, gpu_memory_utilization=0.15, max_model_len=512, seed=0)
    tokenizer = llm.get_tokenizer()
    tags = {tag: tokenizer.encode(tag, add_special_tokens=False) for tag in ("<think>", "</think>")}
    scored = llm.generate({"prompt_token_ids": hf["ids"]}, SamplingParams(max_tokens=1, prompt_logprobs=0),
                          use_tqdm=False)[0]
    logprobs = [entry[token].logprob for entry, token in zip(scored.prompt_logprobs[1:], hf["ids"][1:], strict=True)]
    greedy = llm.generate({"prompt_token_ids": hf["prompt"]},
                          SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True), use_tqdm=False)[0]
    del llm
    return {"tags": tags, "logprobs": logprobs, "greedy": list(greedy.outputs[0].token_ids)}


def check_case(name: str, work: str, hf_only: bool) -> dict:
    from openrlhf_classmate.cli.prepare_policy import prepare

    arch, kind, tied, spare = CASES[name]
    source = save_untagged(os.path.join(work, f"{name}_source"), arch, kind, tied, spare)
    report = prepare(source, os.path.join(work, f"{name}_prepared"), log=lambda line: None)
    folder = report.output_dir
    hf = hf_side(folder)
    row = {"case": name, "arch": arch, "tied": tied, "spare_rows": spare, "vocab_rows": hf["vocab_rows"],
           "tokenizer_len": hf["tokenizer_len"], "hf_tags": hf["tags"],
           "checks": {"hf_tags_single": all(len(v) == 1 for v in hf["tags"].values())}}
    if hf_only:
        return row
    dtype = "float32"
    try:
        seen = vllm_side(folder, hf, dtype)
    except Exception as e:  # noqa: BLE001  (vLLM's refusal of float32 is some ValueError / RuntimeError of its own)
        row["float32_refused"] = f"{type(e).__name__}: {str(e)[:300]}"
        dtype = "bfloat16"
        hf = hf_side(folder, dtype)
        seen = vllm_side(folder, hf, dtype)
    diffs = [abs(a - b) for a, b in zip(seen["logprobs"], hf["logprobs"], strict=True)]
    diff = max(diffs)
    # the positions that read a tag's new rows: the prediction right after a tag (its embedding row) and the
    # prediction of a tag (its head row: the embedding row again when tied)
    tag_ids = {ids[0] for ids in hf["tags"].values()}
    after_tag = [d for d, prev, token in zip(diffs, hf["ids"][:-1], hf["ids"][1:], strict=True)
                 if prev in tag_ids or token in tag_ids]
    row.update(per_position_diff=[float(f"{d:.3g}") for d in diffs],
               max_abs_logprob_diff_after_tags=max(after_tag) if after_tag else None)
    row.update(dtype=dtype, vllm_tags=seen["tags"], max_abs_logprob_diff=diff, hf_greedy=hf["greedy"],
               vllm_greedy=seen["greedy"], greedy_equal=seen["greedy"] == hf["greedy"])
    row["checks"].update(vllm_tags_equal=seen["tags"] == hf["tags"], logprobs_equal=diff <= TOLERANCE[dtype])
    if dtype == "float32":
        row["checks"]["greedy_equal"] = row["greedy_equal"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_out"))
    p.add_argument("--hf-only", action="store_true", help="the transformers half only (no vLLM: the CPU check)")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        rows = [check_case(name, work, a.hf_only) for name in CASES]
    ok = all(all(r["checks"].values()) for r in rows)
    with open(os.path.join(a.out, "prepared_policy_vllm.json"), "w") as f:
        json.dump({"tolerance": TOLERANCE, "hf_only": a.hf_only, "ok": ok, "cases": rows}, f, indent=1)
    for r in rows:
        extra = "" if a.hf_only else (f", {r['dtype']}: max |logprob vLLM - HF| {r['max_abs_logprob_diff']:.2e} "
                                      f"(at the tags {r['max_abs_logprob_diff_after_tags']:.2e}), greedy tokens "
                                      f"{'equal' if r['greedy_equal'] else 'differ'}")
        print(f"{r['case']}: {r['vocab_rows']} embedding rows for {r['tokenizer_len']} tokens, tags "
              f"{r['hf_tags']}{extra}: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in r["checks"].items()))
    print("prepared policy: " + ("all checks pass" if ok else "a check FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
