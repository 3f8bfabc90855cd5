"""The launcher's command line: upstream's parser and checks reused, the classmate group, --config, validation."""

import os

import pytest

from openrlhf_classmate.integration.args import ConfigError, build_parser, parse_args
from openrlhf_classmate.integration.classmate_config import REWARD_FUNC_PATH
from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

BASE = [
    "--actor.model_name_or_path", "policy", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
    "--data.prompt_dataset", "d.jsonl", "--rollout.batch_size", "4", "--rollout.micro_batch_size", "2",
    "--rollout.n_samples_per_prompt", "4", "--vllm.num_engines", "1",
]
CLASSMATE = ["--classmate.model_name_or_path", "classmate"]


def _error(argv, capsys=None) -> str:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    return str(info.value.code)


def test_every_upstream_flag_group_is_accepted_unchanged():
    args = parse_args(BASE + [
        "--algo.advantage.estimator", "group_norm", "--algo.advantage.is_correction_level", "token",
        "--algo.advantage.is_correction_mode", "mask", "--actor.eps_clip_low_high", "0.2", "0.28",
        "--ds.zero_stage", "3", "--ckpt.save_hf", "--logger.tensorboard_dir", "tb", "--eval.steps", "5",
        "--vllm.enable_sleep", "--train.colocate_all",
    ])
    assert args.algo.advantage.estimator == "group_norm"
    assert args.actor.eps_clip_low_high == [0.2, 0.28]
    assert args.ds.zero_stage == 3 and args.ckpt.save_hf is True
    assert args.vllm.enable_sleep is True  # kept: colocate_all is set (upstream post-processing ran)
    parser_dests = {a.dest for a in build_parser()._actions}
    assert {"actor.adam.lr", "critic.value_clip", "algo.kl.unbiased_gradient", "ds.lora.rank", "classmate.lam"} - parser_dests == {"classmate.lam"}


def test_upstream_post_processing_and_checks_still_run():
    args = parse_args(BASE)
    assert args.actor.eps_clip_low_high == (0.2, 0.2)  # upstream default filled in
    assert args.rollout.vllm_generate_batch_size == 4
    # upstream's assert, reported with our flag names instead of a traceback
    with pytest.raises(ConfigError, match=r"group_norm normalises .* --rollout.n_samples_per_prompt >= 2"):
        parse_args(BASE + ["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "1"])
    args = parse_args(BASE + ["--vllm.enable_sleep"])
    assert args.vllm.enable_sleep is False  # upstream turns sleep off without colocate_all


def test_without_classmate_it_is_upstream_plus_the_registry_reward():
    args = parse_args(BASE)
    assert args.classmate.model_name_or_path is None
    assert args.reward.remote_url == [REWARD_FUNC_PATH]
    args = parse_args(BASE + ["--reward.remote_url", "http://a:1/score,http://b:2/score"])
    assert args.reward.remote_url == ["http://a:1/score", "http://b:2/score"]


def test_classmate_defaults_and_derived_values():
    args = parse_args(BASE + CLASSMATE + ["--data.max_len", "1024", "--classmate.max_new_tokens", "256"])
    c = args.classmate
    assert c.estimator == "gdpo" and c.token_mode == "classmate_partial" and c.prompt_mode == "retokenize"
    assert c.max_context == 1024 + 256
    assert c.classmate_think_open == "<think>" and c.eps_clip_low_high == [0.4, 0.4]
    assert args.engine.backend == "hf"  # no real vLLM on this machine


def test_config_file_maps_nested_keys_and_the_command_line_wins(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "actor:\n  adam:\n    lr: 3.0e-6\n  eps_clip_low_high: [0.1, 0.3]\n"
        "ckpt:\n  save_hf: true\n"
        "classmate:\n  model_name_or_path: [cm-a, cm-b]\n  weights: [2, 1]\n  estimator: separated\n"
        "  reward_weight: 0.5\n"
    )
    args = parse_args(BASE + ["--config", str(cfg), "--classmate.reward_weight", "0.25"])
    assert args.actor.adam.lr == pytest.approx(3e-6)
    assert args.actor.eps_clip_low_high == [0.1, 0.3]
    assert args.ckpt.save_hf is True
    assert args.classmate.model_name_or_path == ["cm-a", "cm-b"] and args.classmate.weights == [2.0, 1.0]
    assert args.classmate.estimator == "separated"
    assert args.classmate.reward_weight == 0.25  # explicit flag overrides the file


@pytest.mark.parametrize(
    "text, message",
    [
        ("actor:\n  adam:\n    lrr: 1\n", "unknown key 'actor.adam.lrr'"),
        ("ckpt:\n  save_hf: 3\n", "'ckpt.save_hf' is a switch"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("actor: [unclosed\n", "not valid YAML"),
        ("classmate:\n  estimator: nope\n", "invalid choice: 'nope'"),
    ],
)
def test_bad_config_files_fail_with_one_clear_message(tmp_path, text, message, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    if "invalid choice" in message:
        with pytest.raises(SystemExit):
            parse_args(BASE + ["--config", str(cfg)])
        assert message in capsys.readouterr().err
    else:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
            parse_args(BASE + ["--config", str(cfg)])


def test_missing_config_file_is_named():
    with pytest.raises(ConfigError, match="nope.yaml: cannot read"):
        parse_args(BASE + ["--config", "nope.yaml"])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--classmate.estimator", "gdpo"], "--classmate.estimator gdpo needs a classmate"),
        (CLASSMATE + ["--classmate.weights", "1", "2"], "--classmate.weights has 2 values for 1 classmate"),
        (CLASSMATE + ["--classmate.placement", "colocate"], "needs --train.colocate_actor_ref"),
        (CLASSMATE + ["--classmate.loss", "vanilla_classmate"], "needs separate main/classmate advantages"),
        (CLASSMATE + ["--classmate.loss", "vanilla_classmate", "--classmate.estimator", "separated"],
         "exist only with --classmate.prompt_mode splice"),
        (CLASSMATE + ["--classmate.keep_min", "0.9", "--classmate.keep_max", "0.2"], "keep_min"),
        (CLASSMATE + ["--rollout.n_samples_per_prompt", "1"], "n_samples_per_prompt >= 2"),
        (CLASSMATE + ["--vllm.num_engines", "0"], "--vllm.num_engines >= 1"),
        (CLASSMATE + ["--reward.model_name_or_path", "rm"], "--reward.model_name_or_path is not supported"),
    ],
)
def test_invalid_classmate_combinations_fail_up_front(extra, message):
    assert message in _error(BASE + extra)


def _save_tokenizer(path, words):
    build_word_tokenizer(words).save_pretrained(str(path))
    return str(path)


def test_splice_needs_identical_vocabularies(tmp_path):
    main = _save_tokenizer(tmp_path / "main", ["a", "b", "c"])
    same = _save_tokenizer(tmp_path / "same", ["a", "b", "c"])
    other = _save_tokenizer(tmp_path / "other", ["a", "b", "z"])
    argv = [a if a != "policy" else main for a in BASE] + ["--classmate.prompt_mode", "splice"]
    args = parse_args(argv + ["--classmate.model_name_or_path", same])
    assert args.classmate.prompt_mode == "splice"
    message = _error(argv + ["--classmate.model_name_or_path", other])
    assert f"--classmate.prompt_mode splice with classmate {other}" in message
    assert "identical vocabularies" in message and "retokenize" in message
    assert os.path.isdir(other)
