"""Every YAML config in configs/ goes through the launcher's own parser (upstream's checks and ours; nothing runs), so
a broken config fails CI. Model paths are overridden with tiny local models, as the train_scripts do with MODEL /
CLASSMATE_MODEL (the splice check of the reference reproduction loads both tokenizers)."""

import glob
import os
import re

import pytest
import yaml

from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.testing.tiny_models import save_tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml")))
NAMES = [os.path.splitext(os.path.basename(c))[0] for c in CONFIGS]
REQUIRED = {
    "warmup", "baseline_grpo", "classmate_gdpo", "classmate_separated", "self_classmate",
    "classmate_reproduce_reference", "classmate_gsm8k", "classmate_math", "tinyv", "darling", "vrcli",
}
WORDS = ["a", "b", "c", "1", "2"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_models")
    kwargs = dict(hidden_size=8, num_layers=1, num_heads=2)
    policy = save_tiny_model(str(root / "policy"), WORDS, seed=0, **kwargs)
    classmate = save_tiny_model(str(root / "classmate"), WORDS, seed=1, **kwargs)  # same vocabulary: splice works
    return policy, classmate


def _tree(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _parse(name: str, tiny, *extra: str):
    policy, classmate = tiny
    path = os.path.join(REPO, "configs", f"{name}.yaml")
    argv = ["--config", path, "--actor.model_name_or_path", policy]
    if (_tree(path).get("classmate") or {}).get("model_name_or_path"):
        argv += ["--classmate.model_name_or_path", classmate]
    return parse_args(argv + list(extra))


def test_the_issue_s_configs_exist():
    assert REQUIRED <= set(NAMES), f"missing configs: {sorted(REQUIRED - set(NAMES))}"


@pytest.mark.parametrize("name", NAMES)
def test_config_parses_through_the_launcher(name, tiny):
    args = _parse(name, tiny)
    assert args.actor.model_name_or_path == tiny[0]
    assert args.data.input_key == "prompt" and args.data.label_key == "label" and args.data.apply_chat_template
    assert args.data.prompt_dataset.endswith(".jsonl")
    assert args.ckpt.save_hf and args.ckpt.save_steps > 0


@pytest.mark.parametrize("name", NAMES)
def test_config_is_commented_and_has_no_machine_specific_paths(name):
    text = open(os.path.join(REPO, "configs", f"{name}.yaml"), encoding="utf-8").read()
    assert text.startswith("#") and "Run with train_scripts/" in text
    assert not re.search(r"(/work/|/home/|/root/|/tmp/|/scratch/)", text)
    # placeholder paths are relative to the repository (data/, runs/) or hub ids
    for key, value in _flat(_tree(os.path.join(REPO, "configs", f"{name}.yaml"))).items():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and ("/" in v) and not v.startswith("http"):
                assert not v.startswith("/"), f"{key}: {v}"


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_reproduce_reference_maps_the_reference_hyperparameters(tiny):
    a = _parse("classmate_reproduce_reference", tiny)
    c = a.classmate
    # method: the reference's estimator (separated), loss (vanilla_classmate) and aggregation
    assert c.loss == "vanilla_classmate" and c.estimator == "separated" and c.prompt_mode == "splice"
    assert c.loss_agg_mode == "seq-mean-token-sum-norm" and a.algo.advantage.estimator == "dr_grpo"
    assert c.condition == "always" and c.token_mode == "classmate_partial" and c.truncation == "vanilla"
    assert c.reward_weight == 1.0 and c.samples == 1 and len(c.model_name_or_path) == 1
    # the reference scripts' hyper-parameters
    assert a.actor.adam.lr == pytest.approx(1e-5) and a.actor.lr_scheduler == "constant"
    assert list(a.actor.adam.betas) == [0.9, 0.999] and a.actor.adam.weight_decay == pytest.approx(0.01)
    assert a.actor.max_norm == 1.0 and a.actor.lr_warmup_ratio == 0.0
    assert a.rollout.batch_size == 64 and a.rollout.n_samples_per_prompt == 8
    assert a.train.batch_size == 16 * 8 and a.train.max_epochs == 1 and a.train.num_episodes == 3
    assert a.train.micro_batch_size == 16 and a.rollout.micro_batch_size == 16
    assert a.data.max_len == 1024 + 3072 and a.rollout.max_new_tokens == 3072
    assert tuple(a.actor.eps_clip_low_high) == (0.2, 0.2) and list(c.eps_clip_low_high) == [0.4, 0.4]
    assert a.actor.dual_clip == 3.0 and c.dual_clip == 3.0
    assert a.algo.kl.init_coef == 0.0 and not a.algo.kl.use_loss and a.actor.entropy_coef == 0.0
    assert a.train.seed == 42 and a.ckpt.save_steps == 10 and a.eval.steps == 10
    assert a.rollout.temperature == 1.0 and a.rollout.top_p == 1.0
    assert a.eval.n_samples_per_prompt == 1 and a.eval.temperature == 1.0
    assert c.temperature == 1.0 and c.top_p == 1.0 and c.top_k == -1


def test_method_choices_of_the_other_configs(tiny):
    for name in ("warmup", "baseline_grpo"):
        a = _parse(name, tiny)
        assert a.algo.advantage.estimator == "dr_grpo" and a.classmate.model_name_or_path is None
        assert a.classmate.judge_base_url and a.classmate.judge_model  # judge-rated sycophancy data
    assert _parse("warmup", tiny).data.prompt_dataset.endswith("warmup_train.jsonl")
    gdpo = _parse("classmate_gdpo", tiny)
    assert gdpo.classmate.estimator == "gdpo" and gdpo.classmate.loss == "auto"
    # placement auto: HF engines (CPU) take no GPU, separate; vLLM engines on the config's colocated GPUs: share
    assert gdpo.classmate.placement == ("separate" if gdpo.engine.backend == "hf" else "share")
    assert gdpo.train.colocate_all
    assert _parse("classmate_gdpo", tiny, "--engine.backend", "vllm").classmate.placement == "share"
    sep = _parse("classmate_separated", tiny)
    assert sep.classmate.estimator == "separated" and list(sep.classmate.eps_clip_low_high) == [0.4, 0.4]
    assert _tree(os.path.join(REPO, "configs", "self_classmate.yaml"))["classmate"]["model_name_or_path"] == [
        _tree(os.path.join(REPO, "configs", "self_classmate.yaml"))["actor"]["model_name_or_path"]]
    for name, data in (("classmate_gsm8k", "gsm8k"), ("classmate_math", "hendrycks_math")):
        a = _parse(name, tiny)
        assert f"/{data}/" in a.data.prompt_dataset and a.classmate.judge_base_url is None
    tinyv = _parse("tinyv", tiny)
    assert tinyv.algo.advantage.estimator == "group_norm" and tinyv.algo.kl.use_loss
    assert tinyv.tinyv.model == "zhangchenxu/TinyV-1.5B" and tinyv.tinyv.base_url.startswith("http://")
    assert (tinyv.tinyv.mode, tinyv.tinyv.weight, tinyv.tinyv.max_retries) == ("addon", 1.0, 3)
    darling = _parse("darling", tiny)
    assert darling.algo.advantage.estimator == "dr_grpo" and darling.classmate.main_scorer == "math_verify"
    d = darling.darling
    assert (d.diversity, d.combine, d.diversity_floor, d.threshold) == ("partition", "multiplicative", 0.1, 0.5)
    assert (d.cls_token, d.sep_token, d.max_len, d.short_answer_words) == ("<|im_start|>", "<|im_end|>", 4096, 5)
    vrcli = _parse("vrcli", tiny)
    assert vrcli.algo.kl.init_coef > 0 and vrcli.rollout.n_samples_per_prompt == 16  # the generator = ref model
    assert vrcli.vrcli.enable and vrcli.vrcli.mapping == "ladder" and vrcli.vrcli.baseline == "dataset"
    assert vrcli.rollout.temperature == 1.0 and vrcli.algo.advantage.estimator == "group_norm"


def test_command_line_flags_override_a_config(tiny):
    a = _parse("classmate_gdpo", tiny, "--actor.adam.lr", "3e-6", "--classmate.estimator", "grpo_w_classmate")
    assert a.actor.adam.lr == pytest.approx(3e-6) and a.classmate.estimator == "grpo_w_classmate"
