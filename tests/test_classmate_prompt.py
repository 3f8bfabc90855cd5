"""Classmate input ids (the layout of ``openrlhf_classmate/algo/classmate_prompt.py``)."""

import pytest
import torch

from openrlhf_classmate.algo.classmate_prompt import (
    PROMPT_MODES,
    build_classmate_input,
    build_classmate_inputs,
    check_splice_compatible,
)
from openrlhf_classmate.algo.spans import cot_mask, think_token_ids
from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

WORDS = ["be", "kind", "why", "is", "sky", "blue", "light", "scatters", "so", "it", "looks", "answer"]
MESSAGES = [
    {"role": "system", "content": "be kind"},
    {"role": "user", "content": "why is sky blue"},
]
PROMPT_TOKENS = ["<|system|>", "\n", "be", "kind", "<eos>", "\n", "<|user|>", "\n", "why", "is", "sky", "blue"]
PROMPT_TOKENS += ["<eos>", "\n", "<|assistant|>", "\n"]
COT_WORDS = ["\n", "light", "scatters", "so", "it", "looks", "blue", "\n"]
BIG = dict(max_context=1000, max_new_tokens=10)


@pytest.fixture(scope="module")
def main_tok():
    return build_word_tokenizer(WORDS)


def _cot_ids(tok) -> list[int]:
    return tok.convert_tokens_to_ids(COT_WORDS)


def _tokens(tok, ids) -> list[str]:
    return tok.convert_ids_to_tokens(ids)


def test_retokenize_across_vocabularies(main_tok):
    classmate = build_word_tokenizer(list(reversed(WORDS)) + ["extra"])  # same words, different ids
    assert classmate.get_vocab() != main_tok.get_vocab()
    inp = build_classmate_input(classmate, MESSAGES, _cot_ids(main_tok), main_tok, **BIG)
    assert inp.valid and inp.skip_reason is None
    expected = PROMPT_TOKENS + ["<think>"] + COT_WORDS + ["</think>", "\n", "\n"]
    assert _tokens(classmate, inp.input_ids) == expected
    assert inp.cot_offset == len(PROMPT_TOKENS) + 1
    assert inp.cot_token_count == len(COT_WORDS)
    cot = inp.input_ids[inp.cot_offset : inp.cot_offset + inp.cot_token_count]
    assert _tokens(classmate, cot) == COT_WORDS
    assert "retokenize" == PROMPT_MODES[0]


def test_splice_reuses_main_ids_verbatim(main_tok):
    classmate = build_word_tokenizer(WORDS)  # identical vocabulary
    cot = _cot_ids(main_tok) + [main_tok.convert_tokens_to_ids("<unk>")]  # verbatim, even ids retokenize would drop
    inp = build_classmate_input(classmate, MESSAGES, cot, main_tok, mode="splice", **BIG)
    assert inp.input_ids[inp.cot_offset : inp.cot_offset + inp.cot_token_count] == cot
    assert _tokens(classmate, inp.input_ids[-3:]) == ["</think>", "\n", "\n"]


def test_splice_refuses_different_vocabularies(main_tok):
    other = build_word_tokenizer(WORDS + ["extra"])
    with pytest.raises(ValueError, match="--classmate.prompt_mode retokenize"):
        check_splice_compatible(main_tok, other)
    with pytest.raises(ValueError, match="identical vocabularies"):
        build_classmate_input(other, MESSAGES, _cot_ids(main_tok), main_tok, mode="splice", **BIG)
    with pytest.raises(ValueError, match="identical vocabularies"):
        build_classmate_inputs(other, [MESSAGES], [_cot_ids(main_tok)], main_tok, mode="splice", **BIG)
    check_splice_compatible(main_tok, build_word_tokenizer(WORDS))  # no error


def test_no_second_think_tag_when_template_opens_thinking(main_tok):
    classmate = build_word_tokenizer(WORDS, think_in_template=True)  # generation prompt ends "<think>\n"
    inp = build_classmate_input(classmate, MESSAGES, _cot_ids(main_tok), main_tok, **BIG)
    tokens = _tokens(classmate, inp.input_ids)
    assert tokens.count("<think>") == 1
    assert tokens == PROMPT_TOKENS + ["<think>", "\n"] + COT_WORDS + ["</think>", "\n", "\n"]
    assert inp.cot_offset == len(PROMPT_TOKENS) + 2


def test_configurable_think_tags(main_tok):
    template = (
        "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}answer\n{% endif %}"
    )
    classmate = build_word_tokenizer(WORDS, chat_template=template)
    inp = build_classmate_input(
        classmate, MESSAGES[1:], _cot_ids(main_tok), main_tok, think_open="so", think_close="it", **BIG
    )
    prompt = ["why", "is", "sky", "blue", "\n", "answer", "\n"]
    assert _tokens(classmate, inp.input_ids) == prompt + ["so"] + COT_WORDS + ["it", "\n", "\n"]


def test_empty_cot_is_allowed(main_tok):
    inp = build_classmate_input(main_tok, MESSAGES, [], main_tok, **BIG)
    assert inp.cot_token_count == 0
    assert _tokens(main_tok, inp.input_ids[-4:]) == ["<think>", "</think>", "\n", "\n"]


def test_over_length_is_skipped_not_truncated(main_tok):
    n = len(PROMPT_TOKENS) + 1 + len(COT_WORDS) + 3
    ok = build_classmate_input(main_tok, MESSAGES, _cot_ids(main_tok), main_tok, max_context=n + 5, max_new_tokens=5)
    assert ok.valid and len(ok.input_ids) == n
    bad = build_classmate_input(main_tok, MESSAGES, _cot_ids(main_tok), main_tok, max_context=n + 4, max_new_tokens=5)
    assert bad.input_ids is None and not bad.valid
    assert bad.skip_reason == f"classmate input ({n} tokens) + max_new_tokens (5) exceeds max_context ({n + 4})"


def test_batch_helper_and_spans_end_to_end(main_tok):
    open_id, close_id = think_token_ids(main_tok)
    eos = main_tok.eos_token_id
    rows = [
        main_tok.convert_tokens_to_ids(["<think>", "\n", "light", "scatters", "\n", "</think>", "\n", "\n", "blue"])
        + [eos],
        main_tok.convert_tokens_to_ids(["<think>", "</think>", "blue"]) + [eos],
        main_tok.convert_tokens_to_ids(["<think>", "so", "it"]) + [eos],
    ]
    width = max(map(len, rows))
    ids = torch.full((3, width), main_tok.pad_token_id)
    mask = torch.zeros((3, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    spans = cot_mask(ids, mask, think_open_id=open_id, think_close_id=close_id, stop_ids=eos)
    cots = [ids[i][spans.mask[i]].tolist() for i in range(3)]
    skip = (spans.length == 0).tolist()
    out = build_classmate_inputs(main_tok, [MESSAGES] * 3, cots, main_tok, skip=skip, **BIG)
    assert [o.valid for o in out] == [True, False, True]
    assert out[1].skip_reason == "empty CoT (remove_wo_cot)"
    tail = ["\n", "light", "scatters", "\n", "</think>", "\n", "\n"]
    assert _tokens(main_tok, out[0].input_ids[out[0].cot_offset :]) == tail
    assert _tokens(main_tok, out[2].input_ids[out[2].cot_offset :]) == ["so", "it", "</think>", "\n", "\n"]


def test_bad_arguments(main_tok):
    with pytest.raises(ValueError, match="unknown classmate prompt mode 'copy'"):
        build_classmate_input(main_tok, MESSAGES, [], main_tok, mode="copy", **BIG)
    with pytest.raises(ValueError, match="cot_token_ids_list"):
        build_classmate_inputs(main_tok, [MESSAGES], [], main_tok, **BIG)
