"""ClassmateExperienceMaker and ClassmateStage with a fake Ray (upstream's own test pattern): fake classmate engines
return canned answers, upstream's forward passes are replaced by a recorder, everything else is the real code."""

import json
import time
from types import SimpleNamespace

import pytest
import ray
import torch
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from openrlhf_classmate.integration import patches
from openrlhf_classmate.integration.args import parse_args
from openrlhf_classmate.integration.classmate_stage import ClassmateInputError, ClassmateStage
from openrlhf_classmate.integration.experience import ClassmateExperience
from openrlhf_classmate.integration.experience_maker import ClassmateExperienceMaker
from openrlhf_classmate.testing.tiny_models import save_tiny_model

WORDS = ["0", "1", "2", "3", "4", "+", "=", "?", "answer"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("maker")
    policy = save_tiny_model(str(root / "policy"), WORDS, seed=0)
    classmate = save_tiny_model(str(root / "classmate"), WORDS, hidden_size=16, seed=1)
    from transformers import AutoTokenizer

    return SimpleNamespace(policy=policy, classmate=classmate, tok=AutoTokenizer.from_pretrained(policy))


def _args(world, *extra):
    patches.install_experience()
    return parse_args([
        "--actor.model_name_or_path", world.policy, "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node",
        "1", "--data.prompt_dataset", "d.jsonl", "--rollout.batch_size", "1", "--rollout.micro_batch_size", "2",
        "--rollout.n_samples_per_prompt", "4", "--vllm.num_engines", "1", "--classmate.model_name_or_path",
        world.classmate, "--classmate.max_new_tokens", "4", "--data.max_len", "40", *extra,
    ])


def _sample(tok, prompt: str, response: str, reward: float):
    messages = [{"role": "user", "content": prompt}]
    prompt_ids = tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)["input_ids"]
    response_ids = tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    seq = torch.tensor(prompt_ids + response_ids)
    action_mask = torch.zeros(len(seq) - 1, dtype=torch.bool)
    action_mask[len(prompt_ids) - 1 :] = True
    label = json.dumps({"data_source": "arithmetic", "ground_truth": "3", "messages": messages})
    return ClassmateExperience(
        sequences=seq.unsqueeze(0), attention_mask=torch.ones(1, len(seq), dtype=torch.long),
        action_mask=action_mask.unsqueeze(0), rewards=torch.tensor([reward]), prompts=[prompt], labels=[label],
        response_length=torch.tensor([len(response_ids)]), total_length=torch.tensor([len(seq)]),
        info={"reward": torch.tensor([reward])},
    )


class FakeEngine:
    """Answers with the last number of the CoT it was shown (a classmate that can only read), records calls."""

    def __init__(self, tok, log):
        self.tok, self.log, self.seeds = tok, log, []
        self.generate_responses = SimpleNamespace(remote=self._generate)
        self.wake_up = SimpleNamespace(remote=lambda **kw: log.append("wake_up"))
        self.sleep = SimpleNamespace(remote=lambda **kw: log.append("sleep"))

    def _generate(self, prompt, label, sampling_params, max_length, hf_tokenizer, num_samples):
        self.log.append("generate")
        self.seeds.append(sampling_params.seed)
        ids = prompt["input_ids"]
        cot = self.tok.decode(ids[prompt["cot_offset"] : prompt["cot_offset"] + prompt["cot_len"]]).split()
        numbers = [w for w in cot if w.isdigit()]
        answer = self.tok(f"answer {numbers[-1] if numbers else '0'}", add_special_tokens=False)["input_ids"]
        lp = None
        if sampling_params.prompt_logprobs is not None:
            lp = [-0.1 * (j + 1) for j in range(prompt["cot_len"])]
        return [{"output_token_ids": answer, "finish_reason": "stop", "cot_logprobs": lp, "finished_at": time.time()}]


@pytest.fixture()
def fake_ray(monkeypatch):
    log = []

    def get(x):
        log.append("get")
        return x

    monkeypatch.setattr(ray, "get", get)
    return log


def _maker(args, world, log, colocated=False):
    engine = FakeEngine(world.tok, log)
    stage = ClassmateStage(args, world.tok, [[engine]], [world.tok])
    maker = ClassmateExperienceMaker.__new__(ClassmateExperienceMaker)
    maker.strategy = SimpleNamespace(args=args)
    maker.args, maker.tokenizer = args, world.tok
    maker.stage, maker.classmate_engines, maker.colocated = stage, [engine], colocated
    maker.sleep = colocated
    return maker, engine


@pytest.fixture()
def upstream_forward(monkeypatch, fake_ray):
    def fake(self, rollout_samples):
        fake_ray.append("actor/ref forward")
        time.sleep(0.05)  # the forwards take time: the maker logs it (classmate/actor_ref_forward_time)
        experiences = self.split_rollout_samples(rollout_samples)
        for e in experiences:
            e.action_log_probs = torch.zeros(e.action_mask.shape)
            e.advantages = torch.full(e.action_mask.shape, 99.0)
        return experiences

    monkeypatch.setattr(RemoteExperienceMaker, "make_experience_batch", fake)


# main rewards [1, 0, 1, 0]; classmate reads the last CoT number: "3" is right -> classmate [1, 1, 1, 0].
# CoT lengths 5, 5, 3, 1 tokens: classmate inputs of 20, 20, 18, 16 tokens (+4 new tokens each).
RESPONSES = [("<think> 1 + 2 = 3 </think> 3", 1.0), ("<think> 2 + 1 = 3 </think> 2", 0.0),
             ("<think> 0 + 3 </think> 3", 1.0), ("<think> 2 </think> 4", 0.0)]


def _rollout(world):
    return [_sample(world.tok, "1 + 2 = ?", r, m) for r, m in RESPONSES]


def test_separated_advantages_live_on_the_cot_and_the_stage_overlaps_the_forwards(world, fake_ray,
                                                                                 upstream_forward):
    args = _args(world, "--classmate.estimator", "separated", "--algo.advantage.no_std_norm")
    maker, engine = _maker(args, world, fake_ray)
    samples = _rollout(world)
    experiences = maker.make_experience_batch(samples)

    # not colocated: requests go out before the actor/ref forwards and are gathered after them
    assert fake_ray.index("generate") < fake_ray.index("actor/ref forward") < len(fake_ray) - 1
    assert "sleep" not in fake_ray and "wake_up" not in fake_ray
    assert len(set(engine.seeds)) == 4  # a fresh seed per request

    main_expected = [0.5, -0.5, 0.5, -0.5]  # R^m - group mean
    classmate_expected = [0.25, 0.25, 0.25, -0.75]
    for exp in experiences:
        assert isinstance(exp, ClassmateExperience)
        for row, index in enumerate(exp.index):
            v, m = exp.action_mask[row].bool(), exp.cot_mask[row]
            assert int(m.sum()) == len(RESPONSES[index][0].split("</think>")[0].split()) - 1  # tokens between tags
            assert torch.all(exp.advantages[row][v] == main_expected[index]) and torch.all(exp.advantages[row][~v] == 0)
            assert torch.all(exp.classmate_advantages[row][m] == classmate_expected[index])
            assert torch.all(exp.classmate_advantages[row][~m] == 0)  # classmate_partial: nothing outside the CoT
        assert exp.info["classmate/reward"].tolist() == [1.0 if i < 3 else 0.0 for i in exp.index]
        assert torch.all(exp.info["classmate/valid"] == 1)
        assert torch.all(exp.info["classmate/adv_abs_outside_cot"] == 0)
        assert torch.all(exp.info["classmate/stage_time"] >= exp.info["classmate/stage_overlap_time"])
        assert torch.all(exp.info["classmate/actor_ref_forward_time"] >= 0.05)


def test_colocated_classmate_finishes_and_sleeps_before_the_forwards(world, fake_ray, upstream_forward):
    args = _args(world, "--train.colocate_actor_ref", "--classmate.placement", "colocate")
    maker, _ = _maker(args, world, fake_ray, colocated=True)
    experiences = maker.make_experience_batch(_rollout(world))
    order = [e for e in fake_ray if e != "get"]
    assert order == ["wake_up"] + ["generate"] * 4 + ["sleep", "actor/ref forward"]
    assert torch.all(torch.cat([e.info["classmate/stage_overlap_time"] for e in experiences]) == 0)
    # gdpo (default): one advantage tensor; CoT tokens carry the batch-normalised sum, other tokens A^m
    for exp in experiences:
        assert exp.classmate_advantages is None
        for row in range(len(exp.index)):
            answer = exp.action_mask[row].bool() & ~exp.cot_mask[row]
            assert len(set(exp.advantages[row][answer].tolist())) == 1


def test_skipped_classmate_inputs_are_masked_not_scored_zero(world, fake_ray, upstream_forward):
    # a tiny classmate context: the two longest CoTs no longer fit and are skipped with a reason
    args = _args(world, "--classmate.estimator", "separated", "--algo.advantage.no_std_norm",
                 "--classmate.max_context", "23")  # 20 + 4 > 23 >= 18 + 4
    maker, engine = _maker(args, world, fake_ray)
    experiences = maker.make_experience_batch(_rollout(world))
    valid = {i: bool(e.info["classmate/valid"][r]) for e in experiences for r, i in enumerate(e.index)}
    assert valid == {0: False, 1: False, 2: True, 3: True}
    skip = experiences[0].info["classmate/skip_over_max_context"][0]
    assert skip == pytest.approx(0.5)
    for exp in experiences:
        for row, index in enumerate(exp.index):
            expected = {0: 0.0, 1: 0.0, 2: 0.5, 3: -0.5}[index]  # only the valid pair forms the statistics
            assert torch.all(exp.classmate_advantages[row][exp.cot_mask[row]] == expected)


def test_vanilla_classmate_carries_the_classmate_log_probs_on_the_cot(world, fake_ray, upstream_forward):
    args = _args(world, "--classmate.estimator", "separated", "--classmate.loss", "vanilla_classmate",
                 "--classmate.prompt_mode", "splice", "--classmate.model_name_or_path", world.policy)
    maker, _ = _maker(args, world, fake_ray)
    experiences = maker.make_experience_batch(_rollout(world))
    for exp in experiences:
        for row in range(len(exp.index)):
            lp = exp.classmate_log_probs[row]
            m = exp.cot_mask[row]
            assert lp[m].tolist() == pytest.approx([-0.1 * (j + 1) for j in range(int(m.sum()))])
            assert torch.all(torch.isinf(lp[~m]))


def test_a_label_without_messages_is_a_clear_error(world, fake_ray):
    args = _args(world)
    stage = ClassmateStage(args, world.tok, [[FakeEngine(world.tok, fake_ray)]], [world.tok])
    sample = _sample(world.tok, "1 + 2 = ?", "<think> 3 </think> 3", 1.0)
    sample.labels = [json.dumps({"data_source": "arithmetic", "ground_truth": "3"})]
    with pytest.raises(ClassmateInputError, match="no 'messages' list"):
        stage.dispatch([sample])
    sample.labels = ["not json"]
    with pytest.raises(ClassmateInputError, match="not JSON"):
        stage.dispatch([sample])


def test_bad_labels_stop_the_run_with_the_registrys_message(world, fake_ray, upstream_forward):
    from openrlhf_classmate.scoring import LabelError

    args = _args(world)
    maker, _ = _maker(args, world, fake_ray)
    samples = _rollout(world)
    samples[2].labels = [json.dumps({"data_source": "arithmetic", "messages": [{"role": "user", "content": "x"}]})]
    with pytest.raises(LabelError, match="data_source 'arithmetic', field 'ground_truth'"):
        maker.make_experience_batch(samples)
