"""Train-inference mismatch: the statistics with numbers worked out by hand, through upstream's real
batching, the rollout request upstream's real generator sends, the HF engine's log-probs against the actor's
definition, the per-step report and its warning line."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest
import ray
import torch

from openrlhf_classmate.algo.mismatch import METRIC_KEYS, logprob_mismatch
from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.integration.rollout import mismatch
from openrlhf_classmate.integration.rollout.hf_engine import HFEngine, create_hf_engines
from openrlhf_classmate.integration.trainer import install_rollout_request
from openrlhf_classmate.testing.tiny_models import save_tiny_model

WORDS = ["0", "1", "2", "3", "4", "+", "=", "?"]


def _k3(d: float) -> float:
    return math.exp(d) - 1 - d


def test_statistics_by_hand_over_micro_batches_of_different_widths():
    # micro-batch 1: one row, the last position padding; micro-batch 2: one row of width 2
    f64 = dict(dtype=torch.float64)
    engine = [torch.tensor([[-1.0, -2.0, -0.5, 0.0]], **f64), torch.tensor([[-0.2, -3.0]], **f64)]
    actor = [torch.tensor([[-1.1, -1.5, -0.5, -7.0]], **f64), torch.tensor([[-0.2, -2.0]], **f64)]
    masks = [torch.tensor([[1, 1, 1, 0]]), torch.tensor([[1, 1]])]
    m = logprob_mismatch(engine, actor, masks)
    d = [-0.1, 0.5, 0.0, 0.0, 1.0]  # actor - engine on the five valid tokens (the padded -7.0 is ignored)
    assert m.tokens == 5 and m.nonfinite == 0
    assert m.abs_diff_mean == pytest.approx(1.6 / 5, abs=1e-12)
    assert m.abs_diff_max == pytest.approx(1.0, abs=1e-12)
    assert m.kl_k3 == pytest.approx(sum(_k3(x) for x in d) / 5, abs=1e-12)  # 0.1743681...
    assert m.kl_k3 == pytest.approx(0.17436810345, abs=1e-10)
    assert list(m.metrics()) == list(METRIC_KEYS)
    assert list(m.metrics().values()) == [m.abs_diff_mean, m.abs_diff_max, m.kl_k3]


def test_k3_is_exact_for_tiny_differences_and_zero_when_equal():
    engine = torch.full((2, 3), -2.0)
    m = logprob_mismatch([engine], [engine.clone()], [torch.ones(2, 3)])
    assert (m.abs_diff_mean, m.abs_diff_max, m.kl_k3) == (0.0, 0.0, 0.0)
    d = 1e-6  # the naive exp(d) - 1 - d in float32 would be all rounding error; the true value is d^2/2
    m = logprob_mismatch([torch.tensor([[-2.0]])], [torch.tensor([[-2.0 + d]], dtype=torch.float64)],
                         [torch.ones(1, 1)])
    assert m.kl_k3 == pytest.approx(d * d / 2, rel=1e-3)


def test_non_finite_tokens_are_left_out_and_counted():
    engine = torch.tensor([[-1.0, float("-inf"), -0.5, float("nan")]])
    actor = torch.tensor([[-1.5, -2.0, -0.5, -1.0]])
    m = logprob_mismatch([engine], [actor], [torch.ones(1, 4)])
    assert (m.tokens, m.nonfinite) == (2, 2)
    assert m.abs_diff_mean == pytest.approx(0.25) and m.abs_diff_max == pytest.approx(0.5)
    assert logprob_mismatch([engine[:, 1:2]], [actor[:, 1:2]], [torch.ones(1, 1)]) is None  # nothing finite left
    with pytest.raises(ValueError, match="same shape"):
        logprob_mismatch([engine], [actor[:, :3]], [torch.ones(1, 4)])


def test_upstreams_batching_pads_and_the_statistics_see_each_token_once():
    """Upstream concatenates the samples of a micro-batch with right padding (``Experience.concat_experiences``);
    packing (``--ds.packing_samples``) happens inside the actor's forward, whose log-probs come back padded the same
    way. The statistics over upstream's micro-batches equal those over the samples one by one."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    gen = torch.Generator().manual_seed(0)
    samples = []
    for length in (7, 3, 5, 9):
        action = torch.zeros(length - 1, dtype=torch.long)
        action[2:] = 1
        rollout = -torch.rand(length - 1, generator=gen) * 3
        samples.append(Experience(sequences=torch.randint(3, 9, (1, length), generator=gen),
                                  attention_mask=torch.ones(1, length, dtype=torch.long),
                                  action_mask=action.unsqueeze(0), rollout_log_probs=rollout.unsqueeze(0)))
    for s in samples:  # what upstream's actor forward returns: its log-probs, zero off the action mask
        s.action_log_probs = (s.rollout_log_probs + 0.01 * torch.arange(s.action_mask.shape[1])) * s.action_mask
    one_by_one = mismatch.measure(samples)
    batched = [Experience.concat_experiences(samples[:3], 0), Experience.concat_experiences(samples[3:], 0)]
    assert batched[0].rollout_log_probs.shape == (3, 6)  # padded to the longest sample of the micro-batch
    together = mismatch.measure(batched)
    assert together.tokens == one_by_one.tokens == 4 + 0 + 2 + 6
    assert together.metrics() == pytest.approx(one_by_one.metrics(), abs=1e-12)
    assert together.abs_diff_max == pytest.approx(0.01 * 7, abs=1e-6)  # the last token of the 9-token sample
    batched[1].rollout_log_probs = None  # an agent that returned no log-probs: nothing to compare
    assert mismatch.measure(batched) is None


def test_upstreams_vllm_kl_is_the_k1_estimate_of_the_same_kl():
    """``vllm_kl`` (upstream, only with IS correction) = mean(engine - actor): the k1 estimator of
    KL(engine || actor); ``mismatch/kl_k3`` estimates the same KL without its sign flips."""
    from openrlhf.models.loss import PolicyLoss

    engine = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    actor = torch.tensor([[-1.1, -1.5, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss = PolicyLoss(is_correction_level="token", is_correction_threshold=[0.0, 100.0])
    *_, vllm_kl, _ = loss(actor, actor, torch.zeros(1, 4), action_mask=mask, rollout_log_probs=engine)
    assert float(vllm_kl) == pytest.approx((0.1 - 0.5 + 0.0) / 3, abs=1e-6)  # can be negative
    assert logprob_mismatch([engine], [actor], [mask]).kl_k3 == pytest.approx((_k3(-0.1) + _k3(0.5)) / 3)


def test_step_report_warns_with_the_step_only_above_the_threshold():
    low = logprob_mismatch([torch.tensor([[-1.0, -2.0]], dtype=torch.float64)],
                           [torch.tensor([[-1.01, -2.01]], dtype=torch.float64)], [torch.ones(1, 2)])
    metrics, warning = mismatch.step_report(low, 7, 0.1)
    assert metrics == pytest.approx({"mismatch/logprob_abs_diff_mean": 0.01, "mismatch/logprob_abs_diff_max": 0.01,
                                     "mismatch/kl_k3": _k3(-0.01)}) and warning is None
    high = logprob_mismatch([torch.tensor([[-1.0, -2.0]])], [torch.tensor([[-3.0, -2.5]])], [torch.ones(1, 2)])
    metrics, warning = mismatch.step_report(high, 8, 0.1)
    assert metrics["mismatch/logprob_abs_diff_mean"] == pytest.approx(1.25)
    assert warning.startswith("step 8: train-inference mismatch: mean |actor - engine log-prob| 1.25 > "
                              "--engine.mismatch_warn_threshold 0.1 (max 2,")
    assert "\n" not in warning and "weight sync" in warning
    assert mismatch.step_report(None, 9, 0.1) == ({}, None)


# ── the request, through upstream's real samples generator ──


def _args(*extra):
    return parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl", *extra])


class _Engine:
    def __init__(self):
        self.params = []
        self.get_num_unfinished_requests = SimpleNamespace(remote=lambda: 0)
        self.generate_responses = SimpleNamespace(remote=lambda **kw: self.params.append(kw["sampling_params"]))


def _dispatched_params(monkeypatch, args):
    import openrlhf.trainer.ppo_utils.samples_generator as samples_generator

    monkeypatch.setattr(samples_generator, "SamplingParams", samples_generator.SamplingParams)  # restored after
    monkeypatch.setattr(ray, "get", lambda refs: refs)
    install_rollout_request(args)
    engine = _Engine()
    generator = samples_generator.SamplesGenerator.__new__(samples_generator.SamplesGenerator)
    generator.args, generator.vllm_engines, generator.tokenizer = args, [engine], None
    generator._dispatch_prompts_to_vllm(["p"], ["l"], temperature=0.7, top_p=0.9, max_new_tokens=12,
                                        n_samples_per_prompt=1)
    return engine.params[0]


def test_rollout_requests_ask_for_the_sampled_tokens_log_prob_only(monkeypatch):
    from vllm.sampling_params import RequestOutputKind

    params = _dispatched_params(monkeypatch, _args())
    assert params.logprobs == 0 and params.output_kind == RequestOutputKind.FINAL_ONLY and params.detokenize is False
    assert params.flat_logprobs is False  # the HF engine (CPU: --engine.backend auto -> hf) returns a list of dicts
    assert _dispatched_params(monkeypatch, _args("--engine.backend", "vllm")).flat_logprobs is True
    assert (params.temperature, params.top_p, params.max_tokens, params.min_tokens) == (0.7, 0.9, 12, 1)  # upstream's
    # upstream asks for logprobs=1 with IS correction: the sampled token's entry is all its executor reads
    assert _dispatched_params(monkeypatch, _args("--algo.advantage.is_correction_level", "token")).logprobs == 0
    # a user's agent may read the decoded text: it keeps it
    assert _dispatched_params(monkeypatch, _args("--train.agent_func_path", "agent.py")).detokenize is True


def test_metrics_off_leaves_upstreams_request_unchanged(monkeypatch):
    from vllm.sampling_params import RequestOutputKind

    params = _dispatched_params(monkeypatch, _args("--engine.no_mismatch_metrics", "--engine.backend", "vllm"))
    assert params.logprobs is None and params.output_kind == RequestOutputKind.CUMULATIVE and params.detokenize
    assert params.flat_logprobs is False
    for flag, value in (("--engine.mismatch_warn_threshold", "0.5"), ("--engine.mismatch_interval", "1")):
        with pytest.raises(SystemExit, match=f"{flag} sets the mismatch metrics, which --engine.no_mismatch_metrics "
                                             "turns off: drop one of the two"):
            _args("--engine.no_mismatch_metrics", flag, value)


def test_measured_steps_are_the_first_two_then_every_interval():
    assert [s for s in range(1, 21) if mismatch.measured_step(s, 5)] == [1, 2, 5, 10, 15, 20]
    assert [s for s in range(1, 6) if mismatch.measured_step(s, 1)] == [1, 2, 3, 4, 5]
    assert [s for s in range(1, 13) if mismatch.measured_step(s, 4)] == [1, 2, 4, 8, 12]


def test_a_step_between_measurements_asks_for_no_log_probs(monkeypatch):
    # a step between measurements asks for log-probs in none of its requests (upstream's request), and keeps the
    # other cheap settings (one final output, no detokenised text)
    from vllm.sampling_params import RequestOutputKind

    monkeypatch.setattr(mismatch, "_measuring", True)  # restored after
    mismatch.set_measuring(False)
    params = _dispatched_params(monkeypatch, _args("--engine.backend", "vllm"))
    assert params.logprobs is None and params.flat_logprobs is False
    assert params.output_kind == RequestOutputKind.FINAL_ONLY and params.detokenize is False
    # upstream's IS correction reads the log-probs on every step: they are asked for whatever the interval
    params = _dispatched_params(monkeypatch, _args("--engine.backend", "vllm", "--algo.advantage.is_correction_level",
                                                   "token"))
    assert params.logprobs == 0 and params.flat_logprobs is True
    mismatch.set_measuring(True)
    assert _dispatched_params(monkeypatch, _args("--engine.backend", "vllm")).logprobs == 0


def test_the_samples_generator_measures_steps_one_two_and_every_interval(monkeypatch):
    # upstream's real samples generator, our subclass: each rollout batch sets whether its requests ask for the
    # log-probs
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    from openrlhf_classmate.integration.rollout.samples_generator import ClassmateSamplesGenerator

    monkeypatch.setattr(mismatch, "_measuring", True)
    seen = []
    monkeypatch.setattr(SamplesGenerator, "generate_samples",
                        lambda self, **kw: seen.append(mismatch._measuring) or ([], 0.0, 0, False))
    generator = ClassmateSamplesGenerator.__new__(ClassmateSamplesGenerator)
    generator.args = _args("--engine.mismatch_interval", "3")
    for _ in range(7):
        generator.generate_samples()
    assert seen == [True, True, True, False, False, True, False]  # steps 1, 2, 3, 6


# ── the HF engine: the actor's log-probs of the sampled tokens, after temperature ──


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), WORDS, hidden_size=32, seed=3)


def test_hf_engine_reports_the_actors_log_probs_of_the_sampled_tokens(model_dir):
    """Through upstream's own executor with the launcher's request: ``rollout_log_probs`` equal what upstream's
    actor computes for the same tokens (``log_softmax(logits / temperature)``), to float rounding."""
    from openrlhf.models.utils import log_probs_from_logits
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    args = _args("--rollout.temperature", "0.7")
    engine = HFEngine(model=model_dir, seed=0, max_model_len=64, device="cpu")
    params = mismatch.rollout_sampling_params(args)(temperature=0.7, top_p=1.0, top_k=-1, max_tokens=8,
                                                    min_tokens=0, skip_special_tokens=False)
    outs = asyncio.run(engine.generate_responses("1 + 2 = ?", "3", params, 64, tok, num_samples=4))
    for out in outs:
        tokens, (start, end) = out["observation_tokens"], out["action_ranges"][0]
        assert end > start and len(out["rollout_log_probs"]) == len(tokens)
        with torch.no_grad():
            logits = engine.model(input_ids=torch.tensor([tokens])).logits.float() / 0.7
        actor = log_probs_from_logits(logits[:, :-1], torch.tensor([tokens[1:]]))[0]
        assert out["rollout_log_probs"][start:end] == pytest.approx(actor[start - 1:end - 1].tolist(), abs=1e-5)
        assert out["rollout_log_probs"][:start] == [0.0] * start


def test_hf_engine_refuses_a_log_prob_mode_it_cannot_report():
    with pytest.raises(ValueError, match="processed log-probs .* not logprobs_mode='raw_logprobs'"):
        create_hf_engines(1, pretrain="m", logprobs_mode="raw_logprobs")


def test_hf_engine_drops_the_weight_syncs_a_fault_test_names(model_dir, monkeypatch):
    monkeypatch.setenv("OPENRLHF_CLASSMATE_FAULT_DROP_WEIGHT_SYNCS", "2")
    engine = HFEngine(model=model_dir, seed=0, device="cpu")
    state = {k: torch.zeros_like(v) for k, v in engine.get_state_dict().items()}
    assert engine.load_weights(engine.get_state_dict()) == 1
    assert engine.load_weights(state) == 1  # the second sync is dropped: nothing loaded, nothing counted
    assert all(bool(v.abs().sum() > 0) for k, v in engine.model.state_dict().items() if k.endswith("proj.weight"))
    assert engine.load_weights(state) == 2 and engine.get_num_weight_updates() == 2
