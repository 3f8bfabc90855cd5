"""One CoT / answer split for training, reward and evaluation, over every tokenizer of the BPE world.

Each case is a response written as token ids; it goes through the real rollout path: the HF engine (the policy
engines' stand-in on CPU) with the launcher's policy executor, upstream's ``SingleTurnAgentExecutor.execute``
(prompt truncation, generation) and ``reward_func``; upstream's ``_process_response_into_experience`` turns the
output into the rollout sample the classmate stage splits; ``evaluate.split_response`` splits the same ids. Only the
engine's transformers model is scripted (it writes the case's ids, then more tokens that the engine must cut at the
stop id). All three must give the case's CoT ids and answer.
"""

import asyncio
import json
import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from vllm import SamplingParams

import openrlhf_classmate.reward_func as reward_module
from openrlhf_classmate.algo.classmate_prompt import encode_text
from openrlhf_classmate.algo.response_split import ThinkFormat, decoded_answer, load_stop_token_ids
from openrlhf_classmate.algo.spans import split_response_ids, think_token_ids
from openrlhf_classmate.cli import evaluate as ev
from openrlhf_classmate.cli.train_ppo_ray import POLICY_EXECUTOR_PATH, reward_env
from openrlhf_classmate.integration.classmate.classmate_stage import ClassmateStage
from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.integration.rollout.hf_engine import HFEngine
from openrlhf_classmate.testing.bpe_world import KINDS

MAX_TOKENS = 48


@dataclass
class Case:
    name: str
    response: list[int]  # what the model writes, up to and including the stop id where it stops
    cot: list[int]  # expected CoT ids
    answer: str | None  # expected decoded answer (None: no answer)
    status: str
    user: str = "What is 1 + 2?"
    max_length: int = 512  # upstream's prompt + response budget (small: the prompt is left-truncated)
    marker: str = ""  # ends the user message: the scripted model finds its case by it


def cases(tok, kind: str, stops: list[int]) -> list[Case]:
    def t(text):  # text as ordinary pieces (a tag in it is NOT the tag's id)
        return encode_text(tok, text)

    open_id, close_id = think_token_ids(tok)
    s0, s1 = stops[0], stops[-1]  # the tokenizer's EOS and another stop id of the generation config
    thinking = kind == "qwen3_thinking"  # the template opened <think>: responses start inside the CoT
    head = [] if thinking else [open_id]
    cot = t("\nLet me add: 1 + 2 = 3.\n")
    pieces = t("\nSo 1 + 2 = 3.\n") + t("</think>") + t("\n\n3")
    quoted = t("The tag </think> ends thinking; <|im_end|> too. 1 + 2 = 3.")
    multibyte = t("café 🙂 日本語 Straße: 1 + 2 = 3")
    long_user = "Please be careful. " * 40 + "What is 1 + 2?"
    out = [
        Case("answer", head + cot + [close_id] + t("\n\n3") + [s0], cot, "3", "answer"),
        Case("close_tag_as_pieces", head + pieces + [s0], pieces, None, "unclosed"),
        Case("quoted_tags_in_cot", head + quoted + [close_id] + t("3") + [s0], quoted, "3", "answer"),
        Case("other_stop_id_no_close", head + cot + [s1], cot, None, "unclosed"),
        Case("other_stop_id_after_answer", head + cot + [close_id] + t(" 3") + [s1], cot, "3", "answer"),
        Case("multibyte", head + multibyte + [close_id] + t("\n\n3") + [s0], multibyte, "3", "answer"),
        Case("empty_cot", head + [close_id] + t("3") + [s0], [], "3", "answer"),
        Case("truncated_in_cot", head + cot + t("and then"), cot + t("and then"), None, "unclosed"),
        Case("truncated_in_answer", head + cot + [close_id] + t("\n\n3"), cot, "3", "answer"),
        Case("nfc_changed_prompt", head + cot + [close_id] + t("3") + [s0], cot, "3", "answer",
             user="Cafe\u0301 na\u0131\u0308ve: what is 1 + 2?"),
        Case("nfc_changed_prompt_pieces", head + pieces + [s0], pieces, None, "unclosed",
             user="Cafe\u0301: what is 1 + 2?"),
        Case("left_truncated_prompt", head + cot + [close_id] + t("3") + [s0], cot, "3", "answer", user=long_user,
             max_length=MAX_TOKENS + 40),
        Case("left_truncated_prompt_pieces", head + pieces + [s0], pieces, None, "unclosed", user=long_user,
             max_length=MAX_TOKENS + 40),
    ]
    if not thinking:
        # no <think> id at all: the whole response is CoT, a </think> after it does not make an answer
        out.append(Case("no_open_tag", cot + [close_id] + t("3") + [s0], cot + [close_id] + t("3"), None,
                        "unopened"))
    for i, case in enumerate(out):
        case.marker = f"[case {i}]"
        case.user = f"{case.user} {case.marker}"
    return out


def messages(case: Case) -> list[dict]:
    return [{"role": "system", "content": "Be kind."}, {"role": "user", "content": case.user}]


class ScriptedLM:
    """Stands in for the HF engine's transformers model: continues the prompt of case i with that case's ids, then
    with tokens the engine must cut off (after a stop id, or at max_tokens)."""

    def __init__(self, tok, all_cases: list[Case]):
        self.tok, self.cases = tok, all_cases
        self.tail = encode_text(tok, " and more text")

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **kwargs):
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            prompt = self.tok.decode([t for t, m in zip(ids, mask) if m])
            marker = re.findall(r"\[case \d+\]", prompt)[-1]
            case = next(c for c in self.cases if c.marker == marker)
            continuation = (case.response + self.tail * 4 + [pad_token_id] * max_new_tokens)[:max_new_tokens]
            rows.append(ids + continuation)
        return SimpleNamespace(sequences=torch.tensor(rows), scores=None)


def _args(world, kind, *extra, classmate=True):
    classmate_flags = ["--classmate.model_name_or_path", world.paths["llama3"]] if classmate else []
    return parse_args(["--actor.model_name_or_path", world.paths[kind], "--actor.num_gpus_per_node", "1",
                       "--ref.num_gpus_per_node", "1", "--data.prompt_dataset", "d.jsonl", "--rollout.batch_size",
                       "2", "--rollout.n_samples_per_prompt", "2", "--vllm.num_engines", "1", *classmate_flags,
                       *extra])


def _rollout(world, kind, all_cases, monkeypatch, *extra, classmate=True):
    """Every case through the HF engine + policy executor; returns (engine outputs, answers reward_func received)."""
    for name, value in reward_env(_args(world, kind, *extra, classmate=classmate)).items():  # what the launcher exports to the engines
        monkeypatch.setenv(name, value)
    tok = world.tokenizer(kind)
    engine = HFEngine(model=world.paths[kind], seed=0, max_model_len=512, agent_func_path=POLICY_EXECUTOR_PATH)
    engine.model = ScriptedLM(tok, all_cases)
    seen = []
    real = reward_module.reward_func

    def spy(queries, prompts, labels, answers=None, **kwargs):
        seen.append((prompts[0], answers[0]))
        return real(queries, prompts, labels, answers=answers, **kwargs)

    monkeypatch.setattr(reward_module, "reward_func", spy)
    label = json.dumps({"data_source": "exact_match", "ground_truth": "3"})

    async def run():
        jobs = []
        for case in all_cases:
            prompt = tok.apply_chat_template(messages(case), add_generation_prompt=True, tokenize=False)
            truncated = case.name.startswith("truncated")
            params = SamplingParams(temperature=0.0, max_tokens=len(case.response) if truncated else MAX_TOKENS)
            jobs.append(engine.generate_responses(prompt, label, params, case.max_length, tok, num_samples=1))
        return [out[0] for out in await asyncio.gather(*jobs)]

    outputs = asyncio.run(run())
    answers = {p: a for p, a in seen}
    return outputs, [answers[out["prompt"]] for out in outputs]


@pytest.mark.parametrize("kind", KINDS)
def test_classmate_stage_reward_and_evaluation_split_every_case_alike(bpe_world, kind, monkeypatch):
    tok = bpe_world.tokenizer(kind)
    stops = bpe_world.stops(kind)
    assert len(stops) == (1 if kind == "sentencepiece" else 2)
    all_cases = cases(tok, kind, stops)
    outputs, reward_answers = _rollout(bpe_world, kind, all_cases, monkeypatch)

    # training: upstream turns each engine output into a rollout sample; the classmate stage splits those
    samples = [SamplesGenerator._process_response_into_experience(None, out, max_len=c.max_length)
               for out, c in zip(outputs, all_cases)]
    stage = ClassmateStage(_args(bpe_world, kind), tok, [], [])
    spans = stage.spans(samples)
    # evaluation: the model's stop ids and the rendered prompt, as evaluate.run gets them
    eval_stops = load_stop_token_ids(bpe_world.paths[kind], tok)
    open_id, close_id = think_token_ids(tok)
    rows = [ev.Row(messages=messages(c), label={}) for c in all_cases]
    _, opened = ev.render_prompts(tok, rows, chat_template=True, template_kwargs={},
                                   think_ids=(open_id, close_id))
    assert opened == [kind == "qwen3_thinking"] * len(all_cases)

    for i, (case, out) in enumerate(zip(all_cases, outputs)):
        start, end = out["action_ranges"][0]
        response = out["observation_tokens"][start:end]
        assert response == case.response, case.name  # the engine stopped on every stop id / at max_tokens
        assert out["truncated"] == case.name.startswith("truncated"), case.name
        # reward (policy engine)
        assert reward_answers[i] == case.answer, case.name
        logs = out["extra_logs"]
        assert (logs["has_answer"], logs["main_valid"]) == (float(case.answer is not None), 1.0), case.name
        assert out["reward"] == out["scores"] == (1.0 if case.answer == "3" else 0.0), case.name
        # training (classmate stage)
        cot_ids = spans.response_ids[i][spans.cot[i]].tolist()
        assert cot_ids == case.cot, case.name
        assert bool(spans.has_answer[i]) == (case.answer is not None), case.name
        # evaluation
        split = ev.split_response(response, tok, open_id=open_id, close_id=close_id, starts_in_think=opened[i],
                                  stop_ids=eval_stops)
        assert (split["cot_ids"], split["answer"], split["status"]) == (case.cot, case.answer, case.status), case.name
        assert split["has_answer"] == (case.answer is not None), case.name

    by_name = {c.name: (c, out, samples[i]) for i, (c, out) in enumerate(zip(all_cases, outputs))}
    # the edge cases are real: the long prompt was left-truncated by upstream, the NFC prompt does not round-trip
    case, out, sample = by_name["left_truncated_prompt"]
    full = tok(tok.apply_chat_template(messages(case), add_generation_prompt=True, tokenize=False),
               add_special_tokens=False)["input_ids"]
    assert len(full) > out["action_ranges"][0][0] == case.max_length - MAX_TOKENS
    if kind.startswith("qwen3"):  # the NFC-normalising tokenizer
        case, out, _ = by_name["nfc_changed_prompt"]
        query = tok.decode(out["observation_tokens"], skip_special_tokens=False)
        assert not query.startswith(out["prompt"])  # a text search could not cut the prompt off this query


def test_pieces_that_read_as_a_close_tag_are_not_one(bpe_world):
    """A reward hack: the text after a typed ``</think>`` is not an answer (text search said 1.0)."""
    tok = bpe_world.tokenizer("qwen3")
    open_id, close_id = think_token_ids(tok)
    typed = encode_text(tok, "</think>")
    assert close_id not in typed and len(typed) > 1 and tok.decode(typed) == "</think>"
    response = [open_id] + encode_text(tok, "1 + 2 = 3") + typed + encode_text(tok, "\n\n3") + [tok.eos_token_id]
    assert tok.decode(response, skip_special_tokens=True).split("</think>")[1].strip() == "3"  # what text saw
    split = ThinkFormat.of(tok, stop_ids=bpe_world.stops("qwen3")).split([], response)
    assert split.status == "unclosed" and decoded_answer(tok, response, split) is None
    split = split_response_ids(response, think_open_id=open_id, think_close_id=close_id,
                               stop_ids=bpe_world.stops("qwen3"))
    assert split.cot_end == len(response) - 1


def test_whole_response_mode_scores_the_whole_response_in_the_engine(bpe_world, monkeypatch):
    tok = bpe_world.tokenizer("llama3")
    answer = encode_text(tok, "3")
    case = Case("whole", answer + [bpe_world.stops("llama3")[1]], [], "3", "no_think", marker="[case 0]")
    case.user += " [case 0]"
    outputs, answers = _rollout(bpe_world, "llama3", [case], monkeypatch, "--classmate.final_answer",
                                "whole_response", classmate=False)
    assert answers == ["3"] and outputs[0]["reward"] == 1.0


# ── the launcher's wiring ──


def test_the_launcher_gives_the_policy_engines_our_executor_only_for_the_registry_reward(monkeypatch):
    from openrlhf_classmate.cli.train_ppo_ray import EngineFactory
    from openrlhf_classmate.integration.classmate_config import REWARD_FUNC_PATH

    factory = EngineFactory(SimpleNamespace(engine=SimpleNamespace(backend="hf"),
                                            classmate=SimpleNamespace(model_name_or_path=None)))
    seen = []
    monkeypatch.setattr(factory, "create", lambda **kw: seen.append(kw) or ["engine"])
    base = (1, 1, "policy", 42, False, False, False, 256)
    factory.policy(*base, agent_func_path=None, remote_rm_url=[REWARD_FUNC_PATH])
    factory.policy(*base, agent_func_path="/my/agent.py", remote_rm_url=[REWARD_FUNC_PATH])  # never replaced
    factory.policy(*base, agent_func_path=None, remote_rm_url=["/my/reward.py"])  # a user's reward: upstream's
    factory.policy(*base, agent_func_path=None, remote_rm_url=["http://127.0.0.1:5000/get_reward"])
    assert [kw["agent_func_path"] for kw in seen] == [POLICY_EXECUTOR_PATH, "/my/agent.py", None, None]
    assert all(kw["remote_rm_url"] for kw in seen)  # passed on unchanged


def test_reward_env_exports_every_stop_id_and_refuses_tags_that_are_not_one_token(bpe_world):
    env = reward_env(_args(bpe_world, "qwen3"))
    tok = bpe_world.tokenizer("qwen3")
    assert json.loads(env["OPENRLHF_CLASSMATE_STOP_IDS"]) == tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert (env["OPENRLHF_CLASSMATE_THINK_OPEN"], env["OPENRLHF_CLASSMATE_THINK_CLOSE"]) == ("<think>", "</think>")
    with pytest.raises(SystemExit, match=r"^error: think tag '</answer>' must encode to exactly one token.*"
                                         r"--classmate.final_answer whole_response"):
        reward_env(_args(bpe_world, "qwen3", "--classmate.think_close", "</answer>"))
    # a user's reward function splits its own text: no token-id requirement then
    reward_env(_args(bpe_world, "qwen3", "--classmate.think_close", "</answer>", "--reward.remote_url", "/r.py",
                     "--classmate.scorer", "exact_match"))
