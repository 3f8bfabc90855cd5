"""Held-out evaluation of a main model with the frozen classmate, built exactly as in training.

For each held-out problem the main model samples ``samples`` responses (temperature 1, the training rollout
setting). Each response is split into CoT / answer on token ids (``spans.cot_mask``); the main answer (text after
``</think>``) is scored by the registry's ``arithmetic`` scorer. The classmate then receives
``build_classmate_input(messages, CoT)`` (the launcher's classmate prompt) and answers greedily; its answer is scored
with the same scorer. Accuracies are means over all samples.

The CPU demo generates with its in-memory models (:func:`evaluate`); the GPU demo with the saved models through
``cli.evaluate``'s generation backends, vLLM or transformers (:func:`evaluate_saved`).
"""

from __future__ import annotations

import json

import torch

from openrlhf_classmate.algo.classmate_prompt import build_classmate_input
from openrlhf_classmate.algo.spans import cot_mask, think_token_ids
from openrlhf_classmate.demo import world as W

MAX_NEW_TOKENS = 24
CLASSMATE_MAX_NEW_TOKENS = 4


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        attention[i, width - len(r) :] = 1
    return ids, attention


@torch.no_grad()
def generate(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, sample: bool,
             batch_size: int = 256) -> list[list[int]]:
    """Generated ids per prompt (EOS kept when produced, nothing after it)."""
    out: list[list[int]] = []
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        ids, attention = _left_pad(chunk, pad)
        gen = model.generate(input_ids=ids, attention_mask=attention, do_sample=sample,
                             temperature=1.0 if sample else None, top_p=1.0 if sample else None,
                             top_k=0 if sample else None,  # 0: no top-k (transformers would default to 50)
                             max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad)
        for row in gen[:, ids.shape[1] :].tolist():
            end = row.index(eos) + 1 if eos in row else len(row)
            out.append(row[:end])
    return out


CPU_STYLE_NAMES = ("full", "skip", "none", "other")  # the CoT shapes the CPU demo's evaluations count


def cot_style(problem: W.Problem, cot: str) -> str:
    """Shape of a CoT, whatever its running results: ``full`` (every step written as ``op d = r``), ``skip`` (all
    but the last step), ``private`` (every step, numbers in :func:`world.private_number`'s notation), ``none``
    (empty) or ``other``."""
    words = cot.split()
    if not words:
        return "none"
    steps = len(problem.steps)
    for kind, n, number in (("full", steps, str), ("skip", steps - 1, str), ("private", steps, W.private_number)):
        shape = [number(problem.first)] + [w for op, d in problem.steps[:n] for w in (op, number(d), "=", None)]
        if len(words) == len(shape) and all(s is None or s == w for s, w in zip(shape, words)):
            return kind
    return "other"


def true_chain(problem: W.Problem) -> list[int]:
    """The correct running results."""
    value, out = problem.first, []
    for op, d in problem.steps:
        value = W.apply(value, op, d)
        out.append(value)
    return out


def chain_correct(problem: W.Problem, cot: str) -> bool:
    """The CoT is the complete, correct chain."""
    return cot.split() == W.chain_text(problem, true_chain(problem)).split()


def evaluate(main_model, main_tok, classmate_model, classmate_tok, problems: list[W.Problem], samples: int,
             seed: int) -> dict:
    """The CPU demo's evaluation: both models in memory, transformers ``generate``."""
    from openrlhf_classmate.algo.response_split import stop_token_ids

    torch.manual_seed(seed)
    prompts = []
    for p in problems:
        text = main_tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False)
        prompts += [list(main_tok.encode(text, add_special_tokens=False))] * samples
    responses = generate(main_model, main_tok, prompts, MAX_NEW_TOKENS, sample=True)
    return score_samples(problems, samples, prompts, responses, main_tok,
                         stop_token_ids(main_tok, main_model.generation_config), classmate_tok,
                         lambda ids: generate(classmate_model, classmate_tok, ids, CLASSMATE_MAX_NEW_TOKENS,
                                              sample=False),
                         CLASSMATE_MAX_NEW_TOKENS)


def evaluate_saved(main_path: str, classmate_path: str, problems: list[W.Problem], samples: int, seed: int, *,
                   backend: str, max_new_tokens: int, classmate_max_new_tokens: int,
                   gpu_memory_utilization: float = 0.3, style_names: tuple[str, ...] = CPU_STYLE_NAMES) -> dict:
    """The GPU demo's evaluation: saved models through ``cli.evaluate``'s generation backends (``vllm``: one
    ``vllm.LLM`` after the other, eager, bf16; ``hf``: transformers ``generate``), main model at temperature 1 with
    ``samples`` samples per problem, then the classmate greedily on each CoT."""
    from transformers import AutoTokenizer

    from openrlhf_classmate.algo.response_split import load_stop_token_ids
    from openrlhf_classmate.demo.warmstart import prompt_ids
    from openrlhf_classmate.eval.generation import GenParams, make_generator

    main_tok = AutoTokenizer.from_pretrained(main_path)
    classmate_tok = AutoTokenizer.from_pretrained(classmate_path)
    options = dict(seed=seed, progress=False, gpu_memory_utilization=gpu_memory_utilization, enforce_eager=True,
                   batch_size=256, dtype="bf16" if backend == "vllm" else "auto")
    prompts = [prompt_ids(main_tok, p) for p in problems]
    main = make_generator(backend, main_path, **options)
    try:
        outputs = main.generate(prompts, GenParams(max_new_tokens, temperature=1.0, n=samples, seed=seed))
    finally:
        main.close()
    responses = [g.token_ids for gens in outputs for g in gens]
    classmate = make_generator(backend, classmate_path, **options)
    try:
        return score_samples(problems, samples, [p for p in prompts for _ in range(samples)], responses, main_tok,
                             load_stop_token_ids(main_path, main_tok), classmate_tok,
                             lambda ids: [gens[0].token_ids for gens in classmate.generate(
                                 ids, GenParams(classmate_max_new_tokens, temperature=0.0, seed=seed))],
                             classmate_max_new_tokens, style_names)
    finally:
        classmate.close()


def score_samples(problems: list[W.Problem], samples: int, prompts: list[list[int]], responses: list[list[int]],
                  main_tok, stops, classmate_tok, classmate_generate, classmate_max_new_tokens: int,
                  style_names: tuple[str, ...] = CPU_STYLE_NAMES) -> dict:
    """Accuracies and CoT shapes of ``responses`` (problem-major: ``samples`` per problem, ``prompts`` alike);
    ``classmate_generate(prompt_ids_list)`` answers each classmate prompt greedily. ``styles`` counts the shapes of
    ``style_names`` (the last, ``other``, takes every shape not named before it)."""
    from openrlhf_classmate.algo.response_split import ThinkFormat, decoded_answer
    from openrlhf_classmate.scoring import score_responses

    open_id, close_id = think_token_ids(main_tok)
    width = max(1, max(len(r) for r in responses))
    ids = torch.full((len(responses), width), main_tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.bool)
    for i, r in enumerate(responses):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    spans = cot_mask(ids, mask, think_open_id=open_id, think_close_id=close_id, stop_ids=stops)
    form = ThinkFormat(open_id, close_id, stops)

    rows, classmate_prompts = [], []
    for i, r in enumerate(responses):
        p = problems[i // samples]
        cot_ids = ids[i][spans.mask[i]].tolist()
        cot = main_tok.decode(cot_ids, skip_special_tokens=True)
        text = main_tok.decode(r, skip_special_tokens=False)
        answer = decoded_answer(main_tok, r, form.split(prompts[i], r))  # the training reward's answer
        request = build_classmate_input(classmate_tok, p.messages, cot_ids, main_tok, max_context=1 << 16,
                                        max_new_tokens=classmate_max_new_tokens)
        classmate_prompts.append(request.input_ids)
        rows.append({"problem": p.text, "ground_truth": p.answer, "response": text, "cot": cot, "answer": answer,
                     "cot_tokens": int(spans.length[i]), "style": cot_style(p, cot),
                     "chain_correct": chain_correct(p, cot)})
    classmate_out = classmate_generate(classmate_prompts)
    labels = [{"data_source": "arithmetic", "ground_truth": str(row["ground_truth"])} for row in rows]
    main_scores = score_responses([row["answer"] for row in rows], labels)
    cm_texts = [classmate_tok.decode(o, skip_special_tokens=True) for o in classmate_out]
    cm_scores = score_responses(cm_texts, labels)
    for row, m, c, t in zip(rows, main_scores, cm_scores, cm_texts):
        row["main_correct"] = bool(m.valid and m.score > 0)
        row["classmate_answer"] = t
        row["classmate_correct"] = bool(c.valid and c.score > 0)

    n = len(rows)
    shapes = by_style(rows, style_names)
    return {
        "main_accuracy": sum(r["main_correct"] for r in rows) / n,
        "classmate_accuracy": sum(r["classmate_correct"] for r in rows) / n,
        "cot_tokens": sum(r["cot_tokens"] for r in rows) / n,
        "chain_correct": sum(r["chain_correct"] for r in rows) / n,
        "styles": {k: v["samples"] / n for k, v in shapes.items()},
        "by_style": shapes,
        "num_problems": len(problems),
        "samples_per_problem": samples,
        "rows": rows,
    }


def by_style(rows: list[dict], style_names: tuple[str, ...]) -> dict:
    """Per CoT shape (``style_names``; the last takes the rest): how many samples, and the main and classmate
    accuracies on them: which shapes a main-answer reward favours, and which ones the classmate can follow."""
    groups: dict[str, list[dict]] = {name: [] for name in style_names}
    for r in rows:
        groups[r["style"] if r["style"] in style_names[:-1] else style_names[-1]].append(r)
    out = {}
    for name, mine in groups.items():
        out[name] = {"samples": len(mine),
                     "main_accuracy": sum(r["main_correct"] for r in mine) / len(mine) if mine else None,
                     "classmate_accuracy": sum(r["classmate_correct"] for r in mine) / len(mine) if mine else None}
    return out


def style_line(result: dict) -> str:
    """``by_style`` in one line: ``style n (main %, classmate %)`` per shape that occurs."""
    parts = [f"{name} {v['samples']} ({100 * v['main_accuracy']:.1f}%, {100 * v['classmate_accuracy']:.1f}%)"
             for name, v in result["by_style"].items() if v["samples"]]
    return "by CoT style, samples (main acc, classmate acc): " + ", ".join(parts)


def summary_line(result: dict) -> str:
    s = result["styles"]
    return (f"main acc {100 * result['main_accuracy']:5.1f}%  classmate acc {100 * result['classmate_accuracy']:5.1f}%  "
            f"CoT {result['cot_tokens']:4.1f} tok  styles {'/'.join(s)} "
            + "/".join(f"{100 * v:.0f}" for v in s.values()) + "%")


def write_rows(path: str, result: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in result["rows"]:
            f.write(json.dumps(row) + "\n")
