"""``cli/prepare_policy.py``: a causal LM without single-token think tags (as Llama-3.x, Qwen2.5 and OLMo-2 ship)
becomes a policy the launcher accepts: the tags become one id each, their new rows are the mean of the pieces they
were written in, every other token's logits stay as they were, tied and untied heads alike; the folder reloads, the
launcher's ``--check`` accepts it where it refused the source, ``--tag-rate`` counts what the reward reads; and a
slow round trip trains it through the launcher and converts the checkpoint with the tags kept."""

from __future__ import annotations

import json
import os

import pytest
import torch

from openrlhf_classmate.cli import prepare_policy as pp
from openrlhf_classmate.eval.generation import Generation
from openrlhf_classmate.testing.bpe_world import build_tokenizer, stop_token_ids

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (architecture, world tokenizer, tied head, spare embedding rows past the tokenizer). Qwen2.5 and OLMo-2 pad
# their tables (151936 rows for 151665 tokens, 100352 for 100278): the new ids then take spare rows, no resize.
CASES = {
    "llama_tied": ("llama", "llama3", True, 0),
    "llama_untied": ("llama", "llama3", False, 0),
    "qwen2_tied_spare_rows": ("qwen2", "qwen3", True, 24),
    "olmo2_untied_spare_rows": ("olmo2", "llama3", False, 40),
}
TEXTS = ("let me think step by step: 12 + 7 = 19.", "the answer is 5, so we add first then check again wait")


def save_untagged(path: str, arch: str, kind: str, tied: bool, spare: int, seed: int = 0) -> str:
    """A tiny random ``arch`` causal LM over the ``kind`` world tokenizer without think tags, saved to ``path``."""
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Olmo2Config,
        Olmo2ForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tokenizer = build_tokenizer(kind, think_tags=False)
    stops = stop_token_ids(kind, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else stops[0]
    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
               "olmo2": (Olmo2Config, Olmo2ForCausalLM)}
    config_class, model_class = classes[arch]
    config = config_class(vocab_size=len(tokenizer) + spare, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          tie_word_embeddings=tied, pad_token_id=pad, bos_token_id=bos, eos_token_id=stops[0])
    torch.manual_seed(seed)
    model = model_class(config)
    model.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=pad, bos_token_id=bos)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _load(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def _tied(model) -> bool:
    return model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Every case of :data:`CASES` saved and prepared once: {name: (source folder, prepared folder, report)}."""
    root = tmp_path_factory.mktemp("prepare")
    out = {}
    for i, (name, (arch, kind, tied, spare)) in enumerate(CASES.items()):
        source = save_untagged(str(root / name), arch, kind, tied, spare, seed=i)
        report = pp.prepare(source, str(root / f"{name}_policy"), log=lambda *_: None)
        out[name] = (source, str(root / f"{name}_policy"), report)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_tags_become_one_token_each_and_every_other_token_keeps_its_logits(prepared, name):
    arch, _, tied, spare = CASES[name]
    source, folder, report = prepared[name]
    before, old_tok = _load(source)
    after, new_tok = _load(folder)
    assert after.config.model_type == arch and _tied(after) == tied == report.tied_embeddings
    assert pp.single_token_id(old_tok, "<think>") is None and pp.single_token_id(old_tok, "</think>") is None
    ids = [new_tok.encode(t, add_special_tokens=False) for t in ("<think>", "</think>")]
    assert ids == [[report.think_open.id], [report.think_close.id]]
    assert [report.think_open.id, report.think_close.id] == [len(old_tok), len(old_tok) + 1]  # the next free ids
    rows = after.get_input_embeddings().weight.shape[0]
    assert rows == after.config.vocab_size == len(old_tok) + max(spare, 2)  # spare rows taken, else resized by 2
    assert (report.rows_before, report.rows_after) == (len(old_tok) + spare, rows)
    # every other token: encodes as before, and its logits are unchanged on every input over the old vocabulary
    new_ids = {report.think_open.id, report.think_close.id}
    others = [i for i in range(len(old_tok) + spare) if i not in new_ids]
    chat = old_tok.apply_chat_template([{"role": "user", "content": TEXTS[0]}], add_generation_prompt=True,
                                       tokenize=False)
    for text in (*TEXTS, chat):
        old_ids = old_tok.encode(text, add_special_tokens=False)
        assert new_tok.encode(text, add_special_tokens=False) == old_ids
        x = torch.tensor([old_ids])
        with torch.no_grad():
            diff = (before(x).logits[..., others] - after(x).logits[..., others]).abs().max()
        assert float(diff) <= 1e-6
    # the new rows: the mean of the rows of the pieces each tag was written in (input, and output when untied)
    for note in (report.think_open, report.think_close):
        assert note.added and note.pieces == old_tok.encode(note.text, add_special_tokens=False)
        assert len(note.pieces) > 1
        for get in (lambda m: m.get_input_embeddings(), lambda m: m.get_output_embeddings()):
            want = get(before).weight[note.pieces].mean(dim=0)
            assert torch.allclose(get(after).weight[note.id], want, atol=1e-6)
    with open(os.path.join(folder, pp.NOTE)) as f:
        note = json.load(f)
    assert note["source"] == source and note["think_close"]["id"] == report.think_close.id
    assert note["think_open"]["piece_texts"] == old_tok.convert_ids_to_tokens(report.think_open.pieces)


def test_the_tags_survive_decode_encode_round_trips_and_the_chat_template(prepared):
    _, folder, report = prepared["qwen2_tied_spare_rows"]
    _, tok = _load(folder)
    open_id, close_id = report.think_open.id, report.think_close.id
    ids = tok.encode("<think>\n1 + 2 = 3</think>\n\n3", add_special_tokens=False)
    assert ids.count(open_id) == ids.count(close_id) == 1 and ids[0] == open_id
    text = tok.decode(ids, skip_special_tokens=True)  # special=False: the reward's and the classmate's decode keep them
    assert text == "<think>\n1 + 2 = 3</think>\n\n3"
    assert tok.encode(text, add_special_tokens=False) == ids
    chat = [{"role": "user", "content": "1 + 2 = ?"}, {"role": "assistant", "content": "<think>\nadd</think>\n\n3"}]
    rendered = tok.apply_chat_template(chat, tokenize=False)
    assert [open_id, close_id] == [t for t in tok.encode(rendered, add_special_tokens=False) if t in (open_id, close_id)]


def test_a_model_that_has_the_tags_already_is_left_alone(tmp_path, capsys):
    from openrlhf_classmate.testing.bpe_world import save_world_model

    source = save_world_model("qwen3", str(tmp_path / "qwen3"), hidden_size=16, num_layers=1)
    assert pp.main([source, str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "already has '<think>' and '</think>' as single tokens" in out[0]
    assert not os.path.exists(tmp_path / "out") and sorted(os.listdir(tmp_path)) == ["qwen3"]


def test_custom_tags_and_a_tag_that_is_one_token_already(tmp_path):
    """Only the tag that is not one token is added; ``<think>`` stays where the tokenizer had it."""
    from openrlhf_classmate.testing.bpe_world import save_world_model

    source = save_world_model("llama3", str(tmp_path / "m"), hidden_size=16, num_layers=1)
    report = pp.prepare(source, str(tmp_path / "out"), think_open="<think>", think_close="<answer>")
    _, tok = _load(str(tmp_path / "out"))
    assert not report.think_open.added and report.think_open.id == tok.convert_tokens_to_ids("<think>")
    assert report.think_close.added and tok.encode("<answer>", add_special_tokens=False) == [report.think_close.id]
    assert report.tokens_after == report.tokens_before + 1


def test_overwrite_replaces_an_earlier_preparation_only(prepared, tmp_path, capsys):
    source, _, _ = prepared["llama_tied"]
    out = tmp_path / "policy"
    assert pp.main([source, str(out)]) == 0
    assert pp.main([source, str(out)]) == 1
    assert "exists; --overwrite replaces an earlier preparation" in capsys.readouterr().err
    assert pp.main([source, str(out), "--overwrite"]) == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert pp.main([source, str(other), "--overwrite"]) == 1
    assert f"holds files but no {pp.NOTE}" in capsys.readouterr().err
    assert (other / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "policy"]  # no temporary folder left


def _vit_folder(path: str) -> str:
    from transformers import ViTConfig, ViTModel

    ViTModel(ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                       image_size=8, patch_size=4)).save_pretrained(path)
    build_tokenizer("llama3", think_tags=False).save_pretrained(path)
    return path


ERRORS = [
    (lambda t, src: [str(t / "missing"), str(t / "out")], "MODEL {t}/missing: no such folder"),
    (lambda t, src: [os.path.join(src, "config.json"), str(t / "out")], "is a file; give the model's folder"),
    (lambda t, src: [str(t), str(t / "out")], "holds no config.json: not a Hugging Face model folder"),
    (lambda t, src: ["someone/not-here", str(t / "out")], "MODEL someone/not-here: cannot load its tokenizer ("),
    (lambda t, src: [src, str(t / "out"), "--think-close", "<think>"], "the open and close tags are the same tag"),
    (lambda t, src: [src, str(t / "out"), "--think-open", " "], "--think-open ' ' is empty"),
    (lambda t, src: [src, str(t / "out"), "--think-open", " <think>"], "has white space around it"),
    (lambda t, src: [src, os.path.join(src, "policy")], "lies inside the model folder"),
    (lambda t, src: [src, src, "--overwrite"], "is the model folder"),
    (lambda t, src: [src], "give OUT_DIR"),
    (lambda t, src: [_vit_folder(str(t / "vit")), str(t / "out")], "is not a causal LM"),
    (lambda t, src: [src, "--tag-rate", str(t / "none.jsonl")], "none.jsonl: no such file"),
    (lambda t, src: [src, str(t / "out"), "--tag-rate", str(t / "p.jsonl")], "drop OUT_DIR"),
]


@pytest.mark.parametrize("argv, message", ERRORS, ids=[m.split(":")[-1].strip()[:30] for _, m in ERRORS])
def test_errors_are_one_line_and_write_nothing(prepared, tmp_path, capsys, argv, message):
    source, _, _ = prepared["llama_tied"]
    work = tmp_path / "w"
    work.mkdir()
    args = argv(work, source)
    before = sorted(os.listdir(work)), sorted(os.listdir(source))
    capsys.readouterr()  # what building the arguments printed
    assert pp.main(args) == 1
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if not line.startswith("[prepare_policy] ")]  # progress
    assert len(errors) == 1 and errors[0].startswith("error: "), captured.err
    assert message.format(t=work) in errors[0]
    assert not os.path.exists(work / "out") and sorted(os.listdir(source)) == before[1]
    assert not [n for n in os.listdir(work) if n.startswith(".")]


def _one_row(path):
    """A data file of one GSM8K-labelled prompt (the classmate's messages included)."""
    chat = [{"role": "user", "content": "1 + 1 = ?"}]
    path.write_text(json.dumps({"prompt": chat, "label": json.dumps(
        {"data_source": "gsm8k", "ground_truth": "2", "messages": chat})}) + "\n")
    return path


def _check_argv(policy: str, data: str) -> list[str]:
    return ["--check", "--actor.model_name_or_path", policy, "--actor.num_gpus_per_node", "1",
            "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--data.prompt_dataset", data,
            "--data.input_key", "prompt", "--data.label_key", "label", "--data.apply_chat_template",
            "--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "2", "--rollout.micro_batch_size", "1",
            "--train.batch_size", "4",  # one optimizer step per rollout of 2 x 2 samples
            "--classmate.model_name_or_path", policy]


def test_the_launcher_check_accepts_the_prepared_model_where_it_refused_the_source(prepared, tmp_path, capsys):
    from openrlhf_classmate.cli import train_ppo_ray

    source, folder, _ = prepared["llama_untied"]
    data = _one_row(tmp_path / "train.jsonl")
    with pytest.raises(SystemExit) as refused:
        train_ppo_ray.main(_check_argv(source, str(data)))
    message = str(refused.value)
    assert "--classmate.think_open '<think>' is not one token of the policy tokenizer" in message
    assert f"run python -m openrlhf_classmate.cli.prepare_policy {source} OUT and train OUT" in message
    capsys.readouterr()
    train_ppo_ray.main(_check_argv(folder, str(data)))
    out, err = capsys.readouterr()
    assert out.strip().endswith("check passed: the run would start"), err


def test_evaluate_runs_on_the_prepared_model_where_it_refused_the_source(prepared, tmp_path, capsys):
    from openrlhf_classmate.cli import evaluate

    source, folder, _ = prepared["olmo2_untied_spare_rows"]
    data = _one_row(tmp_path / "test.jsonl")

    def run(model: str, out: str) -> int:
        return evaluate.main(["--model", model, "--data", str(data), "--output-dir", str(tmp_path / out), "--backend",
                              "hf", "--max-new-tokens", "4", "--samples", "2", "--temperature", "1.0", "--quiet"])

    assert run(source, "source") == 1
    assert "'<think>' must encode to exactly one token" in capsys.readouterr().err
    assert run(folder, "prepared") == 0
    summary = json.loads((tmp_path / "prepared" / "summary.json").read_text())
    assert summary["metrics"]["gsm8k"]["samples"] == 2 and "answer_fraction" in summary["metrics"]["gsm8k"]


class ScriptedGenerator:
    """evaluate's generator interface, answering every prompt with the same scripted responses."""

    def __init__(self, responses: list[list[int]]):
        self.responses = responses
        self.prompts: list[list[int]] = []

    def generate(self, prompts, params):
        self.prompts = [list(p) for p in prompts]
        assert params.n == len(self.responses)
        return [[Generation(list(r), "stop") for r in self.responses] for _ in prompts]


def test_tag_rate_counts_what_the_reward_reads(prepared, tmp_path):
    source, folder, report = prepared["llama_tied"]
    _, old_tok = _load(source)
    _, tok = _load(folder)
    eos = tok.convert_tokens_to_ids("<|eot_id|>")

    def text(t: str) -> list[int]:
        return old_tok.encode(t, add_special_tokens=False)  # the old tokenizer: tags written as pieces

    open_id, close_id = report.think_open.id, report.think_close.id
    responses = [[open_id, *text("1 + 1 = 2"), close_id, *text("\n\n2"), eos],  # the reward reads "2"
                 [*text("<think>1 + 1 = 2</think>\n\n2"), eos],  # the format as text only: scores 0
                 [*text("2"), eos]]
    prompts = [[{"role": "user", "content": "1 + 1 = ?"}], [{"role": "user", "content": "2 + 2 = ?"}]]
    rows = tmp_path / "responses.jsonl"
    rate = pp.tag_rate(folder, prompts, samples=3, generator=ScriptedGenerator(responses), responses_out=str(rows))
    assert (rate.responses, rate.close_as_text, rate.closed_by_token, rate.prompt_opens_think) == (6, 4, 2, 0)
    lines = pp.describe_rate(rate, "<think>", "</think>")
    assert "wrote '</think>' (as text, in any tokens): 4/6 (67%)" in lines[1]
    assert "every other response scores 0): 2/6 (33%)" in lines[2]
    written = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [r["closed_by_token"] for r in written] == [True, False, False] * 2
    assert written[0]["prompt"] == prompts[0] and written[1]["response"][0]["content"].startswith("<think>")
    # the source model: the tags are no tokens, so nothing can close the block for the reward
    scripted = ScriptedGenerator([responses[1], responses[1], responses[2]])
    rate = pp.tag_rate(source, prompts, samples=3, generator=scripted, system="Think first.")
    assert (rate.close_as_text, rate.closed_by_token) == (4, None)
    assert old_tok.encode("Think first.", add_special_tokens=False)[0] in scripted.prompts[0]  # the system message
    assert "n/a, the tags are not one token each" in pp.describe_rate(rate, "<think>", "</think>")[2]


def test_tag_rate_runs_a_real_model(prepared, tmp_path, capsys):
    source, folder, _ = prepared["olmo2_untied_spare_rows"]
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{i} + 1 = ?"}]}) + "\n"
                            for i in range(3)) + json.dumps({"prompt": "2 + 2 = ?"}) + "\n")
    for model in (source, folder):
        assert pp.main([model, "--tag-rate", str(data), "--limit", "3", "--samples", "2", "--max-new-tokens", "4",
                        "--backend", "hf"]) == 0
    out = capsys.readouterr().out
    assert f"{source}: 3 prompts x 2 samples" in out and "n/a, the tags are not one token each" in out
    assert f"{folder}: 3 prompts x 2 samples" in out and "the reward reads these answers" in out


@pytest.mark.slow
def test_a_prepared_model_trains_through_the_launcher_and_converts_with_its_tags(tmp_path):
    """Round trip: an e2e-world policy without think tags, prepared, trained for two GRPO steps by the launcher
    (ZeRO-2, checkpoints and HF saves), then its DeepSpeed checkpoint converted: the tags keep their ids."""
    from transformers import AutoTokenizer

    from openrlhf_classmate.cli import convert_checkpoint as cc
    from openrlhf_classmate.testing.e2e import WORDS, build_world, launcher_argv, run_launcher
    from openrlhf_classmate.testing.tiny_models import new_tiny_model
    from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

    world = build_world(str(tmp_path / "world"))
    model, tokenizer = new_tiny_model(None, tokenizer=build_word_tokenizer(WORDS, think_tags=False))
    source = str(tmp_path / "untagged")
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    policy = str(tmp_path / "policy")
    report = pp.prepare(source, policy)
    ids = [report.think_open.id, report.think_close.id]
    log = str(tmp_path / "launcher.log")
    argv = launcher_argv({**world, "policy": policy}, classmate=False, extra=["--actor.entropy_coef", "0.01"])
    code = run_launcher(argv, log, cwd=REPO)
    assert code == 0, open(log).read()[-4000:]
    converted = str(tmp_path / "converted")
    cc.convert(os.path.join(world["root"], "ckpt"), converted, log=lambda *_: None)
    with open(os.path.join(world["root"], "ckpt", "engine_weight_updates.json")) as f:
        assert json.load(f)["policy"] == [2]  # two steps trained: the one engine got the weights after both
    for folder in (os.path.join(world["root"], "hf_final"), converted):
        tok = AutoTokenizer.from_pretrained(folder)
        assert [tok.encode(t, add_special_tokens=False) for t in ("<think>", "</think>")] == [[ids[0]], [ids[1]]]
        model, _ = _load(folder)
        assert model.get_input_embeddings().weight.shape[0] == report.rows_after
