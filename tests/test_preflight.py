"""The launcher's preflight beyond the bad-input table: every numeric option has a range, the repository's configs are
inside them, the judge flags are documented, and what ``--check`` reports for a good run."""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import pytest

from openrlhf_classmate.cli import train_ppo_ray
from openrlhf_classmate.config_fields import option_help
from openrlhf_classmate.integration.classmate_config import ClassmateConfig, EngineConfig
from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.integration.launch.preflight import (
    RANGES,
    PreflightError,
    PreflightReport,
    check_estimator_masks_invalid_scores,
    check_ranges,
    check_tokenizers,
)
from openrlhf_classmate.testing.tiny_models import save_tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_numeric_classmate_and_engine_option_has_a_range():
    numeric = {f"{prefix}.{f.name}" for prefix, cls in (("classmate", ClassmateConfig), ("engine", EngineConfig))
               for f in dataclasses.fields(cls) if "int" in str(f.type) or "float" in str(f.type)}
    assert numeric - set(RANGES) == set(), "give the new option's field a metadata range (config_fields.Bound)"
    assert set(RANGES) - numeric == set()


def test_judge_settings_are_documented_with_range_and_default():
    fields = {f.name: f for f in dataclasses.fields(ClassmateConfig)}
    for name, default in (("judge_timeout_s", 60.0), ("judge_max_retries", 3), ("judge_max_concurrency", 32)):
        assert fields[name].default == default
        help_text = option_help(fields[name])
        assert f"default: {default:g}." in help_text and ("Must be >" in help_text), help_text


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("preflight")
    return save_tiny_model(str(root / "policy"), ["a", "1"], hidden_size=8, num_layers=1, num_heads=2)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml"))), ids=os.path.basename)
def test_the_repository_configs_are_inside_the_ranges(path, tiny):
    import yaml

    alone = (yaml.safe_load(open(path)).get("vrcli") or {}).get("enable")  # VR-CLI runs without a classmate
    classmate = [] if alone else ["--classmate.model_name_or_path", tiny]
    args = parse_args(["--config", path, "--actor.model_name_or_path", tiny, *classmate])
    check_ranges(args)


def test_judge_settings_reach_both_reward_streams(tmp_path):
    from openrlhf_classmate.integration.classmate_config import judge_config_from_args

    args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl",
                       "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
                       "--classmate.judge_base_url", "http://127.0.0.1:9/v1", "--classmate.judge_model", "j",
                       "--classmate.judge_timeout_s", "7.5", "--classmate.judge_max_retries", "0",
                       "--classmate.judge_max_concurrency", "3"])
    judge = judge_config_from_args(args)  # the controller's (classmate answers)
    assert (judge.timeout_s, judge.max_retries, judge.max_concurrency) == (7.5, 0, 3)
    policy = save_tiny_model(str(tmp_path / "policy"), ["a"], hidden_size=8, num_layers=1, num_heads=2)
    args.actor.model_name_or_path = policy
    engine_side = json.loads(train_ppo_ray.reward_env(args)["OPENRLHF_CLASSMATE_JUDGE"])  # the engines' (main)
    assert (engine_side["timeout_s"], engine_side["max_retries"], engine_side["max_concurrency"]) == (7.5, 0, 3)


def test_check_reports_what_it_checked_and_warns_about_a_classmate_without_think_tags(tmp_path, capsys):
    words = ["1", "2", "+", "=", "?"]
    policy = save_tiny_model(str(tmp_path / "policy"), words, hidden_size=8, num_layers=1, num_heads=2)
    chat = [{"role": "user", "content": "1 + 1 = ?"}]
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": chat, "label": json.dumps(
        {"data_source": "gsm8k", "ground_truth": "2", "messages": chat})}) + "\n")
    argv = ["--check", "--actor.model_name_or_path", policy, "--actor.num_gpus_per_node", "1",
            "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--data.prompt_dataset", str(data),
            "--data.input_key", "prompt", "--data.label_key", "label", "--data.apply_chat_template",
            "--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "2", "--rollout.micro_batch_size", "1",
            "--train.batch_size", "4",  # one optimizer step per rollout of 2 x 2 samples
            "--ckpt.path", str(tmp_path / "ckpt"), "--classmate.model_name_or_path", policy,
            "--classmate.classmate_think_open", "<reason>", "--classmate.classmate_think_close", "</reason>"]
    train_ppo_ray.main(argv)
    out, err = capsys.readouterr()
    assert f"--data.prompt_dataset {data}: 1 rows checked (scorers: gsm8k)" in out
    # --logprobs.chunked auto (the default): the policy folder's config read, a plain head, so the chunked path
    assert f"--logprobs.chunked: {policy} has a plain LM head (chunks of 2048 tokens)" in out
    assert out.strip().endswith("check passed: the run would start")
    assert f"warning: classmate tokenizer {policy} has no single token for '<reason>'" in err
    assert not os.path.exists(tmp_path / "ckpt")  # --check writes nothing


def test_tokenizer_check_is_skipped_when_nothing_splits_on_tags():
    args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl",
                       "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
                       "--classmate.final_answer", "whole_response"])

    def never(path):
        raise AssertionError("no tokenizer should be loaded")

    check_tokenizers(args, PreflightReport(), load=never)


def test_hf_engine_refuses_a_batch_that_would_never_run(tmp_path):
    from openrlhf_classmate.integration.rollout.hf_engine import HFEngine

    model = save_tiny_model(str(tmp_path / "m"), ["a"], hidden_size=8, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match=r"--engine.hf_max_batch\) must be >= 1, got 0"):
        HFEngine(model=model, max_batch=0)


def test_gae_is_refused_where_the_registry_reward_can_mark_scores_invalid():
    # gae's critic would regress on a failed score's placeholder 0; the other estimators mask it
    base = ["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl"]
    with pytest.raises(PreflightError, match=r"^--algo.advantage.estimator gae \(upstream's default\) trains its "
                                             r"critic on every score.*: set --algo.advantage.estimator group_norm"):
        check_estimator_masks_invalid_scores(parse_args(base))  # the default reward: the scorer registry
    check_estimator_masks_invalid_scores(parse_args(base + ["--reward.remote_url", "http://127.0.0.1:9/score"]))
    for estimator in ("reinforce", "flash_reinforce"):
        check_estimator_masks_invalid_scores(parse_args(base + ["--algo.advantage.estimator", estimator]))


def _refusal(argv: list[str]) -> str:
    """The one line a launch with ``argv`` stops with (``main`` raising ``SystemExit``)."""
    with pytest.raises(SystemExit) as info:
        train_ppo_ray.main(argv)
    return str(info.value.code)


def _launch_argv(tmp_path) -> list[str]:
    """A launch of a tiny local policy on a one-row dataset (what ``main`` needs up to the point where Ray starts)."""
    policy = save_tiny_model(str(tmp_path / "policy"), ["1", "2", "+", "=", "?"], hidden_size=8, num_layers=1,
                             num_heads=2)
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "1 + 1 = ?"}],
                                "label": json.dumps({"data_source": "gsm8k", "ground_truth": "2"})}) + "\n")
    return ["--actor.model_name_or_path", policy, "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
            "--vllm.num_engines", "1", "--data.prompt_dataset", str(data), "--data.input_key", "prompt",
            "--data.label_key", "label", "--data.apply_chat_template", "--rollout.n_samples_per_prompt", "2",
            "--rollout.batch_size", "2", "--rollout.micro_batch_size", "1", "--train.batch_size", "4",
            "--algo.advantage.estimator", "group_norm"]


def test_a_launch_with_load_enable_says_on_stderr_when_it_starts_fresh_and_refuses_a_folder_without_a_tag(
        tmp_path, capsys, monkeypatch):
    """The real launch path (``main`` without ``--check``) up to the point where Ray would start: ``run`` is
    replaced by a recorder, so the test sees exactly what a user sees before training begins."""
    argv = _launch_argv(tmp_path) + ["--ckpt.load_enable"]
    launched = []
    monkeypatch.setattr(train_ppo_ray, "run", launched.append)
    ckpt = tmp_path / "ckpt"
    capsys.readouterr()  # the tiny model's save progress
    train_ppo_ray.main(argv + ["--ckpt.path", str(ckpt)])
    assert len(launched) == 1
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [f"warning: --ckpt.load_enable: no checkpoint in {ckpt}/_actor yet, the run starts from step 0"]

    (ckpt / "_actor" / "global_step1").mkdir(parents=True)  # a save that died before its first file
    assert _refusal(argv + ["--ckpt.path", str(ckpt)]) == (
        f"error: --ckpt.load_enable: no complete checkpoint to resume from in {ckpt}/_actor: {ckpt}/_actor/"
        "global_step1 has no *model_states.pt file (the save did not finish). Restore the named file(s), or start "
        "without --ckpt.load_enable in another --ckpt.path")
    (ckpt / "_actor" / "global_step1").rmdir()
    with pytest.raises(SystemExit, match=f"error: --ckpt.load_enable: {ckpt}/_actor is empty, so there is no "
                                         "checkpoint to resume from: remove that folder to start fresh there"):
        train_ppo_ray.main(argv + ["--ckpt.path", str(ckpt)])
    assert len(launched) == 1  # refused before Ray


PARTS_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def test_content_parts_pass_where_the_chat_template_renders_them(tmp_path, capsys):
    """OpenAI-style content parts (``[{"type": "text", "text": ...}]``) are accepted for the prompt and the
    classmate's label messages when the models' template renders the parts; the default template of the test
    models prints the list and is refused (tests/test_bad_inputs.py)."""
    from transformers import AutoTokenizer

    from openrlhf_classmate.data.messages import renders_parts

    words = ["1", "2", "+", "=", "?"]
    policy = save_tiny_model(str(tmp_path / "policy"), words, hidden_size=8, num_layers=1, num_heads=2,
                             chat_template=PARTS_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    assert renders_parts(tokenizer)
    parts = [{"role": "system", "content": "x"}, {"role": "user", "content": [{"type": "text", "text": "1 + 1 = ?"}]}]
    assert "1 + 1 = ?<eos>" in tokenizer.apply_chat_template(parts, tokenize=False)
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": parts, "label": json.dumps(
        {"data_source": "gsm8k", "ground_truth": "2", "messages": parts})}) + "\n")
    train_ppo_ray.main(["--check", "--actor.model_name_or_path", policy, "--actor.num_gpus_per_node", "1",
                        "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--data.prompt_dataset", str(data),
                        "--data.input_key", "prompt", "--data.label_key", "label", "--data.apply_chat_template",
                        "--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "2",
                        "--rollout.micro_batch_size", "1", "--train.batch_size", "4",
                        "--classmate.model_name_or_path", policy])
    out, err = capsys.readouterr()
    assert out.strip().endswith("check passed: the run would start"), err


def test_a_fresh_run_into_a_folder_of_earlier_checkpoints_is_refused_before_ray(tmp_path, capsys, monkeypatch):
    # without --ckpt.load_enable a run saved into the earlier run's --ckpt.path: the rotation (--ckpt.max_num) then
    # removed the new run's own HF folders (the earlier run's had higher step numbers) and the earlier DeepSpeed tags,
    # leaving the two runs mixed in one folder
    argv = _launch_argv(tmp_path) + ["--ckpt.save_steps", "2", "--ckpt.save_hf"]
    launched = []
    monkeypatch.setattr(train_ppo_ray, "run", launched.append)
    ckpt = tmp_path / "ckpt"
    capsys.readouterr()
    train_ppo_ray.main(argv + ["--ckpt.path", str(ckpt)])  # a new folder
    (ckpt / "_actor" / "global_step4").mkdir(parents=True)
    (ckpt / "global_step4_hf").mkdir()
    assert _refusal(argv + ["--ckpt.path", str(ckpt)]) == (
        f"error: --ckpt.path {ckpt} holds checkpoints of an earlier run (_actor/global_step4, global_step4_hf): a new "
        "run saving there (--ckpt.save_steps 2) would rotate them out and mix its own in; resume that run with "
        "--ckpt.load_enable, or give another --ckpt.path, or move them away")
    train_ppo_ray.main(argv[:-3] + ["--ckpt.path", str(ckpt)])  # a run that saves no checkpoint there: fine
    assert len(launched) == 2


# the scorers a row meets, classmate-only flags, engines' memory, the sandbox request's time limit
BASE = ["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl", "--actor.num_gpus_per_node", "1",
        "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--rollout.n_samples_per_prompt", "2"]
CLASSMATE = ["--classmate.model_name_or_path", "c"]


def test_each_row_is_checked_by_every_registry_scorer_it_meets():
    from openrlhf_classmate.integration.launch.preflight_data import row_scorers

    remote = ["--reward.remote_url", "http://127.0.0.1:9/score"]
    assert row_scorers(parse_args(BASE)) == (("", "auto"),)  # the registry reward, each label's data_source
    assert row_scorers(parse_args(BASE + CLASSMATE)) == (("", "auto"),)  # the classmate's answers: the same scorer
    both = parse_args(BASE + CLASSMATE + ["--classmate.main_scorer", "gsm8k", "--classmate.scorer", "math_verify"])
    assert row_scorers(both) == (("--classmate.main_scorer", "gsm8k"), ("--classmate.scorer", "math_verify"))
    assert row_scorers(both, classmate_answers=False) == (("--classmate.main_scorer", "gsm8k"),)  # eval rows
    assert row_scorers(parse_args(BASE + CLASSMATE + remote)) == ()  # the user's reward scores both
    assert row_scorers(parse_args(BASE + CLASSMATE + remote + ["--classmate.scorer", "gsm8k"])) == (
        ("--classmate.scorer", "gsm8k"),)


def test_eval_rows_are_not_checked_against_the_classmate_scorer(tmp_path, capsys):
    """Evaluation scores the main answers only: eval rows that the classmate's scorer could not use pass."""
    chat = [{"role": "user", "content": "1 + 1 = ?"}]
    policy = save_tiny_model(str(tmp_path / "policy"), ["1", "2", "+", "=", "?", "A"], hidden_size=8, num_layers=1,
                             num_heads=2)

    def rows(name: str, truth: str) -> str:
        path = tmp_path / name
        path.write_text(json.dumps({"prompt": chat, "label": json.dumps(
            {"data_source": "gsm8k", "ground_truth": truth, "messages": chat})}) + "\n")
        return str(path)

    # gsm8k (the main answers') takes 2.5, arithmetic (the classmate's) integers only
    argv = ["--check", *BASE, *CLASSMATE, "--actor.model_name_or_path", policy, "--classmate.model_name_or_path",
            policy, "--data.prompt_dataset", rows("train.jsonl", "2"), "--eval.dataset", rows("eval.jsonl", "2.5"),
            "--data.input_key", "prompt", "--data.label_key", "label", "--data.apply_chat_template",
            "--rollout.batch_size", "2", "--rollout.micro_batch_size", "1", "--train.batch_size", "4",
            "--ckpt.path", str(tmp_path / "ckpt"),
            "--classmate.scorer", "arithmetic"]
    train_ppo_ray.main(argv)
    assert capsys.readouterr().out.strip().endswith("check passed: the run would start")
    assert _refusal(argv + ["--data.prompt_dataset", str(tmp_path / "eval.jsonl")]) == (
        f"error: {tmp_path}/eval.jsonl:1: field 'label': --classmate.scorer arithmetic scores every row's classmate "
        "answers and cannot use this label (data_source 'arithmetic', field 'ground_truth': '2.5' is not an integer); "
        "set --classmate.scorer to a scorer that fits these rows (auto: each label's data_source)")


def test_options_that_act_without_a_classmate_are_not_refused_without_one():
    from openrlhf_classmate.integration.launch.preflight import check_classmate_only_flags

    args = parse_args(BASE + ["--classmate.think_open", "<reason>", "--classmate.think_close", "</reason>",
                              "--classmate.final_answer", "whole_response", "--classmate.main_scorer", "gsm8k",
                              "--classmate.loss_agg_mode", "seq-mean-token-mean", "--classmate.judge_timeout_s", "5",
                              "--classmate.stop_after_invalid_steps", "0", "--rollout.max_new_tokens", "8"])
    check_classmate_only_flags(args)
    check_classmate_only_flags(parse_args(BASE + CLASSMATE + ["--classmate.placement", "share"]))
    with pytest.raises(PreflightError, match=r"^--classmate.gdpo_weights 1 0, --classmate.seed_requests need a "
                                             r"classmate"):
        check_classmate_only_flags(parse_args(BASE + ["--classmate.gdpo_weights", "1", "0",
                                                      "--classmate.seed_requests"]))


@pytest.mark.parametrize("flags, refused", [
    (["--classmate.placement", "share"], True),
    (["--classmate.placement", "separate"], False),  # GPUs of their own
    (["--classmate.placement", "colocate", "--train.colocate_actor_ref"], False),  # beside the actor, not the engines
    (["--classmate.placement", "colocate", "--train.colocate_all", "--vllm.enable_sleep"], True),
])
def test_engine_memory_fractions_are_checked_where_both_engine_groups_share_gpus(flags, refused):
    from openrlhf_classmate.integration.launch.preflight import check_engine_memory

    args = parse_args(BASE + CLASSMATE + flags + ["--vllm.gpu_memory_utilization", "0.8"])
    args.engine.backend = "vllm"  # as resolved where vLLM is installed
    if refused:
        with pytest.raises(PreflightError, match=r"^--vllm.gpu_memory_utilization 0.8 \+ "
                                                 r"--classmate.gpu_memory_utilization 0.3 = 1.1 of each GPU"):
            check_engine_memory(args)
    else:
        check_engine_memory(args)
    args.engine.backend = "hf"  # HF engines reserve no fraction
    check_engine_memory(args)
    args.engine.backend, args.vllm.gpu_memory_utilization = "vllm", 0.6
    check_engine_memory(args)


def test_the_sandbox_request_time_limit_must_exceed_the_sandbox_default_per_test(monkeypatch):
    """Code rows without max_execution_time get the sandbox's --default-time-limit (read from its /health): one
    request, all of a row's tests, must be allowed more than that."""
    import http.server

    from openrlhf_classmate.integration.launch.preflight_data import _check_code_time_limits, _Lengths
    from openrlhf_classmate.testing.servers import QuietHandler, serve_in_thread

    class Health(QuietHandler):
        def do_GET(self):  # noqa: N802
            self.reply(200, {"limits": {"max_time_limit_s": 60.0, "default_time_limit_s": 10.0}})

    with serve_in_thread(http.server.HTTPServer(("127.0.0.1", 0), Health)) as server:
        monkeypatch.setenv("OPENRLHF_CLASSMATE_SANDBOX_URL", f"http://127.0.0.1:{server.server_port}")
        found = _Lengths(first_use={"code": "d.jsonl:1"}, code_default="d.jsonl:3")
        _check_code_time_limits(found, PreflightReport())  # the default 600 s per request
        monkeypatch.setenv("OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT", "5")
        with pytest.raises(PreflightError, match=r"^OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT 5 s, the time limit of one "
                                                 r"sandbox request .* is not above d.jsonl:3: the sandbox's "
                                                 r"--default-time-limit .* 10 s per test"):
            _check_code_time_limits(found, PreflightReport())
        monkeypatch.setenv("OPENRLHF_CLASSMATE_CODE_TIME_LIMIT", "2")  # replaces the sandbox's default
        _check_code_time_limits(found, PreflightReport())
