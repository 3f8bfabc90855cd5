"""Every bad input tried against the tools, as one table: what a user gave and the one line it must produce.

Each row names the tool, builds the input in a temporary world (tiny local models, small data files), runs the tool's
real entry point in-process (the launcher's ``main(["--check", ...])``, a setup_data script's ``main``,
``evaluate.main``, ``convert_checkpoint.main``, the sandbox's command line and its real app (requests through
FastAPI's test client), or the scoring API) and checks the outcome: for the command-line tools exactly one
``error:`` line, no traceback, a non-zero exit status, and the substrings that name the flag, the file (and line) or
the field; for scoring calls and sandbox requests the exception type, the (invalid / zero) score and its reason, or
the HTTP status and error. A few rows are inputs that must still pass, with a warning (a torn checkpoint with a
complete older one, prompts longer than --data.max_len leaves room for, a sandbox not reachable at --check time).

Rows are grouped by class (LAUNCHER, CHAT: chat messages; NUMBERS: non-finite / out-of-range numbers in every flag
group, upstream's floats and the environment, think-tag pairs; MORE_PREFLIGHT: what used to pass the preflight and
fail inside Ray; FIT: rows against every scorer they meet, judges, time limits' lower bounds, prompt turns,
classmate-only flags, engines' memory; YAML; SETUP_DATA; SCORING; SANDBOX; CONVERT; EVALUATE): a new bad input joins
its class.
``test_launcher_subprocess`` repeats two rows through a real ``python -m ... --check`` process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from openrlhf_classmate.testing.tiny_models import save_tiny_model

REPO = Path(__file__).resolve().parents[1]
WORDS = ["0", "1", "2", "3", "4", "+", "=", "?"]


# ── the world ────────────────────────────────────────────────────────────────────────────────────────────────────


def _jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _row(data_source: str = "arithmetic", truth: str = "2", messages: bool = True, **extra) -> dict:
    chat = [{"role": "user", "content": "1 + 1 = ?"}]
    label = {"data_source": data_source, "ground_truth": truth, **extra}
    if messages:
        label["messages"] = chat
    return {"prompt": chat, "label": json.dumps(label)}


@pytest.fixture(scope="module")
def w(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bad_inputs")
    kw = dict(hidden_size=8, num_layers=1, num_heads=2)
    world = {
        "root": root,
        "policy": save_tiny_model(str(root / "policy"), WORDS, **kw),
        "classmate": save_tiny_model(str(root / "classmate"), WORDS, seed=1, **kw),
        "data": _jsonl(root / "train.jsonl", [_row() for _ in range(4)]),
        "judge_data": _jsonl(root / "helpful.jsonl", [
            _row("helpful_instructions", None, raw_question_for_monitor="1 + 1 = ?") for _ in range(4)]),
    }
    no_config = root / "no_config"
    no_config.mkdir()
    (no_config / "tokenizer.json").write_text("{}")
    world["no_config"] = str(no_config)
    world["a_file"] = _jsonl(root / "a_file.txt", ["not a folder"])
    world["small_vocab"] = _shrunk_embedding(world["policy"], root / "small_vocab")
    world["other_vocab"] = save_tiny_model(str(root / "other_vocab"), [*WORDS, "5"], seed=2, **kw)
    return world


def _shrunk_embedding(model: str, path: Path) -> str:
    """A copy of ``model`` whose config declares 3 embedding rows fewer than its tokenizer has tokens."""
    import shutil

    shutil.copytree(model, path)
    config = json.loads((path / "config.json").read_text())
    config["vocab_size"] -= 3
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def launcher_argv(w: dict, *extra: str, classmate: bool = True, data: str | None = None) -> list[str]:
    root = w["root"]
    argv = [
        "--actor.model_name_or_path", w["policy"], "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--vllm.num_engines", "1", "--data.prompt_dataset", data or w["data"], "--data.input_key", "prompt",
        "--data.label_key", "label", "--data.apply_chat_template", "--data.max_len", "64",
        "--rollout.max_new_tokens", "16", "--rollout.batch_size", "4", "--rollout.micro_batch_size", "4",
        "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16", "--train.micro_batch_size", "4",
        "--ckpt.path", str(root / "run" / "ckpt"), "--ckpt.output_dir", str(root / "run" / "final"),
        "--logger.tensorboard_dir", str(root / "run" / "tb"),
    ]
    if classmate:
        argv += ["--classmate.model_name_or_path", w["classmate"], "--classmate.max_new_tokens", "8"]
    else:
        argv += ["--algo.advantage.estimator", "group_norm"]
    return argv + list(extra)


# ── runners: (exit status, text the user sees) ──────────────────────────────────────────────────────────────────


def _capture(fn: Callable[[], int | None]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = fn() or 0
        except SystemExit as e:
            if isinstance(e.code, str):
                err.write(e.code + "\n")
                code = 1
            else:
                code = e.code or 0
    return code, err.getvalue()


def run_launcher(argv: list[str]) -> tuple[int, str]:
    from openrlhf_classmate.cli import train_ppo_ray

    return _capture(lambda: train_ppo_ray.main(["--check", *argv]))


def run_setup_data(script: str, argv: list[str]) -> tuple[int, str]:
    spec = importlib.util.spec_from_file_location(f"setup_data_{script}", REPO / "setup_data" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return _capture(lambda: module.main(argv))


def run_evaluate(argv: list[str]) -> tuple[int, str]:
    from openrlhf_classmate.cli import evaluate

    return _capture(lambda: evaluate.main(argv))


def run_convert(argv: list[str]) -> tuple[int, str]:
    from openrlhf_classmate.cli import convert_checkpoint

    return _capture(lambda: convert_checkpoint.main(argv))


# ── the table ────────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class Case:
    id: str
    tool: str
    """launcher, yaml, setup_data, scoring, convert or evaluate."""
    run: Callable[[dict, Path], tuple[int, str]]
    """(world, tmp dir) -> (exit status, output); scoring rows return (0, description of the outcome)."""
    expect: tuple[str, ...]
    """Substrings of the error line (or of the outcome for scoring rows / warnings for passing rows)."""
    passes: bool = False
    """The input is bad but usable: exit status 0 (the expected text is a warning)."""
    outcome: bool = False
    """An API call, not a command: ``run`` returns (0, what happened) (raised exception or scores)."""


def L(id_: str, extra: Callable[[dict, Path], list[str]] | list[str], *expect: str, classmate: bool = True,
      data: Callable[[dict, Path], str] | None = None, passes: bool = False, tool: str = "launcher") -> Case:
    def run(w, tmp):
        flags = extra(w, tmp) if callable(extra) else extra
        return run_launcher(launcher_argv(w, *flags, classmate=classmate, data=data(w, tmp) if data else None))
    return Case(id_, tool, run, expect, passes)


def D(id_: str, rows: list, *expect: str, classmate: bool = True, suffix: str = ".jsonl", raw: bytes | None = None,
      extra: list[str] = (), passes: bool = False) -> Case:
    """A launcher row whose prompt dataset holds ``rows`` (or the bytes ``raw``)."""
    def data(w, tmp):
        path = tmp / f"data{suffix}"
        if raw is not None:
            path.write_bytes(raw)
            return str(path)
        return _jsonl(path, rows)
    return L(id_, list(extra), *expect, classmate=classmate, data=data, passes=passes)


def Y(id_: str, text: str | bytes, *expect: str) -> Case:
    def run(w, tmp):
        path = tmp / "run.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return run_launcher(launcher_argv(w, "--config", str(path)))
    return Case(id_, "yaml", run, expect)


def _torn_ckpt(tmp: Path, *, break_older: bool) -> str:
    """A --ckpt.path whose latest tag (global_step2) has a truncated model file; the older tag is complete unless
    ``break_older``."""
    ckpt = tmp / "ckpt"
    for step in (1, 2):
        tag = ckpt / "_actor" / f"global_step{step}"
        tag.mkdir(parents=True)
        torch.save({"module": {"w": torch.zeros(4)}}, tag / "mp_rank_00_model_states.pt")
        torch.save({"optimizer_state_dict": {}}, tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (ckpt / "_actor" / "latest").write_text("global_step2")
    model = ckpt / "_actor" / "global_step2" / "mp_rank_00_model_states.pt"
    model.write_bytes(model.read_bytes()[:100])
    if break_older:
        (ckpt / "_actor" / "global_step1" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    return str(ckpt)


LAUNCHER = [
    L("actor path missing", lambda w, t: ["--actor.model_name_or_path", str(t / "nope")],
      "--actor.model_name_or_path", "nope does not exist"),
    L("actor path is a file", lambda w, t: ["--actor.model_name_or_path", w["a_file"]],
      "--actor.model_name_or_path", "is a file"),
    L("actor folder without config.json", lambda w, t: ["--actor.model_name_or_path", w["no_config"]],
      "--actor.model_name_or_path", "no config.json"),
    L("classmate path missing", lambda w, t: ["--classmate.model_name_or_path", "./missing_classmate"],
      "--classmate.model_name_or_path", "missing_classmate does not exist"),
    L("dataset missing", lambda w, t: ["--data.prompt_dataset", str(t / "missing.jsonl")],
      "--data.prompt_dataset", "missing.jsonl does not exist"),
    D("dataset line not JSON", [_row(), "{not json"], "data.jsonl:2", "invalid JSON"),
    D("dataset not UTF-8", [], "data.jsonl", "not valid UTF-8", raw=b'{"prompt": "caf\xe9"}\n'),
    D("dataset empty", [], "data.jsonl", "empty input file", raw=b""),
    D("dataset line not an object", [_row(), "[1, 2]"], "data.jsonl:2", "expected a JSON object"),
    D("prompt field missing", [_row(), {"label": _row()["label"]}], "data.jsonl:2", "field 'prompt' missing",
      "--data.input_key"),
    D("prompt field of the wrong type", [{"prompt": 7, "label": _row()["label"]}], "data.jsonl:1", "field 'prompt'"),
    D("label field missing", [{"prompt": "1 + 1 = ?"}], "data.jsonl:1", "field 'label' missing", "--data.label_key"),
    D("label not JSON", [{"prompt": "1 + 1 = ?", "label": "{oops"}], "data.jsonl:1", "field 'label'",
      "not valid JSON"),
    D("label without data_source", [{"prompt": "x", "label": json.dumps({"ground_truth": "1"})}], "data.jsonl:1",
      "data_source"),
    D("unknown data_source (typo)", [_row("gsm8kk", "2")], "data.jsonl:1", "no scorer", "Did you mean 'gsm8k'"),
    D("data_source in the wrong case", [_row("GSM8K", "2")], "data.jsonl:1", "case-sensitive"),
    D("gsm8k ground truth not a number", [_row("gsm8k", "two")], "data.jsonl:1", "ground_truth", "not a number"),
    D("sycophancy label without the question", [_row("helpful_instructions", None)], "data.jsonl:1",
      "raw_question_for_monitor"),
    D("classmate label without messages", [_row(messages=False)], "data.jsonl:1", "no 'messages' list"),
    L("judge-scored data, classmate run, no judge", [], "helpful.jsonl:1", "--classmate.judge_base_url",
      data=lambda w, t: w["judge_data"]),
    L("judge-scored data, plain GRPO, no judge", [], "helpful.jsonl:1", "LLM judge", "--classmate.judge_model",
      classmate=False, data=lambda w, t: w["judge_data"]),
    L("eval dataset with a bad row", lambda w, t: ["--eval.dataset", _jsonl(t / "eval.jsonl", [_row(), "oops"])],
      "eval.jsonl:2", "invalid JSON"),
    L("label key unset with the registry reward", ["--data.label_key", ""], "--data.label_key is not set"),
    L("prompt_probs count mismatch", ["--data.prompt_probs", "0.5,0.5"], "--data.prompt_probs", "2 values for 1"),
    L("judge URL without scheme", ["--classmate.judge_base_url", "127.0.0.1:8000/v1", "--classmate.judge_model", "j"],
      "--classmate.judge_base_url", "http(s) URL"),
    L("judge URL without model", ["--classmate.judge_base_url", "http://127.0.0.1:8000/v1"],
      "--classmate.judge_model"),
    L("judge model without URL", ["--classmate.judge_model", "j"], "--classmate.judge_base_url"),
    L("classmate temperature 3", ["--classmate.temperature", "3"], "--classmate.temperature", "in [0, 2]", "3"),
    L("classmate top_p 0", ["--classmate.top_p", "0"], "--classmate.top_p", "(0, 1]"),
    L("classmate weights nan", ["--classmate.weights", "nan"], "--classmate.weights"),
    L("classmate weights all zero", ["--classmate.weights", "0"], "--classmate.weights"),
    L("gdpo weights all zero", ["--classmate.gdpo_weights", "0", "0"], "--classmate.gdpo_weights", "all zero"),
    L("gdpo weight infinite", ["--classmate.gdpo_weights", "inf", "1"], "--classmate.gdpo_weights"),
    L("classmate clip range not positive", ["--classmate.eps_clip_low_high", "0", "0.2"],
      "--classmate.eps_clip_low_high", "> 0"),
    L("classmate dual clip below 1", ["--classmate.dual_clip", "0.5"], "--classmate.dual_clip", "> 1"),
    L("hf_max_batch 0 (used to hang)", ["--engine.hf_max_batch", "0"], "--engine.hf_max_batch", ">= 1"),
    L("classmate max_context leaves no room", ["--classmate.max_context", "8"], "--classmate.max_context",
      "no room"),
    L("classmate samples 0", ["--classmate.samples", "0"], "--classmate.samples"),
    L("keep_min above keep_max", ["--classmate.keep_min", "0.9", "--classmate.keep_max", "0.2"],
      "--classmate.keep_min"),
    L("judge timeout 0", ["--classmate.judge_timeout_s", "0"], "--classmate.judge_timeout_s", ">= 1"),
    L("judge retries negative", ["--classmate.judge_max_retries", "-1"], "--classmate.judge_max_retries", ">= 0"),
    L("judge concurrency 0", ["--classmate.judge_max_concurrency", "0"], "--classmate.judge_max_concurrency"),
    L("classmate gpu memory 1.5", ["--classmate.gpu_memory_utilization", "1.5"],
      "--classmate.gpu_memory_utilization"),
    L("ckpt path is a file", lambda w, t: ["--ckpt.path", w["a_file"]], "--ckpt.path", "is a file"),
    L("output dir under a file", lambda w, t: ["--ckpt.output_dir", w["a_file"] + "/final"], "--ckpt.output_dir",
      "is a file"),
    L("tensorboard dir is a file", lambda w, t: ["--logger.tensorboard_dir", w["a_file"]],
      "--logger.tensorboard_dir", "is a file"),
    L("ckpt path under /proc (permission bits say writable to root)",
      ["--ckpt.path", "/proc/openrlhf_classmate_x/ckpt"], "--ckpt.path", "/proc/openrlhf_classmate_x/ckpt", "cannot"),
    L("think tag not a token of the policy", ["--classmate.think_close", "</reasoning>"],
      "--classmate.think_close", "not one token"),
    L("after_think reward without the tag", ["--classmate.think_close", "</reasoning>"],
      "--classmate.think_close", "whole_response", classmate=False),
    L("group estimator with one sample (upstream assert)", ["--rollout.n_samples_per_prompt", "1"],
      "--algo.advantage.estimator group_norm", "--rollout.n_samples_per_prompt >= 2", classmate=False),
    L("unknown estimator", ["--classmate.estimator", "gdpoo"], "--classmate.estimator", "invalid choice"),
    L("not a number", ["--rollout.batch_size", "four"], "--rollout.batch_size", "invalid int value"),
    L("unknown flag", ["--classmate.temprature", "1"], "unrecognized arguments", "--classmate.temprature"),
    L("zero GPUs per node", ["--actor.num_gpus_per_node", "0"], "--actor.num_gpus_per_node", ">= 1"),
    L("max_len below max_new_tokens", ["--data.max_len", "16"], "--data.max_len", "--rollout.max_new_tokens"),
    L("ckpt.max_num 0", ["--ckpt.max_num", "0"], "--ckpt.max_num"),
    L("classmate estimator without classmate", ["--classmate.estimator", "gdpo"], "needs a classmate",
      classmate=False),
    L("classmate without policy engines", ["--vllm.num_engines", "0"], "--vllm.num_engines >= 1"),
    L("resume with every checkpoint torn", lambda w, t: ["--ckpt.path", _torn_ckpt(t, break_older=True), "--ckpt.load_enable"],
      "--ckpt.load_enable", "mp_rank_00_model_states.pt is cut short", "global_step1 has no *optim_states.pt"),
    L("resume from an empty _actor folder", lambda w, t: ["--ckpt.path", _resume_dir(t, "empty"), "--ckpt.load_enable"],
      "--ckpt.load_enable", "_actor is empty", "no checkpoint to resume from"),
    L("resume from an _actor folder of other files", lambda w, t: ["--ckpt.path", _resume_dir(t, "other"),
                                                                   "--ckpt.load_enable"],
      "--ckpt.load_enable", "no 'latest' file and no global_stepN/ folder (only notes.txt)"),
    L("resume with --ckpt.path set to the _actor folder", lambda w, t: ["--ckpt.path", _resume_dir(t, "actor"),
                                                                        "--ckpt.load_enable"],
      "--ckpt.load_enable", "holds DeepSpeed tags itself", "pass the folder above it as --ckpt.path"),
    L("resume from Hugging Face saves only", lambda w, t: ["--ckpt.path", _resume_dir(t, "hf"), "--ckpt.load_enable"],
      "--ckpt.load_enable", "holds Hugging Face saves (global_step2_hf) but no DeepSpeed checkpoint"),
    L("resume with nothing saved yet", lambda w, t: ["--ckpt.path", str(t / "new"), "--ckpt.load_enable"],
      "--ckpt.load_enable: no checkpoint in", "the run starts from step 0", passes=True),
    L("resume over a torn latest checkpoint", lambda w, t: ["--ckpt.path", _torn_ckpt(t, break_older=False),
                                                             "--ckpt.load_enable"],
      "global_step2/mp_rank_00_model_states.pt is cut short", "resuming from global_step1", passes=True),
]


def _resume_dir(tmp: Path, kind: str) -> str:
    """A --ckpt.path with an ``_actor`` folder that is empty / holds other files, the ``_actor`` folder itself, or
    a --ckpt.path with only an HF save."""
    ckpt = tmp / "ckpt"
    if kind == "actor":
        return _torn_ckpt(tmp, break_older=False) + "/_actor"
    if kind == "hf":
        (ckpt / "global_step2_hf").mkdir(parents=True)
        return str(ckpt)
    (ckpt / "_actor").mkdir(parents=True)
    if kind == "other":
        (ckpt / "_actor" / "notes.txt").write_text("not a checkpoint")
    return str(ckpt)


# chat messages as the chat template needs them (the prompt field, and the label's messages that the
# classmate renders with its own template)
def _chat(content, role: str = "user") -> list[dict]:
    return [{"role": role, "content": content}]


def _chat_row(prompt: list, label_messages: list | None = None) -> dict:
    label = {"data_source": "arithmetic", "ground_truth": "2", "messages": label_messages or _chat("1 + 1 = ?")}
    return {"prompt": prompt, "label": json.dumps(label)}


CHAT = [
    D("chat content null", [_chat_row(_chat(None))], "data.jsonl:1", "field 'prompt'", "message 0", "null"),
    D("chat content a number", [_chat_row(_chat(7))], "data.jsonl:1", "message 0", "content", "int"),
    D("chat content an object", [_chat_row(_chat({"text": "1 + 1"}))], "data.jsonl:1", "message 0", "dict"),
    D("chat content parts the template prints as a list", [_chat_row(_chat([{"type": "text", "text": "1 + 1"}]))],
      "data.jsonl:1", "content parts", "chat template"),
    D("chat content part without text", [_chat_row(_chat([{"type": "image_url", "image_url": "x.png"}]))],
      "data.jsonl:1", "message 0"),
    D("chat unknown role", [_chat_row(_chat("1 + 1 = ?", role="usr"))], "data.jsonl:1", "unknown role 'usr'"),
    D("chat role not a string", [_chat_row([{"role": 1, "content": "1 + 1 = ?"}])], "data.jsonl:1", "role"),
    D("chat empty content", [_chat_row(_chat("  "))], "data.jsonl:1", "message 0", "empty"),
    D("chat message not an object", [_chat_row(["1 + 1 = ?"])], "data.jsonl:1", "message 0", "str"),
    D("chat message without content", [_chat_row([{"role": "user"}])], "data.jsonl:1", "message 0", "content"),
    D("chat error in a later message", [_chat_row([{"role": "system", "content": "be brief"}, *_chat(None)])],
      "data.jsonl:1", "message 1", "null"),
    D("classmate label messages with null content", [_chat_row(_chat("1 + 1 = ?"), _chat(None))], "data.jsonl:1",
      "field 'label'", "messages", "message 0", "null"),
    D("classmate label messages with an unknown role", [_chat_row(_chat("1 + 1 = ?"), _chat("x", role="bot"))],
      "data.jsonl:1", "field 'label'", "unknown role 'bot'"),
    D("classmate label messages with content parts", [_chat_row(_chat("1 + 1 = ?"),
                                                                _chat([{"type": "text", "text": "1 + 1"}]))],
      "data.jsonl:1", "field 'label'", "content parts"),
]


# every number finite and in range (argparse types of every group, upstream's floats, environment)
def _env_launcher(env: dict[str, str], *expect: str) -> Case:
    def run(w, tmp):
        with _env(**env):
            return run_launcher(launcher_argv(w))
    return Case(f"environment {' '.join(f'{k}={v}' for k, v in env.items())}", "launcher", run, expect)


def _stale_build_lock(w, tmp):
    # a lock file in an op's build folder, left an hour ago by a build that was killed
    lock = tmp / "torch_extensions" / "cpu_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with _env(TORCH_EXTENSIONS_DIR=str(tmp / "torch_extensions")):
        return run_launcher(launcher_argv(w))


NUMBERS = [
    L("vrcli thresholds nan", ["--vrcli.thresholds", "nan", "1"], "--vrcli.thresholds", "finite", "nan"),
    L("vrcli ladder reward inf", ["--vrcli.ladder_rewards", "0", "inf"], "--vrcli.ladder_rewards", "finite"),
    L("tinyv timeout inf", ["--tinyv.timeout_s", "inf"], "--tinyv.timeout_s", "finite"),
    L("tinyv backoff nan", ["--tinyv.backoff_s", "nan"], "--tinyv.backoff_s", "finite"),
    L("tinyv weight nan", ["--tinyv.weight", "nan"], "--tinyv.weight", "finite"),
    L("darling lambda nan", ["--darling.lambda_quality", "nan"], "--darling.lambda_quality", "finite"),
    L("darling quality values inf", ["--darling.quality_values", "inf", "0"], "--darling.quality_values", "finite"),
    L("darling timeout inf", ["--darling.timeout_s", "inf"], "--darling.timeout_s", "finite"),
    L("classmate reward weight -inf", ["--classmate.reward_weight=-inf"], "--classmate.reward_weight", "finite"),
    L("classmate judge timeout inf", ["--classmate.judge_timeout_s", "inf"], "--classmate.judge_timeout_s", "finite"),
    L("upstream learning rate nan", ["--actor.adam.lr", "nan"], "--actor.adam.lr", "finite"),
    L("upstream kl coefficient inf", ["--algo.kl.init_coef", "inf"], "--algo.kl.init_coef", "finite"),
    L("upstream clip range nan", ["--reward.clip_range", "nan", "1"], "--reward.clip_range", "NaN"),
    L("upstream temperature nan", ["--rollout.temperature", "nan"], "--rollout.temperature", "finite"),
    _env_launcher({"OPENRLHF_CLASSMATE_CODE_TIME_LIMIT": "inf"}, "OPENRLHF_CLASSMATE_CODE_TIME_LIMIT", "finite"),
    _env_launcher({"OPENRLHF_CLASSMATE_CODE_TIME_LIMIT": "nan"}, "OPENRLHF_CLASSMATE_CODE_TIME_LIMIT", "finite"),
    _env_launcher({"OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT": "nan"}, "OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT", "finite"),
    L("think tags identical", ["--classmate.think_open", "</think>"], "--classmate.think_open",
      "--classmate.think_close", "same tag"),
    L("think tags swapped", ["--classmate.think_open", "</think>", "--classmate.think_close", "<think>"],
      "--classmate.think_open", "swapped"),
    L("classmate think tags identical", ["--classmate.classmate_think_close", "<think>"],
      "--classmate.classmate_think_open", "same tag"),
    L("classmate think tags swapped", ["--classmate.classmate_think_open", "</think>",
                                       "--classmate.classmate_think_close", "<think>"],
      "--classmate.classmate_think_open", "swapped"),
    L("think tags swapped, after_think reward without a classmate", ["--classmate.think_open", "</think>",
                                                                     "--classmate.think_close", "<think>"],
      "swapped", classmate=False),
    D("code test time limit NaN in a row", [{"prompt": "x", "label": json.dumps(
        {"data_source": "code", "tests": ["assert 1"], "max_execution_time": float("nan")})}],
      "data.jsonl:1", "max_execution_time", classmate=False),
]


def _long_prompt_rows(words: int) -> list[dict]:
    return [_row(), _chat_row(_chat(" ".join(["1"] * words)), _chat(" ".join(["1"] * words)))]


# the preflight's list: what used to pass the preflight and fail later, inside Ray
MORE_PREFLIGHT = [
    Case("a build lock left by a killed DeepSpeed op build", "launcher", _stale_build_lock,
         ("cpu_adam/lock", "60 min old", "wait for it forever", "rm ")),
    D("prompts longer than --data.max_len leaves room for", _long_prompt_rows(60), "1 of 2 prompts",
      "longer than 48 tokens", "--data.max_len", passes=True),
    D("classmate prompt alone over --classmate.max_context", _long_prompt_rows(60),
      "--classmate.max_context 72", "1 of 2 rows", passes=True),
    L("classmate scorer unknown", ["--classmate.scorer", "gsm8kk"], "--classmate.scorer", "Did you mean 'gsm8k'"),
    L("main scorer unknown", ["--classmate.main_scorer", "mathverify"], "--classmate.main_scorer", "no scorer"),
    D("bad row beyond --data.max_samples", [_row(), _row(), "{oops"], "data.jsonl:3", "invalid JSON",
      extra=["--data.max_samples", "1"]),
    L("policy tokenizer larger than its embedding", lambda w, t: ["--actor.model_name_or_path", w["small_vocab"]],
      "--actor.model_name_or_path", "vocab_size"),
    L("classmate tokenizer larger than its embedding", lambda w, t: ["--classmate.model_name_or_path",
                                                                      w["small_vocab"]],
      "--classmate.model_name_or_path", "vocab_size"),
    D("dataset compressed (.jsonl.gz)", [], "data.jsonl.gz", "compressed", suffix=".jsonl.gz",
      raw=__import__("gzip").compress(b'{"prompt": "x"}\n')),
    D("dataset of a format the loader cannot read (.txt)", [], "data.txt", ".jsonl", suffix=".txt", raw=b"x\n"),
    D("dataset suffix in capitals (.JSONL)", [_row()], "data.JSONL", "case-sensitively", "rename", suffix=".JSONL"),
    L("eval dataset compressed", lambda w, t: ["--eval.dataset", str((t / "eval.jsonl.gz").write_bytes(
        __import__("gzip").compress(b"{}\n")) and t / "eval.jsonl.gz")], "--eval.dataset", "eval.jsonl.gz",
      "compressed"),
    L("max_samples 0", ["--data.max_samples", "0"], "--data.max_samples", ">= 1"),
    L("max_samples negative", ["--data.max_samples", "-5"], "--data.max_samples", ">= 1"),
    L("max_epochs 0", ["--train.max_epochs", "0"], "--train.max_epochs", ">= 1"),
    L("num_episodes 0", ["--train.num_episodes", "0"], "--train.num_episodes", ">= 1"),
    L("train batch size 0", ["--train.batch_size", "0"], "--train.batch_size", ">= 1"),
    L("train micro batch size 0", ["--train.micro_batch_size", "0"], "--train.micro_batch_size", ">= 1"),
    L("vllm tensor parallel 0", ["--vllm.tensor_parallel_size", "0"], "--vllm.tensor_parallel_size", ">= 1"),
    L("eval steps 0 (modulo by zero)", ["--eval.steps", "0"], "--eval.steps", "-1"),
    L("save steps 0 (modulo by zero)", ["--ckpt.save_steps", "0"], "--ckpt.save_steps", "-1"),
    L("logging steps 0 (modulo by zero)", ["--logger.logging_steps", "0"], "--logger.logging_steps", ">= 1"),
    L("vrcli max_len shorter than every sequence", ["--algo.kl.init_coef", "1e-6", "--vrcli.enable",
                                                     "--vrcli.baseline", "online", "--vrcli.max_len", "8"],
      "--vrcli.max_len 8", "shorter than", classmate=False, data=lambda w, t: _story_rows(t)),
    Case("code rows with the sandbox not reachable", "launcher", lambda w, t: _code_rows_without_sandbox(w, t),
         ("sandbox", "not reachable", "largest 100 s", "data.jsonl:1"), passes=True),
]


def _code_rows_without_sandbox(w: dict, t: Path) -> tuple[int, str]:
    data = _jsonl(t / "data.jsonl", [{"prompt": "x", "label": json.dumps(
        {"data_source": "code", "tests": ["assert 1"], "max_execution_time": 100})}])
    with _env(OPENRLHF_CLASSMATE_SANDBOX_URL=_refused_port().removesuffix("/v1")):
        return run_launcher(launcher_argv(w, classmate=False, data=data))
if not importlib.util.find_spec("vllm") or "shims" in (importlib.util.find_spec("vllm").origin or ""):
    MORE_PREFLIGHT.append(L("engine backend vllm without vLLM", ["--engine.backend", "vllm"], "--engine.backend vllm",
                            "not installed"))


def _story_rows(t: Path) -> str:
    from openrlhf_classmate.testing.vrcli_world import write_story_rows

    write_story_rows(str(t / "stories.jsonl"), 4)
    return str(t / "stories.jsonl")


# accepted by the preflight, then failing inside Ray or training on nothing: the scorer every row
# meets (the main answers' and the classmate's), the judge it needs, the lower bounds of the time limits, a prompt
# the policy could answer, classmate-only flags without a classmate, engines' memory fractions on shared GPUs
def _code_row(**label) -> dict:
    return {"prompt": "x", "label": json.dumps({"data_source": "code", "tests": ["assert 1"], **label})}


def _code_rows(w: dict, t: Path, env: dict[str, str], **label) -> tuple[int, str]:
    """A plain GRPO run on code rows with ``label`` fields, the sandbox not reachable, under ``env``."""
    data = _jsonl(t / "data.jsonl", [_code_row(**label)])
    with _env(OPENRLHF_CLASSMATE_SANDBOX_URL=_refused_port().removesuffix("/v1"), **env):
        return run_launcher(launcher_argv(w, classmate=False, data=data))


def _memory(*flags: str) -> list[str]:
    return ["--engine.backend", "vllm", *flags]


FIT = [
    L("classmate scorer that does not fit the rows", ["--classmate.scorer", "mmlu_sycophancy"], "train.jsonl:1",
      "--classmate.scorer mmlu_sycophancy", "not one letter of ABCD"),
    L("main scorer that does not fit the rows", ["--classmate.main_scorer", "mmlu_sycophancy"], "train.jsonl:1",
      "--classmate.main_scorer mmlu_sycophancy", "not one letter of ABCD", classmate=False),
    L("classmate judge scorer without a judge", ["--classmate.scorer", "sycophancy_judge"],
      "--classmate.scorer sycophancy_judge", "classmate answers", "--classmate.judge_base_url"),
    L("main judge scorer without a judge, hub dataset (rows not scanned)", ["--classmate.main_scorer",
                                                                            "sycophancy_judge"],
      "--classmate.main_scorer sycophancy_judge", "main answers", "--classmate.judge_base_url",
      data=lambda w, t: "org/hub_dataset"),
    D("code row time limit far too small", [_code_row(max_execution_time=1e-9)], "data.jsonl:1",
      "max_execution_time", ">= 0.1", classmate=False),
    _env_launcher({"OPENRLHF_CLASSMATE_CODE_TIME_LIMIT": "1e-9"}, "OPENRLHF_CLASSMATE_CODE_TIME_LIMIT", ">= 0.1"),
    _env_launcher({"OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT": "0.5"}, "OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT", ">= 1"),
    Case("sandbox request time limit below the rows' test time limit", "launcher",
         lambda w, t: _code_rows(w, t, {"OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT": "3"}, max_execution_time=5),
         ("OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT 3", "data.jsonl:1: max_execution_time 5")),
    L("judge timeout below a second", ["--classmate.judge_timeout_s", "0.001"], "--classmate.judge_timeout_s",
      ">= 1"),
    L("tinyv timeout below a second", ["--tinyv.timeout_s", "0.001"], "--tinyv.timeout_s", ">= 1"),
    L("darling timeout below a second", ["--darling.timeout_s", "0.001"], "--darling.timeout_s", ">= 1"),
    D("chat prompt of only an assistant turn", [_chat_row(_chat("1 + 1 = ?", role="assistant"))], "data.jsonl:1",
      "field 'prompt'", "no user message"),
    D("chat prompt ending in an assistant turn", [_chat_row([*_chat("1 + 1 = ?"), *_chat("2", role="assistant")])],
      "data.jsonl:1", "field 'prompt'", "message 1 (assistant)"),
    D("classmate label messages of only an assistant turn", [_chat_row(_chat("1 + 1 = ?"),
                                                                       _chat("1 + 1", role="assistant"))],
      "data.jsonl:1", "field 'label'", "no user message"),
    L("classmate placement without a classmate", ["--classmate.placement", "share"], "--classmate.placement share",
      "needs a classmate", "--classmate.model_name_or_path", classmate=False),
    L("classmate engine settings without a classmate", ["--classmate.num_engines", "2", "--classmate.temperature",
                                                        "0.5"],
      "--classmate.num_engines 2", "--classmate.temperature 0.5", "need a classmate", classmate=False),
    L("engine memory fractions of 1 or more under share", _memory("--classmate.placement", "share",
                                                                  "--vllm.gpu_memory_utilization", "0.8"),
      "--vllm.gpu_memory_utilization 0.8", "--classmate.gpu_memory_utilization 0.3", "below 1"),
    L("engine memory fractions of 1 or more under colocate_all", _memory(
        "--classmate.placement", "colocate", "--train.colocate_all", "--vllm.enable_sleep",
        "--vllm.gpu_memory_utilization", "0.5", "--classmate.gpu_memory_utilization", "0.5"),
      "--vllm.gpu_memory_utilization 0.5", "--classmate.gpu_memory_utilization 0.5", "--train.colocate_all"),
]


YAML = [
    Y("yaml syntax error", "actor:\n  adam: [1,\nrollout: x\n", "run.yaml:", "not valid YAML"),
    Y("yaml not UTF-8", b"actor:\n  adam:\n    lr: 1e-5 # caf\xe9\n", "run.yaml:3", "not UTF-8"),
    Y("yaml unknown key", "classmate:\n  temprature: 0.5\n", "unknown key 'classmate.temprature'"),
    Y("yaml duplicate key", "classmate:\n  temperature: 0.5\n  temperature: 0.7\n", "run.yaml:3",
      "duplicate key 'temperature'", "line 2"),
    Y("yaml duplicate group", "ckpt:\n  save_hf: true\nckpt:\n  max_num: 2\n", "run.yaml:3", "duplicate key 'ckpt'"),
    Y("yaml top level a list", "- a\n- b\n", "top level must be a mapping"),
    Y("yaml switch not a boolean", "ckpt:\n  save_hf: 3\n", "'ckpt.save_hf' is a switch"),
    Y("yaml invalid choice", "classmate:\n  estimator: nope\n", "--classmate.estimator", "invalid choice",
      "set in --config"),
    Y("yaml list for a scalar", "classmate:\n  temperature: [0.5, 0.7]\n", "'classmate.temperature' takes one value"),
    Y("yaml list of the wrong length", "classmate:\n  gdpo_weights: [1, 1, 1]\n", "run.yaml:2",
      "'classmate.gdpo_weights' takes 2 values", "got 3"),
    Y("yaml empty list", "classmate:\n  weights: []\n", "run.yaml:2", "'classmate.weights'", "empty list"),
    Y("yaml scalar for a group of flags", "classmate: 5\n", "run.yaml:1", "'classmate' is a group of flags",
      "mapping"),
    Y("yaml list for a group of flags", "tinyv: [a, b]\n", "run.yaml:1", "'tinyv' is a group of flags"),
    Y("yaml value out of range", "classmate:\n  top_p: 1.5\n", "--classmate.top_p", "(0, 1]"),
    Y("yaml empty value", "classmate:\n  model_name_or_path:\n", "run.yaml:2", "'classmate.model_name_or_path'",
      "no value"),
    Y("yaml empty value in a flow mapping", "classmate: {temperature: }\n", "run.yaml:1", "'classmate.temperature'",
      "no value"),
    Y("yaml empty group", "rollout: {batch_size: 4}\nclassmate:\n", "run.yaml:2", "'classmate'", "no value"),
    Y("yaml empty switch", "ckpt:\n  save_hf:\n", "run.yaml:2", "'ckpt.save_hf'", "no value"),
    Y("yaml flag nested and dotted", "classmate:\n  temperature: 0.5\nclassmate.temperature: 0.7\n",
      "'classmate.temperature'", "run.yaml:2", "run.yaml:3"),
    Y("yaml flag dotted at two depths", "actor:\n  adam.lr: 1e-6\n  adam:\n    lr: 2e-6\n", "'actor.adam.lr'",
      "run.yaml:2", "run.yaml:4"),
    Y("yaml merge key replacing a merged mapping (merges are shallow)",
      "actor: &a\n  adam: {lr: 1e-6, betas: [0.9, 0.9]}\ncritic:\n  <<: *a\n  adam: {lr: 2e-6}\n",
      "run.yaml:5", "'adam'", "shallow"),
    Y("yaml nan", "classmate:\n  temperature: .nan\n", "--classmate.temperature", "finite", "set in --config"),
    Y("yaml inf", "tinyv:\n  timeout_s: .inf\n", "--tinyv.timeout_s", "finite", "set in --config"),
    Case("yaml file missing", "yaml", lambda w, t: run_launcher(launcher_argv(w, "--config", str(t / "none.yaml"))),
         ("none.yaml", "cannot read")),
    Case("yaml path is a directory", "yaml", lambda w, t: run_launcher(launcher_argv(w, "--config", str(t))),
         ("is a directory",)),
]


def S(id_: str, script: str, build: Callable[[Path], list[str]], *expect: str) -> Case:
    return Case(id_, "setup_data", lambda w, t: run_setup_data(script, [*build(t), "--quiet"]), expect)


def _gsm(t: Path, rows: list, name: str = "train.jsonl") -> list[str]:
    return ["--input", _jsonl(t / name, rows), "--output-dir", str(t / "out")]


GSM = {"question": "1 + 1?", "answer": "so #### 2"}
SETUP_DATA = [
    S("setup input missing", "gsm8k", lambda t: ["--input", str(t / "train.jsonl"), "--output-dir", str(t / "o")],
      "train.jsonl", "no such file"),
    S("setup line not JSON", "gsm8k", lambda t: _gsm(t, [GSM, "{bad"]), "train.jsonl:2", "invalid JSON"),
    S("setup line not an object", "gsm8k", lambda t: _gsm(t, ["[]"]), "train.jsonl:1", "expected a JSON object"),
    S("setup field missing", "gsm8k", lambda t: _gsm(t, [{"question": "q"}]), "train.jsonl:1", "field 'answer'"),
    S("setup field of the wrong type", "gsm8k", lambda t: _gsm(t, [{"question": 3, "answer": "#### 1"}]),
      "train.jsonl:1", "field 'question'"),
    S("setup no final answer", "gsm8k", lambda t: _gsm(t, [{"question": "q", "answer": "none"}]), "train.jsonl:1",
      "'#### <number>'"),
    S("setup empty file", "gsm8k", lambda t: _gsm(t, []), "train.jsonl", "empty input file"),
    S("setup not UTF-8", "gsm8k", lambda t: ["--input", str((t / "train.jsonl").write_bytes(b"\xff\xfe") and
                                                           t / "train.jsonl"), "--output-dir", str(t / "o")],
      "train.jsonl", "not valid UTF-8"),
    S("setup unsupported suffix", "gsm8k", lambda t: ["--input", _jsonl(t / "train.csv", [GSM]), "--output-dir",
                                                       str(t / "o")], "train.csv", "unsupported input format"),
    S("setup output dir is a file", "gsm8k", lambda t: ["--input", _jsonl(t / "train.jsonl", [GSM]),
                                                         "--output-dir", _jsonl(t / "taken", ["x"])],
      "taken", "is a file"),
    S("setup output dir under a file", "gsm8k", lambda t: ["--input", _jsonl(t / "train.jsonl", [GSM]),
                                                            "--output-dir", _jsonl(t / "taken", ["x"]) + "/sub"],
      "cannot be created", "is a file"),
    S("setup split not read by the script", "gsm8k", lambda t: ["--input", "dev=" + _jsonl(t / "x.jsonl", [GSM]),
                                                                 "--output-dir", str(t / "o")],
      "no split 'dev'"),
    S("setup split not told by the file name", "gsm8k", lambda t: _gsm(t, [GSM], name="data.jsonl"),
      "data.jsonl", "cannot tell which source split"),
    S("setup max rows 0", "gsm8k", lambda t: _gsm(t, [GSM]) + ["--max-rows", "0"], "--max-rows"),
    S("setup negative size", "gsm8k", lambda t: _gsm(t, [GSM]) + ["--test-size", "-1"], "--test-size", ">= 0"),
    S("setup output dir is the input's folder", "gsm8k", lambda t: ["--input", _jsonl(t / "train.jsonl", [GSM]),
                                                                     "--output-dir", str(t)],
      "train.jsonl: writing train.jsonl here would replace the input file", "choose another --output-dir"),
    S("setup output dir is the input's folder via a symlink", "gsm8k",
      lambda t: ["--input", _jsonl(t / "train.jsonl", [GSM]), "--output-dir",
                 str((t / "link").symlink_to(t) or t / "link")], "would replace the input file"),
    S("setup output dir under /proc (permission bits say writable to root)", "gsm8k",
      lambda t: ["--input", _jsonl(t / "train.jsonl", [GSM]), "--output-dir", "/proc/openrlhf_classmate_x/out"],
      "/proc/openrlhf_classmate_x/out", "cannot be", "--output-dir"),
    S("setup story last_n_chapters negative", "vrcli_story",
      lambda t: ["--input", _jsonl(t / "train.jsonl", [_story_row(last_n_chapters=-2)]), "--output-dir",
                 str(t / "o")], "train.jsonl:1", "last_n_chapters", "-2", "-1 (the whole story)"),
    S("setup story last_n_chapters zero", "vrcli_story",
      lambda t: ["--input", _jsonl(t / "train.jsonl", [_story_row(last_n_chapters=0)]), "--output-dir",
                 str(t / "o")], "train.jsonl:1", "last_n_chapters", "got 0"),
    S("vrcli baseline model missing", "vrcli_baseline_ppl",
      lambda t: [_story_rows(t), "--model", str(t / "no_model"), "--output-dir", str(t / "o")], "--model",
      "no_model does not exist"),
    S("vrcli baseline model folder without config", "vrcli_baseline_ppl",
      lambda t: [_story_rows(t), "--model", str(t), "--output-dir", str(t / "o")], "--model", "no config.json"),
    S("vrcli baseline output dir under /proc", "vrcli_baseline_ppl",
      lambda t: [_story_rows(t), "--model", str(t / "no_model"), "--output-dir", "/proc/openrlhf_classmate_x"],
      "/proc/openrlhf_classmate_x", "--output-dir"),
    S("setup mmlu answer index out of range", "mmlu_sycophancy",
      lambda t: ["--input", _jsonl(t / "test.jsonl", [{"question": "q", "choices": ["a", "b"], "answer": 5,
                                                        "subject": "s"}]), "--output-dir", str(t / "o")],
      "test.jsonl:1", "answer"),
]


def _story_row(**over) -> dict:
    row = {"story_text": "Once upon a time.", "next_chapter": " ".join(["word"] * 250), "chapter_index": 3,
           "next_chapter_synopsis": "SYN", "last_n_chapters": 1, "next_chapter_header": "Chapter 3"}
    return {**row, **over}


def _score(labels, responses=("1",), judge=None):
    from openrlhf_classmate.scoring import score_responses

    return score_responses(list(responses), labels, judge=judge)


def _raises(fn, exc_name: str) -> tuple[int, str]:
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001
        return 0, f"{type(e).__name__}: {e}"
    return 0, f"no exception ({exc_name} expected): {result}"


def _results(results) -> tuple[int, str]:
    return 0, " | ".join(f"valid={r.valid} score={r.score} reason={r.reason} explanation={r.explanation}"
                         for r in results)


def _nested_frac(depth: int) -> str:
    text = "1"
    for _ in range(depth):
        text = "\\frac{" + text + "}{2}"
    return "\\boxed{" + text + "}"


def _judged(directive: str, timeout_s: float = 5.0, retries: int = 1) -> tuple[int, str]:
    from openrlhf_classmate.scoring import JudgeConfig
    from openrlhf_classmate.testing.judge_server import serve_judge

    label = {"data_source": "helpful_instructions", "raw_question_for_monitor": "q"}
    with serve_judge() as server:
        cfg = JudgeConfig(base_url=server.base_url, model="fake-judge", timeout_s=timeout_s, max_retries=retries,
                          backoff_s=0.01)
        return _results(_score([label], [f"an answer {directive}"], judge=cfg))


def _refused_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def _reward_func_with_judge(directive: str) -> tuple[int, str]:
    from openrlhf_classmate.reward_func import reward_func
    from openrlhf_classmate.testing.judge_server import serve_judge

    label = json.dumps({"data_source": "helpful_instructions", "raw_question_for_monitor": "q"})
    with serve_judge() as server, _env(OPENRLHF_CLASSMATE_JUDGE=json.dumps(
            {"base_url": server.base_url, "model": "fake-judge", "max_retries": 1, "backoff_s": 0.01})):
        out = reward_func([f"P:<think> x </think> answer {directive}"], ["P:"], [label], answers=[f"answer {directive}"])
    return 0, json.dumps(out, sort_keys=True)


@contextlib.contextmanager
def _env(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def C(id_: str, fn: Callable[[], tuple[int, str]], *expect: str) -> Case:
    return Case(id_, "scoring", lambda w, t: fn(), expect, outcome=True)


SCORING = [
    C("code label time limit NaN", lambda: _raises(lambda: _score(
        [{"data_source": "code", "tests": ["assert 1"], "max_execution_time": float("nan")}]), "LabelError"),
      "LabelError", "max_execution_time"),
    C("code label time limit inf", lambda: _raises(lambda: _score(
        [{"data_source": "code", "tests": ["assert 1"], "max_execution_time": float("inf")}]), "LabelError"),
      "LabelError", "max_execution_time"),
    C("code label time limit far too small", lambda: _raises(lambda: _score(
        [{"data_source": "code", "tests": ["assert 1"], "max_execution_time": 1e-9}]), "LabelError"),
      "LabelError", "max_execution_time", ">= 0.1"),
    C("label not JSON", lambda: _raises(lambda: _score(["{oops"]), "LabelError"), "LabelError", "label #0",
      "not valid JSON"),
    C("label empty", lambda: _raises(lambda: _score([""]), "LabelError"), "LabelError", "--data.label_key"),
    C("label a list", lambda: _raises(lambda: _score(["[1]"]), "LabelError"), "must be a JSON object"),
    C("unknown data_source", lambda: _raises(lambda: _score([{"data_source": "gsm8kk", "ground_truth": "1"}]), "x"),
      "UnknownDataSourceError", "Did you mean 'gsm8k'", "python -m openrlhf_classmate.scoring --list"),
    C("gsm8k ground truth missing", lambda: _raises(lambda: _score([{"data_source": "gsm8k"}]), "LabelError"),
      "LabelError", "field 'ground_truth'", "missing"),
    C("mmlu hint letter missing", lambda: _raises(lambda: _score([{"data_source": "cais/mmlu"}]), "LabelError"),
      "LabelError", "ground_truth"),
    C("judge scorer without a judge", lambda: _raises(lambda: _score(
        [{"data_source": "helpful_instructions", "raw_question_for_monitor": "q"}]), "JudgeNotConfiguredError"),
      "JudgeNotConfiguredError", "needs an LLM judge"),
    C("judge URL without scheme", lambda: _raises(lambda: __import__("openrlhf_classmate.scoring", fromlist=["x"])
                                                  .JudgeConfig(base_url="host:8000/v1", model="j"), "ValueError"),
      "ValueError", "http(s) URL"),
    C("judge answers 503", lambda: _judged("[[fake:status=503]]"), "valid=False", "judge HTTP 503",
      "gave up after 1 retries"),
    C("judge answers without a rating", lambda: _judged("[[fake:garbage]]"), "valid=False", "no rating"),
    C("judge answers a malformed body", lambda: _judged("[[fake:malformed]]"), "valid=False", "malformed"),
    C("judge times out", lambda: _judged("[[fake:sleep=3]]", timeout_s=0.5), "valid=False", "timed out after 0.5s"),
    C("judge connection refused", lambda: _results(_score(
        [{"data_source": "helpful_instructions", "raw_question_for_monitor": "q"}], ["a"],
        judge=__import__("openrlhf_classmate.scoring", fromlist=["x"]).JudgeConfig(
            base_url=_refused_port(), model="j", max_retries=1, backoff_s=0.01))), "valid=False", "connection error"),
    C("reward_func with the judge down", lambda: _reward_func_with_judge("[[fake:status=503]]"),
      '"main_valid": 0.0', '"rewards": 0.0', '"judge_sample/failures": 1.0', '"judge_sample/failure_status": 503.0'),
    C("math answer nested 200 deep (reward hack)", lambda: _results(_score(
        [{"data_source": "math_verify", "ground_truth": "\\frac{1}{2}"}], [_nested_frac(200)])),
      "valid=True score=0.0", "nested 201 deep"),
    C("math boxed answer of 5000 characters", lambda: _results(_score(
        [{"data_source": "math_verify", "ground_truth": "1"}], ["\\boxed{" + "1+" * 2500 + "1}"])),
      "valid=True score=0.0", "5001 characters"),
    C("math ground truth math-verify cannot parse", lambda: _results(_score(
        [{"data_source": "math_verify", "ground_truth": "}{"}], ["\\boxed{1}"])),
      "valid=False", "could not parse the ground truth"),
]


def _fake_tag(tmp: Path, broken: bool = False, garbage: bool = False, latest: str | bytes = "global_step1") -> str:
    actor = tmp / "ck" / "_actor"
    tag = actor / "global_step1"
    tag.mkdir(parents=True)
    torch.save({"not": "a deepspeed checkpoint"} if garbage else {"module": {}}, tag / "mp_rank_00_model_states.pt")
    torch.save({}, tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    if broken:
        (tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"PK\x03\x04 torn")
    (actor / "latest").write_bytes(latest if isinstance(latest, bytes) else latest.encode())
    return str(tmp / "ck")


def _bad_config_model(tmp: Path, w: dict) -> str:
    import shutil

    path = tmp / "broken_base"
    shutil.copytree(w["policy"], path)
    (path / "config.json").write_text("{not json")
    return str(path)


def _mismatched_base(w: dict, tmp: Path) -> tuple[int, str]:
    """convert's model building with a base model of another size than the checkpoint's weights."""
    from openrlhf_classmate.cli import convert_checkpoint as cc
    from openrlhf_classmate.testing.tiny_models import new_tiny_model

    other, _ = new_tiny_model(WORDS, hidden_size=16, num_layers=1, num_heads=2)
    return _raises(lambda: cc.build_model(w["policy"], other.state_dict()), "ConversionError")


def V(id_: str, build: Callable[[dict, Path], list[str]], *expect: str) -> Case:
    return Case(id_, "convert", lambda w, t: run_convert(build(w, t)), expect)


CONVERT = [
    V("convert checkpoint dir missing", lambda w, t: [str(t / "nope"), str(t / "out")], "nope does not exist"),
    V("convert dir without a checkpoint", lambda w, t: [w["policy"], str(t / "out")], "holds no DeepSpeed checkpoint"),
    V("convert tag missing", lambda w, t: [_fake_tag(t), str(t / "out"), "--tag", "global_step9"],
      "'global_step9' not found", "available tags: global_step1"),
    V("convert torn checkpoint file", lambda w, t: [_fake_tag(t, broken=True), str(t / "out"),
                                                    "--base-model", w["policy"]],
      "incomplete", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt is cut short"),
    V("convert file that is not a DeepSpeed checkpoint", lambda w, t: [_fake_tag(t, garbage=True), str(t / "out"),
                                                                       "--base-model", w["policy"]],
      "cannot rebuild the weights", "zero_to_fp32"),
    V("convert output is a file", lambda w, t: [_fake_tag(t), w["a_file"]], "is a file, not a model directory"),
    V("convert output under a file", lambda w, t: [_fake_tag(t), w["a_file"] + "/out"], "cannot be created",
      "is a file"),
    V("convert base model missing", lambda w, t: [_fake_tag(t), str(t / "out"), "--base-model", str(t / "nobase")],
      "base model", "does not exist"),
    V("convert base model with a broken config", lambda w, t: [_fake_tag(t), str(t / "out"), "--base-model",
                                                              _bad_config_model(t, w)],
      "cannot build a model from its config"),
    V("convert output is the checkpoint", lambda w, t: [ck := _fake_tag(t), ck, "--overwrite", "--base-model",
                                                        w["policy"]],
      "is the checkpoint folder", "would delete that input"),
    V("convert output inside the checkpoint", lambda w, t: [ck := _fake_tag(t), ck + "/_actor/hf", "--base-model",
                                                            w["policy"]], "lies inside the checkpoint folder"),
    V("convert output holds the checkpoint", lambda w, t: [_fake_tag(t), str(t), "--overwrite", "--base-model",
                                                           w["policy"]], "contains the checkpoint folder"),
    V("convert output is the base model", lambda w, t: [_fake_tag(t), w["policy"], "--overwrite", "--base-model",
                                                         w["policy"]], "is the base model folder"),
    V("convert latest with a NUL byte", lambda w, t: [_fake_tag(t, latest="global_step1\x00"), str(t / "out")],
      "'latest'", "\\x00", "--tag", "global_step1"),
    V("convert latest naming a path", lambda w, t: [_fake_tag(t, latest="../../etc"), str(t / "out")],
      "'latest'", "'../../etc'", "--tag"),
    V("convert latest not UTF-8", lambda w, t: [_fake_tag(t, latest=b"\xff\xfe"), str(t / "out")], "'latest'",
      "UTF-8", "--tag"),
    V("convert tag naming a path", lambda w, t: [_fake_tag(t), str(t / "out"), "--tag", "../_actor/global_step1"],
      "--tag", "not a checkpoint tag"),
    V("convert bad dtype", lambda w, t: [_fake_tag(t), str(t / "out"), "--dtype", "int8"], "--dtype",
      "invalid choice"),
    Case("convert base model of another size", "convert", lambda w, t: _mismatched_base(w, t),
         ("ConversionError", "shape mismatch"), outcome=True),
]


def E(id_: str, build: Callable[[dict, Path], list[str]], *expect: str) -> Case:
    return Case(id_, "evaluate", lambda w, t: run_evaluate(build(w, t)), expect)


def _ev(w: dict, t: Path, *extra: str, data: str | None = None) -> list[str]:
    return ["--model", w["policy"], "--data", data or w["data"], "--output-dir", str(t / "eval"), "--quiet", *extra]


EVALUATE = [
    E("evaluate data missing", lambda w, t: _ev(w, t, data=str(t / "none.jsonl")), "--data", "does not exist"),
    E("evaluate data is a directory", lambda w, t: _ev(w, t, data=str(t)), "--data", "not a file"),
    E("evaluate line not JSON", lambda w, t: _ev(w, t, data=_jsonl(t / "d.jsonl", [_row(), "{x"])),
      "d.jsonl:2", "invalid JSON"),
    E("evaluate data not UTF-8", lambda w, t: _ev(w, t, data=str((t / "d.jsonl").write_bytes(b"\xff") and
                                                                t / "d.jsonl")), "not valid UTF-8"),
    E("evaluate prompt field missing", lambda w, t: _ev(w, t, data=_jsonl(t / "d.jsonl", [{"label": "{}"}])),
      "d.jsonl:1", "'prompt'", "--input-key"),
    E("evaluate label missing", lambda w, t: _ev(w, t, data=_jsonl(t / "d.jsonl", [{"prompt": "x"}])),
      "d.jsonl:1", "'label' missing", "--label-key"),
    E("evaluate unknown data source", lambda w, t: _ev(w, t, data=_jsonl(t / "d.jsonl", [_row("nope")])),
      "d.jsonl:1", "no scorer"),
    E("evaluate judge-scored data without a judge", lambda w, t: _ev(w, t, data=w["judge_data"]),
      "helpful.jsonl:1", "--judge-base-url"),
    E("evaluate judge URL without scheme", lambda w, t: _ev(w, t, "--judge-base-url", "host:1/v1", "--judge-model",
                                                           "j", data=w["judge_data"]), "--judge-base-url",
      "http(s) URL"),
    E("evaluate monitor without a judge", lambda w, t: _ev(w, t, "--monitor"), "--monitor needs a judge"),
    E("evaluate no-think with a classmate", lambda w, t: _ev(w, t, "--no-think", "--classmate", w["classmate"]),
      "--no-think"),
    E("evaluate output dir is a file", lambda w, t: ["--model", w["policy"], "--data", w["data"], "--output-dir",
                                                     w["a_file"]], "--output-dir", "is a file"),
    E("evaluate model missing", lambda w, t: _ev(w, t) + ["--model", str(t / "nomodel")], "--model",
      "does not exist"),
    E("evaluate model folder without config", lambda w, t: _ev(w, t) + ["--model", w["no_config"]], "--model",
      "no config.json"),
    E("evaluate model folder without a tokenizer", lambda w, t: _ev(w, t) + ["--model", _config_only(t, w)],
      "--model", "cannot load its tokenizer"),
    E("evaluate batch size 0", lambda w, t: _ev(w, t, "--batch-size", "0"), "--batch-size", ">= 1"),
    E("evaluate temperature 5", lambda w, t: _ev(w, t, "--temperature", "5"), "--temperature", "[0, 2]"),
    E("evaluate top-p 0", lambda w, t: _ev(w, t, "--top-p", "0"), "--top-p"),
    E("evaluate limit 0", lambda w, t: _ev(w, t, "--limit", "0"), "--limit"),
    E("evaluate chat template kwargs not JSON", lambda w, t: _ev(w, t, "--chat-template-kwargs", "{x"),
      "--chat-template-kwargs", "not JSON"),
    E("evaluate unknown scorer", lambda w, t: _ev(w, t, "--scorer", "gsm8kk"), "no scorer", "--scorer"),
    E("evaluate chat content null", lambda w, t: _ev(w, t, data=_jsonl(t / "d.jsonl", [_chat_row(_chat(None))])),
      "d.jsonl:1", "message 0", "null"),
    E("evaluate chat unknown role", lambda w, t: _ev(w, t, data=_jsonl(t / "d.jsonl", [
        _chat_row(_chat("1 + 1 = ?", role="usr"))])), "d.jsonl:1", "unknown role 'usr'"),
    E("evaluate chat content parts the template prints as a list", lambda w, t: _ev(w, t, data=_jsonl(
        t / "d.jsonl", [_chat_row(_chat([{"type": "text", "text": "1 + 1"}]))])), "d.jsonl:1", "content parts"),
    E("evaluate think tags swapped", lambda w, t: _ev(w, t, "--think-open", "</think>", "--think-close", "<think>"),
      "--think-open", "swapped"),
    E("evaluate think tags identical", lambda w, t: _ev(w, t, "--think-open", "</think>"), "--think-open",
      "same tag"),
    E("evaluate temperature nan", lambda w, t: _ev(w, t, "--temperature", "nan"), "--temperature"),
    E("evaluate gpu memory utilization nan", lambda w, t: _ev(w, t, "--gpu-memory-utilization", "nan"),
      "--gpu-memory-utilization", "finite"),
    E("evaluate think tag not in the tokenizer", lambda w, t: _ev(w, t, "--think-close", "</reasoning>"),
      "--think-open/--think-close", "cli.prepare_policy"),
    # the launcher's checks, shared; evaluate's own flags in its messages
    E("evaluate policy tokenizer larger than its embedding", lambda w, t: _ev(w, t) + ["--model", w["small_vocab"]],
      "--model", "vocab_size", "resize_token_embeddings"),
    E("evaluate classmate tokenizer larger than its embedding", lambda w, t: _ev(w, t, "--classmate",
                                                                               w["small_vocab"]),
      "--classmate", "vocab_size"),
    E("evaluate reader tokenizer larger than its embedding", lambda w, t: _ev(w, t, "--reader", w["small_vocab"]),
      "--reader", "vocab_size"),
    E("evaluate splice with another vocabulary", lambda w, t: _ev(w, t, "--classmate", w["other_vocab"],
                                                                  "--classmate-prompt-mode", "splice"),
      "--classmate", "identical vocabularies", "--classmate-prompt-mode retokenize"),
    E("evaluate TinyV rows without a verifier", lambda w, t: _ev(w, t, data=_jsonl(t / "d.jsonl", [
        _row("bigmath_tinyv", "2", question="1 + 1 = ?")])), "d.jsonl:1", "--tinyv-base-url"),
    E("evaluate TinyV URL without scheme", lambda w, t: _ev(w, t, "--tinyv-base-url", "host:1/v1"),
      "--tinyv-base-url", "http(s) URL"),
    E("evaluate rows scored only in training", lambda w, t: _ev(w, t, data=_jsonl(t / "d.jsonl", [
        _row("vrcli_story", "red")])), "d.jsonl:1", "vrcli_story", "only in training", "--scorer"),
    E("evaluate label empty", lambda w, t: _ev(w, t, data=_jsonl(t / "d.jsonl", [{"prompt": "x", "label": ""}])),
      "d.jsonl:1", "--label-key"),
    E("evaluate max-new-tokens as long as the model's context", lambda w, t: _ev(w, t, "--max-new-tokens", "512"),
      "--max-new-tokens 512", "context of --model", "512 tokens"),
    E("evaluate output dir under /proc (permission bits say writable to root)",
      lambda w, t: _ev(w, t) + ["--output-dir", "/proc/openrlhf_classmate_x/eval"], "--output-dir",
      "/proc/openrlhf_classmate_x/eval", "cannot be"),
    Case("evaluate prompts longer than the model's context", "evaluate", lambda w, t: run_evaluate(_ev(
        w, t, "--backend", "hf", "--max-new-tokens", "4", "--no-plot",
        data=_jsonl(t / "d.jsonl", _long_prompt_rows(520)))), ("d.jsonl", "1 of 2 prompts", "longer than 508 tokens",
                                                               "--max-new-tokens 4", "d.jsonl:2", "from the front"),
         passes=True),
]


def _sandbox_request(body: str) -> tuple[int, str]:
    """A request to the sandbox's real app (request validation happens before any program runs)."""
    from fastapi.testclient import TestClient

    from openrlhf_classmate.sandbox.app import create_app
    from openrlhf_classmate.sandbox.config import SandboxConfig
    from openrlhf_classmate.sandbox.service import Sandbox

    cfg = SandboxConfig()
    reply = TestClient(create_app(cfg, Sandbox(cfg)), raise_server_exceptions=False).post(
        "/test_program", content=body, headers={"content-type": "application/json"})
    return 0, f"HTTP {reply.status_code} {reply.text}"


def _sandbox_cli(argv: list[str]) -> tuple[int, str]:
    from openrlhf_classmate.sandbox.__main__ import config_from_args

    return _capture(lambda: config_from_args(argv) and None)


def X(id_: str, body: str, *expect: str) -> Case:
    return Case(id_, "sandbox", lambda w, t: _sandbox_request(body), expect, outcome=True)


SANDBOX = [
    X("sandbox time limit NaN", '{"program": "x", "tests": ["assert 1"], "max_execution_time": NaN}', "HTTP 422",
      "max_execution_time", "finite"),
    X("sandbox time limit Infinity", '{"program": "x", "tests": ["assert 1"], "max_execution_time": Infinity}',
      "HTTP 422", "max_execution_time"),
    X("sandbox time limit negative", '{"program": "x", "tests": ["assert 1"], "max_execution_time": -1}',
      "HTTP 422", "max_execution_time"),
    X("sandbox time limit above the maximum", '{"program": "x", "tests": ["assert 1"], "max_execution_time": 1e9}',
      "HTTP 422", "exceeds this service's limit"),
    X("sandbox time limit a string", '{"program": "x", "tests": ["assert 1"], "max_execution_time": "5"}',
      "HTTP 422", "max_execution_time"),
    Case("sandbox flag max-time-limit inf", "sandbox", lambda w, t: _sandbox_cli(["--max-time-limit", "inf"]),
         ("--max-time-limit", "finite")),
    Case("sandbox flag grace-s nan", "sandbox", lambda w, t: _sandbox_cli(["--grace-s", "nan"]),
         ("--grace-s", "finite")),
    Case("sandbox flag max-request-mb inf", "sandbox", lambda w, t: _sandbox_cli(["--max-request-mb", "inf"]),
         ("--max-request-mb", "finite")),
    Case("sandbox flag port 70000", "sandbox", lambda w, t: _sandbox_cli(["--port", "70000"]),
         ("--port", "70000", "65535")),
    Case("sandbox flag port negative", "sandbox", lambda w, t: _sandbox_cli(["--port=-1"]), ("--port", "-1")),
    Case("sandbox flag default time limit above the maximum", "sandbox",
         lambda w, t: _sandbox_cli(["--default-time-limit", "90"]), ("default_time_limit", "max_time_limit")),
]


def _config_only(t: Path, w: dict) -> str:
    import shutil

    path = t / "config_only"
    path.mkdir()
    shutil.copy(os.path.join(w["policy"], "config.json"), path / "config.json")
    return str(path)


CASES = (LAUNCHER + CHAT + NUMBERS + MORE_PREFLIGHT + FIT + YAML + SETUP_DATA + SCORING + SANDBOX + CONVERT
         + EVALUATE)


def test_the_table_is_large_and_covers_every_tool():
    counts = {tool: sum(c.tool == tool for c in CASES) for tool in
              ("launcher", "yaml", "setup_data", "scoring", "sandbox", "convert", "evaluate")}
    assert all(n >= 5 for n in counts.values()), counts
    assert len(CASES) >= 60 and len({(c.tool, c.id) for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.tool}: {c.id}")
def test_bad_input(case: Case, w: dict, tmp_path: Path):
    code, text = case.run(w, tmp_path)
    assert "Traceback" not in text, text
    if case.outcome:
        for needle in case.expect:
            assert needle in text, f"{needle!r} not in {text!r}"
        return
    if case.passes:
        assert code == 0, text
        warnings = [line for line in text.splitlines() if line.startswith("warning: ")]
        if case.tool == "evaluate":
            assert not any(re.search(r"--[a-z]+\.[a-z]", line) for line in warnings), warnings
        assert any(all(n in line for n in case.expect) for line in warnings), text
        return
    assert code != 0, f"accepted: {text}"
    errors = [line for line in text.splitlines() if "error:" in line]
    assert len(errors) == 1, f"expected one error line, got:\n{text}"
    if case.tool == "evaluate":  # evaluate has no --group.name flags: its messages name its own
        assert not re.search(r"--[a-z]+\.[a-z]", errors[0]), errors[0]
    for needle in case.expect:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"


@pytest.mark.parametrize("extra, code, needle", [
    ([], 0, "check passed: the run would start"),
    (["--engine.hf_max_batch", "0"], 1, "error: --engine.hf_max_batch must be >= 1, got 0"),
])
def test_launcher_subprocess(w: dict, extra: list[str], code: int, needle: str):
    """The real command: ``--check`` exits 0 or prints one error line, before Ray starts (no Ray session)."""
    argv = [sys.executable, "-m", "openrlhf_classmate.cli.train_ppo_ray", "--check", *launcher_argv(w, *extra)]
    # a Ray start would fail loudly (the launcher refuses a dashboard address in one error line): --check never starts
    # it. A dashboard address, not a GCS one: the preflight's count of the cluster's GPUs gets its refusal at once
    # (a dead GCS address such as 127.0.0.1:1 left it waiting out its 15 s limit)
    env = dict(os.environ, RAY_ADDRESS="http://127.0.0.1:1")
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert needle in (proc.stdout if code == 0 else proc.stderr)
    if code:
        assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [needle]
        assert "Traceback" not in proc.stderr
