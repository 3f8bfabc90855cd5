"""The launcher's command line: upstream's parser and checks reused, the classmate group, --config, validation."""

import os

import pytest

from openrlhf_classmate.eval.generation import real_vllm_available
from openrlhf_classmate.integration.classmate_config import REWARD_FUNC_PATH
from openrlhf_classmate.integration.launch.args import ConfigError, build_parser, parse_args
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


def test_our_reward_function_named_by_another_path_is_still_ours(tmp_path, monkeypatch):
    """``--reward.remote_url`` naming openrlhf_classmate/reward_func.py by a relative path, a symlink or a second
    checkout's copy is our scorer-registry reward: without this the launcher took it for a user's function, whose
    classmate answers then reach it without the split answers (every classmate score invalid, seen in a demo run
    from a second checkout) and whose main answers get upstream's executor."""
    from openrlhf_classmate.integration.classmate_config import is_registry_reward_func, registry_reward_in_use

    monkeypatch.chdir(os.path.dirname(os.path.dirname(REWARD_FUNC_PATH)))
    link = tmp_path / "link.py"
    link.symlink_to(REWARD_FUNC_PATH)
    copy = tmp_path / "checkout2" / "openrlhf_classmate" / "reward_func.py"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(open(REWARD_FUNC_PATH, "rb").read())
    for url in ("openrlhf_classmate/reward_func.py", str(link), str(copy)):
        args = parse_args(BASE + ["--reward.remote_url", url])
        assert args.reward.remote_url == [REWARD_FUNC_PATH] and registry_reward_in_use(args), url
        assert is_registry_reward_func(url)
    # another function of that name, and URLs, stay the user's
    other = tmp_path / "mine" / "reward_func.py"
    other.parent.mkdir()
    other.write_text("def reward_func(queries, prompts, labels):\n    return {'rewards': 0.0}\n")
    args = parse_args(BASE + ["--reward.remote_url", f"{other},http://a:1/score"])
    assert args.reward.remote_url == [str(other), "http://a:1/score"] and not registry_reward_in_use(args)
    assert not is_registry_reward_func("http://a:1/score") and not is_registry_reward_func(str(tmp_path / "none.py"))


def test_classmate_defaults_and_derived_values():
    args = parse_args(BASE + CLASSMATE + ["--data.max_len", "1024", "--classmate.max_new_tokens", "256"])
    cfg = args.classmate
    assert cfg.estimator == "gdpo" and cfg.token_mode == "classmate_partial" and cfg.prompt_mode == "retokenize"
    assert cfg.max_context == 1024 + 256
    assert cfg.classmate_think_open == "<think>" and cfg.eps_clip_low_high == [0.4, 0.4]
    assert args.engine.backend == ("vllm" if real_vllm_available() else "hf")  # auto: vLLM where it is installed


def test_values_set_for_the_user_are_logged_once_each(capsys):
    args = parse_args(BASE + CLASSMATE + ["--data.max_len", "1024", "--classmate.max_new_tokens", "256"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[openrlhf_classmate] ")]
    expected = [
        f"--reward.remote_url {REWARD_FUNC_PATH} (no reward given:",
        "--algo.advantage.estimator group_norm (a classmate run needs a per-prompt-group baseline; upstream's "
        "default is gae)",
        "--classmate.classmate_think_open <think> (from --classmate.think_open)",
        "--classmate.classmate_think_close </think> (from --classmate.think_close)",
        f"--engine.backend {args.engine.backend} (auto:",
        "--classmate.estimator gdpo (the default with a classmate)",
        "--classmate.max_context 1280 (--data.max_len 1024 + --classmate.max_new_tokens 256)",
        f"--classmate.placement {args.classmate.placement} (auto:",  # HF engines (CPU): separate
    ]
    assert len(lines) == len(expected), lines
    for line, start in zip(lines, expected):
        assert line.removeprefix("[openrlhf_classmate] ").startswith(start), line


def test_values_the_user_gave_are_not_logged(capsys):
    parse_args(BASE + CLASSMATE + ["--reward.remote_url", "http://a:1/score", "--algo.advantage.estimator", "rloo",
                                   "--classmate.estimator", "grpo", "--classmate.max_context", "4096",
                                   "--classmate.classmate_think_open", "<t>", "--classmate.classmate_think_close",
                                   "</t>", "--engine.backend", "hf", "--classmate.placement", "separate"])
    assert "[openrlhf_classmate]" not in capsys.readouterr().err


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


def test_config_merge_keys_work_as_yaml_defines_them(tmp_path):
    # an anchor on one group merged into another; a merged mapping extended inside (merge within the nested key),
    # an explicit scalar next to the merge key wins
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "actor: &opt\n  adam: &adam {lr: 3.0e-6, betas: [0.8, 0.9]}\n"
        "critic:\n  <<: *opt\n  adam:\n    <<: *adam\n    lr: 7.0e-6\n"
        "rollout: &r {temperature: 0.9}\neval:\n  <<: *r\n  temperature: 0.5\n"
    )
    args = parse_args(BASE + ["--config", str(cfg), "--critic.model_name_or_path", "critic"])
    assert args.critic.adam.lr == pytest.approx(7e-6) and list(args.critic.adam.betas) == [0.8, 0.9]
    assert args.actor.adam.lr == pytest.approx(3e-6) and args.rollout.temperature == pytest.approx(0.9)
    assert args.eval.temperature == pytest.approx(0.5)


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
        (CLASSMATE + ["--classmate.placement", "share", "--classmate.num_engines", "2"],
         "--classmate.num_engines 2 x --classmate.tensor_parallel_size 1 = 2 GPUs do not fit the policy engines' "
         "placement group (1 GPUs = --vllm.num_engines 1 x --vllm.tensor_parallel_size 1)"),
        (CLASSMATE + ["--classmate.placement", "colocate", "--train.colocate_actor_ref",
                      "--classmate.tensor_parallel_size", "2"],
         "= 2 GPUs do not fit the actor/ref placement group (1 GPUs = --actor.num_nodes 1 x"),
        (["--rollout.temperature", "2.5"], "--rollout.temperature 2.5 / --rollout.top_p 1.0 / --rollout.max_new_tokens "
         "None: vLLM rejects these sampling settings: temperature must be in [0, 2], got 2.5"),
        (["--rollout.top_p", "0"], "top_p must be in (0, 1], got 0.0"),
        (["--eval.dataset", "e.jsonl", "--eval.temperature", "-1"], "--eval.temperature -1.0 / --rollout.top_p 1.0: "
         "vLLM rejects these sampling settings: temperature must be non-negative"),
        # the field's range (config_fields) is checked before the sampling settings go through vLLM's
        (CLASSMATE + ["--classmate.top_k", "-5"], "--classmate.top_k must be >= -1, got -5"),

        (CLASSMATE + ["--classmate.final_answer", "whole_response"], "give a classmate no CoT to read"),
        (CLASSMATE + ["--classmate.dispatch", "group", "--classmate.placement", "colocate",
                      "--train.colocate_actor_ref"],
         "--classmate.dispatch group: the classmate engines sleep during the rollout (--classmate.placement colocate "
         "or --classmate.enable_sleep); use --classmate.dispatch batch (or auto)"),
        (CLASSMATE + ["--classmate.dispatch", "group", "--classmate.enable_sleep"],
         "--classmate.dispatch group: the classmate engines sleep during the rollout"),
        (CLASSMATE + ["--classmate.dispatch", "group", "--rollout.batch_size", "2", "--train.async_enable",
                      "--rollout.vllm_generate_batch_size", "4"],
         "--classmate.dispatch group: --rollout.vllm_generate_batch_size 4 > --rollout.batch_size 2 generates groups "
         "for later steps"),
    ],
)
def test_invalid_classmate_combinations_fail_up_front(extra, message):
    error = _error(BASE + extra)
    assert error.startswith("error: ") and message in error


def test_placements_that_fit_and_sampling_vllm_accepts_pass():
    args = parse_args(BASE + CLASSMATE + ["--vllm.num_engines", "2", "--classmate.placement", "share",
                                          "--classmate.num_engines", "2", "--classmate.temperature", "0",
                                          "--rollout.temperature", "0.001"])
    assert args.classmate.num_engines == 2


@pytest.mark.parametrize("extra, per_group", [
    ([], True),  # placement auto: separate (HF engines) or share, the classmate engines awake during the rollout
    (["--classmate.placement", "share"], True),
    (["--classmate.placement", "share", "--classmate.enable_sleep"], False),
    (["--classmate.placement", "colocate", "--train.colocate_actor_ref"], False),
    (["--rollout.batch_size", "2", "--rollout.vllm_generate_batch_size", "4", "--train.async_enable"], False),
    (["--train.async_enable"], True),
    (["--classmate.dispatch", "batch"], False),
    (["--classmate.dispatch", "group", "--classmate.placement", "share"], True),
])
def test_auto_dispatch_goes_per_group_where_the_classmate_engines_are_awake(extra, per_group):
    from openrlhf_classmate.integration.classmate_config import dispatch_per_group

    assert dispatch_per_group(parse_args(BASE + CLASSMATE + extra)) is per_group
    assert dispatch_per_group(parse_args(BASE + extra[:0])) is False  # no classmate: nothing to send


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


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--algo.advantage.estimator", "gae"], "--algo.advantage.estimator gae needs a critic"),
        (["--algo.advantage.estimator", "reinforce"], "use reinforce_baseline"),
        (["--algo.advantage.estimator", "flash_reinforce"], "use group_norm, dr_grpo or rloo"),
        (["--algo.advantage.no_std_norm"], "use --algo.advantage.estimator dr_grpo"),
        (["--algo.advantage.estimator", "rloo", "--algo.advantage.no_std_norm"], "no effect with"),
        (["--algo.advantage.gamma", "0.9"], "drop --algo.advantage.gamma"),
        (["--algo.advantage.lambd", "0.95"], "--algo.advantage.lambd 0.95 is GAE's"),
        (["--reward.normalize_enable"], "drop --reward.normalize_enable"),
        (["--classmate.estimator", "separated_non_neg", "--algo.advantage.estimator", "reinforce_baseline"],
         "separated_non_neg keeps the classmate advantage >= 0, which the batch whitening of "
         "--algo.advantage.estimator reinforce_baseline"),
        (["--actor.policy_loss_type", "gspo", "--classmate.loss_agg_mode", "seq-mean-token-sum-norm"],
         "drop --classmate.loss_agg_mode seq-mean-token-sum-norm"),
        (["--actor.policy_loss_type", "gspo", "--classmate.estimator", "separated", "--classmate.loss",
          "vanilla_classmate", "--classmate.prompt_mode", "splice"], "use --classmate.loss separated with gspo"),
        (["--train.agent_func_path", "agent.py"], "set --classmate.scorer"),
    ],
)
def test_upstream_options_without_a_meaning_in_a_classmate_run_are_refused_naming_both(extra, message, tmp_path):
    tok = _save_tokenizer(tmp_path / "tok", ["a"])
    argv = [a if a not in ("policy", "classmate") else tok for a in BASE + CLASSMATE]
    text = _error(argv + extra)
    assert message in text and text.startswith("error: ") and "\n" not in text


def test_upstream_options_honoured_in_a_classmate_run_parse():
    args = parse_args(BASE + CLASSMATE + [
        "--algo.advantage.estimator", "reinforce_baseline", "--algo.advantage.no_std_norm",
        "--reward.overlong_buffer_len", "64", "--reward.stop_properly_penalty_coef", "0.5",
        "--reward.clip_range", "-1", "1", "--algo.kl.init_coef", "0.01", "--actor.policy_loss_type", "gspo",
        "--algo.advantage.is_correction_level", "seq", "--classmate.loss_agg_mode", "seq-mean-token-mean"])
    assert args.algo.advantage.estimator == "reinforce_baseline"
    assert args.actor.loss_agg_mode == "seq-mean-token-mean"  # --classmate.loss_agg_mode reaches upstream's loss
    default = parse_args(BASE + CLASSMATE)
    assert default.algo.advantage.estimator == "group_norm" and default.classmate.estimator == "gdpo"


def test_classmate_scorer_without_a_classmate_points_to_main_scorer():
    assert "--classmate.main_scorer" in _error(BASE + ["--classmate.scorer", "math_verify"])
    assert parse_args(BASE + ["--classmate.main_scorer", "math_verify"]).classmate.main_scorer == "math_verify"


def test_seq_mean_token_sum_norm_needs_a_fixed_response_width():
    # T = --rollout.max_new_tokens; without it T would be each micro-batch's padded width, so the
    # same response would weigh 1/5 or 1/9 of its token sum depending on the prompts it was batched with
    import torch

    from openrlhf_classmate.integration.training.actor import build_classmate_loss

    for extra in ([], CLASSMATE):
        text = _error(BASE + extra + ["--classmate.loss_agg_mode", "seq-mean-token-sum-norm"])
        assert text == ("error: --classmate.loss_agg_mode seq-mean-token-sum-norm divides each sequence's token sum "
                        "by a fixed T = --rollout.max_new_tokens: set --rollout.max_new_tokens")
    args = parse_args(BASE + ["--classmate.loss_agg_mode", "seq-mean-token-sum-norm", "--rollout.max_new_tokens",
                              "16"])
    loss, _, _ = build_classmate_loss(args)
    assert loss.max_response_len == 16
    values = []
    for width in (5, 9):  # one response of 3 tokens, padded into two micro-batches of different widths
        lp = torch.zeros(1, width)
        mask = torch.zeros(1, width, dtype=torch.bool)
        mask[0, :3] = True
        advantages = torch.where(mask, 1.0, 0.0)
        values.append(loss(lp, lp, advantages, action_mask=mask, classmate_advantages=torch.zeros(1, width))[0])
    assert values[0].item() == values[1].item() == pytest.approx(-3 / 16)


def test_a_dashboard_address_for_a_direct_launch_is_one_line():
    # ray job submit takes http://HEAD:8265; ray.init (RAY_SUBMIT=0: the launcher joins the cluster itself) fails on
    # it with a traceback ("Module: http does not have ClientBuilder")
    from openrlhf_classmate.cli.train_ppo_ray import ray_init_address

    with pytest.raises(SystemExit, match=r"^error: RAY_ADDRESS=http://10.0.0.1:8265 is a dashboard .* HEAD_IP:6379"):
        ray_init_address("http://10.0.0.1:8265")
    assert ray_init_address("auto") == "auto" and ray_init_address("10.0.0.1:6379") == "10.0.0.1:6379"


def test_the_launcher_as_a_ray_job_driver_merges_its_runtime_env_into_the_jobs(monkeypatch):
    # `ray job submit --runtime-env-json` (the train scripts' cluster path) forwards HF_HUB_OFFLINE, WANDB_MODE, ...,
    # which init_ray passes through too; ray.init in a job's driver refused the same key twice (even with one value)
    import json

    import ray
    from ray.runtime_env.runtime_env import _merge_runtime_env

    from openrlhf_classmate.cli.train_ppo_ray import init_ray

    job_env = {"working_dir": "gcs://_ray_pkg_x.zip", "env_vars": {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}}
    for name, value in {"RAY_ADDRESS": "127.0.0.1:6379", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline",
                        "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": job_env})}.items():
        monkeypatch.setenv(name, value)
    for name in ("RAY_OVERRIDE_JOB_RUNTIME_ENV", "OPENRLHF_CLASSMATE_SCORER"):  # restored afterwards (init_ray sets them)
        monkeypatch.delenv(name, raising=False)
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    init_ray(None, {"OPENRLHF_CLASSMATE_SCORER": "auto"})
    [call] = calls
    assert call["address"] == "127.0.0.1:6379" and call["runtime_env"]["env_vars"]["HF_HUB_OFFLINE"] == "1"
    # ray.init's own merge of the job's runtime env with the driver's (ray/_private/worker.py)
    merged = _merge_runtime_env(job_env, call["runtime_env"],
                                override=os.environ.get("RAY_OVERRIDE_JOB_RUNTIME_ENV") == "1")
    assert merged is not None and merged["working_dir"] == job_env["working_dir"]
    assert merged["env_vars"]["OPENRLHF_CLASSMATE_SCORER"] == "auto" and merged["env_vars"]["WANDB_MODE"] == "offline"
    assert merged["worker_process_setup_hook"] == "openrlhf_classmate.integration.patches.worker_setup"
