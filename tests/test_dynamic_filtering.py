"""Dynamic filtering with invalid scores, in-process: upstream's ``SamplesGenerator`` (dispatch,
response -> experience, generate_samples) under our filter, rollout engines replaced by a stand-in whose samples are
scored by the real ``reward_func`` against a real judge server on 127.0.0.1 that fails where told to (HTTP 503).
Only Ray's ``wait`` / ``get`` are replaced (in order, no cluster)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import ray
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

from openrlhf_classmate.errors import TrainingStopped
from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.integration.rollout.samples_generator import (
    KEEP,
    NO_VALID_SCORE,
    OUT_OF_RANGE,
    ClassmateSamplesGenerator,
    filter_decision,
)
from openrlhf_classmate.scoring import JudgeConfig
from openrlhf_classmate.testing.judge_server import serve_judge

DOWN = "[[fake:status=503]]"  # the judge answers HTTP 503 to this sample's request: an invalid score


def rated(n: int) -> str:
    return f"[[fake:rating={n}]]"


class Engine:
    """A rollout engine: ``answers[prompt]`` are the prompt's n final answers, each scored by ``reward_func``."""

    def __init__(self, answers: dict[str, list[str]]):
        self.answers, self.dispatched = answers, []
        self.generate_responses = SimpleNamespace(remote=self._generate)
        self.get_num_unfinished_requests = SimpleNamespace(remote=lambda: 0)

    def _generate(self, prompt, label, sampling_params, max_length, hf_tokenizer, num_samples, images=None):
        from openrlhf_classmate.reward_func import reward_func

        self.dispatched.append(prompt)
        assert len(self.answers[prompt]) == num_samples
        out = []
        for answer in self.answers[prompt]:
            info = reward_func([prompt + answer], [prompt], [label], answers=[answer])
            out.append({"prompt": prompt, "label": label, "observation_tokens": [5, 6, 7, 8],
                        "action_ranges": [(2, 4)], "rollout_log_probs": None, "truncated": False,
                        "reward": info["rewards"], "scores": info["scores"], "extra_logs": info["extra_logs"]})
        return out


@pytest.fixture()
def judge(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda x: x)
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns=1, timeout=None: (refs[:num_returns], refs[num_returns:]))
    with serve_judge() as server:
        config = JudgeConfig(base_url=server.base_url, model="fake-judge", max_retries=0, timeout_s=10)
        monkeypatch.setenv("OPENRLHF_CLASSMATE_JUDGE", json.dumps(dataclasses.asdict(config)))
        yield server


def _generator(cls, answers: dict[str, list[str]], *flags: str, filtering: bool = True):
    args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl",
                       "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "4",
                       "--algo.advantage.estimator", "group_norm",
                       *(["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "2", "9"]
                         if filtering else []), *flags])
    label = json.dumps({"data_source": "helpful_instructions", "ground_truth": None,
                        "raw_question_for_monitor": "Is my plan good?", "messages": []})
    loader = [(None, [prompt], [label], [None]) for prompt in answers]  # one prompt per data-loader batch
    engine = Engine(answers)
    generator = cls(strategy=SimpleNamespace(args=args), prompts_dataloader=loader, eval_dataloader=None,
                    tokenizer=None, vllm_engines=[engine])
    return generator, engine


ANSWERS = {
    "p0": [rated(10), rated(10), DOWN, DOWN],  # valid mean 10: no signal (upstream: (10 + 10 + 0 + 0) / 4 = 5, kept)
    "p1": [rated(3), rated(5), DOWN, DOWN],  # valid mean 4 (upstream: 2, not > 2, dropped)
    "p2": [DOWN] * 4,  # the judge failed every sample: no valid score (upstream: mean 0, dropped)
    "p3": [rated(4), rated(6), rated(6), rated(4)],
    "p4": [rated(5)] * 4,
}


def test_the_group_mean_is_over_valid_scores_and_a_group_without_one_is_dropped_and_counted(judge):
    ours, engine = _generator(ClassmateSamplesGenerator, ANSWERS)
    samples, pass_rate, consumed, exhausted = ours.generate_samples()
    assert [s.prompts[0] for s in samples[::4]] == ["p1", "p3"] and len(samples) == 8
    assert engine.dispatched == ["p0", "p1", "p2", "p3"] and consumed == 4 and not exhausted
    assert pass_rate == pytest.approx(8 / 4 * 100)  # upstream's formula (samples / prompts)
    assert ours.invalid_groups == 1 and ours.seen_valid_score
    # the invalid samples of p1 are still there, marked, for the experience maker to mask
    assert [float(s.info["main_valid"][0]) for s in samples[:4]] == [1.0, 1.0, 0.0, 0.0]
    assert [float(s.scores[0]) for s in samples[:4]] == [3.0, 5.0, 0.0, 0.0]
    # upstream on the same answers keeps p0 (placeholder zeros pull its mean into range) and drops p1
    theirs, _ = _generator(SamplesGenerator, ANSWERS)
    assert [s.prompts[0] for s in theirs.generate_samples()[0][::4]] == ["p0", "p3"]


def test_judge_down_stops_the_run_with_the_all_invalid_message_instead_of_consuming_the_epoch(judge):
    down = {f"p{i}": [DOWN] * 4 for i in range(10)}
    theirs, engine = _generator(SamplesGenerator, down)
    assert theirs.generate_samples()[0] == [] and len(engine.dispatched) == 10  # upstream: the epoch, silently
    failed_before = judge.statuses.count(503)
    ours, engine = _generator(ClassmateSamplesGenerator, down, "--classmate.stop_after_invalid_steps", "2")
    with pytest.raises(TrainingStopped) as stop:
        ours.generate_samples()
    assert str(stop.value) == (
        "error: dynamic filtering dropped 4 prompt groups whose main scores were all invalid (2 x "
        "--rollout.batch_size 2): no score has been valid yet (judge or verifier down or misconfigured? see the "
        "reward function's log lines); stopping (--classmate.stop_after_invalid_steps)")
    assert len(engine.dispatched) == 5  # 2 + 3 replacements: the 4th dropped group stopped it
    assert judge.statuses.count(503) - failed_before == 5 * 4  # each sample asked the judge once and failed
    # 0 = never stop (the epoch runs out as upstream's would); after a valid score, later failures never stop it
    never, _ = _generator(ClassmateSamplesGenerator, down, "--classmate.stop_after_invalid_steps", "0")
    assert never.generate_samples()[0] == [] and never.invalid_groups == 10
    later = {"p0": [rated(4), rated(6), rated(5), rated(5)], **{f"p{i}": [DOWN] * 4 for i in range(1, 10)}}
    recovered, _ = _generator(ClassmateSamplesGenerator, later, "--classmate.stop_after_invalid_steps", "1")
    samples = recovered.generate_samples()[0]
    assert len(samples) == 4 and recovered.invalid_groups == 9


def test_filter_decision():
    assert filter_decision([10.0, 10.0, 0.0, 0.0], [True, True, False, False], (2, 9)) == OUT_OF_RANGE
    assert filter_decision([3.0, 5.0, 0.0, 0.0], [True, True, False, False], (2, 9)) == KEEP
    assert filter_decision([0.0] * 4, [False] * 4, (-1, 1)) == NO_VALID_SCORE  # 0 would be inside the range
    assert filter_decision([2.0, 2.0], [True, True], (2, 9)) == OUT_OF_RANGE  # open interval, as upstream


class Dispatch:
    """Stands in for ``ClassmateStage.dispatch`` (tests/test_experience_maker.py runs the real one on groups):
    records what it was sent and returns a one-request pending batch per sample."""

    def __init__(self):
        self.calls = []

    def __call__(self, group, first_index=0):
        import torch

        from openrlhf_classmate.integration.classmate.classmate_stage import PendingClassmate, Spans

        self.calls.append(([s.prompts[0] for s in group], first_index))
        n = len(group)
        flags = torch.zeros(n, dtype=torch.bool)
        spans = Spans([torch.tensor([1])] * n, [torch.tensor([True])] * n, torch.ones(n), flags, flags, flags)
        pending = PendingClassmate(spans, [{"sample": s.prompts[0]} for s in group], [""] * n, [[None] * n],
                                   dispatched_at=float(len(self.calls)))
        pending.refs = {(i, 0, 0): f"{s.prompts[0]}#{i}" for i, s in enumerate(group)}
        return pending


@pytest.mark.parametrize("filtering", [False, True])
def test_each_kept_group_sends_its_classmate_requests_as_soon_as_it_is_generated(judge, filtering):
    from openrlhf_classmate.integration.classmate.classmate_stage import ClassmateRollout

    ours, engine = _generator(ClassmateSamplesGenerator, ANSWERS, filtering=filtering)
    dispatch = ours.classmate_dispatch = Dispatch()
    samples, _, consumed, _ = ours.generate_samples()
    kept = ["p1", "p3"] if filtering else ["p0", "p1"]  # filtering drops p0 and p2 (no request for them)
    assert isinstance(samples, ClassmateRollout) and [s.prompts[0] for s in samples[::4]] == kept
    assert dispatch.calls == [([kept[0]] * 4, 0), ([kept[1]] * 4, 4)]
    pending = samples.classmate_pending
    assert pending.per_group and pending.dispatched_at == 1.0  # the first group's dispatch
    assert [pending.refs[(i, 0, 0)] for i in range(8)] == [f"{p}#{i % 4}" for p in kept for i in range(4)]
    assert [label["sample"] for label in pending.labels] == [s.prompts[0] for s in samples]

    # a batch that will train without the classmate (the step-time benchmark's alternation) sends nothing
    plain, _ = _generator(ClassmateSamplesGenerator, ANSWERS, filtering=filtering)
    plain.classmate_dispatch, plain.dispatch_next_per_group = Dispatch(), lambda: False
    samples = plain.generate_samples()[0]
    assert type(samples) is list and len(samples) == 8 and plain.classmate_dispatch.calls == []


def test_each_rollout_batch_reports_where_its_seconds_went(judge, monkeypatch):
    # rollout/* (the controller adds them to the step's status): the engines' share (their generation and the main
    # reward in their executors), the processing of the responses here, the wake-up / sleep around them
    import time

    from openrlhf_classmate.integration.rollout.samples_generator import rollout_parts

    assert rollout_parts(10.0, 9.0, 1.5, 4.0) == {"rollout/wake_sleep_s": 1.0, "rollout/engines_s": 7.5,
                                                  "rollout/process_s": 1.5, "rollout/first_group_s": 4.0}
    ours, engine = _generator(ClassmateSamplesGenerator, {"p3": ANSWERS["p3"], "p4": ANSWERS["p4"]},
                              filtering=False)
    generate = engine._generate
    engine.generate_responses = SimpleNamespace(remote=lambda *a, **k: time.sleep(0.4) or generate(*a, **k))
    samples = ours.generate_samples()[0]
    parts = ours.parts
    assert len(samples) == 8 and set(parts) == {"rollout/wake_sleep_s", "rollout/engines_s", "rollout/process_s",
                                                 "rollout/first_group_s"}
    # the stand-in engine answers at dispatch (Ray's get is the identity here): 2 x 0.4 s before the first group
    assert 0.8 <= parts["rollout/engines_s"] < 2.5 and parts["rollout/first_group_s"] >= 0.8
    assert 0 < parts["rollout/process_s"] < parts["rollout/engines_s"] and parts["rollout/wake_sleep_s"] < 0.2
