"""The classmate stage keeps vLLM's finish reasons: a classmate request that vLLM aborted or failed (``abort`` /
``error``) is masked (invalid, counted under ``classmate/skip_generation_*``), never scored as a wrong answer; a
``repetition`` or ``length`` cut is a real answer and is scored. Fake Ray and fake engines, real stage code."""

import json
import time
from types import SimpleNamespace

import pytest
import ray
import torch

from openrlhf_classmate.integration import patches
from openrlhf_classmate.integration.classmate.classmate_stage import ClassmateStage
from openrlhf_classmate.integration.experience.experience import ClassmateExperience
from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.testing.tiny_models import save_tiny_model

WORDS = ["0", "1", "2", "3", "4", "+", "=", "?", "answer"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("finish")
    policy = save_tiny_model(str(root / "policy"), WORDS, seed=0)
    classmate = save_tiny_model(str(root / "classmate"), WORDS, hidden_size=16, seed=1)
    return SimpleNamespace(policy=policy, classmate=classmate, tok=AutoTokenizer.from_pretrained(policy))


def _sample(tok, response: str, reward: float):
    messages = [{"role": "user", "content": "1 + 2 = ?"}]
    prompt_ids = tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)["input_ids"]
    response_ids = tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    seq = torch.tensor(prompt_ids + response_ids)
    action_mask = torch.zeros(len(seq) - 1, dtype=torch.bool)
    action_mask[len(prompt_ids) - 1:] = True
    label = json.dumps({"data_source": "arithmetic", "ground_truth": "3", "messages": messages})
    return ClassmateExperience(
        sequences=seq.unsqueeze(0), attention_mask=torch.ones(1, len(seq), dtype=torch.long),
        action_mask=action_mask.unsqueeze(0), rewards=torch.tensor([reward]), prompts=["p"], labels=[label],
        response_length=torch.tensor([len(response_ids)]), total_length=torch.tensor([len(seq)]),
        info={"reward": torch.tensor([reward])},
    )


class Engine:
    """Always answers "answer 3" (correct); the finish reason is scripted per request, in dispatch order; answers
    report finishing ``delay`` seconds after the request."""

    def __init__(self, tok, reasons, delay=0.0):
        self.tok, self.reasons, self.delay = tok, list(reasons), delay
        self.generate_responses = SimpleNamespace(remote=self._generate)

    def _generate(self, prompt, label, sampling_params, max_length, hf_tokenizer, num_samples):
        ids = self.tok("answer 3", add_special_tokens=False)["input_ids"]
        return [{"output_token_ids": ids, "finish_reason": self.reasons.pop(0), "cot_logprobs": None,
                 "finished_at": time.time() + self.delay}]


def _stage_args(world):
    patches.install_experience()
    return parse_args([
        "--actor.model_name_or_path", world.policy, "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node",
        "1", "--data.prompt_dataset", "d.jsonl", "--rollout.batch_size", "1", "--rollout.micro_batch_size", "2",
        "--rollout.n_samples_per_prompt", "4", "--vllm.num_engines", "1", "--classmate.model_name_or_path",
        world.classmate, "--classmate.max_new_tokens", "4", "--data.max_len", "40",
    ])


def test_aborted_and_failed_classmate_calls_are_masked_not_scored(world, monkeypatch):
    monkeypatch.setattr(ray, "get", lambda x: x)
    engine = Engine(world.tok, ["stop", "abort", "error", "repetition"])
    stage = ClassmateStage(_stage_args(world), world.tok, [[engine]], [world.tok])
    samples = [_sample(world.tok, "<think> 1 + 2 = 3 </think> 3", 1.0) for _ in range(4)]
    result = stage.gather(stage.dispatch(samples), torch.ones(4))
    assert result.valid.tolist() == [True, False, False, True]
    assert result.reward.tolist() == [1.0, 0.0, 0.0, 1.0]  # the masked ones carry no score at all
    assert result.metrics["classmate/skip_generation_abort"] == pytest.approx(0.25)
    assert result.metrics["classmate/skip_generation_error"] == pytest.approx(0.25)
    assert result.metrics["classmate/valid_fraction"] == pytest.approx(0.5)


def test_the_stage_reports_where_its_time_goes(world, monkeypatch):
    from openrlhf_classmate.integration.classmate.classmate_scoring import registry_scorer

    monkeypatch.setattr(ray, "get", lambda x: x)
    registry = registry_scorer()

    def slow_scorer(answers):
        time.sleep(0.2)
        return registry(answers)

    stage = ClassmateStage(_stage_args(world), world.tok, [[Engine(world.tok, ["stop"] * 4, delay=0.3)]],
                           [world.tok], scorer=slow_scorer)
    samples = [_sample(world.tok, "<think> 1 + 2 = 3 </think> 3", 1.0) for _ in range(4)]
    result = stage.gather(stage.dispatch(samples), torch.ones(4))
    m = result.metrics
    assert m["classmate/score_time"] == pytest.approx(0.2, abs=0.1)
    assert m["classmate/generation_time"] == pytest.approx(0.3, abs=0.1)  # dispatch -> last answer finished
    assert 0 < m["classmate/dispatch_time"] < m["classmate/generation_time"]


def test_classmate_requests_ask_for_the_final_token_ids_only(world, monkeypatch):
    # the executor reads the finished answer's token ids: no per-token cumulative outputs, no engine-side
    # detokenisation (both cost Python time per generated token in the engine); checked against vLLM's own
    # SamplingParams validation (the CPU shim mirrors it; on the GPU machine it is the real class)
    from vllm.sampling_params import RequestOutputKind

    monkeypatch.setattr(ray, "get", lambda x: x)
    seen = []

    class Recording(Engine):
        def _generate(self, prompt, label, sampling_params, **kwargs):
            seen.append(sampling_params)
            return super()._generate(prompt, label, sampling_params, **kwargs)

    stage = ClassmateStage(_stage_args(world), world.tok, [[Recording(world.tok, ["stop"] * 4)]], [world.tok])
    samples = [_sample(world.tok, "<think> 1 + 2 = 3 </think> 3", 1.0) for _ in range(4)]
    result = stage.gather(stage.dispatch(samples), torch.ones(4))
    assert result.valid.all() and result.reward.tolist() == [1.0] * 4  # answers decoded by the stage itself
    assert len(seen) == 4
    assert all(p.output_kind == RequestOutputKind.FINAL_ONLY and p.detokenize is False for p in seen)
    # no request seed by default (vLLM samples seeded requests one by one at every decode step)
    assert {p.seed for p in seen} == {None}
