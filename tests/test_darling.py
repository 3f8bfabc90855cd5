"""DARLING: partitions and diversity on hand-made groups with known classes, the combination modes with numbers, the
pair-classifier client against real local /classify servers (round-robin, one down), the reward hook through the
experience maker over upstream's real dr_grpo advantages (with and without a classmate), and the launch checks."""

import asyncio
import importlib.util
import os
import socket
from types import SimpleNamespace

import pytest
import torch

from openrlhf_classmate.algo.darling import (
    all_pairs,
    combine,
    ngram_diversity,
    pair_text,
    partition,
    partition_correct_diversity,
    partition_diversity,
    short_answer_rule,
)
from openrlhf_classmate.integration.experience.reward_methods import build_reward_hooks
from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.rewards.darling import DarlingConfig, DarlingRewardHook
from openrlhf_classmate.rewards.pair_classifier import ClassifierSettings, PairClassifier
from openrlhf_classmate.testing.fake_servers import FakeClassifierServer
from openrlhf_classmate.testing.servers import serve_in_thread


def _load_maker_helpers():
    """The fake-Ray experience-maker harness of test_experience_maker.py (tests/ is no package: --import-mode=importlib)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_experience_maker.py")
    spec = importlib.util.spec_from_file_location("experience_maker_harness", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_harness = _load_maker_helpers()
_args, _maker, _sample, _scalars = _harness._args, _harness._maker, _harness._sample, _harness._scalars
world, fake_ray = _harness.world, _harness.fake_ray  # fixtures


def _closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


# ── partitions and diversity ──


def test_union_find_takes_the_transitive_closure_of_the_equivalent_pairs():
    same = {p: False for p in all_pairs(5)}
    same.update({(0, 1): True, (1, 2): True, (3, 4): True})  # (0, 2) False, yet 0 ~ 1 ~ 2
    class_of, determined = partition(5, same)
    assert class_of == [0, 0, 0, 3, 3] and all(determined)
    assert partition_diversity(class_of) == pytest.approx([0.5, 0.5, 0.5, 0.75, 0.75])  # (5 - |C|) / (5 - 1)
    assert partition_diversity([0] * 4) == [0.1] * 4  # all equivalent: 0, floored at 0.1
    assert partition_diversity([0, 1, 2, 3], floor=0.1) == [1.0] * 4  # all different
    assert len(all_pairs(8)) == 28 and len(all_pairs(16)) == 120


def test_unknown_pairs_leave_only_the_classes_they_could_join_undetermined():
    same = {p: False for p in all_pairs(5)}
    same.update({(0, 1): True, (1, 2): True, (0, 2): None})  # unknown, but 0 and 2 are connected anyway
    assert partition(5, same)[1] == [True] * 5
    same[(2, 3)] = None  # could join {0, 1, 2} and {3}
    class_of, determined = partition(5, same)
    assert class_of == [0, 0, 0, 3, 4] and determined == [False, False, False, False, True]


def test_partition_correct_and_ngram_variants():
    class_of = [0, 0, 2, 3, 3]
    correct = [True, True, True, False, True]  # k = 4 correct; class 0 holds 2 of them, class 3 holds 1
    assert partition_correct_diversity(class_of, correct) == pytest.approx([2 / 3, 2 / 3, 1.0, 0.1, 1.0])
    assert partition_correct_diversity(class_of, [True, False, False, False, False]) == [0.1] * 5  # k <= 1
    texts = ["a b c d e", "a b c d x", "q r s t", "a b"]
    # 4-grams: t0 {abcd, bcde}, t1 {abcd, bcdx}, t2 {qrst}, t3 none
    assert ngram_diversity(texts, n=4) == pytest.approx([0.5, 0.5, 1.0, 0.0])


def test_short_answer_rule_and_pair_input():
    assert short_answer_rule("42", "42") is True
    assert short_answer_rule("The answer 42", "answer is 41") is False  # 2 * |{answer}| < 3
    assert short_answer_rule("x = 5", "5 = X") is True
    assert short_answer_rule("one two three four five six", "one") is None  # longer than 5 words: classifier
    assert pair_text("a  b c", "d e", cls="[CLS]", sep="[SEP]", max_len=9) == "[CLS]a b c[SEP]d e[SEP]"
    # (9 - 3) // 2 = 3 words
    assert pair_text("a b c d", "e f g h", cls="<s>", sep="</s>", max_len=9) == "<s>a b c</s>e f g</s>"


def test_combination_modes_with_numbers():
    q, d = [1.0, 0.0, 1.0, 1.0], [0.5, 1.0, 0.25, 0.1]
    assert combine(q, d)[0] == pytest.approx([0.5, 0.0, 0.25, 0.1])
    assert combine(q, d, mode="additive", lambda_quality=1.0, lambda_diversity=0.5)[0] == pytest.approx(
        [1.25, 0.5, 1.125, 1.05])
    # z-scores: q mean 0.75, std 0.5 -> [0.5, -1.5, 0.5, 0.5]; d mean 0.4625, std 0.3966 -> ...
    rewards, _ = combine(q, d, mode="normalize_then_sum", lambda_quality=2.0, lambda_diversity=1.0)
    dt = torch.tensor(d, dtype=torch.float64)
    zd = (dt - dt.mean()) / (dt.std() + 1e-6)
    zq = torch.tensor([0.5, -1.5, 0.5, 0.5], dtype=torch.float64) * 0.5 / (0.5 + 1e-6)
    assert rewards == pytest.approx((2 * zq + zd).tolist())
    assert combine([1.0, 1.0], [0.3, 0.9], mode="normalize_then_sum")[0] == pytest.approx([-0.70710, 0.70710], abs=1e-4)
    # min-shift: a reward model's qualities [-2, 1, 3] become [0, 3, 5]
    assert combine([-2.0, 1.0, 3.0], [1.0, 0.5, 0.2], min_shift=True)[0] == pytest.approx([0.0, 1.5, 1.0])


def test_combination_reports_which_rewards_depend_on_unknowns():
    q, d = [1.0, 0.0, 1.0, 1.0], [0.5, 1.0, 0.25, 0.1]
    d_known = [False, False, True, True]
    assert combine(q, d, diversity_known=d_known)[1] == [False, True, True, True]  # q = 0: reward 0 regardless
    assert combine(q, d, mode="additive", diversity_known=d_known)[1] == d_known
    assert combine(q, d, mode="normalize_then_sum", diversity_known=d_known)[1] == [False] * 4
    rewards, ok = combine([5.0, 1.0, 3.0], [1.0, 1.0, 1.0], mode="normalize_then_sum",
                          quality_known=[True, False, True])
    assert ok == [True, False, True] and rewards[1] == 0.0  # a failed quality leaves the group statistics
    assert rewards[0] == pytest.approx(0.7071, abs=1e-4) and rewards[2] == pytest.approx(-0.7071, abs=1e-4)


# ── the classifier client against real servers ──


def test_classifier_round_robin_payload_and_probabilities():
    a, b = FakeClassifierServer(model="similarity_gpu_0"), FakeClassifierServer(model="similarity_gpu_1")
    texts = [pair_text(f"w{i} x y z", f"w{i} x y q", cls="<|im_start|>", sep="<|im_end|>", max_len=4096)
             for i in range(10)]
    with serve_in_thread(a), serve_in_thread(b):
        client = PairClassifier(ClassifierSettings(urls=(a.url + "/v1", b.url)))
        probs = asyncio.run(client.classify(texts))
    assert probs == pytest.approx([3 / 5] * 10)  # Jaccard of {wi, x, y, z} and {wi, x, y, q}
    assert len(a.requests) == 5 and len(b.requests) == 5
    assert a.requests[0] == {"model": "similarity_gpu_0", "input": [texts[0]]}
    assert {r["model"] for r in b.requests} == {"similarity_gpu_1"}  # each server's own /v1/models name
    assert client.stats.pairs == 10 and client.stats.failed_pairs == 0 and client.stats.retries == 0


def test_one_server_down_costs_retries_not_pairs_and_all_down_makes_pairs_unknown():
    live = FakeClassifierServer()
    texts = [pair_text("a b c", "a b d", cls="<|im_start|>", sep="<|im_end|>", max_len=99)] * 8
    with serve_in_thread(live):
        client = PairClassifier(ClassifierSettings(urls=(_closed_url(), live.url), backoff_s=0.0,
                                                   pairs_per_request=2))
        probs = asyncio.run(client.classify(texts))
    assert probs == pytest.approx([0.5] * 8) and len(live.requests) == 4
    assert client.stats.retries == 2 and client.stats.failed_pairs == 0  # the 2 requests sent to the down server
    with serve_in_thread(FakeClassifierServer(fail_first=1)) as flaky:
        client = PairClassifier(ClassifierSettings(urls=(flaky.url,), backoff_s=0.0))
        assert asyncio.run(client.classify(texts[:1])) == [pytest.approx(0.5)] and client.stats.retries == 1
    client = PairClassifier(ClassifierSettings(urls=(_closed_url(), _closed_url()), max_retries=1, backoff_s=0.0))
    assert asyncio.run(client.classify(texts[:3])) == [None, None, None]
    assert client.stats.failed_pairs == 3 and client.stats.requests == 3
    assert "/v1/models" in client.stats.errors[0] and "ClientConnectorError" in client.stats.errors[0]


# ── the hook through the experience maker (upstream's real dr_grpo advantages) ──

A = "<think> 1 + 2 = 3 </think> answer 3"
B = "5 5 4 4 0 0 answer 3"
C = "? ? ? ? ? ? ? 1"
D = "0 0 0 0 0 0 answer 3"  # Jaccard(B, D) = 3/5: equivalent; every other pair of different texts < 0.25
GROUPS = [([A, A, B, C], [1, 1, 1, 0]), ([A, B, D, C], [1, 1, 1, 1]), ([A, B, C, D], [0, 0, 0, 0])]
# classes: {0,1} {2} {3} | {0} {1,2} {3} | {0} {1,3} {2} -> Div = (4 - |C|) / 3
DIV = [[2 / 3, 2 / 3, 1, 1], [1, 2 / 3, 2 / 3, 1], [1, 2 / 3, 1, 2 / 3]]


def _rollout(tok):
    return [_sample(tok, "1 + 2 = ?", text, float(q)) for texts, qs in GROUPS for text, q in zip(texts, qs)]


def _darling_args(world, url, *extra, classmate=False):
    return _args(world, "--algo.advantage.estimator", "dr_grpo", "--darling.diversity", "partition",
                 "--darling.classifier_urls", url, "--darling.backoff_s", "0", *extra, classmate=classmate)


@pytest.mark.parametrize("classmate", [False, True])
def test_the_hook_sets_quality_times_diversity_and_dr_grpo_centres_it(world, fake_ray, classmate):
    server = FakeClassifierServer()
    with serve_in_thread(server):
        extra = ("--classmate.estimator", "separated") if classmate else ()
        args = _darling_args(world, server.url + "/v1", *extra, classmate=classmate)
        maker, _ = _maker(args, world.tok, fake_ray, classmate=classmate)
        maker.reward_hooks = build_reward_hooks(args)
        out = maker.make_experience_batch(_rollout(world.tok))
    expected = torch.tensor([q * d for (_, qs), divs in zip(GROUPS, DIV) for q, d in zip(qs, divs)],
                            dtype=torch.float64)
    g = expected.view(3, 4)
    assert _scalars(out).tolist() == pytest.approx((g - g.mean(1, keepdim=True)).flatten().tolist(), abs=1e-6)
    info = {k: float(out[0].info[k][0]) for k in out[0].info if k.startswith("darling/")}
    assert info["darling/all_correct"] == 1.0 and info["darling/all_incorrect"] == 1.0
    assert info["darling/quality"] == pytest.approx(7 / 12)
    assert info["darling/diversity"] == pytest.approx(10 / 12)
    assert info["darling/num_classes"] == 3.0 and info["darling/largest_class"] == 2.0
    assert info["darling/pairs_classified"] == 18.0 and info["darling/pairs_unknown"] == 0.0
    assert len(server.requests) == 18  # every pair of every group, one per request
    rewards = torch.cat([e.info["reward"] for e in out]).double()
    assert float(rewards.mean()) == pytest.approx(float(expected.mean()), abs=1e-6)


def test_unknown_pairs_are_counted_and_their_rewards_masked_never_read_as_different(world, fake_ray):
    args = _darling_args(world, _closed_url(), "--darling.max_retries", "0")
    maker, _ = _maker(args, world.tok, fake_ray, classmate=False)
    maker.reward_hooks = build_reward_hooks(args)
    out = maker.make_experience_batch(_rollout(world.tok))
    valid = torch.cat([e.info["main_valid"] for e in out])
    order = torch.cat([torch.tensor(e.index) for e in out])
    valid = valid[order.argsort()]
    # every class touches an unknown pair; a correct answer's reward q * Div depends on it, a wrong one's (0) not
    assert valid.tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1]
    assert _scalars(out)[valid == 0].abs().max() == 0.0
    info = {k: float(out[0].info[k][0]) for k in out[0].info if k.startswith("darling/")}
    assert info["darling/pairs_unknown"] == 18.0 and info["darling/undetermined"] == 7.0


def test_short_answers_need_no_classifier_and_ngram_needs_no_server(world, fake_ray):
    args = _args(world, "--algo.advantage.estimator", "dr_grpo", "--darling.diversity", "ngram",
                 "--darling.ngram_n", "2", classmate=False)
    maker, _ = _maker(args, world.tok, fake_ray, classmate=False)
    maker.reward_hooks = build_reward_hooks(args)
    out = maker.make_experience_batch(_rollout(world.tok))
    texts = [t for texts, _ in GROUPS for t in texts]
    qs = [q for _, qs in GROUPS for q in qs]
    div = [d for i in range(0, 12, 4) for d in ngram_diversity(texts[i : i + 4], n=2)]
    rewards = torch.tensor([q * d for q, d in zip(qs, div)], dtype=torch.float64).view(3, 4)
    assert _scalars(out).tolist() == pytest.approx((rewards - rewards.mean(1, keepdim=True)).flatten().tolist(),
                                                   abs=1e-6)


# ── launch checks ──


@pytest.mark.parametrize("extra, message", [
    (["--darling.combine", "additive"], "needs DARLING on"),
    (["--darling.diversity", "partition", "--darling.classifier_urls", "http://x:1"], "dr_grpo"),
    (["--darling.diversity", "partition", "--algo.advantage.estimator", "dr_grpo"], "needs the pair classifier"),
    (["--darling.diversity", "ngram", "--algo.advantage.estimator", "dr_grpo", "--darling.threshold", "0.3"],
     "partition variants"),
    (["--darling.diversity", "ngram", "--algo.advantage.estimator", "dr_grpo", "--darling.lambda_quality", "2"],
     "multiplicative"),
    (["--darling.diversity", "ngram", "--algo.advantage.estimator", "dr_grpo", "--darling.combine", "additive",
      "--darling.lambda_diversity", "0"], "quality-only"),
    (["--darling.diversity", "partition", "--algo.advantage.estimator", "dr_grpo", "--darling.classifier_urls",
      "x:1"], "http"),
    (["--darling.diversity", "ngram", "--algo.advantage.estimator", "dr_grpo", "--train.async_enable"],
     "synchronous"),
])
def test_bad_darling_options_are_refused_with_one_line(world, extra, message, monkeypatch):
    monkeypatch.delenv("DARLING_CLASSIFIER_URLS", raising=False)
    with pytest.raises(SystemExit) as e:
        _args(world, *extra, classmate=False)
    assert str(e.value).startswith("error: ") and message in str(e.value) and "\n" not in str(e.value)


def test_classifier_urls_from_the_environment_and_no_hook_when_off(world, monkeypatch):
    monkeypatch.setenv("DARLING_CLASSIFIER_URLS", "http://127.0.0.1:8010/v1, http://127.0.0.1:8011/v1")
    args = _args(world, "--algo.advantage.estimator", "dr_grpo", "--darling.diversity", "partition",
                 classmate=False)
    hooks = build_reward_hooks(args)
    assert len(hooks) == 1 and hooks[0].classifier.roots == ["http://127.0.0.1:8010", "http://127.0.0.1:8011"]
    assert build_reward_hooks(parse_args(["--actor.model_name_or_path", world.policy])) == []


def _plain_samples(qualities, valid=None):
    from types import SimpleNamespace

    return [SimpleNamespace(rewards=torch.tensor([float(q)]),
                            info={} if valid is None else {"main_valid": torch.tensor([float(valid[i])])})
            for i, q in enumerate(qualities)]


def test_quality_values_map_correct_and_incorrect_and_failed_qualities_stay_masked():
    from openrlhf_classmate.rewards.darling import DarlingConfig, DarlingRewardHook

    hook = DarlingRewardHook(DarlingConfig(diversity="ngram", ngram_n=1, quality_values=[1.0, -1.0]), 4)
    samples = _plain_samples([1, 0, 0, 1], valid=[1, 1, 1, 0])
    metrics = hook.apply(samples, ["a b", "a c", "d e", "a b"])  # 1-gram diversity: [0, 0.5, 1, 0]
    assert [float(s.rewards[0]) for s in samples] == pytest.approx([0.0, -0.5, -1.0, 0.0])
    assert [float(s.info["main_valid"][0]) for s in samples[3:]] == [0.0]  # its quality failed: still masked
    assert float(samples[0].info["main_valid"][0]) == 1.0 and metrics["darling/undetermined"] == 0.0
    assert metrics["darling/quality"] == pytest.approx(-1 / 3)  # over the valid qualities: 1, -1, -1


def test_partition_correct_classifies_only_pairs_of_correct_responses():
    from openrlhf_classmate.rewards.darling import DarlingConfig, DarlingRewardHook

    with serve_in_thread(FakeClassifierServer()) as server:
        hook = DarlingRewardHook(DarlingConfig(diversity="partition_correct", classifier_urls=[server.url]), 4)
        samples = _plain_samples([1, 1, 0, 1])
        metrics = hook.apply(samples, [A, A, B, C])
    assert len(server.requests) == 3 and metrics["darling/pairs_classified"] == 3.0  # pairs among {0, 1, 3}
    # k = 3 correct: {0, 1} share a class -> (3 - 2) / 2 = 0.5; 3 alone -> 1; the wrong one gets the floor (x q = 0)
    assert [float(s.rewards[0]) for s in samples] == pytest.approx([0.5, 0.5, 0.0, 1.0])


def _scored(rewards, valid):
    """Rollout samples as the hook sees them: the reward function's quality and its validity flag (an invalid score
    carries the placeholder 0)."""
    return [SimpleNamespace(rewards=torch.tensor([float(r)]), info={"main_valid": torch.tensor([float(v)])})
            for r, v in zip(rewards, valid)]


def test_an_invalid_quality_is_not_read_as_an_incorrect_answer():
    # partition_correct: the diversity of a correct answer depends on k, the number of correct answers; with one
    # answer's correctness unknown (judge down), k is unknown and so are the correct answers' rewards: masked, not
    # computed as if the unknown answer were wrong. An incorrect answer gets the floor whatever k is: still scored.
    hook = DarlingRewardHook(DarlingConfig(diversity="partition_correct", classifier_urls=["http://127.0.0.1:9"],
                                           short_answer_words=5), 4)
    samples = _scored([1, 0, 0, 1], [1, 1, 0, 1])  # row 2 invalid; rows 0-2 give the same short answer
    metrics = hook.apply(samples, ["x", "x", "x", "y"])
    assert [float(s.info["main_valid"][0]) for s in samples] == [0.0, 1.0, 0.0, 0.0]
    assert float(samples[1].rewards[0]) == 0.0  # incorrect: quality 0 x the floor
    assert metrics["darling/undetermined"] == 2.0  # rows 0 and 3: valid scores whose reward is unknown
    # all valid: the same group is scored as before (k = 3 correct among rows 0, 2, 3; rows 0 and 2 share a class)
    samples = _scored([1, 0, 1, 1], [1, 1, 1, 1])
    hook.apply(samples, ["x", "x", "x", "y"])
    assert [float(s.info["main_valid"][0]) for s in samples] == [1.0] * 4
    assert [round(float(s.rewards[0]), 4) for s in samples] == [0.5, 0.0, 0.5, 1.0]


def test_all_correct_and_all_incorrect_count_groups_over_their_valid_answers():
    hook = DarlingRewardHook(DarlingConfig(diversity="ngram", ngram_n=1), 4)
    # group 0: no valid score (not all-incorrect: unknown); group 1: every valid answer correct, one invalid;
    # group 2: every valid answer wrong
    samples = _scored([0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1])
    metrics = hook.apply(samples, ["a b", "a c", "d e", "f g"] * 3)
    assert metrics["darling/all_correct"] == 1.0 and metrics["darling/all_incorrect"] == 1.0
