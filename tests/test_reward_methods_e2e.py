"""configs/tinyv.yaml and configs/darling.yaml for 2 steps each through the real launcher on CPU (Ray, DeepSpeed, HF
engines, tiny random models), against local stand-ins of the TinyV verifier and DARLING's pair classifier. The
configs are used as they are; only the model, data, sizes and CPU settings are overridden (later flags win)."""

import json
import os
import random
import socket

import pytest

from openrlhf_classmate.testing.e2e import build_world, run_launcher, tensorboard_scalars
from openrlhf_classmate.testing.fake_servers import FakeClassifierServer, FakeVerifierServer
from openrlhf_classmate.testing.servers import serve_in_thread

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 4  # samples per prompt
PROMPTS_PER_STEP = 4
EVAL_ROWS = 8  # x 4 samples: enough that some of the random policy's evaluation answers reach the verifier


def _rows(path: str, data_source: str, n: int, seed: int, marker: str = "", ground_truth: str | None = None) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            a = rng.randint(0, 4)
            b = rng.randint(0, 4 - a)
            question = f"{marker}{a} + {b} = ?"
            messages = [{"role": "user", "content": question}]
            label = {"data_source": data_source, "ground_truth": ground_truth or str(a + b), "question": question,
                     "messages": messages}
            f.write(json.dumps({"prompt": messages, "label": json.dumps(label)}) + "\n")


def _argv(config: str, world: dict, data: str, eval_data: str = "") -> list[str]:
    root = world["root"]
    return [
        "--config", os.path.join(REPO, "configs", f"{config}.yaml"),
        "--actor.model_name_or_path", world["policy"], "--actor.num_gpus_per_node", "1",
        "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--vllm.sync_backend", "gloo",
        "--data.prompt_dataset", data, "--data.max_len", "64", "--data.max_samples", str(2 * PROMPTS_PER_STEP),
        "--eval.dataset", eval_data, "--eval.steps", "2",
        "--rollout.max_new_tokens", "16", "--rollout.batch_size", str(PROMPTS_PER_STEP),
        "--rollout.micro_batch_size", "4", "--rollout.n_samples_per_prompt", str(N),
        "--train.batch_size", str(PROMPTS_PER_STEP * N), "--train.micro_batch_size", "4", "--train.num_episodes", "1",
        "--ds.zero_stage", "2", "--ds.attn_implementation", "sdpa", "--actor.adam.lr", "1e-3",
        "--ckpt.path", os.path.join(root, "ckpt"), "--ckpt.output_dir", os.path.join(root, "final"),
        "--logger.tensorboard_dir", os.path.join(root, "tb"),
    ]


def _launch(argv, log_path):
    code = run_launcher(argv, log_path, cwd=REPO, env={"DARLING_CLASSIFIER_URLS": ""})
    if code != 0:
        with open(log_path) as f:
            pytest.fail(f"launcher exited with {code}; log tail:\n{f.read()[-6000:]}")


def _closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def test_tinyv_config_trains_with_the_verifier(tmp_path):
    world = build_world(str(tmp_path / "world"))
    data, eval_data = str(tmp_path / "train.jsonl"), str(tmp_path / "eval.jsonl")
    _rows(data, "bigmath_tinyv", 2 * PROMPTS_PER_STEP, seed=0)
    # evaluation rows whose answer the policy cannot write (its vocabulary has no "-"): only the verifier scores them
    _rows(eval_data, "bigmath_tinyv", EVAL_ROWS, seed=1, marker="? ", ground_truth="-1")
    # a verifier that accepts everything: every answer the rule rejects is rescued, at weight 0.5 in training
    with serve_in_thread(FakeVerifierServer(reply="True")) as server:
        argv = _argv("tinyv", world, data, eval_data) + ["--tinyv.base_url", server.base_url, "--tinyv.weight", "0.5",
                                                         "--eval.n_samples_per_prompt", "4"]
        _launch(argv, str(tmp_path / "run.log"))
        requests = list(server.requests)
    tb = tensorboard_scalars(os.path.join(world["root"], "tb"))
    names = ("verifier_called", "rescued", "verifier_failed", "rule_correct")
    for name in names:
        assert set(tb.get(f"train/tinyv/{name}", {})) == {1, 2}, f"train/tinyv/{name} missing: {sorted(tb)}"
    called, rescued = tb["train/tinyv/verifier_called"], tb["train/tinyv/rescued"]
    assert all(v == 0.0 for v in tb["train/tinyv/verifier_failed"].values())
    assert sum(called.values()) > 0 and rescued == called  # the verifier said True to every call
    for step in (1, 2):  # addon at w = 0.5: reward = rule + 0.5 * rescued; validation uses w = 1
        rule = tb["train/tinyv/rule_correct"][step]
        assert tb["train/reward"][step] == pytest.approx(rule + 0.5 * rescued[step], abs=1e-5)
        assert tb["train/validation_reward"][step] == pytest.approx(rule + rescued[step], abs=1e-5)
    train_requests = [r for r in requests if "<question>? " not in r["messages"][0]["content"]]
    assert len(train_requests) == round(PROMPTS_PER_STEP * N * sum(called.values()))  # one request per call
    assert all(r["model"] == "zhangchenxu/TinyV-1.5B" and r["max_tokens"] == 8 for r in requests)
    eval_requests = len(requests) - len(train_requests)
    pass1 = [v[2] for tag, v in tb.items() if tag.startswith("eval/") and tag.endswith("_pass1")]
    assert eval_requests > 0 and pass1, sorted(tb)
    assert tb["eval/eval_num_samples"][2] == EVAL_ROWS * 4
    assert pass1[0] == pytest.approx(eval_requests / (EVAL_ROWS * 4))  # a verified answer counts 1 (weight 1, not 0.5)


def test_darling_config_trains_with_the_pair_classifier_one_server_down(tmp_path):
    world = build_world(str(tmp_path / "world"))
    data = str(tmp_path / "train.jsonl")
    _rows(data, "deepscaler", 2 * PROMPTS_PER_STEP, seed=0)
    with serve_in_thread(FakeClassifierServer(model="similarity_gpu_1")) as live:
        argv = _argv("darling", world, data) + ["--darling.classifier_urls", _closed_url(), live.url + "/v1",
                                                "--darling.backoff_s", "0"]
        _launch(argv, str(tmp_path / "run.log"))
        requests = list(live.requests)
    tb = tensorboard_scalars(os.path.join(world["root"], "tb"))
    for name in ("quality", "diversity", "reward", "num_classes", "largest_class", "all_correct", "all_incorrect",
                 "pairs_classified", "pairs_short_rule", "pairs_unknown", "classifier_retries", "undetermined"):
        assert set(tb.get(f"train/darling/{name}", {})) == {1, 2}, f"train/darling/{name} missing: {sorted(tb)}"
    pairs = PROMPTS_PER_STEP * N * (N - 1) // 2
    for step in (1, 2):
        assert tb["train/darling/pairs_classified"][step] + tb["train/darling/pairs_short_rule"][step] == pairs
        assert tb["train/darling/pairs_unknown"][step] == 0.0  # the down server cost retries, not pairs
        assert tb["train/darling/undetermined"][step] == 0.0
        assert 1.0 <= tb["train/darling/num_classes"][step] <= N
        assert tb["train/darling/all_correct"][step] + tb["train/darling/all_incorrect"][step] <= PROMPTS_PER_STEP
        assert tb["train/reward"][step] == pytest.approx(tb["train/darling/reward"][step], abs=1e-5)
        assert 0.1 - 1e-6 <= tb["train/darling/diversity"][step] <= 1.0
    assert sum(tb["train/darling/classifier_retries"].values()) > 0
    assert len(requests) == sum(tb["train/darling/pairs_classified"].values())
    assert all(r["model"] == "similarity_gpu_1" and r["input"][0].startswith("<|im_start|>") for r in requests)
