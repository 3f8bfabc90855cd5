"""ClassmateExperienceMaker over upstream's real ``RemoteExperienceMaker.make_experience_batch``: only Ray, the
model actors (actor / reference forward passes return fixed functions of the tokens) and the classmate engines are
faked; upstream's split, KL, length penalties, baselines and advantage code all run for real."""

import copy
import json
import time
from types import SimpleNamespace

import pytest
import ray
import torch
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

from openrlhf_classmate.integration import patches
from openrlhf_classmate.integration.classmate.classmate_stage import ClassmateInputError, ClassmateStage
from openrlhf_classmate.integration.experience.experience import ClassmateExperience
from openrlhf_classmate.integration.experience.experience_maker import AllScoresInvalidError, ClassmateExperienceMaker
from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.integration.training.actor import ClassmateLossAdapter, build_classmate_loss
from openrlhf_classmate.testing.tiny_models import save_tiny_model
from openrlhf_classmate.testing.tokenizers import build_word_tokenizer, default_chat_template

WORDS = ["0", "1", "2", "3", "4", "5", "+", "=", "?", "answer"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("maker")
    policy = save_tiny_model(str(root / "policy"), WORDS, seed=0)
    classmate = save_tiny_model(str(root / "classmate"), WORDS, hidden_size=16, seed=1)
    thinking = str(root / "thinking")  # a template that opens <think> in the generation prompt (R1-distill style)
    build_word_tokenizer(WORDS, chat_template=default_chat_template(think_in_template=True)).save_pretrained(thinking)
    from transformers import AutoTokenizer

    return SimpleNamespace(policy=policy, classmate=classmate, thinking=thinking,
                           tok=AutoTokenizer.from_pretrained(policy), think_tok=AutoTokenizer.from_pretrained(thinking))


def _args(world, *extra, classmate=True, policy=None):
    patches.install_experience()
    argv = [
        "--actor.model_name_or_path", policy or world.policy, "--actor.num_gpus_per_node", "1",
        "--ref.num_gpus_per_node", "1", "--data.prompt_dataset", "d.jsonl", "--rollout.batch_size", "3",
        "--rollout.micro_batch_size", "5", "--rollout.n_samples_per_prompt", "4", "--vllm.num_engines", "1",
        "--data.max_len", "40", "--rollout.max_new_tokens", "12", "--algo.kl.init_coef", "0",
    ]
    if classmate:
        argv += ["--classmate.model_name_or_path", world.classmate, "--classmate.max_new_tokens", "4"]
    return parse_args(argv + list(extra))


def _sample(tok, prompt: str, response: str, reward: float, valid: bool = True, truncated: bool = False,
            cut_to: int | None = None):
    """A rollout sample; ``cut_to``: its prompt ids cut from the front to that many, as upstream's executor does to a
    prompt longer than its room (the sample keeps the full prompt text)."""
    messages = [{"role": "user", "content": prompt}]
    prompt_text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
    if cut_to is not None:
        prompt_ids = prompt_ids[-cut_to:]
    response_ids = tok(response, add_special_tokens=False)["input_ids"] + ([] if truncated else [tok.eos_token_id])
    seq = torch.tensor(prompt_ids + response_ids)
    action_mask = torch.zeros(len(seq) - 1, dtype=torch.bool)
    action_mask[len(prompt_ids) - 1 :] = True
    label = json.dumps({"data_source": "arithmetic", "ground_truth": "3", "messages": messages})
    # vLLM's log-probs of the sampled tokens differ a little from the trainer's (for the IS-correction tests)
    rollout = -0.05 * ((seq[1:] % 5) + 1).float() + 0.03 * torch.cos(torch.arange(len(seq) - 1).float())
    return ClassmateExperience(
        sequences=seq.unsqueeze(0), attention_mask=torch.ones(1, len(seq), dtype=torch.long),
        action_mask=action_mask.unsqueeze(0), rewards=torch.tensor([reward]), scores=torch.tensor([reward]),
        prompts=[prompt_text], labels=[label], rollout_log_probs=rollout.unsqueeze(0),
        response_length=torch.tensor([len(response_ids)]), total_length=torch.tensor([len(seq)]),
        truncated=torch.tensor([truncated]),
        info={"reward": torch.tensor([reward]), "main_valid": torch.tensor([float(valid)])},
    )


class FakeEngine:
    """Answers with the last number of the CoT it was shown (a classmate that can only read), records calls."""

    def __init__(self, tok, log):
        self.tok, self.log, self.seeds, self.prompts = tok, log, [], []
        self.generate_responses = SimpleNamespace(remote=self._generate)
        self.wake_up = SimpleNamespace(remote=lambda **kw: log.append("wake_up"))
        self.sleep = SimpleNamespace(remote=lambda **kw: log.append("sleep"))

    def _generate(self, prompt, label, sampling_params, max_length, hf_tokenizer, num_samples):
        self.log.append("generate")
        self.seeds.append(sampling_params.seed)
        ids = prompt["input_ids"]
        self.prompts.append(self.tok.decode(ids))
        cot = self.tok.decode(ids[prompt["cot_offset"] : prompt["cot_offset"] + prompt["cot_len"]]).split()
        numbers = [w for w in cot if w.isdigit()]
        answer = self.tok(f"answer {numbers[-1] if numbers else '0'}", add_special_tokens=False)["input_ids"]
        lp = None
        if sampling_params.prompt_logprobs is not None:
            lp = [-0.1 * (j + 1) for j in range(prompt["cot_len"])]
        return [{"output_token_ids": answer, "finish_reason": "stop", "cot_logprobs": lp, "finished_at": time.time()}]


def actor_log_probs(sequences: torch.Tensor) -> torch.Tensor:
    return -0.05 * ((sequences[:, 1:] % 5) + 1).float()


def ref_log_probs(sequences: torch.Tensor) -> torch.Tensor:
    return -0.08 * ((sequences[:, 1:] % 3) + 1).float()


class FakeModelGroup:
    """A model actor group (RayActorGroup) whose forward returns ``fn(sequences)`` per micro-batch, on one rank."""

    def __init__(self, fn, log, name):
        self.fn, self.log, self.name = fn, log, name

    def async_run_method_batch(self, method_name, **kwargs):
        assert method_name == "forward"
        self.log.append(f"{self.name} forward")
        return [[self.fn(seq) * mask for seq, mask in zip(kwargs["sequences"], kwargs["action_mask"])]]

    def async_run_method(self, method_name, **kwargs):
        return [None]


@pytest.fixture()
def fake_ray(monkeypatch):
    log = []

    def get(x):
        log.append("get")
        return x

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "put", lambda x: x)
    return log


def _maker(args, tok, log, colocated=False, classmate=True, main_tok=None):
    engine = FakeEngine(tok, log)
    stage = ClassmateStage(args, main_tok or tok, [[engine]], [tok]) if classmate else None
    ref = FakeModelGroup(ref_log_probs, log, "ref") if args.algo.kl.init_coef > 0 else None
    maker = ClassmateExperienceMaker(
        FakeModelGroup(actor_log_probs, log, "actor"), None, None, ref, FixedKLController(args.algo.kl.init_coef),
        SimpleNamespace(args=args), main_tok or tok, classmate_stage=stage,
        classmate_engines=[engine] if classmate else [], colocated=colocated,
    )
    return maker, engine


def _upstream(args, tok, samples):
    """Upstream's own maker on a copy of the same samples (no classmate): its advantages are the reference."""
    log = []
    ref = FakeModelGroup(ref_log_probs, log, "ref") if args.algo.kl.init_coef > 0 else None
    maker = RemoteExperienceMaker(FakeModelGroup(actor_log_probs, log, "actor"), None, None, ref,
                                  FixedKLController(args.algo.kl.init_coef), SimpleNamespace(args=args), tok)
    return maker.make_experience_batch(copy.deepcopy(samples))


# Three prompt groups of four. The classmate reads the last CoT number: "3" is right.
GROUPS = [
    [("<think> 1 + 2 = 3 </think> 3", 1.0), ("<think> 2 + 1 = 3 </think> 2", 0.0),
     ("<think> 0 + 3 </think> 3", 1.0), ("<think> 2 </think> 4", 0.0)],
    [("<think> 3 </think> 3", 1.0), ("<think> 1 + 1 + 1 = 3 + 0 = 3 </think> 3", 1.0),
     ("<think> 4 </think> 4", 0.0), ("<think> 1 + 2 = 3 </think> 3", 1.0)],
    [("<think> 5 - 2 = 3 </think> 1", 0.0), ("<think> 2 </think> 2", 0.0),
     ("<think> 0 </think> 0", 0.0), ("<think> 3 + 0 = 3 </think> 3", 1.0)],
]
RESPONSES = [r for group in GROUPS for r in group]
MAIN = torch.tensor([m for _, m in RESPONSES], dtype=torch.float64)
CLASSMATE = torch.tensor([1.0 if r.split("</think>")[0].split()[-1] == "3" else 0.0 for r, _ in RESPONSES],
                         dtype=torch.float64)


def _rollout(tok, valid=None, truncated=()):
    return [_sample(tok, "1 + 2 = ?", r, m, valid=True if valid is None else valid[i], truncated=i in truncated)
            for i, (r, m) in enumerate(RESPONSES)]


def _per_row(experiences, name):
    """{rollout index: row tensor over the action mask}."""
    return {i: getattr(e, name)[r][e.action_mask[r].bool()] for e in experiences for r, i in enumerate(e.index)}


def _by_group(x: torch.Tensor) -> torch.Tensor:
    return x.view(3, 4)


def _dr_grpo(x: torch.Tensor) -> torch.Tensor:
    g = _by_group(x)
    return (g - g.mean(1, keepdim=True)).flatten()


def _group_norm(x: torch.Tensor, eps=1e-9) -> torch.Tensor:
    g = _by_group(x)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + eps)).flatten()


# ---------------------------------------------------------------------------------------------------------------
# The main stream equals upstream's advantages for every upstream reward / advantage option
# ---------------------------------------------------------------------------------------------------------------

SHAPING = {
    "none": [],
    "overlong": ["--reward.overlong_buffer_len", "6", "--reward.overlong_penalty_factor", "0.5"],
    "stop_properly": ["--reward.stop_properly_penalty_coef", "0.25"],
    "clip": ["--reward.clip_range", "-0.3", "0.4"],
    "kl_in_reward": ["--algo.kl.init_coef", "0.2", "--algo.kl.estimator", "k1"],
    "all": ["--reward.overlong_buffer_len", "6", "--reward.stop_properly_penalty_coef", "-0.5",
            "--reward.clip_range", "-0.6", "0.9", "--algo.kl.init_coef", "0.1", "--algo.kl.estimator", "k3"],
}
BASELINES = {
    "group_norm": ["--algo.advantage.estimator", "group_norm"],
    "dr_grpo": ["--algo.advantage.estimator", "dr_grpo"],
    "rloo": ["--algo.advantage.estimator", "rloo"],
    "reinforce_baseline": ["--algo.advantage.estimator", "reinforce_baseline"],
    "reinforce_baseline_no_std": ["--algo.advantage.estimator", "reinforce_baseline", "--algo.advantage.no_std_norm"],
}


@pytest.mark.parametrize("shaping", list(SHAPING))
@pytest.mark.parametrize("baseline", list(BASELINES))
def test_main_stream_equals_upstreams_own_advantages(world, fake_ray, shaping, baseline):
    extra = BASELINES[baseline] + SHAPING[shaping]
    args = _args(world, "--classmate.estimator", "separated", *extra)
    samples = _rollout(world.tok, truncated={5, 9})
    maker, _ = _maker(args, world.tok, fake_ray)
    ours = maker.make_experience_batch(samples)
    reference = _upstream(_args(world, *extra, classmate=False), world.tok, samples)
    main, upstream = _per_row(ours, "advantages"), _per_row(reference, "advantages")
    assert sorted(main) == list(range(12))
    for i in range(12):
        torch.testing.assert_close(main[i].double(), upstream[i].double(), rtol=0, atol=2e-6, msg=f"row {i}")
    # the classmate stream is there too, on the CoT only
    cm = _per_row(ours, "classmate_advantages")
    assert any(bool((cm[i] != 0).any()) for i in range(12))


def test_single_advantage_estimators_equal_upstream_without_a_classmate_signal(world, fake_ray):
    # gdpo_wo_bn with w_c = 0 and grpo with a classmate reward of 0 (condition no_classmate) are plain GRPO
    extra = ["--algo.advantage.estimator", "group_norm", *SHAPING["all"]]
    reference = _per_row(_upstream(_args(world, *extra, classmate=False), world.tok, _rollout(world.tok)),
                         "advantages")
    for flags in (["--classmate.estimator", "gdpo_wo_bn", "--classmate.gdpo_weights", "1", "0"],
                  ["--classmate.estimator", "grpo", "--classmate.condition", "no_classmate"]):
        maker, _ = _maker(_args(world, *flags, *extra), world.tok, fake_ray)
        ours = _per_row(maker.make_experience_batch(_rollout(world.tok)), "advantages")
        for i in range(12):
            torch.testing.assert_close(ours[i].double(), reference[i].double(), rtol=0, atol=2e-6)


# ---------------------------------------------------------------------------------------------------------------
# Each option changes the trained quantity the way upstream's formula says (hand-computed values)
# ---------------------------------------------------------------------------------------------------------------


def _scalars(experiences, name="advantages"):
    """The per-row constant of a token advantage tensor (asserting it is constant on the response)."""
    out = torch.zeros(12, dtype=torch.float64)
    for i, row in _per_row(experiences, name).items():
        assert torch.allclose(row, row[0].expand_as(row), atol=1e-6), f"row {i} is not constant: {row}"
        out[i] = row[0]
    return out


def _run(world, fake_ray, *extra, **kw):
    args = _args(world, "--classmate.estimator", "separated", *extra)
    maker, engine = _maker(args, world.tok, fake_ray)
    return maker.make_experience_batch(_rollout(world.tok, **kw)), engine


def test_dr_grpo_vs_group_norm_vs_rloo_baselines(world, fake_ray):
    dr, _ = _run(world, fake_ray, "--algo.advantage.estimator", "dr_grpo")
    gn, _ = _run(world, fake_ray, "--algo.advantage.estimator", "group_norm")
    rloo, _ = _run(world, fake_ray, "--algo.advantage.estimator", "rloo")
    torch.testing.assert_close(_scalars(dr), _dr_grpo(MAIN), rtol=0, atol=1e-6)
    torch.testing.assert_close(_scalars(gn), _group_norm(MAIN), rtol=0, atol=1e-6)
    loo = _by_group(MAIN)
    torch.testing.assert_close(_scalars(rloo), (loo - (loo.sum(1, keepdim=True) - loo) / 3).flatten(), rtol=0,
                               atol=1e-6)
    # the classmate stream gets the same baseline, on its CoT tokens
    for out, expected in ((dr, _dr_grpo(CLASSMATE)), (gn, _group_norm(CLASSMATE))):
        for exp in out:
            for r, i in enumerate(exp.index):
                on_cot = exp.classmate_advantages[r][exp.cot_mask[r]].double()
                torch.testing.assert_close(on_cot, expected[i].expand_as(on_cot), rtol=0, atol=1e-6)
    assert not torch.allclose(_scalars(dr), _scalars(gn))  # the choice matters


def test_overlong_penalty_reaches_the_main_advantage(world, fake_ray):
    # max_new_tokens 12, buffer 6: a response longer than 6 tokens loses (len - 6) / 6 * 0.5 (at most 0.5)
    base, _ = _run(world, fake_ray, "--algo.advantage.estimator", "dr_grpo")
    pen, _ = _run(world, fake_ray, "--algo.advantage.estimator", "dr_grpo", *SHAPING["overlong"])
    lengths = torch.tensor([len(world.tok(r, add_special_tokens=False)["input_ids"]) + 1 for r, _ in RESPONSES])
    penalty = -torch.clamp(lengths - 6, min=0, max=6).double() / 6 * 0.5
    assert (penalty < 0).sum() >= 3
    torch.testing.assert_close(_scalars(pen), _dr_grpo(MAIN + penalty), rtol=0, atol=1e-6)
    assert not torch.allclose(_scalars(pen), _scalars(base))


def test_stop_properly_penalty_scales_truncated_rewards(world, fake_ray):
    out, _ = _run(world, fake_ray, "--algo.advantage.estimator", "dr_grpo", *SHAPING["stop_properly"],
                  truncated={1, 5, 9})
    shaped = MAIN.clone()
    shaped[[1, 5, 9]] *= 0.25
    torch.testing.assert_close(_scalars(out), _dr_grpo(shaped), rtol=0, atol=1e-6)


def test_reward_clip_clamps_the_post_baseline_main_scalar(world, fake_ray):
    out, _ = _run(world, fake_ray, "--algo.advantage.estimator", "dr_grpo", *SHAPING["clip"])
    expected = _dr_grpo(MAIN).clamp(-0.3, 0.4)
    assert (expected != _dr_grpo(MAIN)).any()
    torch.testing.assert_close(_scalars(out), expected, rtol=0, atol=1e-6)


def test_kl_in_reward_adds_upstreams_per_token_kl_return_to_the_main_stream(world, fake_ray):
    beta = 0.2
    out, _ = _run(world, fake_ray, "--algo.advantage.estimator", "dr_grpo", *SHAPING["kl_in_reward"])
    a_main = _dr_grpo(MAIN)
    for exp in out:
        for r, i in enumerate(exp.index):
            mask = exp.action_mask[r].bool()
            seq = exp.sequences[r : r + 1]
            kl = (actor_log_probs(seq) - ref_log_probs(seq))[0][mask].double()  # k1
            kl_return = -beta * kl.flip(0).cumsum(0).flip(0)  # Σ_{s≥t} -β KL_s
            torch.testing.assert_close(exp.advantages[r][mask].double(), a_main[i] + kl_return, rtol=0, atol=1e-6)
            cm = exp.classmate_advantages[r][mask]
            assert torch.all(cm[~exp.cot_mask[r][mask]] == 0)  # the KL return is the main stream's only


def test_reinforce_baseline_whitens_each_stream(world, fake_ray):
    out, _ = _run(world, fake_ray, "--algo.advantage.estimator", "reinforce_baseline")
    main = torch.cat([e.advantages[e.action_mask.bool()] for e in out]).double()
    assert main.mean().abs() < 1e-6 and (main.var(unbiased=False) - 1).abs() < 1e-5
    cm = torch.cat([e.classmate_advantages[e.cot_mask] for e in out]).double()
    assert cm.mean().abs() < 1e-6 and (cm.var(unbiased=False) - 1).abs() < 1e-5
    centred, _ = _run(world, fake_ray, "--algo.advantage.estimator", "reinforce_baseline",
                      "--algo.advantage.no_std_norm")
    main = torch.cat([e.advantages[e.action_mask.bool()] for e in centred]).double()
    assert main.mean().abs() < 1e-6 and (main.var(unbiased=False) - 1).abs() > 0.05


def _adapter_loss(args, experience):
    """The loss the actor would compute on ``experience`` (our adapter around the loss built from ``args``)."""
    built = build_classmate_loss(args)
    assert built is not None
    loss_fn, fields, zero = built
    trainer = SimpleNamespace(current_experience=experience)
    adapter = ClassmateLossAdapter(loss_fn, fields, trainer, zero)
    log_probs = experience.action_log_probs + 0.1 * torch.sin(torch.arange(experience.action_log_probs.numel())
                                                               .view_as(experience.action_log_probs).float())
    return adapter(log_probs, experience.action_log_probs, experience.advantages, action_mask=experience.action_mask,
                   rollout_log_probs=experience.rollout_log_probs)


@pytest.mark.parametrize("option", [["--algo.advantage.is_correction_level", "token"],
                                    ["--algo.advantage.is_correction_level", "seq"],
                                    ["--algo.advantage.is_correction_level", "token",
                                     "--algo.advantage.is_correction_mode", "clip"],
                                    ["--actor.policy_loss_type", "gspo"]])
def test_is_correction_and_gspo_reach_the_classmate_loss_as_upstream_defines_them(world, fake_ray, option):
    from openrlhf.models.loss import PolicyLoss

    threshold = ["--algo.advantage.is_correction_threshold", "0.97", "1.03"]
    args = _args(world, "--classmate.estimator", "separated", *option, *threshold)
    plain_args = _args(world, "--classmate.estimator", "separated")
    maker, _ = _maker(args, world.tok, fake_ray)
    exp = maker.make_experience_batch(_rollout(world.tok))[0]
    loss, _, _, vllm_kl, _ = _adapter_loss(args, exp)
    plain, *_ = _adapter_loss(plain_args, exp)
    assert not torch.allclose(loss, plain)  # the option is live
    # and it is exactly upstream's: two PolicyLoss calls with the same options and the two clip ranges
    a = args.algo.advantage
    options = dict(policy_loss_type=args.actor.policy_loss_type, is_correction_level=a.is_correction_level,
                   is_correction_mode=a.is_correction_mode, is_correction_threshold=a.is_correction_threshold,
                   token_level_loss=True)
    lp = exp.action_log_probs + 0.1 * torch.sin(torch.arange(exp.action_log_probs.numel())
                                                .view_as(exp.action_log_probs).float())
    call = dict(action_mask=exp.action_mask, rollout_log_probs=exp.rollout_log_probs)
    main = PolicyLoss(0.2, 0.2, **options)(lp, exp.action_log_probs, exp.advantages, **call)
    cm = PolicyLoss(0.4, 0.4, **options)(lp, exp.action_log_probs, exp.classmate_advantages, **call)
    torch.testing.assert_close(loss, main[0] + cm[0], rtol=0, atol=1e-6)
    assert (vllm_kl is None) == (main[3] is None)


def test_think_opened_by_the_template_starts_the_cot_at_the_response(world, fake_ray):
    args = _args(world, "--classmate.estimator", "separated", policy=world.thinking)
    responses = [("1 + 2 = 3 </think> 3", 1.0), ("2 </think> 2", 0.0), ("3 </think> 4", 0.0), ("1 + 1 </think> 2", 0.0)]
    samples = [_sample(world.think_tok, "1 + 2 = ?", r, m) for r, m in responses]
    maker, engine = _maker(args, world.tok, fake_ray, main_tok=world.think_tok)
    args.rollout.batch_size = 1
    experiences = maker.make_experience_batch(samples)
    for exp in experiences:
        for row, index in enumerate(exp.index):
            response = responses[index][0].split()
            m = exp.cot_mask[row][exp.action_mask[row].bool()]
            cot_len = response.index("</think>")
            assert m[:cot_len].all() and not m[cot_len:].any()  # the CoT starts at the first response token
            answer = ~exp.cot_mask[row] & exp.action_mask[row].bool()
            assert torch.all(exp.classmate_advantages[row][answer] == 0)
    # the classmate read the CoT only, never the answer after </think>
    for prompt, (response, _) in zip(engine.prompts, responses):
        assert prompt.split("<think>")[-1].split("</think>")[0].split() == response.split("</think>")[0].split()
    # classmate rewards: last CoT number "3" only in row 0 and row 2
    assert [float(x) for e in experiences for x in e.info["classmate/valid"]] == [1.0] * 4


# ---------------------------------------------------------------------------------------------------------------
# Main validity, placement, logging, labels
# ---------------------------------------------------------------------------------------------------------------


def test_invalid_main_scores_leave_the_statistics_and_get_zero_main_advantage(world, fake_ray):
    valid = [True] * 12
    valid[1] = valid[6] = False  # e.g. the judge answered 503 for these two
    out, _ = _run(world, fake_ray, "--algo.advantage.estimator", "dr_grpo", valid=valid)
    scalars = _scalars(out)
    ok = torch.tensor(valid)
    for g in range(3):
        members = [i for i in range(4 * g, 4 * g + 4) if valid[i]]
        mean = MAIN[members].mean()
        for i in range(4 * g, 4 * g + 4):
            assert scalars[i].item() == pytest.approx((MAIN[i] - mean).item() if valid[i] else 0.0, abs=1e-6)
    # the logged reward is the mean over valid main scores
    logged = torch.cat([e.info["reward"] for e in out])
    assert logged.mean().item() == pytest.approx(MAIN[ok].mean().item(), abs=1e-6)
    assert torch.cat([e.info["main_valid"] for e in out]).sum().item() == 10


def test_plain_runs_mask_invalid_main_scores_too_and_equal_upstream_otherwise(world, fake_ray):
    args = _args(world, "--algo.advantage.estimator", "group_norm", classmate=False)
    maker, _ = _maker(args, world.tok, fake_ray, classmate=False)
    all_valid = _per_row(maker.make_experience_batch(_rollout(world.tok)), "advantages")
    reference = _per_row(_upstream(args, world.tok, _rollout(world.tok)), "advantages")
    for i in range(12):
        assert torch.equal(all_valid[i], reference[i])  # upstream's own tensors, untouched
    valid = [i != 4 for i in range(12)]
    masked = _per_row(maker.make_experience_batch(_rollout(world.tok, valid=valid)), "advantages")
    assert torch.all(masked[4] == 0)
    rest = MAIN[[5, 6, 7]]
    expected = (MAIN[5] - rest.mean()) / (rest.std() + 1e-9)
    assert masked[5][0].item() == pytest.approx(expected.item(), abs=1e-5)
    with pytest.raises(AllScoresInvalidError, match="all 12 main scores"):
        maker.make_experience_batch(_rollout(world.tok, valid=[False] * 12))


def _invalid_rollout(tok, invalid):
    """The rollout with the rows in ``invalid`` failed: main_valid 0 and the placeholder reward 0 that the reward
    function reports for them."""
    return [_sample(tok, "1 + 2 = ?", r, 0.0 if i in invalid else m, valid=i not in invalid)
            for i, (r, m) in enumerate(RESPONSES)]


def _whitened(rows: dict, valid: list[bool], centre_only: bool = False) -> dict:
    """Upstream's batch whitening by hand, over the tokens of the valid rows only (biased variance)."""
    tokens = torch.cat([rows[i].double() for i in rows if valid[i]])
    mean, std = tokens.mean(), 1.0 if centre_only else tokens.var(unbiased=False).clamp(min=1e-8).sqrt()
    return {i: (rows[i].double() - mean) / std if valid[i] else torch.zeros_like(rows[i].double()) for i in rows}


@pytest.mark.parametrize("estimator", ["reinforce_baseline", "reinforce", "flash_reinforce"])
def test_plain_runs_leave_invalid_scores_out_of_upstreams_batch_statistics(world, fake_ray, estimator):
    # whitening (reinforce_baseline, reinforce) and the batch mean (flash_reinforce) over the valid
    # rows only; an invalid row's advantage is exactly 0 on every token
    args = _args(world, "--algo.advantage.estimator", estimator, classmate=False)
    maker, _ = _maker(args, world.tok, fake_ray, classmate=False)
    invalid = {1, 6}
    valid = [i not in invalid for i in range(12)]
    out = _per_row(maker.make_experience_batch(_invalid_rollout(world.tok, invalid)), "advantages")
    lengths = {i: len(out[i]) for i in range(12)}
    ok = torch.tensor(valid)
    if estimator == "reinforce_baseline":  # group mean over valid rows, then whitened over valid tokens
        centred = torch.zeros(12, dtype=torch.float64)
        for g in range(3):
            members = [i for i in range(4 * g, 4 * g + 4) if valid[i]]
            centred[members] = MAIN[members] - MAIN[members].mean()
        expected = _whitened({i: centred[i].expand(lengths[i]) for i in range(12)}, valid)
    elif estimator == "reinforce":  # no baseline; the return R on every token, whitened over valid tokens
        expected = _whitened({i: MAIN[i].expand(lengths[i]) for i in range(12)}, valid)
    else:  # flash_reinforce: R - the batch mean of the valid rewards, no whitening
        expected = {i: (MAIN[i] - MAIN[ok].mean()).expand(lengths[i]) * float(valid[i]) for i in range(12)}
    for i in range(12):
        torch.testing.assert_close(out[i].double(), expected[i], rtol=0, atol=1e-5, msg=f"row {i}")
    assert out[1].eq(0).all() and out[6].eq(0).all()
    # with every score valid, upstream's own tensors are kept untouched
    all_valid = _per_row(maker.make_experience_batch(_rollout(world.tok)), "advantages")
    reference = _per_row(_upstream(args, world.tok, _rollout(world.tok)), "advantages")
    assert all(torch.equal(all_valid[i], reference[i]) for i in range(12))


def test_gae_stops_at_an_invalid_main_score_its_critic_would_learn(world, fake_ray):
    # the preflight refuses gae with the scorer-registry reward; a user's reward function can still mark scores
    from openrlhf_classmate.errors import TrainingStopped

    args = _args(world, "--algo.advantage.estimator", "gae", "--reward.remote_url", "http://127.0.0.1:9/score",
                 classmate=False)
    critic = FakeModelGroup(lambda seq: 0.1 * (seq[:, 1:] % 4).float(), fake_ray, "critic")
    maker = ClassmateExperienceMaker(FakeModelGroup(actor_log_probs, fake_ray, "actor"), critic, None, None,
                                     FixedKLController(0.0), SimpleNamespace(args=args), world.tok)
    assert len(maker.make_experience_batch(_rollout(world.tok))) > 0  # all valid: upstream's gae as is
    with pytest.raises(TrainingStopped, match="reached --algo.advantage.estimator gae, whose critic would learn"):
        maker.make_experience_batch(_invalid_rollout(world.tok, {3}))


@pytest.mark.parametrize("estimator", ["grpo", "grpo_w_classmate", "gdpo"])
def test_whitened_classmate_runs_give_rows_with_an_invalid_main_score_zero(world, fake_ray, estimator):
    args = _args(world, "--classmate.estimator", estimator, "--algo.advantage.estimator", "reinforce_baseline")
    maker, _ = _maker(args, world.tok, fake_ray)
    out = maker.make_experience_batch(_invalid_rollout(world.tok, {1, 6}))
    rows = _per_row(out, "advantages")
    cot = _per_row(out, "cot_mask")
    for i in (1, 6):  # the classmate scored these rows (valid), the main reward did not
        if estimator == "gdpo":  # S = w_c A^c still trains the CoT; the answer tokens carry A^m: none
            assert rows[i][~cot[i]].eq(0).all()
        else:  # the single stream needs a valid main score
            assert rows[i].eq(0).all()
    trained = torch.cat([rows[i][cot[i] if i in (1, 6) else torch.ones_like(cot[i])] for i in range(12)]).double()
    trained = trained if estimator == "gdpo" else torch.cat([rows[i] for i in range(12) if i not in (1, 6)]).double()
    assert trained.mean().abs() < 1e-6 and (trained.var(unbiased=False) - 1).abs() < 1e-5  # whitened over them


def test_separated_advantages_live_on_the_cot_and_the_stage_overlaps_the_forwards(world, fake_ray):
    out, engine = _run(world, fake_ray, "--algo.advantage.estimator", "dr_grpo")
    # not colocated: requests go out before the actor forward and are gathered after it
    assert fake_ray.index("generate") < fake_ray.index("actor forward") < len(fake_ray) - 1
    assert "sleep" not in fake_ray and "wake_up" not in fake_ray
    assert engine.seeds == [None] * 12  # the engine's seed (vLLM samples seeded requests one by one)
    main_expected = _dr_grpo(MAIN)
    classmate_expected = _dr_grpo(CLASSMATE)
    for exp in out:
        assert isinstance(exp, ClassmateExperience)
        for row, index in enumerate(exp.index):
            v, m = exp.action_mask[row].bool(), exp.cot_mask[row]
            assert int(m.sum()) == len(RESPONSES[index][0].split("</think>")[0].split()) - 1  # tokens between tags
            assert torch.allclose(exp.advantages[row][v].double(), main_expected[index].expand(int(v.sum())))
            assert torch.all(exp.advantages[row][~v] == 0)
            torch.testing.assert_close(exp.classmate_advantages[row][m].double(),
                                       classmate_expected[index].expand(int(m.sum())), rtol=0, atol=1e-6)
            assert torch.all(exp.classmate_advantages[row][~m] == 0)  # classmate_partial: nothing outside the CoT
        assert exp.info["classmate/reward"].tolist() == [CLASSMATE[i].item() for i in exp.index]
        assert torch.all(exp.info["classmate/valid"] == 1)
        assert torch.all(exp.info["classmate/adv_abs_outside_cot"] == 0)
        assert torch.all(exp.info["classmate/stage_time"] >= exp.info["classmate/stage_overlap_time"])
        assert torch.all(exp.info["classmate/actor_ref_forward_time"] >= 0)  # logged for the step-time bench


def test_colocated_classmate_finishes_and_sleeps_before_the_forwards(world, fake_ray):
    args = _args(world, "--train.colocate_actor_ref", "--classmate.placement", "colocate")
    maker, _ = _maker(args, world.tok, fake_ray, colocated=True)
    experiences = maker.make_experience_batch(_rollout(world.tok))
    order = [e for e in fake_ray if e != "get"]
    assert order == ["wake_up"] + ["generate"] * 12 + ["sleep", "actor forward"]
    assert torch.all(torch.cat([e.info["classmate/stage_overlap_time"] for e in experiences]) == 0)
    # gdpo (default): one advantage tensor; CoT tokens carry the batch-normalised sum, other tokens A^m
    for exp in experiences:
        assert exp.classmate_advantages is None
        for row in range(len(exp.index)):
            answer = exp.action_mask[row].bool() & ~exp.cot_mask[row]
            assert len(set(exp.advantages[row][answer].tolist())) == 1


def test_skipped_classmate_inputs_are_masked_not_scored_zero_and_logged_over_valid_rows(world, fake_ray):
    # a tiny classmate context: the long CoT of row 5 (13 tokens) no longer fits and is skipped with a reason
    out, _ = _run(world, fake_ray, "--algo.advantage.estimator", "dr_grpo", "--classmate.max_context", "24")
    valid = {i: bool(e.info["classmate/valid"][r]) for e in out for r, i in enumerate(e.index)}
    assert [i for i, ok in valid.items() if not ok] == [5]
    assert out[0].info["classmate/skip_over_max_context"][0] == pytest.approx(1 / 12)
    cm = {i: row.max().item() if row.any() else 0.0 for i, row in _per_row(out, "classmate_advantages").items()}
    # group 1 without row 5: classmate rewards [1, 1, 1] of rows 4, 6, 7 minus their mean (1) -> 0; row 6 is 0 -> ...
    rest = CLASSMATE[[4, 6, 7]]
    for i in (4, 6, 7):
        row = _per_row(out, "classmate_advantages")[i]
        expected = (CLASSMATE[i] - rest.mean()).item()
        assert row[row != 0].tolist() == pytest.approx([expected] * int((row != 0).sum()), abs=1e-6)
    assert cm[5] == 0.0
    # classmate/reward is logged over valid rows only (the skipped row is not a 0)
    logged = torch.cat([e.info["classmate/reward"] for e in out])
    ok = torch.tensor([valid[i] for i in range(12)])
    order = torch.cat([torch.tensor(e.index) for e in out])
    assert logged.mean().item() == pytest.approx(CLASSMATE[order][ok[order]].mean().item(), abs=1e-6)


def test_vanilla_classmate_carries_the_classmate_log_probs_on_the_cot(world, fake_ray):
    args = _args(world, "--classmate.estimator", "separated", "--classmate.loss", "vanilla_classmate",
                 "--classmate.prompt_mode", "splice", "--classmate.model_name_or_path", world.policy)
    maker, _ = _maker(args, world.tok, fake_ray)
    experiences = maker.make_experience_batch(_rollout(world.tok))
    for exp in experiences:
        for row in range(len(exp.index)):
            lp = exp.classmate_log_probs[row]
            m = exp.cot_mask[row]
            assert lp[m].tolist() == pytest.approx([-0.1 * (j + 1) for j in range(int(m.sum()))])
            assert torch.all(torch.isinf(lp[~m]))
        assert torch.isfinite(exp.info["classmate/cot_logprob"]).all()


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


def test_bad_labels_stop_the_run_with_the_registrys_message(world, fake_ray):
    from openrlhf_classmate.scoring import LabelError

    maker, _ = _maker(_args(world), world.tok, fake_ray)
    samples = _rollout(world.tok)
    samples[2].labels = [json.dumps({"data_source": "arithmetic", "messages": [{"role": "user", "content": "x"}]})]
    with pytest.raises(LabelError, match="data_source 'arithmetic', field 'ground_truth'"):
        maker.make_experience_batch(samples)


REWARD_FILE = '''
import json, os

def reward_func(queries, prompts, labels, **kwargs):
    # a user's own reward function: 1 when the text after the last </think> says "answer 3"
    with open(os.environ["CLASSMATE_TEST_QUERIES"], "a") as f:
        f.write(json.dumps({"query": queries[0], "prompt": prompts[0]}) + "\\n")
    answer = queries[0].rsplit("</think>", 1)[-1].split()
    return {"rewards": float(answer[-2:] == ["answer", "3"]), "scores": 0.0, "extra_logs": {}}
'''


def test_classmate_answers_go_through_the_users_reward_function_by_default(world, fake_ray, tmp_path, monkeypatch):
    from openrlhf_classmate.integration.classmate.classmate_scoring import RewardPathScorer, build_classmate_scorer

    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_FILE)
    monkeypatch.setenv("CLASSMATE_TEST_QUERIES", str(tmp_path / "queries.jsonl"))
    args = _args(world, "--classmate.estimator", "separated", "--reward.remote_url", str(path))
    scorer = build_classmate_scorer(args)
    assert isinstance(scorer, RewardPathScorer)
    engine = FakeEngine(world.tok, fake_ray)
    maker = ClassmateExperienceMaker(
        FakeModelGroup(actor_log_probs, fake_ray, "actor"), None, None, None, FixedKLController(0.0),
        SimpleNamespace(args=args), world.tok, classmate_engines=[engine],
        classmate_stage=ClassmateStage(args, world.tok, [[engine]], [world.tok], scorer=scorer),
    )
    out = maker.make_experience_batch(_rollout(world.tok))
    rewards = {i: e.info["classmate/reward"][r].item() for e in out for r, i in enumerate(e.index)}
    assert [rewards[i] for i in range(12)] == CLASSMATE.tolist()
    seen = [json.loads(line) for line in (tmp_path / "queries.jsonl").read_text().splitlines()]
    assert len(seen) == 12
    prompt = _rollout(world.tok)[0].prompts[0]
    for record in seen:  # the main prompt, the CoT the classmate read, then the classmate's answer
        assert record["prompt"] == prompt and record["query"].startswith(prompt + "<think>")
        assert record["query"].endswith("</think>\n\n" + "answer " + record["query"].split()[-1])
    # an explicit --classmate.scorer overrides the reward path
    assert not isinstance(build_classmate_scorer(_args(world, "--reward.remote_url", str(path),
                                                       "--classmate.scorer", "exact_match")), RewardPathScorer)


def test_reward_hooks_see_the_whole_batch_before_every_estimator(world, fake_ray):
    """A group-level reward (DARLING, VR-CLI) replaces the main rewards before upstream's shaping and the
    estimators; a sample it cannot score is invalid, and its metrics are logged."""
    calls = []

    def hook(maker, samples):
        calls.append(len(samples))
        for i, s in enumerate(samples):
            s.rewards = torch.tensor([float(i % 4)])  # rewards 0, 1, 2, 3 in every group
            s.info["reward"] = s.rewards.clone()
        samples[3].info["main_valid"] = torch.tensor([0.0])
        return {"hook/score_mean": 1.5}

    args = _args(world, "--classmate.estimator", "separated", "--algo.advantage.estimator", "dr_grpo")
    maker, _ = _maker(args, world.tok, fake_ray)
    maker.reward_hooks = [hook]
    out = maker.make_experience_batch(_rollout(world.tok))
    assert calls == [12]
    scalars = _scalars(out)
    assert scalars[:4].tolist() == pytest.approx([-1.0, 0.0, 1.0, 0.0])  # row 3 invalid: mean of 0, 1, 2
    assert scalars[4:8].tolist() == pytest.approx([-1.5, -0.5, 0.5, 1.5])
    assert all(torch.all(e.info["hook/score_mean"] == 1.5) for e in out)


def test_prompts_cut_by_upstream_and_classmate_calls_over_the_context_are_said_once_with_counts(world, fake_ray,
                                                                                                  capfd):
    # room for a prompt: --data.max_len 40 - --rollout.max_new_tokens 12 = 28 tokens; the first group's prompt is
    # longer and arrives cut to 28 (as upstream's executor leaves it); a 24-token classmate context skips row 5
    args = _args(world, "--classmate.estimator", "separated", "--classmate.max_context", "24")
    maker, _ = _maker(args, world.tok, fake_ray)
    long_prompt = " ".join(["1 +"] * 15) + " 2 = ?"

    def rollout():
        return [_sample(world.tok, long_prompt if i < 4 else "1 + 2 = ?", r, m, cut_to=28 if i < 4 else None)
                for i, (r, m) in enumerate(RESPONSES)]

    first = maker.make_experience_batch(rollout())
    second = maker.make_experience_batch(rollout())
    for out in (first, second):
        assert out[0].info["prompt_truncated"][0].item() == pytest.approx(4 / 12)
    said = capfd.readouterr()
    text = said.out + said.err
    assert text.count("4 of 12 rollout samples of this step had their prompt cut from the front to 28 tokens") == 1
    assert text.count("classmate: 5 of 12 requests of this step were skipped") == 1  # the long prompts + row 5
    assert "--classmate.max_context 24" in text
    # a prompt that fits exactly is not counted
    maker, _ = _maker(args, world.tok, fake_ray)
    exact = maker.truncated_prompts([_sample(world.tok, "1 + 2 = ?", "<think> 3 </think> 3", 1.0, cut_to=28)])
    assert exact == {"prompt_truncated": 0.0}


def test_bench_alternation_runs_the_classmate_on_odd_batches_and_plain_grpo_on_even_ones(world, fake_ray, monkeypatch):
    # bench/step_time.py --interleave: GDPO and GRPO steps timed in one process; an even batch must be exactly
    # upstream's GRPO (no classmate call, upstream's advantages), an odd one the full classmate step
    monkeypatch.setenv("OPENRLHF_CLASSMATE_BENCH_ALTERNATE", "1")
    extra = ["--algo.advantage.estimator", "group_norm"]
    maker, _ = _maker(_args(world, *extra), world.tok, fake_ray)
    reference = _per_row(_upstream(_args(world, *extra, classmate=False), world.tok, _rollout(world.tok)),
                         "advantages")
    for batch in (1, 2, 3):
        fake_ray.clear()
        experiences = maker.make_experience_batch(_rollout(world.tok))
        classmate_step = batch % 2 == 1
        assert ("generate" in fake_ray) == classmate_step
        assert all(float(e.info["bench/classmate_step"][0]) == float(classmate_step) for e in experiences)
        assert all(("classmate/stage_time" in e.info) == classmate_step for e in experiences)
        if not classmate_step:
            ours = _per_row(experiences, "advantages")
            for i in range(12):
                torch.testing.assert_close(ours[i].double(), reference[i].double(), rtol=0, atol=2e-6)
    monkeypatch.setenv("OPENRLHF_CLASSMATE_BENCH_ALTERNATE", "1")
    with pytest.raises(ValueError, match="single-advantage estimator"):
        _maker(_args(world, "--classmate.estimator", "separated"), world.tok, fake_ray)


@pytest.mark.parametrize("classmate", [False, True])
def test_each_rollout_batch_measures_the_engines_log_probs_against_the_actors(world, fake_ray, classmate):
    """The mismatch statistics (``integration/rollout/mismatch.py``) of a rollout batch that upstream splits into micro-batches of 5, 5 and 2
    samples of different widths, against the same numbers worked out sample by sample."""
    samples = _rollout(world.tok)
    d = torch.cat([(actor_log_probs(s.sequences) - s.rollout_log_probs)[s.action_mask.bool()].double()
                   for s in samples])
    grpo = ["--algo.advantage.estimator", "group_norm"]
    maker, _ = _maker(_args(world, *grpo, classmate=classmate), world.tok, [], classmate=classmate)
    maker.make_experience_batch(samples)
    m = maker.last_mismatch
    assert m.tokens == d.numel() == sum(int(s.action_mask.sum()) for s in samples)
    assert m.abs_diff_mean == pytest.approx(float(d.abs().mean()), abs=1e-7)
    assert m.abs_diff_max == pytest.approx(float(d.abs().max()), abs=1e-7)
    assert m.kl_k3 == pytest.approx(float((d.exp() - 1 - d).mean()), abs=1e-7)
    assert 0.01 < m.abs_diff_mean < 0.03  # the cosine term of the fixture's rollout log-probs
    off, _ = _maker(_args(world, *grpo, "--engine.no_mismatch_metrics", classmate=classmate), world.tok, [],
                    classmate=classmate)
    off.make_experience_batch(_rollout(world.tok))
    assert off.last_mismatch is None


def test_requests_sent_per_prompt_group_give_the_batch_dispatchs_result(world, fake_ray):
    """--classmate.dispatch group: the generator sends each group's requests as the group is generated and hands the
    batch over with them merged (``merge_pending``); the maker gathers them after the forwards. Same prompts, same
    answers, same rewards and advantages as the requests sent for the whole batch at once."""
    from openrlhf_classmate.integration.classmate.classmate_stage import ClassmateRollout, merge_pending

    args = _args(world, "--algo.advantage.estimator", "dr_grpo", "--classmate.estimator", "separated")
    batch_maker, batch_engine = _maker(args, world.tok, [])
    batch = batch_maker.make_experience_batch(_rollout(world.tok))

    maker, engine = _maker(args, world.tok, fake_ray)
    samples = _rollout(world.tok)
    parts = [maker.stage.dispatch(samples[g : g + 4], first_index=g) for g in range(0, 12, 4)]
    sent = len(engine.prompts)
    assert sent == 12 and fake_ray.count("actor forward") == 0  # every request went out before the batch was whole
    merged = merge_pending(parts)
    assert merged.per_group and sorted(merged.refs) == [(i, 0, 0) for i in range(12)]
    assert merged.dispatched_at == parts[0].dispatched_at and len(merged.spans.cot) == 12
    out = maker.make_experience_batch(ClassmateRollout(samples, merged))
    assert len(engine.prompts) == 12 and engine.prompts == batch_engine.prompts  # nothing sent twice, same inputs

    assert [e.index for e in out] == [e.index for e in batch]
    for exp, ref in zip(out, batch):
        for name in ("advantages", "classmate_advantages", "cot_mask"):
            torch.testing.assert_close(getattr(exp, name), getattr(ref, name), rtol=0, atol=0)
        assert exp.info["classmate/reward"].tolist() == ref.info["classmate/reward"].tolist()
        assert torch.all(exp.info["classmate/dispatched_per_group"] == 1)
        assert torch.all(ref.info["classmate/dispatched_per_group"] == 0)
        assert torch.all(exp.info["classmate/wait_time"] >= 0)


def test_a_bad_label_in_a_later_group_names_its_place_in_the_batch(world, fake_ray):
    from openrlhf_classmate.integration.classmate.classmate_stage import ClassmateInputError

    args = _args(world)
    maker, _ = _maker(args, world.tok, fake_ray)
    samples = _rollout(world.tok)
    samples[5].labels = ["not json"]
    with pytest.raises(ClassmateInputError, match="rollout sample 5:"):
        maker.stage.dispatch(samples[4:8], first_index=4)


def test_the_next_batch_is_a_classmate_step_as_the_bench_alternation_says(world, fake_ray, monkeypatch):
    monkeypatch.setenv("OPENRLHF_CLASSMATE_BENCH_ALTERNATE", "1")
    maker, _ = _maker(_args(world), world.tok, fake_ray)
    seen = []
    for _ in range(4):
        seen.append(maker.next_batch_dispatches_per_group())
        experiences = maker.make_experience_batch(_rollout(world.tok))
        assert ("classmate/reward" in experiences[0].info) == seen[-1]
    assert seen == [True, False, True, False]
    plain, _ = _maker(_args(world), world.tok, fake_ray, classmate=False)
    assert not plain.classmate_step(1) and not plain.next_batch_dispatches_per_group()


def test_seed_requests_gives_every_classmate_request_a_seed_of_its_own_from_the_train_seed(world, fake_ray):
    seeds = []
    for _ in range(2):
        maker, engine = _maker(_args(world, "--classmate.seed_requests"), world.tok, fake_ray)
        maker.make_experience_batch(_rollout(world.tok))
        seeds.append(engine.seeds)
    assert len(set(seeds[0])) == 12 and all(isinstance(s, int) for s in seeds[0])
    assert seeds[0] == seeds[1]  # the same train seed: the same request seeds
    maker, engine = _maker(_args(world, "--classmate.seed_requests", "--train.seed", "7"), world.tok, fake_ray)
    maker.make_experience_batch(_rollout(world.tok))
    assert engine.seeds != seeds[0]


def test_the_bench_before_switch_logs_each_batchs_path(world, fake_ray, monkeypatch):
    # bench/step_time.py --before: the mechanism a new before/after pair plugs into (bench_switches; no change has a
    # before path today, so the test registers two): each rollout batch logs its path index, one step per block in a
    # GDPO-only run, two under the GDPO / GRPO alternation; every batch stays a classmate step without it
    from openrlhf_classmate.integration import bench_switches

    monkeypatch.setattr(bench_switches, "BEFORE_CHANGES", ("first", "second"))
    monkeypatch.setenv("OPENRLHF_CLASSMATE_BENCH_BEFORE", "first,second")
    maker, _ = _maker(_args(world), world.tok, fake_ray)
    index, paths = [], []
    for batch in range(1, 7):
        paths.append(bench_switches.before_path(batch))
        experiences = maker.make_experience_batch(_rollout(world.tok))
        index.append(float(experiences[0].info["bench/before"][0]))
        info = experiences[0].info
        assert float(info["bench/classmate_step"][0]) == 1.0 and "classmate/reward" in info
    assert index == [0, 1, 2] * 2 and paths == [None, "first", "second"] * 2

    monkeypatch.setenv("OPENRLHF_CLASSMATE_BENCH_BEFORE", "second")
    monkeypatch.setenv("OPENRLHF_CLASSMATE_BENCH_ALTERNATE", "1")  # odd batches GDPO, even GRPO
    maker, _ = _maker(_args(world), world.tok, fake_ray)
    plan = []
    for _ in range(8):
        experiences = maker.make_experience_batch(_rollout(world.tok))
        info = experiences[0].info
        plan.append((float(info["bench/classmate_step"][0]), float(info["bench/before"][0])))
    assert plan == [(1.0, 0.0), (0.0, 0.0), (1.0, 1.0), (0.0, 1.0)] * 2

    for value in ("prefix", "first,first", "first,"):
        monkeypatch.setenv("OPENRLHF_CLASSMATE_BENCH_BEFORE", value)
        with pytest.raises(ValueError, match=f"OPENRLHF_CLASSMATE_BENCH_BEFORE={value}: a comma-separated list of "
                                             "first, second, each at most once"):
            _maker(_args(world), world.tok, fake_ray)
    monkeypatch.setattr(bench_switches, "BEFORE_CHANGES", ())  # today's registry: any change is refused
    monkeypatch.setenv("OPENRLHF_CLASSMATE_BENCH_BEFORE", "dispatch")
    with pytest.raises(ValueError, match="no change"):
        _maker(_args(world), world.tok, fake_ray)


def _nan_rollout(tok, bad: dict[int, float]):
    """The rollout as a user's reward function scores it: no ``main_valid`` flag, and the rows in ``bad`` replied with
    a non-finite reward (a server answering ``{"rewards": NaN}``)."""
    rows = []
    for i, (r, m) in enumerate(RESPONSES):
        s = _sample(tok, "1 + 2 = ?", r, bad.get(i, m))
        s.info.pop("main_valid")
        rows.append(s)
    return rows


@pytest.mark.parametrize("classmate", [True, False])
def test_a_non_finite_main_reward_is_an_invalid_score_not_a_crash_or_a_nan_group(world, fake_ray, capsys, classmate):
    # the classmate stream already turned such a reply into an invalid score; the main stream crashed the classmate
    # run (ValueError in compute_advantages) and spread NaN over the whole group of a plain run
    extra = ("--classmate.estimator", "separated") if classmate else ()
    args = _args(world, "--algo.advantage.estimator", "group_norm", "--reward.remote_url",
                 "http://127.0.0.1:9/score", *extra, classmate=classmate)
    maker, _ = _maker(args, world.tok, fake_ray, classmate=classmate)
    out = maker.make_experience_batch(_nan_rollout(world.tok, {4: float("nan"), 9: float("inf")}))
    valid = [i not in (4, 9) for i in range(12)]
    assert torch.cat([e.info["main_valid"] for e in out]).tolist() == [float(v) for v in valid]
    name = "advantages"  # separated: the main stream's (the classmate's are classmate_advantages)
    rows = _per_row(out, name)
    assert all(torch.isfinite(rows[i]).all() for i in range(12))
    assert torch.all(rows[4] == 0) and torch.all(rows[9] == 0)
    # the other rows: the advantages of the same rollout with those two scores marked invalid by the reward function
    maker2, _ = _maker(args, world.tok, fake_ray, classmate=classmate)
    reference = _per_row(maker2.make_experience_batch(_invalid_rollout(world.tok, {4, 9})), name)
    for i in range(12):
        assert torch.allclose(rows[i], reference[i], atol=1e-6), i
    assert all(torch.isfinite(e.rewards).all() for e in out)  # nothing non-finite left for the update's guard
    logged = torch.cat([e.info["reward"] for e in out])
    assert logged.mean().item() == pytest.approx(MAIN[torch.tensor(valid)].mean().item(), abs=1e-6)
    err = capsys.readouterr().err
    assert err.count("2 main reward(s) of this rollout batch arrived non-finite") == 1


def test_the_samples_generator_flags_a_non_finite_reward_where_it_arrives():
    # upstream's own _process_response_into_experience underneath; a non-finite reward or score becomes the
    # placeholder 0 with main_valid 0, so dynamic filtering reads it as an invalid score (not "out of range")
    from openrlhf_classmate.integration.rollout.main_scores import main_validity
    from openrlhf_classmate.integration.rollout.samples_generator import ClassmateSamplesGenerator, filter_decision

    gen = object.__new__(ClassmateSamplesGenerator)

    def response(reward, scores):
        return {"observation_tokens": [1, 2, 3, 4], "action_ranges": [(2, 4)], "reward": reward, "scores": scores,
                "rollout_log_probs": None, "prompt": "p", "label": "l", "extra_logs": {}}

    good = gen._process_response_into_experience(response(1.0, 1.0), max_len=16)
    bad = gen._process_response_into_experience(response(float("nan"), float("nan")), max_len=16)
    half = gen._process_response_into_experience(response(0.5, float("-inf")), max_len=16)
    assert good.info["main_valid"].tolist() == [1.0] and good.rewards.tolist() == [1.0]
    for e in (bad, half):
        assert e.info["main_valid"].tolist() == [0.0]
        assert e.rewards.tolist() == [0.0] and e.scores.tolist() == [0.0]
        assert e.info["reward"].tolist() == [0.0] and e.info["score"].tolist() == [0.0]
    zero = gen._process_response_into_experience(response(0.0, 0.0), max_len=16)
    group = [good, zero, bad, half]
    assert main_validity(group).tolist() == [True, True, False, False]
    # dynamic filtering: the valid scores 1 and 0 average 0.5, inside (0, 1): kept (a NaN among them read as out of range)
    assert filter_decision([float(e.scores[0]) for e in group], main_validity(group).tolist(), (0.0, 1.0)) == "keep"


@pytest.mark.parametrize("classmate", [True, False])
@pytest.mark.parametrize("shaping", ["none", "all"])  # all: penalties, reward clip and the KL return
def test_upstreams_logged_group_std_and_return_leave_invalid_scores_out(world, fake_ray, classmate, shaping):
    # upstream computes info["group_reward_std"] and info["return"] over the placeholder 0 of invalid scores (its
    # group std and baseline); the actor logs their mean. Group 0 has no valid score, row 4 of group 1 failed.
    extra = (("--classmate.estimator", "separated") if classmate else ()) + tuple(SHAPING.get(shaping, ()))
    args = _args(world, "--algo.advantage.estimator", "group_norm", *extra, classmate=classmate)
    maker, _ = _maker(args, world.tok, fake_ray, classmate=classmate)
    invalid = {0, 1, 2, 3, 4}
    out = maker.make_experience_batch(_invalid_rollout(world.tok, invalid))
    valid = torch.tensor([i not in invalid for i in range(12)])

    def info(key):
        rows = torch.zeros(12)
        for e in out:
            rows[torch.tensor(e.index)] = (e.info[key] if key in e.info else getattr(e, key)).float()
        return rows

    # the mean over the groups that have a std (>= 2 valid scores): group 1 (rows 5-7) and group 2, of the rewards
    # upstream's estimator reads (after its length penalties)
    shaped = info("rewards")
    groups_std = (shaped[[5, 6, 7]].std() + shaped[8:12].std()) / 2
    assert info("group_reward_std").mean().item() == pytest.approx(groups_std.item(), abs=1e-6)
    if classmate:
        assert info("classmate/main_group_reward_std").mean().item() == pytest.approx(groups_std.item(), abs=1e-6)
    # return: what upstream sums over the tokens, the post-baseline outcome plus the KL return, i.e. the trained
    # main advantage at the first response token (no whitening here), and the mean over valid rows only
    first = {i: e.advantages[r][e.action_mask[r].bool()][0].item() for e in out for r, i in enumerate(e.index)}
    returns = info("return")
    for i in range(12):
        if valid[i]:
            assert returns[i].item() == pytest.approx(first[i], abs=1e-5), i
    assert returns.mean().item() == pytest.approx(sum(first[i] for i in range(12) if valid[i]) / 7, abs=1e-5)


def test_vanilla_classmate_rows_with_missing_cot_log_probs_are_invalid_not_trained_on(world, fake_ray):
    # vLLM's prompt_logprobs lacking a position reads as -inf (classmate_executor.cot_prompt_logprobs); the loss of
    # vanilla_classmate would clamp that c_t and train on it with a valid A^c: the classmate score is unusable there
    args = _args(world, "--classmate.estimator", "separated", "--classmate.loss", "vanilla_classmate",
                 "--classmate.prompt_mode", "splice", "--classmate.model_name_or_path", world.policy)
    maker, engine = _maker(args, world.tok, fake_ray)
    real = engine._generate
    calls = []

    def one_missing(prompt, *a, **kw):
        out = real(prompt, *a, **kw)
        calls.append(prompt)
        if len(calls) == 3 and out[0]["cot_logprobs"]:
            out[0]["cot_logprobs"][0] = float("-inf")
        return out

    engine.generate_responses = SimpleNamespace(remote=one_missing)
    experiences = maker.make_experience_batch(_rollout(world.tok))
    advantages = _per_row(experiences, "classmate_advantages")
    assert torch.all(advantages[2] == 0)  # the third request's row: no classmate advantage
    assert any(torch.any(advantages[i] != 0) for i in range(12) if i != 2)
    skip = float(experiences[0].info["classmate/skip_cot_logprobs_missing"][0])
    assert skip == pytest.approx(1 / 12)
