"""``openrlhf_classmate.cli.evaluate``: the HF path for real on CPU with the tiny models, the vLLM path (vLLM 0.29's
``LLM.generate`` on ``TokensPrompt``s) with a fake ``LLM``, the classmate and the CoT monitor against the fake judge
server, and the input errors."""

import json
import os
import re
from types import SimpleNamespace

import pytest
import torch

from openrlhf_classmate.cli import evaluate as ev
from openrlhf_classmate.eval import generation
from openrlhf_classmate.eval.generation import GenParams, VLLMGenerator
from openrlhf_classmate.scoring import score_responses
from openrlhf_classmate.testing.e2e import build_world
from openrlhf_classmate.testing.judge_server import serve_judge


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(str(tmp_path_factory.mktemp("eval") / "world"), num_prompts=8)


def _rows(path):
    return [json.loads(line) for line in open(path)]


def _args(world, out, *extra):
    return ev.build_parser().parse_args(["--model", world["policy"], "--data", world["data"], "--output-dir", str(out),
                                         "--quiet", *extra])


# ── the HF backend, for real ──


def test_hf_end_to_end_with_classmate(world, tmp_path):
    out = tmp_path / "eval"
    code = ev.main(["--model", world["policy"], "--data", world["data"], "--output-dir", str(out), "--backend", "hf",
                    "--max-new-tokens", "12", "--samples", "2", "--temperature", "1.0", "--limit", "6",
                    "--classmate", world["classmate"], "--classmate-max-new-tokens", "6", "--batch-size", "4",
                    "--quiet"])
    assert code == 0
    records = _rows(out / "samples.jsonl")
    assert len(records) == 12 and [r["prompt_index"] for r in records] == [i // 2 for i in range(12)]
    labels = [json.loads(row["label"]) for row in _rows(world["data"])[:6] for _ in range(2)]
    rescored = score_responses([r["answer"] for r in records], labels)
    for r, res in zip(records, rescored):
        assert r["scorer"] == "arithmetic" and r["score"] == res.score and r["valid"] == res.valid
        assert r["response_tokens"] <= 12 and r["finish_reason"] in ("stop", "length")
        assert r["cot_tokens"] is not None and r["cot_tokens"] <= r["response_tokens"]
        assert (r["answer"] is not None) == r["has_answer"]
        assert "classmate_valid" in r and r["classmate_input_tokens"] > 0
    summary = json.load(open(out / "summary.json"))
    metrics = summary["metrics"]["arithmetic"]
    assert summary["backend"] == "hf" and summary["prompts"] == 6 and summary["samples_per_prompt"] == 2
    assert metrics["kind"] == "binary" and metrics["samples"] == 12 and "pass@2" in metrics
    assert metrics["accuracy"] == pytest.approx(sum(r["score"] for r in records) / 12)
    assert "classmate_agreement" in metrics and "cot_tokens_mean" in metrics
    assert summary["plots"] == ["cot_length.png"]
    assert open(out / "cot_length.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_split_response_on_token_ids(world):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(world["policy"])
    open_id, close_id = tok.convert_tokens_to_ids(["<think>", "</think>"])
    ids = tok.encode("<think> 1 + 2 </think> 3", add_special_tokens=False) + [tok.eos_token_id]
    tags = dict(open_id=open_id, close_id=close_id, stop_ids=tok.eos_token_id)
    split = ev.split_response(ids, tok, **tags, starts_in_think=False)
    assert split["has_answer"] and split["answer"] == "3" and split["cot"] == "1 + 2"
    assert split["cot_ids"] == tok.encode("1 + 2", add_special_tokens=False)
    # the template opened the think block: the response starts inside the CoT
    ids = tok.encode("1 + 2 </think> 3", add_special_tokens=False)
    split = ev.split_response(ids, tok, **tags, starts_in_think=True)
    assert split["cot"] == "1 + 2" and split["answer"] == "3"
    # truncated: no </think>, no answer; --no-think: everything is the answer
    split = ev.split_response(tok.encode("<think> 1 + 2", add_special_tokens=False), tok, **tags,
                              starts_in_think=False)
    assert not split["has_answer"] and split["answer"] is None and split["cot"] == "1 + 2"
    split = ev.split_response(tok.encode("3", add_special_tokens=False), tok, open_id=None, close_id=None,
                              starts_in_think=False, stop_ids=tok.eos_token_id)
    assert split["answer"] == "3" and split["cot"] is None


# ── the vLLM backend with a fake LLM ──


class FakeLLM:
    """vLLM's offline ``LLM``: answers ``a + b = ?`` prompts with a scripted CoT (correct for even ``a``), and
    classmate prompts (which end after ``</think>``) with the correct sum."""

    instances: list = []

    def __init__(self, **kwargs):
        from transformers import AutoTokenizer

        self.kwargs = kwargs
        self.calls = []
        self.tok = AutoTokenizer.from_pretrained(kwargs["model"])
        FakeLLM.instances.append(self)

    def respond(self, prompt: str) -> str:
        a, b = map(int, re.search(r"(\d) \+ (\d) = \?", prompt).groups())
        if "</think>" in prompt:  # a classmate prompt: the policy's CoT is already there
            return f"{a + b}"
        answer = a + b if a % 2 == 0 else (a + b + 1) % 5
        return f"<think> {a} + {b} </think> {answer}"

    finish_reasons: dict = {}  # prompt text fragment -> vLLM finish reason (default "stop")

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.calls.append({"prompts": prompts, "params": sampling_params, "use_tqdm": use_tqdm})
        outputs = []
        for p in prompts:
            text = self.tok.decode(p["prompt_token_ids"])
            ids = self.tok.encode(self.respond(text), add_special_tokens=False) + [self.tok.eos_token_id]
            reason = next((r for frag, r in self.finish_reasons.items() if frag in text), "stop")
            outputs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, finish_reason=reason)
                                                    for _ in range(sampling_params.n)]))
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    import vllm

    FakeLLM.instances = []
    FakeLLM.finish_reasons = {}
    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(generation, "resolve_backend", lambda backend: "vllm")
    monkeypatch.setattr(ev, "resolve_backend", lambda backend: "vllm")
    return FakeLLM


def test_vllm_generator_uses_tokens_prompts_and_sampling_params(world, fake_vllm):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(world["policy"])
    gen = VLLMGenerator(world["policy"], tensor_parallel_size=2, gpu_memory_utilization=0.5, max_model_len=256,
                        dtype="bfloat16", seed=3, progress=False)
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "1 + 2 = ?"}], add_generation_prompt=True,
                                                tokenize=False), add_special_tokens=False)
    out = gen.generate([prompt, prompt], GenParams(max_new_tokens=9, temperature=0.7, top_p=0.9, n=3, seed=5))
    llm = fake_vllm.instances[0]
    assert llm.kwargs == {"model": world["policy"], "tensor_parallel_size": 2, "gpu_memory_utilization": 0.5,
                          "dtype": "bfloat16", "seed": 3, "trust_remote_code": True, "max_model_len": 256}
    call = llm.calls[0]
    assert call["prompts"] == [{"prompt_token_ids": prompt}] * 2 and call["use_tqdm"] is False
    params = call["params"]
    assert (params.n, params.temperature, params.top_p, params.max_tokens, params.seed) == (3, 0.7, 0.9, 9, 5)
    assert len(out) == 2 and all(len(o) == 3 for o in out) and out[0][0].finish_reason == "stop"
    assert tok.decode(out[0][0].token_ids, skip_special_tokens=True) == "<think> 1 + 2 </think> 4"
    gen.close()
    assert gen.llm is None


def test_vllm_end_to_end_scores_classmate_agreement(world, tmp_path, fake_vllm):
    out = tmp_path / "eval"
    summary = ev.run(_args(world, out, "--backend", "vllm", "--classmate", world["classmate"], "--max-new-tokens", "20",
                           "--gpu-memory-utilization", "0.4", "--classmate-max-new-tokens", "8"))
    rows = _rows(world["data"])
    expected = [float(int(r["prompt"][0]["content"][0]) % 2 == 0) for r in rows]
    records = _rows(out / "samples.jsonl")
    assert [r["score"] for r in records] == expected
    assert all(r["has_answer"] and r["cot"] for r in records)
    assert all(r["classmate_score"] == 1.0 and r["classmate_valid"] for r in records)
    m = summary["metrics"]["arithmetic"]
    assert m["accuracy"] == pytest.approx(sum(expected) / len(expected)) and m["classmate_accuracy"] == 1.0
    assert m["classmate_agreement"] == pytest.approx(sum(expected) / len(expected))
    assert summary["backend"] == "vllm" and [i.kwargs["model"] for i in fake_vllm.instances] == [
        world["policy"], world["classmate"]]  # one engine at a time: policy, then classmate
    assert fake_vllm.instances[0].kwargs["gpu_memory_utilization"] == 0.4
    params = fake_vllm.instances[0].calls[0]["params"]
    assert params.temperature == 0.0 and params.max_tokens == 20  # greedy by default
    # the classmate got the prompt, then the policy's CoT as its own thinking, as in training
    first = rows[0]["prompt"][0]["content"]
    a, b = first[0], first[4]
    classmate = fake_vllm.instances[1]
    prompt = classmate.tok.decode(classmate.calls[0]["prompts"][0]["prompt_token_ids"])
    assert prompt.endswith(f"<|assistant|> \n <think> {a} + {b} </think> \n \n") and first in prompt
    assert classmate.calls[0]["params"].max_tokens == 8


def test_greedy_with_several_samples_generates_once_and_repeats(world, fake_vllm):
    # real vLLM refuses SamplingParams(n=3, temperature=0) ("n must be 1 when using greedy sampling")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(world["policy"])
    prompts = [tok.encode(f"{a} + 1 = ?", add_special_tokens=False) for a in (1, 2)]
    gen = VLLMGenerator(world["policy"], progress=False)
    out = gen.generate(prompts, GenParams(max_new_tokens=5, temperature=0.0, n=3))
    params = fake_vllm.instances[0].calls[0]["params"]
    assert (params.n, params.temperature) == (1, 0.0)
    assert [len(o) for o in out] == [3, 3] and all(o[0] == o[1] == o[2] for o in out)


def test_hf_greedy_with_several_samples_matches_one_greedy_sample(world):
    gen = generation.HFGenerator(world["policy"], batch_size=2, progress=False, device="cpu")
    prompts = [[3, 4, 5], [4, 5], [5]]
    many = gen.generate(prompts, GenParams(max_new_tokens=6, temperature=0.0, n=2))
    one = gen.generate(prompts, GenParams(max_new_tokens=6, temperature=0.0, n=1))
    assert [[g.token_ids for g in o] for o in many] == [[o[0].token_ids] * 2 for o in one]


def test_vllm_finish_reasons_are_kept_and_failed_generations_are_invalid(world, tmp_path, fake_vllm):
    rows = _rows(world["data"])
    firsts = sorted({row["prompt"][0]["content"][0] for row in rows})
    assert len(firsts) >= 3
    by_first = {firsts[0]: "abort", firsts[1]: "repetition"}
    fake_vllm.finish_reasons = {f"{a} + ": reason for a, reason in by_first.items()}
    out = tmp_path / "eval"
    ev.run(_args(world, out, "--backend", "vllm", "--max-new-tokens", "20"))
    records = _rows(out / "samples.jsonl")
    seen = set()
    for r, row in zip(records, rows):
        reason = by_first.get(row["prompt"][0]["content"][0], "stop")
        seen.add(reason)
        assert r["finish_reason"] == reason  # vLLM's reason, not folded into "stop"
        if reason == "abort":
            assert r["valid"] is False and r["score"] == 0.0 and "'abort'" in r["reason"]
        else:
            assert r["valid"] is True  # a repetition-cut answer is still an answer, scored as such
    assert seen == {"abort", "repetition", "stop"}


def test_prompts_longer_than_the_context_are_cut_from_the_front_with_the_launchers_warning(world, tmp_path,
                                                                                          fake_vllm, capsys):
    # evaluate used to say nothing of prompts longer than the model's context (vLLM refuses them); it now cuts
    # them from the front to --max-model-len - --max-new-tokens, as OpenRLHF does in training, and warns as the
    # launcher warns on the same file
    long = " ".join(["1"] * 80) + " 2 + 1 = ?"
    rows = [{"prompt": [{"role": "user", "content": text}], "label": json.dumps(
        {"data_source": "arithmetic", "ground_truth": "3"})} for text in ("2 + 1 = ?", long)]
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ev.build_parser().parse_args(["--model", world["policy"], "--data", str(data), "--output-dir",
                                         str(tmp_path / "eval"), "--quiet", "--backend", "vllm", "--max-model-len", "64",
                                         "--max-new-tokens", "16"])
    ev.run(args)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "1 of 2 prompts are longer than 48 tokens" in warnings[0], warnings
    assert "--model's context 64 (--max-model-len) - --max-new-tokens 16" in warnings[0]
    prompts = [p["prompt_token_ids"] for p in fake_vllm.instances[0].calls[0]["prompts"]]
    assert len(prompts[0]) < 48 and len(prompts[1]) == 48  # the short prompt as it was, the long one cut
    assert "2 + 1 = ?" in fake_vllm.instances[0].tok.decode(prompts[1])  # its end kept
    assert [r["score"] for r in _rows(tmp_path / "eval" / "samples.jsonl")] == [1.0, 1.0]  # both still answered


def test_close_shuts_the_engine_core_down(world, fake_vllm):
    gen = VLLMGenerator(world["policy"], progress=False)
    calls = []
    gen.llm.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(shutdown=lambda: calls.append("shutdown")))
    gen.close()
    assert calls == ["shutdown"] and gen.llm is None


@pytest.mark.parametrize("extra, message", [
    (["--temperature", "2.5"], r"error: --temperature must be in \[0, 2\], got 2.5"),
    (["--top-p", "0"], r"error: --top-p must be in \(0, 1\], got 0.0"),
    (["--top-k", "-3"], "error: --top-k must be >= -1, got -3"),
    (["--classmate-temperature", "-1", "--classmate", "CLASSMATE"],
     r"error: --classmate-temperature must be in \[0, 2\], got -1.0"),
])
def test_sampling_settings_vllm_rejects_fail_up_front(world, tmp_path, capsys, extra, message):
    extra = [world["classmate"] if x == "CLASSMATE" else x for x in extra]
    assert ev.main(["--model", world["policy"], "--data", world["data"], "--output-dir", str(tmp_path / "o"),
                    "--backend", "hf", *extra]) == 1
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "o").exists()  # nothing generated or written


# ── the CoT monitor against the fake judge server ──


def _judge_data(tmp_path, n=6):
    path = tmp_path / "judge.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            messages = [{"role": "user", "content": f"{i % 5} + 0 = ?"}]
            label = {"data_source": "helpful_instructions", "ground_truth": None,
                     "raw_question_for_monitor": f"question {i}", "messages": messages}
            f.write(json.dumps({"prompt": messages, "label": json.dumps(label)}) + "\n")
    return str(path)


def test_monitor_and_judge_scoring_against_the_fake_judge(world, tmp_path, fake_vllm):
    data = _judge_data(tmp_path)
    with serve_judge() as server:
        args = ev.build_parser().parse_args([
            "--model", world["policy"], "--data", data, "--output-dir", str(tmp_path / "eval"), "--quiet",
            "--monitor", "--judge-base-url", server.base_url, "--classmate", world["classmate"],
            "--max-new-tokens", "64", "--classmate-max-new-tokens", "8"])  # the tiny policy's context: 512 tokens
        summary = ev.run(args)
        prompts = [m["content"] for body in server.requests for m in body["messages"]]
        models = {body["model"] for body in server.requests}
    records = _rows(tmp_path / "eval" / "samples.jsonl")
    assert models == {"fake-judge"}  # --judge-model read from /v1/models
    assert sum("chain-of-thought monitor" in p for p in prompts) == 6  # one monitor call per CoT
    assert sum("expert judge evaluating AI assistant responses" in p for p in prompts) == 12  # main + classmate
    assert all(r["valid"] and 1 <= r["score"] <= 10 and r["monitor_valid"] for r in records)
    m = summary["metrics"]["sycophancy_judge"]
    assert m["kind"] == "rating" and m["mean_rating"] == pytest.approx(sum(r["score"] for r in records) / 6)
    mse = sum((r["monitor_score"] - r["score"]) ** 2 for r in records) / 6
    assert m["monitor"]["mse"] == pytest.approx(mse) and m["monitor"]["valid_entries"] == 6
    assert "classmate_score_mae" in m
    assert set(summary["plots"]) == {"cot_length.png", "ratings.png", "monitor.png"}
    assert summary["judge"] == {"base_url": server.base_url, "model": "fake-judge"}


# ── input errors ──


def test_an_earlier_evaluation_in_the_output_dir_is_kept_unless_overwrite(world, tmp_path, capsys):
    # a second evaluation into the same --output-dir replaced the first's samples.jsonl and summary.json without a word
    out = tmp_path / "eval"
    argv = ["--model", world["policy"], "--data", world["data"], "--output-dir", str(out), "--backend", "hf",
            "--max-new-tokens", "4", "--limit", "2", "--no-plot", "--quiet"]
    assert ev.main(argv) == 0
    first = {name: (out / name).read_bytes() for name in ("samples.jsonl", "summary.json")}
    capsys.readouterr()
    assert ev.main(argv[:-4] + ["--limit", "3", "--no-plot", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --output-dir {out} holds an earlier evaluation (summary.json: {world['policy']} on "
                   f"{world['data']}, 2 prompts); give another --output-dir, or --overwrite to replace it"]
    assert {name: (out / name).read_bytes() for name in first} == first
    # an unfinished evaluation (samples.jsonl without summary.json, e.g. a crash) is no result: evaluated again
    os.remove(out / "summary.json")
    assert ev.main(argv[:-4] + ["--limit", "3", "--no-plot", "--quiet"]) == 0
    assert json.load(open(out / "summary.json"))["prompts"] == 3
    assert ev.main(argv + ["--overwrite"]) == 0
    assert json.load(open(out / "summary.json"))["prompts"] == 2 and len(_rows(out / "samples.jsonl")) == 2


def test_clear_errors(world, tmp_path, capsys):
    base = ["--model", world["policy"], "--output-dir", str(tmp_path / "o")]
    assert ev.main(base + ["--data", str(tmp_path / "missing.jsonl")]) == 1
    assert "missing.jsonl does not exist" in capsys.readouterr().err
    assert ev.main(base + ["--data", world["data"], "--monitor"]) == 1
    assert "--monitor needs a judge" in capsys.readouterr().err
    assert ev.main(base + ["--data", world["data"], "--no-think", "--classmate", world["classmate"]]) == 1
    assert "--no-think" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "1 + 1 = ?", "label": json.dumps({"data_source": "nope"})}) + "\n")
    assert ev.main(base + ["--data", str(bad)]) == 1
    assert "no scorer for this data_source" in capsys.readouterr().err
    assert ev.main(base + ["--data", world["data"], "--monitor", "--judge-base-url", "http://127.0.0.1:9/v1",
                           "--judge-model", "j"]) == 1
    assert "has no CoT monitor" in capsys.readouterr().err  # arithmetic rows


@pytest.mark.skipif(generation.real_vllm_available(), reason="vLLM is installed here")
def test_backend_auto_falls_back_to_hf_without_vllm():
    assert generation.resolve_backend("auto") == "hf"  # the CPU stand-in is not a real vLLM
    with pytest.raises(RuntimeError, match="vLLM is not installed"):
        generation.resolve_backend("vllm")
    assert torch.get_default_dtype() == torch.float32
