"""The BPE tokenizer world (``openrlhf_classmate.testing.bpe_world``) and the classmate input over every pair of its
tokenizers: quoted tags never become special ids, no SentencePiece dummy-prefix space, random truncation
on character boundaries, every stop id out of the CoT."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from openrlhf_classmate.algo.classmate_prompt import build_classmate_input, build_classmate_inputs, encode_text
from openrlhf_classmate.algo.response_split import char_boundary, cot_prefixes
from openrlhf_classmate.algo.spans import think_token_ids
from openrlhf_classmate.integration.classmate.classmate_stage import ClassmateStage
from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.testing.bpe_world import KINDS, build_tokenizer

BIG = dict(max_context=4096, max_new_tokens=16)
MESSAGES = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "What is 1 + 2?"}]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ── the world itself ──


def _hashes() -> dict[str, str]:
    return {k: hashlib.sha256(build_tokenizer(k).backend_tokenizer.to_str().encode()).hexdigest()
            for k in KINDS}


def test_training_is_deterministic_across_processes():
    script = ("import json, hashlib; from openrlhf_classmate.testing import bpe_world as W; print(json.dumps({k: "
              "hashlib.sha256(W.build_tokenizer(k).backend_tokenizer.to_str().encode()).hexdigest() for k in W.KINDS}))")
    env = {**os.environ, "PYTHONPATH": REPO, "PYTHONHASHSEED": "123"}
    other = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert json.loads(other.stdout.strip().splitlines()[-1]) == _hashes()


@pytest.mark.parametrize("kind", KINDS)
def test_saved_world_tokenizers_load_back_unchanged(bpe_world, kind):
    built, loaded = build_tokenizer(kind), bpe_world.tokenizer(kind)
    text = "Let me think: café 🙂 12 + 7 = 19 </think> e\u0301 <|im_end|> <think>\n\n3"
    assert loaded.encode(text, add_special_tokens=False) == built.encode(text, add_special_tokens=False)
    open_id, close_id = think_token_ids(loaded)
    assert {open_id, close_id}.isdisjoint(loaded.all_special_ids)  # added, non-special (as in Qwen3)
    assert loaded.decode([open_id, close_id], skip_special_tokens=True) == "<think></think>"
    from transformers import AutoConfig, GenerationConfig

    assert GenerationConfig.from_pretrained(bpe_world.paths[kind]).eos_token_id == bpe_world.stops(kind)
    assert AutoConfig.from_pretrained(bpe_world.paths[kind]).vocab_size == len(loaded)


def test_the_kinds_differ_as_their_families_do(bpe_world):
    qwen, llama, sp = (bpe_world.tokenizer(k) for k in ("qwen3", "llama3", "sentencepiece"))
    assert qwen.get_vocab() == bpe_world.tokenizer("qwen3_thinking").get_vocab()
    assert qwen.get_vocab() != llama.get_vocab() != sp.get_vocab()
    assert qwen.decode(qwen.encode("e\u0301", add_special_tokens=False)) == "\u00e9"  # NFC
    assert llama.decode(llama.encode("e\u0301", add_special_tokens=False)) == "e\u0301"
    assert qwen.convert_ids_to_tokens(qwen.encode("123", add_special_tokens=False)) == ["1", "2", "3"]
    assert llama.convert_ids_to_tokens(llama.encode("12", add_special_tokens=False)) == ["12"]  # up to 3 digits
    assert "<0xF0>" in sp.convert_ids_to_tokens(sp.encode("🙂", add_special_tokens=False))  # byte fallback
    assert sp.convert_ids_to_tokens(sp.encode("sky", add_special_tokens=False))[0].startswith("▁")  # dummy prefix
    prompts = {k: bpe_world.tokenizer(k).apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
               for k in KINDS}
    assert prompts["qwen3"].endswith("<|im_start|>assistant\n")
    assert prompts["qwen3_thinking"].endswith("<|im_start|>assistant\n<think>\n")
    assert prompts["llama3"].startswith("<|begin_of_text|>") and prompts["sentencepiece"].endswith("[/INST]")


# ── classmate inputs over every (main, classmate) pair ──

PAIRS = [(m, c) for m in KINDS for c in KINDS]
QUOTING_COT = "\nThe tag </think> closes; <|im_end|>, <|eot_id|>, </s> and <think> are quoted. café 🙂 = 3.\n"


def _cot_ids(tok, text: str) -> list[int]:
    return encode_text(tok, text)


@pytest.mark.parametrize("main_kind, classmate_kind", PAIRS)
def test_quoted_tags_in_the_cot_never_become_special_ids(bpe_world, main_kind, classmate_kind):
    main, classmate = bpe_world.tokenizer(main_kind), bpe_world.tokenizer(classmate_kind)
    cot_ids = _cot_ids(main, QUOTING_COT)
    inp = build_classmate_input(classmate, MESSAGES, cot_ids, main, **BIG)
    assert inp.valid
    cot = inp.input_ids[inp.cot_offset: inp.cot_offset + inp.cot_token_count]
    control = set(classmate.all_special_ids) | {int(i) for i in classmate.added_tokens_decoder}
    assert not control & set(cot)
    open_id, close_id = think_token_ids(classmate)
    assert inp.input_ids.count(close_id) == 1 and inp.input_ids[inp.cot_offset + inp.cot_token_count] == close_id
    # the classmate reads exactly the main CoT text between its think tags
    text = classmate.decode(inp.input_ids, skip_special_tokens=False)
    opener = "<think>\n" if classmate_kind == "qwen3_thinking" else "<think>"  # the template's own, then the CoT
    assert f"{opener}{main.decode(cot_ids, skip_special_tokens=True)}</think>\n\n" in text
    assert text.endswith("</think>\n\n") and "\ufffd" not in text


@pytest.mark.parametrize("main_kind", KINDS)
def test_no_dummy_prefix_space_before_a_sentencepiece_classmate_cot(bpe_world, main_kind):
    main, sp = bpe_world.tokenizer(main_kind), bpe_world.tokenizer("sentencepiece")
    inp = build_classmate_input(sp, MESSAGES, _cot_ids(main, "Let me add"), main, **BIG)
    cot_tokens = sp.convert_ids_to_tokens(inp.input_ids[inp.cot_offset: inp.cot_offset + inp.cot_token_count])
    assert not cot_tokens[0].startswith("▁")
    assert sp.decode(inp.input_ids).endswith("[/INST]<think>Let me add</think>\n\n")
    # the tokenizer's own encode of the CoT alone would have put one there
    assert sp.convert_ids_to_tokens(sp.encode("Let me add", add_special_tokens=False))[0] == "▁"


@pytest.mark.parametrize("main_kind, classmate_kind", [("qwen3", "qwen3_thinking"), ("llama3", "sentencepiece")])
def test_empty_cot_and_template_opened_think(bpe_world, main_kind, classmate_kind):
    main, classmate = bpe_world.tokenizer(main_kind), bpe_world.tokenizer(classmate_kind)
    inp = build_classmate_input(classmate, MESSAGES, [], main, **BIG)
    text = classmate.decode(inp.input_ids)
    assert inp.cot_token_count == 0 and text.count("<think>") == 1
    assert text.endswith("<think>\n</think>\n\n" if classmate_kind == "qwen3_thinking" else "<think></think>\n\n")


def test_splice_between_the_two_qwen3_templates_reuses_ids(bpe_world):
    main, classmate = bpe_world.tokenizer("qwen3"), bpe_world.tokenizer("qwen3_thinking")
    cot_ids = _cot_ids(main, QUOTING_COT)
    inp = build_classmate_input(classmate, MESSAGES, cot_ids, main, mode="splice", **BIG)
    assert inp.input_ids[inp.cot_offset: inp.cot_offset + inp.cot_token_count] == cot_ids
    with pytest.raises(ValueError, match="identical vocabularies"):
        build_classmate_input(bpe_world.tokenizer("llama3"), MESSAGES, cot_ids, main, mode="splice", **BIG)


# ── the classmate stage: stop ids and truncation at character boundaries ──


def _stage(bpe_world, kind, *extra):
    args = parse_args(["--actor.model_name_or_path", bpe_world.paths[kind], "--actor.num_gpus_per_node", "1",
                       "--ref.num_gpus_per_node", "1", "--data.prompt_dataset", "d.jsonl", "--rollout.batch_size",
                       "2", "--rollout.n_samples_per_prompt", "2", "--vllm.num_engines", "1",
                       "--classmate.model_name_or_path", bpe_world.paths["llama3"], *extra])
    return ClassmateStage(args, bpe_world.tokenizer(kind), [], [])


def _sample(tok, response: list[int]):
    from types import SimpleNamespace

    prompt = tok(tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    seq = torch.tensor(prompt + response)
    action = torch.zeros(len(seq) - 1, dtype=torch.bool)
    action[len(prompt) - 1:] = True
    return SimpleNamespace(sequences=seq.unsqueeze(0), action_mask=action.unsqueeze(0))


@pytest.mark.parametrize("kind", KINDS)
def test_every_stop_id_stays_out_of_the_cot(bpe_world, kind):
    tok, stops = bpe_world.tokenizer(kind), bpe_world.stops(kind)
    open_id, _ = think_token_ids(tok)
    head = [] if kind == "qwen3_thinking" else [open_id]
    cot = _cot_ids(tok, "1 + 2 = 3")
    spans = _stage(bpe_world, kind).spans([_sample(tok, head + cot + [stop]) for stop in stops])
    assert [r[c].tolist() for r, c in zip(spans.response_ids, spans.cot)] == [cot] * len(stops)
    assert not spans.has_answer.any()


MULTIBYTE_COT = "🙂🙂 日本語 Ω€ café naïve 中文 数学 🙂 Straße 日本語 🙂"


@pytest.mark.parametrize("main_kind", KINDS)
def test_random_truncate_cuts_on_character_boundaries(bpe_world, main_kind):
    tok = bpe_world.tokenizer(main_kind)
    open_id, close_id = think_token_ids(tok)
    head = [] if main_kind == "qwen3_thinking" else [open_id]
    cot = _cot_ids(tok, MULTIBYTE_COT)
    assert "\ufffd" in tok.decode(cot[:1]) or "\ufffd" in tok.decode(cot[:2])  # characters span several tokens
    response = head + cot + [close_id] + _cot_ids(tok, "3") + [tok.eos_token_id]
    stage = _stage(bpe_world, main_kind, "--classmate.truncation", "random_truncate", "--classmate.keep_min",
                   "0.05", "--classmate.keep_max", "0.95")
    samples = [_sample(tok, response)] * 64
    spans = stage.spans(samples)
    kept = [r[c].tolist() for r, c in zip(spans.response_ids, spans.cot)]
    # the stage's draws (its generator is seeded with --train.seed), cut as truncate_cot cuts
    u = torch.rand(64, generator=torch.Generator().manual_seed(stage.args.train.seed), dtype=torch.float64)
    raw = torch.floor((0.05 + 0.9 * u) * len(cot)).long().tolist()
    full_text = tok.decode(cot)
    for ids, cut in zip(kept, raw):
        text = tok.decode(ids)
        assert ids == cot[: len(ids)] and "\ufffd" not in text and full_text.startswith(text)
        inside = "\ufffd" in tok.decode(cot[:cut])
        assert (len(ids) < cut) == inside  # moved back exactly when the cut fell inside a character
    assert sum("\ufffd" in tok.decode(cot[:cut]) for cut in raw) > 0 and len(set(raw)) > 10
    # every classmate tokenizer then reads clean text
    for kind in KINDS:
        classmate = bpe_world.tokenizer(kind)
        for inp in build_classmate_inputs(classmate, [MESSAGES] * len(kept), kept, tok, **BIG):
            assert "\ufffd" not in classmate.decode(inp.input_ids)


@pytest.mark.parametrize("main_kind", ["llama3", "sentencepiece"])
def test_evaluations_fixed_fraction_cut_is_the_stages_random_truncate_cut(bpe_world, main_kind):
    """``evaluate --truncate-cot F`` keeps what the classmate stage keeps when its ``random_truncate`` draw is F
    (``--classmate.keep_min = keep_max = F``): the same floor, moved back to the same character boundary."""
    tok = bpe_world.tokenizer(main_kind)
    open_id, close_id = think_token_ids(tok)
    cot = _cot_ids(tok, MULTIBYTE_COT)
    response = [open_id] + cot + [close_id] + _cot_ids(tok, "3") + [tok.eos_token_id]
    stage = _stage(bpe_world, main_kind, "--classmate.truncation", "random_truncate")
    sample, moved = _sample(tok, response), 0
    for keep in [i / 40 for i in range(1, 41)]:  # the stage takes keep_min > 0
        stage.cfg.keep_min = stage.cfg.keep_max = keep
        spans = stage.spans([sample])
        by_stage = spans.response_ids[0][spans.cot[0]].tolist()
        assert cot_prefixes(tok, [cot, []], keep) == [by_stage, []]  # an empty CoT stays empty
        moved += len(by_stage) < int(keep * len(cot))
        assert "\ufffd" not in tok.decode(by_stage)
    assert moved > 0  # some cuts fell inside a character and were moved back
    assert cot_prefixes(tok, [cot], 0.0) == [[]] and cot_prefixes(tok, [cot], 1.0) == [cot]
    with pytest.raises(ValueError, match=r"keep must lie in \[0, 1\], got 1.5"):
        cot_prefixes(tok, [cot], 1.5)


def test_char_boundary_on_a_cut_inside_an_emoji(bpe_world):
    tok = bpe_world.tokenizer("llama3")
    ids = _cot_ids(tok, "ab 🙂 cd")
    bytes_of_emoji = [i for i in range(1, len(ids)) if "\ufffd" in tok.decode(ids[:i])]
    assert bytes_of_emoji  # the emoji is several byte tokens
    for cut in bytes_of_emoji:
        back = char_boundary(tok, ids, cut)
        assert back < cut and "\ufffd" not in tok.decode(ids[:back]) and tok.decode(ids).startswith(tok.decode(ids[:back]))
    assert char_boundary(tok, ids, len(ids)) == len(ids) and char_boundary(tok, ids, 0) == 0


# ── evaluate on the BPE world (real HF generation) ──


def test_evaluate_over_the_bpe_world_with_a_classmate_of_another_vocabulary(bpe_world, tmp_path):
    from openrlhf_classmate.cli import evaluate as ev
    from openrlhf_classmate.scoring import score_responses

    data = tmp_path / "test.jsonl"
    with open(data, "w") as f:
        for a in range(4):
            messages = [{"role": "user", "content": f"{a} + 2 = ?"}]
            label = {"data_source": "arithmetic", "ground_truth": str(a + 2), "messages": messages}
            f.write(json.dumps({"prompt": messages, "label": json.dumps(label)}) + "\n")
    out = tmp_path / "eval"
    code = ev.main(["--model", bpe_world.paths["qwen3_thinking"], "--data", str(data), "--output-dir", str(out),
                    "--backend", "hf", "--max-new-tokens", "16", "--samples", "3", "--temperature", "1.0",
                    "--classmate", bpe_world.paths["sentencepiece"], "--classmate-max-new-tokens", "4", "--quiet",
                    "--no-plot"])
    assert code == 0
    records = [json.loads(line) for line in open(out / "samples.jsonl")]
    assert len(records) == 12
    for r in records:
        assert r["split_status"] in ("answer", "unclosed")  # the template opened <think>: never "unopened"
        assert r["has_answer"] == (r["split_status"] == "answer") == (r["answer"] is not None)
        assert r["classmate_input_tokens"] and r["classmate_output"] is not None
    labels = [{"data_source": "arithmetic", "ground_truth": str(r["prompt_index"] + 2)} for r in records]
    assert [x.score for x in score_responses([r["answer"] for r in records], labels)] == [r["score"] for r in records]
