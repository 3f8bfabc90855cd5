"""The HF engine (vLLM stand-in) and the classmate executor, on a real tiny model, on the CPU also where a GPU is
visible (these files also run on the GPU machine against the real vLLM; the checks are exact)."""

import asyncio
import math

import pytest
import torch
from vllm import SamplingParams

from openrlhf_classmate.integration.classmate.classmate_executor import AgentExecutor, cot_prompt_logprobs
from openrlhf_classmate.integration.rollout.hf_engine import HFEngine, Logprob
from openrlhf_classmate.testing.tiny_models import save_tiny_model

WORDS = ["0", "1", "2", "3", "4", "+", "=", "?"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), WORDS, hidden_size=32, seed=3)


@pytest.fixture()
def engine(model_dir):
    return HFEngine(model=model_dir, seed=0, max_model_len=64, max_batch=8, device="cpu")


def _manual_logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = logits.log_softmax(-1)
    return [float(logp[t - 1, ids[t]]) for t in range(1, len(ids))]


def test_batched_greedy_generation_matches_one_by_one_and_reports_logprobs(engine):
    prompts = [[3, 9, 10, 11], [4, 5], [6, 9, 7, 12, 13, 8], [5]]
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=1, prompt_logprobs=0)

    async def run():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    outputs = asyncio.run(run())
    assert next(engine._batch_counter) == 1  # all four requests went through one batched generate call
    for prompt, out in zip(prompts, outputs):
        tokens = out.outputs[0].token_ids
        with torch.no_grad():
            ref = engine.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=6,
                                        eos_token_id=engine.eos_token_id, pad_token_id=engine.pad_token_id)
        ref_tokens = ref[0, len(prompt):].tolist()
        if engine.eos_token_id in ref_tokens:
            ref_tokens = ref_tokens[: ref_tokens.index(engine.eos_token_id) + 1]
        assert tokens == ref_tokens
        assert out.outputs[0].finish_reason == ("stop" if tokens[-1] == engine.eos_token_id else "length")
        full = prompt + tokens
        manual = _manual_logprobs(engine.model, full)
        got = [next(iter(d.values())).logprob for d in out.outputs[0].logprobs]
        assert got == pytest.approx(manual[len(prompt) - 1 :], abs=1e-4)
        assert out.prompt_logprobs[0] is None
        got_prompt = [out.prompt_logprobs[t][prompt[t]].logprob for t in range(1, len(prompt))]
        assert got_prompt == pytest.approx(manual[: len(prompt) - 1], abs=1e-4)


def test_sampling_is_seeded_and_respects_max_tokens(model_dir):
    params = SamplingParams(temperature=1.0, max_tokens=4)

    def sample(seed):
        engine = HFEngine(model=model_dir, seed=seed, device="cpu")
        return [asyncio.run(engine.generate([3, 4, 5], params)).outputs[0].token_ids for _ in range(3)]

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
    assert all(len(t) <= 4 for t in sample(1))


def test_prompt_too_long_for_max_model_len_is_an_error(model_dir):
    engine = HFEngine(model=model_dir, seed=0, max_model_len=4, device="cpu")
    with pytest.raises(ValueError, match="no room in max_model_len 4"):
        asyncio.run(engine.generate([3, 4, 5, 6], SamplingParams(max_tokens=2)))


def test_weight_updates_are_counted_and_change_the_model(engine, model_dir):
    state = engine.get_state_dict()
    new_state = {k: v + 0.5 for k, v in state.items()}
    assert engine.get_num_weight_updates() == 0
    assert engine.load_weights(new_state) == 1
    assert torch.allclose(engine.model.state_dict()["model.norm.weight"], state["model.norm.weight"] + 0.5)
    with pytest.raises(RuntimeError, match="unexpected"):
        engine.load_weights({**new_state, "bogus.weight": torch.zeros(1)})


def test_generate_responses_runs_upstreams_executor(engine, model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = asyncio.run(engine.generate_responses("1 + 2 =", None, SamplingParams(temperature=0.0, max_tokens=3),
                                                max_length=32, hf_tokenizer=tokenizer, num_samples=2))
    assert len(out) == 2
    prompt_ids = tokenizer("1 + 2 =", add_special_tokens=False)["input_ids"]
    assert out[0]["observation_tokens"][: len(prompt_ids)] == prompt_ids
    assert out[0]["action_ranges"] == [(len(prompt_ids), len(out[0]["observation_tokens"]))]
    assert out[0]["observation_tokens"] == out[1]["observation_tokens"]  # greedy


def test_classmate_executor_returns_the_cot_prompt_logprobs(engine):
    prompt = {"input_ids": [3, 4, 9, 5, 6, 7, 10], "cot_offset": 3, "cot_len": 3}
    params = SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=0)
    out = asyncio.run(AgentExecutor().execute(prompt, None, params, 64, None, engine))
    manual = _manual_logprobs(engine.model, prompt["input_ids"])
    assert out["cot_logprobs"] == pytest.approx(manual[2:5], abs=1e-4)
    assert 1 <= len(out["output_token_ids"]) <= 3 and out["finish_reason"] in ("stop", "length")
    no_lp = asyncio.run(AgentExecutor().execute(prompt, None, SamplingParams(max_tokens=2), 64, None, engine))
    assert no_lp["cot_logprobs"] is None


def test_cot_prompt_logprobs_reads_vllm_format():
    lp = [None, {5: Logprob(-1.0)}, {6: Logprob(-2.0), 9: Logprob(-0.1)}, {7: Logprob(-3.0)}]
    assert cot_prompt_logprobs(lp, [4, 5, 6, 7], 1, 3) == [-1.0, -2.0, -3.0]
    assert cot_prompt_logprobs(None, [4, 5], 0, 2) == [-math.inf, -math.inf]


def test_top_k_off_samples_from_the_whole_vocabulary(model_dir, monkeypatch):
    # vLLM's top_k=-1 means no top-k; transformers would silently apply its default of 50 given None
    engine = HFEngine(model=model_dir, seed=0, device="cpu")
    seen = {}
    real = engine.model.generate

    def spy(**kwargs):
        seen.update(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(engine.model, "generate", spy)
    asyncio.run(engine.generate([3, 4], SamplingParams(temperature=1.0, top_k=-1, max_tokens=2)))
    assert seen["top_k"] == 0
    asyncio.run(engine.generate([3, 4], SamplingParams(temperature=1.0, top_k=5, max_tokens=2)))
    assert seen["top_k"] == 5


def test_min_tokens_holds_eos_back_as_vllm_does(engine):
    # OpenRLHF's rollout passes min_tokens=1; with min_tokens == max_tokens no stop token can end a response early
    params = SamplingParams(temperature=1.0, max_tokens=5, min_tokens=5, seed=1)

    async def run():
        return await asyncio.gather(*(engine.generate([3, 4, 5], params) for _ in range(8)))

    outs = [o.outputs[0] for o in asyncio.run(run())]
    assert all(len(o.token_ids) == 5 and engine.eos_token_id not in o.token_ids for o in outs)
    assert {o.finish_reason for o in outs} == {"length"}


@pytest.mark.parametrize("kwargs", [{"stop": ["="]}, {"presence_penalty": 0.5}, {"n": 2}, {"ignore_eos": True},
                                    {"frequency_penalty": -0.2}, {"flat_logprobs": True, "logprobs": 0}])
def test_sampling_options_the_hf_engine_cannot_honour_are_refused(engine, kwargs):
    params = SamplingParams(temperature=1.0, max_tokens=2, **kwargs)
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"does not support SamplingParams.{name}"):
        asyncio.run(engine.generate([3, 4], params))
