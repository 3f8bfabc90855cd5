"""CoT spans from token ids and CoT truncation (the rules of ``openrlhf_classmate/algo/spans.py``)."""

import pytest
import torch

from openrlhf_classmate.algo.spans import TRUNCATION_MODES, CotSpans, cot_mask, think_token_ids, truncate_cot
from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

OPEN, CLOSE, EOS, PAD, C, A = 100, 101, 2, 0, 5, 6  # <think>, </think>, EOS, pad, CoT token, answer token


def _batch(rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def _rows(mask: torch.Tensor) -> list[list[int]]:
    return mask.int().tolist()


def test_worked_example_section_12():
    ids, v = _batch(
        [
            [OPEN, C, C, C, CLOSE, A, A, EOS],
            [OPEN, C, C, CLOSE, A, EOS],
            [OPEN, C, C, C, C, C, C, C],  # truncated: no </think>, no EOS
            [OPEN, C, CLOSE, A, A, A, EOS],
        ],
        8,
    )
    spans = cot_mask(ids, v, think_open_id=OPEN, think_close_id=CLOSE, stop_ids=EOS)
    assert _rows(spans.mask) == [
        [0, 1, 1, 1, 0, 0, 0, 0],
        [0, 1, 1, 0, 0, 0, 0, 0],
        [0, 1, 1, 1, 1, 1, 1, 1],
        [0, 1, 0, 0, 0, 0, 0, 0],
    ]
    assert spans.start.tolist() == [1, 1, 1, 1]
    assert spans.end.tolist() == [4, 3, 8, 2]
    assert spans.length.tolist() == [3, 2, 7, 1]
    assert spans.has_answer.tolist() == [True, True, False, True]
    assert spans.mask.dtype == torch.bool
    assert not (spans.mask & ~v.bool()).any()


def test_eos_is_excluded_when_there_is_no_close_tag():
    ids, v = _batch([[OPEN, C, C, C, EOS], [OPEN, C, C, C, C]], 6)
    spans = cot_mask(ids, v, think_open_id=OPEN, think_close_id=CLOSE, stop_ids=EOS)
    assert _rows(spans.mask) == [[0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0]]
    assert spans.has_answer.tolist() == [False, False]
    # Without an eos id nothing is recognised as EOS (reference behaviour for that case).
    spans = cot_mask(ids, v, think_open_id=OPEN, think_close_id=CLOSE, stop_ids=None)
    assert _rows(spans.mask)[0] == [0, 1, 1, 1, 1, 0]


def test_no_open_tag_means_whole_valid_response_minus_eos():
    ids, v = _batch([[C, C, CLOSE, A, EOS], [C, C, C], [EOS], []], 5)
    spans = cot_mask(ids, v, think_open_id=OPEN, think_close_id=CLOSE, stop_ids=EOS)
    assert _rows(spans.mask) == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [0] * 5, [0] * 5]
    assert spans.has_answer.tolist() == [False] * 4
    assert spans.length.tolist() == [4, 3, 0, 0]


def test_template_opened_thinking_with_open_id_none():
    # The generation prompt ends with "<think>\n": responses start inside the CoT.
    ids, v = _batch([[C, C, CLOSE, A, EOS], [C, C, C, EOS], [CLOSE, A, EOS]], 5)
    spans = cot_mask(ids, v, think_open_id=None, think_close_id=CLOSE, stop_ids=EOS)
    assert _rows(spans.mask) == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0] * 5]
    assert spans.start.tolist() == [0, 0, 0]
    assert spans.end.tolist() == [2, 3, 0]
    assert spans.has_answer.tolist() == [True, False, True]


def test_first_open_and_first_close_after_it():
    ids, v = _batch(
        [
            [CLOSE, OPEN, C, CLOSE, A, CLOSE, EOS],  # a </think> before <think> is ignored
            [A, OPEN, C, OPEN, C, CLOSE, EOS],  # second <think> is just a CoT token
            [OPEN, CLOSE, A, EOS],  # empty CoT with an answer
        ],
        8,
    )
    spans = cot_mask(ids, v, think_open_id=OPEN, think_close_id=CLOSE, stop_ids=EOS)
    assert _rows(spans.mask) == [
        [0, 0, 1, 0, 0, 0, 0, 0],
        [0, 0, 1, 1, 1, 0, 0, 0],
        [0] * 8,
    ]
    assert spans.start.tolist() == [2, 2, 1]
    assert spans.end.tolist() == [3, 5, 1]
    assert spans.has_answer.tolist() == [True, True, True]


def test_padding_is_never_read():
    ids, v = _batch([[OPEN, C, C]], 6)
    ids[0, 3:] = torch.tensor([CLOSE, OPEN, EOS])  # garbage in the padded region
    spans = cot_mask(ids, v, think_open_id=OPEN, think_close_id=CLOSE, stop_ids=EOS)
    assert _rows(spans.mask) == [[0, 1, 1, 0, 0, 0]]
    assert spans.has_answer.tolist() == [False]


def _loop_reference(ids: torch.Tensor, v: torch.Tensor, open_id, close_id, eos_id) -> list[list[int]]:
    out = []
    for row, row_mask in zip(ids.tolist(), v.tolist(), strict=True):
        n = sum(row_mask)
        valid = row[:n]
        if open_id is not None and open_id not in valid:
            start, close = 0, None
        else:
            start = 0 if open_id is None else valid.index(open_id) + 1
            close = next((t for t in range(start, n) if valid[t] == close_id), None)
        if close is None:
            end = max(start, n - (1 if n and eos_id is not None and valid[-1] == eos_id else 0))
        else:
            end = close
        out.append([1 if start <= t < end else 0 for t in range(len(row))])
    return out


@pytest.mark.parametrize("open_id", [OPEN, None])
def test_random_batches_match_a_loop_reference(open_id):
    gen = torch.Generator().manual_seed(0)
    vocab = torch.tensor([OPEN, CLOSE, EOS, C, A, A, C, C])
    for _ in range(5):
        ids = vocab[torch.randint(0, len(vocab), (64, 12), generator=gen)]
        lengths = torch.randint(0, 13, (64,), generator=gen)
        v = (torch.arange(12).unsqueeze(0) < lengths.unsqueeze(1)).long()
        spans = cot_mask(ids, v, think_open_id=open_id, think_close_id=CLOSE, stop_ids=EOS)
        assert _rows(spans.mask) == _loop_reference(ids, v, open_id, CLOSE, EOS)


def test_bad_masks_raise():
    ids, v = _batch([[OPEN, C, EOS]], 4)
    with pytest.raises(ValueError, match="response_mask shape"):
        cot_mask(ids, v[:, :3], think_open_id=OPEN, think_close_id=CLOSE, stop_ids=EOS)
    left_padded = torch.tensor([[0, 1, 1, 1]])
    with pytest.raises(ValueError, match="right-padded"):
        cot_mask(ids, left_padded, think_open_id=OPEN, think_close_id=CLOSE, stop_ids=EOS)


def test_think_token_ids():
    tok = build_word_tokenizer(["hello", "world"])
    open_id, close_id = think_token_ids(tok)
    assert tok.convert_ids_to_tokens([open_id, close_id]) == ["<think>", "</think>"]
    with pytest.raises(ValueError, match="'hello world'"):
        think_token_ids(tok, think_open="hello world")


def _spans(lengths: list[int], start: int = 1, width: int = 20) -> CotSpans:
    start_t = torch.full((len(lengths),), start)
    end = start_t + torch.tensor(lengths)
    pos = torch.arange(width).unsqueeze(0)
    mask = (pos >= start_t.unsqueeze(1)) & (pos < end.unsqueeze(1))
    return CotSpans(mask=mask, start=start_t, end=end, has_answer=torch.ones(len(lengths), dtype=torch.bool))


def test_truncation_vanilla_and_remove_wo_cot():
    spans = _spans([5, 0, 3])
    kept, skip = truncate_cot(spans, mode="vanilla")
    assert torch.equal(kept.mask, spans.mask) and skip.tolist() == [False, False, False]
    kept, skip = truncate_cot(spans, mode="remove_wo_cot")
    assert torch.equal(kept.mask, spans.mask) and skip.tolist() == [False, True, False]
    assert TRUNCATION_MODES == ("vanilla", "random_truncate", "remove_wo_cot")


def test_random_truncate_keeps_floor_prefix_from_callers_generator():
    lengths = [10, 7, 1, 0, 19]
    spans = _spans(lengths)
    kept, skip = truncate_cot(spans, mode="random_truncate", keep_min=0.1, keep_max=0.9,
                              generator=torch.Generator().manual_seed(123))
    keep = 0.1 + 0.8 * torch.rand(len(lengths), generator=torch.Generator().manual_seed(123), dtype=torch.float64)
    expected = [int(k * n) for k, n in zip(keep.tolist(), lengths, strict=True)]
    assert kept.length.tolist() == expected
    assert kept.start.tolist() == spans.start.tolist()
    assert kept.mask.sum(1).tolist() == expected
    assert not (kept.mask & ~spans.mask).any()  # a prefix of the original CoT
    assert skip.tolist() == [False] * 5  # empty CoTs are not skipped outside remove_wo_cot
    assert kept.length[2] == 0  # floor(keep * 1) = 0: the classmate gets an empty CoT
    again, _ = truncate_cot(spans, mode="random_truncate", keep_min=0.1, keep_max=0.9,
                            generator=torch.Generator().manual_seed(123))
    assert torch.equal(again.mask, kept.mask)


def test_truncation_errors():
    spans = _spans([3])
    with pytest.raises(ValueError, match="generator"):
        truncate_cot(spans, mode="random_truncate")
    with pytest.raises(ValueError, match="keep_min"):
        truncate_cot(spans, mode="random_truncate", keep_min=0.9, keep_max=0.1, generator=torch.Generator())
    with pytest.raises(ValueError, match="unknown truncation mode 'random'"):
        truncate_cot(spans, mode="random")


def test_prompt_opens_think_reads_the_last_tag_on_token_ids():
    from openrlhf_classmate.algo.spans import prompt_opens_think

    o, c = 100, 101
    assert prompt_opens_think([5, 6, o, 3], think_open_id=o, think_close_id=c)  # "...<|assistant|>\n<think>\n"
    assert not prompt_opens_think([5, 6, 3], think_open_id=o, think_close_id=c)
    # an earlier turn's closed think block
    assert not prompt_opens_think([o, 3, c, 5, 6], think_open_id=o, think_close_id=c)
    assert prompt_opens_think([o, 3, c, 5, o, 7], think_open_id=o, think_close_id=c)
    assert prompt_opens_think(torch.tensor([1, o]), think_open_id=o, think_close_id=c)


def test_starts_in_think_rows_start_the_cot_at_the_response():
    o, c, e = 100, 101, 2
    ids = torch.tensor([[7, 8, c, 9, e], [o, 7, c, 9, e]])
    spans = cot_mask(ids, torch.ones_like(ids), think_open_id=o, think_close_id=c, stop_ids=e,
                     starts_in_think=torch.tensor([True, False]))
    assert spans.mask.tolist() == [[1, 1, 0, 0, 0], [0, 1, 0, 0, 0]]
    assert spans.has_answer.tolist() == [True, True]
    without = cot_mask(ids, torch.ones_like(ids), think_open_id=o, think_close_id=c, stop_ids=e)
    assert without.mask[0].tolist() == [1, 1, 1, 1, 0] and not without.has_answer[0]  # the answer would leak


def test_training_and_evaluation_agree_on_a_template_that_opens_think():
    from openrlhf_classmate.cli.evaluate import Row, render_prompts, split_response
    from openrlhf_classmate.testing.tokenizers import build_word_tokenizer, default_chat_template

    tok = build_word_tokenizer(["1", "2", "3", "+", "="], chat_template=default_chat_template(think_in_template=True))
    open_id, close_id = think_token_ids(tok)
    rows = [Row(messages=[{"role": "user", "content": "1 + 2 ="}], label={})]
    prompt_ids, opened = render_prompts(tok, rows, chat_template=True, template_kwargs={},
                                       think_ids=(open_id, close_id))
    assert opened == [True]
    response = tok.encode("1 + 2 = 3 </think> 3", add_special_tokens=False) + [tok.eos_token_id]
    split = split_response(response, tok, open_id=open_id, close_id=close_id, starts_in_think=opened[0],
                           stop_ids=tok.eos_token_id)
    spans = cot_mask(torch.tensor([response]), torch.ones(1, len(response)), think_open_id=open_id,
                     think_close_id=close_id, stop_ids=tok.eos_token_id, starts_in_think=torch.tensor(opened))
    cot_ids = [t for t, m in zip(response, spans.mask[0].tolist()) if m]
    assert split["cot_ids"] == cot_ids == tok.encode("1 + 2 = 3", add_special_tokens=False)
    assert split["answer"] == "3"


def test_a_fixed_fraction_keeps_the_floor_of_the_exact_product():
    # evaluate --truncate-cot 0.7: 0.7 x 90 is 62.99999999999999 in binary floating point; the prefix is 63 tokens
    from openrlhf_classmate.algo.spans import keep_prefix

    lengths = torch.tensor([90, 100, 7, 0])
    spans = CotSpans(mask=torch.zeros(4, 128, dtype=torch.bool), start=torch.tensor([1, 0, 3, 2]),
                     end=torch.tensor([91, 100, 10, 2]), has_answer=torch.ones(4, dtype=torch.bool))
    assert torch.equal(spans.length, lengths)
    assert (keep_prefix(spans, 0.7).end - spans.start).tolist() == [63, 70, 4, 0]
    assert (keep_prefix(spans, 0.29).end - spans.start).tolist() == [26, 29, 2, 0]
    assert (keep_prefix(spans, 1.0).end - spans.start).tolist() == lengths.tolist()
