"""The VR-CLI reward hook (openrlhf_classmate.rewards.vrcli) on a tiny generator with known behaviour
(openrlhf_classmate.testing.vrcli_world): generator inputs, the sign of the improvement, batched vs one-at-a-time
forwards through upstream's real ReferenceModelActor.forward and RayActorGroup chunking (Ray itself faked), ZeRO-3
lock-step, logged metrics, online and precomputed baselines, and the launch checks."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import ray
import torch

from openrlhf_classmate.data.story_prompts import generator_messages, policy_messages
from openrlhf_classmate.errors import TrainingStopped
from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.rewards.likelihood import (
    TemplateError,
    generator_inputs,
    gold_mean_nll,
    group_forward,
    model_checksum,
    plan_micro_batches,
)
from openrlhf_classmate.rewards.vrcli import PENDING_REWARD_FUNC_PATH, VrcliRewardHook, generator_sequence
from openrlhf_classmate.testing.tiny_models import save_tiny_model
from openrlhf_classmate.testing.vrcli_world import (
    build_plan_follower,
    in_process_reference_group,
    story,
    write_story_rows,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from openrlhf.models import Actor
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("vrcli")
    gen = build_plan_follower(str(root / "gen"))
    actor = Actor(AutoModelForCausalLM.from_pretrained(gen, dtype=torch.float32).eval())
    actor.packing_samples = False  # set by Actor only when it loads the model itself
    data = str(root / "train.jsonl")
    rows = write_story_rows(data, 6, seed=3)
    return SimpleNamespace(root=root, gen=gen, tok=AutoTokenizer.from_pretrained(gen), actor=actor, data=data,
                           rows=rows, labels=[json.loads(r["label"]) for r in rows])


@pytest.fixture()
def fake_ray(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda x: x)
    monkeypatch.setattr(ray, "put", lambda x: x)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # ReferenceModelActor.forward's device


def _sample(tok, label: dict, response: str):
    """A rollout sample as upstream builds it: prompt + response tokens, action mask over the response."""
    from openrlhf_classmate.integration.experience.experience import ClassmateExperience

    prompt = tok.apply_chat_template(label["messages"], add_generation_prompt=True, tokenize=False)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    response_ids = tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    seq = torch.tensor(prompt_ids + response_ids)
    action_mask = torch.zeros(len(seq) - 1, dtype=torch.bool)
    action_mask[len(prompt_ids) - 1 :] = True
    return ClassmateExperience(
        sequences=seq.unsqueeze(0), attention_mask=torch.ones(1, len(seq), dtype=torch.long),
        action_mask=action_mask.unsqueeze(0), rewards=torch.tensor([0.0]), scores=torch.tensor([0.0]),
        prompts=[prompt], labels=[json.dumps(label)], response_length=torch.tensor([len(response_ids)]),
        total_length=torch.tensor([len(seq)]), info={"reward": torch.tensor([0.0]), "main_valid": torch.tensor([0.0])},
    )


def _config(**overrides):
    cfg = dict(enable=True, mapping="ladder", thresholds=[0.05, 1.0, 2.0], ladder_rewards=[0.0, 0.5, 0.9, 1.0],
               baseline="online", missing_plan="invalid", micro_batch_size=8, max_tokens_per_forward=16384,
               max_len=0)
    cfg.update(overrides)
    return SimpleNamespace(**cfg)


def _hook(world, checksum=None, **overrides):
    return VrcliRewardHook(_config(**overrides), world.tok, model=world.gen, param_dtype="bf16",
                           reference_checksum=checksum)


def _maker(world, ranks=1, log=None):
    return SimpleNamespace(initial_model_group=in_process_reference_group(world.actor, ranks=ranks, log=log))


def _colour(label):
    return label["ground_truth"].split()[0]


def _other(colour):
    return "blue" if colour != "blue" else "green"


# ── generator inputs ──


def test_generator_inputs_score_the_gold_chapter_and_its_end_of_turn(world):
    label = world.labels[0]
    fields, chapter = story(0, _colour(label))
    base_ids, base_start = generator_inputs(world.tok, generator_messages(fields, None, chapter))
    plan_ids, plan_start = generator_inputs(world.tok, generator_messages(fields, "In summary: red", chapter))
    # the default template renders "<|assistant|>\n{content}<eos>\n": content + end-of-turn tokens are scored
    assert world.tok.decode(base_ids[base_start:]).split() == chapter.split() + ["<eos>"]
    assert base_ids[base_start:] == plan_ids[plan_start:]  # every prompt variant scores the very same tokens
    assert world.tok.decode(base_ids[base_start - 2 : base_start]).split() == ["<|assistant|>"]
    assert len(plan_ids) > len(base_ids)


def test_a_template_that_rewrites_the_assistant_turn_is_refused(world):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(world.gen)
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}<eos>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    with pytest.raises(TemplateError, match="cannot be located"):
        generator_inputs(tok, generator_messages(story(0, "red")[0], None, "red red"))


# ── forwards: the same numbers batched or one at a time, every rank in lock-step ──


def _items(world, n=7):
    items = []
    for i in range(n):
        label = world.labels[i % len(world.labels)]
        plan = None if i % 3 == 0 else " ".join(["red", "the", "and"][: 1 + i % 3] * (1 + i))  # varied lengths
        messages = generator_messages(story(i, _colour(label))[0], plan, label["ground_truth"])
        items.append(generator_inputs(world.tok, messages))
    return items


def test_batched_forwards_equal_one_call_per_sample_and_a_plain_hf_loss(world, fake_ray):
    items = _items(world)
    assert len({len(ids) for ids, _ in items}) > 3  # padding is exercised
    log: list = []
    batched = gold_mean_nll(group_forward(in_process_reference_group(world.actor, ranks=3, log=log)), items,
                            pad_id=world.tok.pad_token_id, micro_batch_size=2, ranks=3)
    single = [gold_mean_nll(group_forward(in_process_reference_group(world.actor)), [item],
                            pad_id=world.tok.pad_token_id, micro_batch_size=1)[0] for item in items]
    assert batched == pytest.approx(single, rel=1e-5, abs=1e-6)
    # and both are the model's own label loss over the gold span (no off-by-one in the action mask)
    model = world.actor.model
    for (ids, start), nll in zip(items, single):
        labels = torch.tensor([[-100] * start + ids[start:]])
        with torch.no_grad():
            loss = model(input_ids=torch.tensor([ids]), labels=labels).loss
        assert nll == pytest.approx(float(loss), rel=1e-5)
    # 7 rows in micro-batches of 2 -> 4, padded to 6 for 3 ranks: every rank ran exactly 2 forwards
    forwards = [rank for rank, rows in log for _ in rows]
    assert sorted(forwards) == [0, 0, 1, 1, 2, 2]


def test_micro_batches_respect_the_row_and_token_limits_and_balance_the_ranks():
    lengths = [100, 90, 80, 40, 30, 20, 10, 5]
    plan = plan_micro_batches(lengths, micro_batch_size=3, max_tokens=200, ranks=2)
    real = [b for b in plan if b[0] >= 0]
    assert sorted(i for b in real for i in b) == list(range(8))
    assert all(len(b) <= 3 and max(lengths[i] for i in b) * len(b) <= 200 for b in real)
    assert len(plan) % 2 == 0
    half = len(plan) // 2
    work = [sum(max(lengths[i] for i in b) * len(b) for b in chunk if b[0] >= 0)
            for chunk in (plan[:half], plan[half:])]
    assert max(work) <= 1.5 * min(work)
    # a row longer than the token limit runs alone
    assert plan_micro_batches([500, 10], 8, 100) == [[0], [1]]


# ── the hook ──


def test_the_plan_changes_the_gold_likelihood_with_the_known_sign(world, fake_ray):
    labels = world.labels[:3]
    responses = []
    for label in labels:
        c = _colour(label)
        responses += [f"<citation> the </citation> In summary: {c} {c}",  # names the gold colour
                      f"In summary: {_other(c)} {_other(c)}",              # names another colour
                      "In summary: the and one",                          # says nothing about colours
                      f"{c} {c} and no marker"]                           # no plan at all
    samples = [_sample(world.tok, labels[i // 4], r) for i, r in enumerate(responses)]
    metrics = _hook(world)(_maker(world), samples)
    rewards = [float(s.rewards[0]) for s in samples]
    valid = [float(s.info["main_valid"][0]) for s in samples]
    assert valid == [1, 1, 1, 0] * 3
    assert rewards == [1.0, 0.0, 0.0, 0.0] * 3  # ladder: gold plan >= 2 %, others below 0.05 %
    assert metrics["vrcli/ladder_n_ge_2"] == 3 and metrics["vrcli/ladder_n_lt_0.05"] == 6
    assert metrics["vrcli/invalid"] == 3 and metrics["vrcli/no_plan"] == 3
    assert metrics["vrcli/forward_sequences"] == 9 + 3  # 9 plans + one baseline per datapoint
    assert metrics["vrcli/baseline_forwards"] == 3
    assert metrics["vrcli/reward_forward_time"] > 0
    # the raw improvements, recomputed from perplexities of the same generator, have the known signs
    clipped = _hook(world, mapping="clipped")
    samples2 = [_sample(world.tok, labels[i // 4], r) for i, r in enumerate(responses)]
    clipped(_maker(world), samples2)
    improvements = [float(s.rewards[0]) for s in samples2]
    assert all(improvements[4 * g] > 2.0 for g in range(3))
    assert all(improvements[4 * g + 1] == 0.0 for g in range(3))  # negative, clipped to 0
    binary = _hook(world, mapping="binary")
    samples3 = [_sample(world.tok, labels[i // 4], r) for i, r in enumerate(responses)]
    m3 = binary(_maker(world), samples3)
    assert [float(s.rewards[0]) for s in samples3][:2] == [1.0, 0.0]
    assert m3["vrcli/improvement_min"] < -2.0 < 2.0 < m3["vrcli/improvement_max"]
    assert abs(m3["vrcli/improvement_p50"]) < 0.05  # the neutral plans sit in the middle


def test_online_baselines_are_computed_once_per_datapoint_and_cached(world, fake_ray):
    label = world.labels[0]
    c = _colour(label)
    hook = _hook(world)
    first = [_sample(world.tok, label, f"In summary: {c}") for _ in range(4)]
    m1 = hook(_maker(world), first)
    second = [_sample(world.tok, label, f"In summary: {c}") for _ in range(4)]
    log: list = []
    m2 = hook(_maker(world, log=log), second)
    assert m1["vrcli/baseline_forwards"] == 1 and m2["vrcli/baseline_forwards"] == 0
    assert m2["vrcli/forward_sequences"] == 4 and sum(sum(rows) for _, rows in log) == 4
    assert m1["vrcli/improvement_mean"] == pytest.approx(m2["vrcli/improvement_mean"], rel=1e-6)


def test_missing_plan_zero_and_too_long_inputs(world, fake_ray):
    label = world.labels[0]
    c = _colour(label)
    samples = [_sample(world.tok, label, "no marker"), _sample(world.tok, label, f"In summary: {c}")]
    m = _hook(world, missing_plan="zero")(_maker(world), samples)
    assert [float(s.info["main_valid"][0]) for s in samples] == [1.0, 1.0]
    assert float(samples[0].rewards[0]) == 0.0 and m["vrcli/invalid"] == 0 and m["vrcli/no_plan"] == 1
    # every generator input is longer than 10 tokens: nothing is forwarded, all invalid
    samples = [_sample(world.tok, label, f"In summary: {c}")]
    hook = _hook(world, max_len=10)
    m = hook(_maker(world), samples)
    assert float(samples[0].info["main_valid"][0]) == 0.0
    assert m["vrcli/invalid_too_long"] == 1 and m["vrcli/forward_sequences"] == 0
    # the step's skip (and stop) message names --vrcli.max_len, not the judge
    baseline = len(generator_sequence(world.tok, label, None)[0])
    assert hook.invalid_reason == (f"VR-CLI: 1 generator sequences longer than --vrcli.max_len 10 (without any plan "
                                   f"the shortest of this batch is {baseline} tokens: raise --vrcli.max_len, 0 = no "
                                   "limit)")


def test_missing_plan_whole_scores_the_whole_response_as_released(world, fake_ray):
    """--vrcli.missing_plan whole: a response without a marker is its own plan, scored exactly like the same text
    after 'In summary:'; the count of marker-less responses is still logged."""
    label = world.labels[0]
    c = _colour(label)
    text = f"{c} {c} and no marker"
    responses = [text, f"In summary: {text}", f"In summary: {_other(c)}", "In summary:"]
    samples = [_sample(world.tok, label, r) for r in responses]
    m = _hook(world, missing_plan="whole", mapping="clipped")(_maker(world), samples)
    rewards = [float(s.rewards[0]) for s in samples]
    assert [float(s.info["main_valid"][0]) for s in samples] == [1.0, 1.0, 1.0, 1.0]
    assert rewards[0] == rewards[1] > 2.0  # the gold colour helps, with or without the marker
    assert m["vrcli/no_plan"] == 2 and m["vrcli/invalid"] == 0  # "In summary:" alone: the released empty plan
    assert m["vrcli/forward_sequences"] == 4 + 1
    # the default leaves both marker-less responses invalid
    samples = [_sample(world.tok, label, r) for r in responses]
    m = _hook(world, mapping="clipped")(_maker(world), samples)
    assert [float(s.info["main_valid"][0]) for s in samples] == [0.0, 1.0, 1.0, 0.0]
    assert m["vrcli/no_plan"] == 2 and m["vrcli/invalid"] == 2


def _nan_on_token(world, word: str):
    """The world's generator with a NaN embedding row for ``word``: every position from that token on has NaN
    log-probs (what garbage reference weights give), sequences without it are unchanged."""
    import copy

    from openrlhf.models import Actor

    model = copy.deepcopy(world.actor.model)
    with torch.no_grad():
        model.transformer.wte.weight[world.tok.convert_tokens_to_ids(word)] = float("nan")
    actor = Actor(model)
    actor.packing_samples = False
    return SimpleNamespace(initial_model_group=in_process_reference_group(actor))


@pytest.mark.parametrize("mapping", ["ladder", "binary", "clipped"])
def test_a_non_finite_nll_makes_the_sample_invalid_in_every_mapping(world, fake_ray, mapping):
    """A NaN plan NLL used to become ladder 0 / binary 1 / clipped NaN, a valid reward; it is now an invalid one."""
    label = world.labels[0]
    c = _colour(label)
    samples = [_sample(world.tok, label, f"In summary: {c}"), _sample(world.tok, label, "In summary: three"),
               _sample(world.tok, label, f"In summary: {_other(c)}")]
    m = _hook(world, mapping=mapping)(_nan_on_token(world, "three"), samples)
    assert [float(s.info["main_valid"][0]) for s in samples] == [1.0, 0.0, 1.0]
    assert all(torch.isfinite(s.rewards).all() for s in samples) and float(samples[1].rewards[0]) == 0.0
    assert m["vrcli/invalid_nonfinite"] == 1 and m["vrcli/invalid"] == 1
    assert sum(m[k] for k in m if k.startswith("vrcli/ladder_n_")) == 2  # the NaN row is in no bucket
    assert all(v == v for v in m.values())  # no NaN in any logged statistic


def test_a_non_finite_online_baseline_makes_its_rows_invalid_and_is_not_cached(world, fake_ray):
    label = json.loads(json.dumps(world.labels[1]))
    label["ground_truth"] += " three"  # in the gold chapter: the baseline (and every plan) NLL is NaN
    hook = _hook(world)
    group = _nan_on_token(world, "three")
    for _ in range(2):
        samples = [_sample(world.tok, label, f"In summary: {_colour(label)}") for _ in range(2)]
        m = hook(group, samples)
        assert [float(s.info["main_valid"][0]) for s in samples] == [0.0, 0.0]
        assert m["vrcli/invalid_nonfinite"] == 2 and m["vrcli/baseline_forwards"] == 1  # tried again, not cached
    assert hook.baseline_cache == {}


def test_perplexity_of_a_huge_nll_is_inf_not_an_error():
    from openrlhf_classmate.algo.vrcli_reward import perplexity

    assert perplexity(1000.0) == float("inf") and perplexity(0.0) == 1.0
    assert perplexity(float("nan")) != perplexity(float("nan"))


def test_a_bad_label_stops_the_run_with_one_line(world, fake_ray):
    label = dict(world.labels[0])
    del label["datapoint_id"]
    with pytest.raises(TrainingStopped, match=r"^error: --vrcli.enable: field 'datapoint_id' is missing"):
        _hook(world)(_maker(world), [_sample(world.tok, label, "In summary: red")])
    label = {**world.labels[0], "data_source": "gsm8k"}
    with pytest.raises(TrainingStopped, match="scores rows of data_source 'vrcli_story', got 'gsm8k'"):
        _hook(world)(_maker(world), [_sample(world.tok, label, "In summary: red")])
    with pytest.raises(TrainingStopped, match="needs the reference model group"):
        _hook(world)(SimpleNamespace(initial_model_group=None), [_sample(world.tok, world.labels[0], "x")])


# ── precomputed baselines ──


def _precompute(world, out_dir, *files, extra=()):
    cmd = [sys.executable, os.path.join(REPO, "setup_data", "vrcli_baseline_ppl.py"), *files, "--model", world.gen,
           "--output-dir", str(out_dir), "--quiet", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**os.environ, "PYTHONPATH": REPO})


@pytest.fixture(scope="module")
def precomputed(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("baselines")
    res = _precompute(world, out, world.data)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "vrcli_baseline_ppl: 6 datapoints in 1 file(s)" in res.stdout
    return str(out / "train.jsonl")


def test_a_parquet_input_is_written_as_jsonl_and_never_rewritten_in_place(world, precomputed, tmp_path):
    # the output is JSON Lines: under the parquet's own name it made a file neither reader could open
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    source = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(world.rows), source)
    before = source.read_bytes()
    res = _precompute(world, tmp_path / "out", source)
    assert res.returncode == 0, res.stderr[-3000:]
    assert os.listdir(tmp_path / "out") == ["train.jsonl"]
    assert open(tmp_path / "out" / "train.jsonl").read() == open(precomputed).read()
    cmd = [sys.executable, os.path.join(REPO, "setup_data", "vrcli_baseline_ppl.py"), str(source), "--model",
           world.gen, "--in-place"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(
        f"--in-place rewrites the files as JSON Lines, and {source} is no .jsonl file; use --output-dir (it is "
        "written there as .jsonl)")
    assert source.read_bytes() == before and pq.read_table(source).num_rows == len(world.rows)


def test_precomputed_baselines_match_the_online_ones_and_carry_the_model_identity(world, precomputed, fake_ray):
    from openrlhf.models import Actor

    rows = [json.loads(line) for line in open(precomputed)]
    labels = [json.loads(r["label"]) for r in rows]
    checksum = model_checksum(world.gen)
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in world.rows]  # only the labels changed
    for label, original in zip(labels, world.labels):
        assert label["baseline_model"] == world.gen and label["baseline_checksum"] == checksum
        assert label["baseline_dtype"] == "bf16" and label["baseline_ppl"] > 1
        assert {k: v for k, v in label.items() if not k.startswith("baseline_")} == {
            k: v for k, v in original.items() if not k.startswith("baseline_")}
    # the same model in the same dtype through the reference-actor path: the same perplexities
    bf16 = Actor(world.gen, attn_implementation="sdpa", param_dtype="bf16")
    maker = SimpleNamespace(initial_model_group=in_process_reference_group(bf16))
    responses = [f"In summary: {_colour(label)}" for label in labels]
    online = [_sample(world.tok, label, r) for label, r in zip(labels, responses)]
    hook = _hook(world)
    hook(maker, online)
    dataset = [_sample(world.tok, label, r) for label, r in zip(labels, responses)]
    m = _hook(world, checksum=checksum, baseline="dataset")(maker, dataset)
    assert m["vrcli/baseline_forwards"] == 0 and m["vrcli/forward_sequences"] == 6
    for label in labels:
        key = (label["datapoint_id"], label["ground_truth"], json.dumps(label["messages"]))
        assert hook.baseline_cache[key] == pytest.approx(label["baseline_ppl"], rel=1e-3)
    assert [float(s.rewards[0]) for s in dataset] == [float(s.rewards[0]) for s in online]


def test_a_baseline_from_another_model_stops_the_hook(world, precomputed, fake_ray):
    label = json.loads(json.loads(open(precomputed).readline())["label"])
    hook = _hook(world, checksum="0" * 64, baseline="dataset")
    with pytest.raises(TrainingStopped, match=r"baseline_ppl was computed with model .* but the reference model is"):
        hook(_maker(world), [_sample(world.tok, label, "In summary: red")])
    hook = _hook(world, checksum=label["baseline_checksum"], baseline="dataset")
    with pytest.raises(TrainingStopped, match=r"has no baseline_ppl: run setup_data/vrcli_baseline_ppl.py"):
        hook(_maker(world), [_sample(world.tok, world.labels[0], "In summary: red")])


def test_the_precompute_script_names_a_bad_row(world, tmp_path):
    bad = tmp_path / "bad.jsonl"
    rows = [dict(world.rows[0]), dict(world.rows[1])]
    label = json.loads(rows[1]["label"])
    del label["ground_truth"]
    rows[1]["label"] = json.dumps(label)
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = _precompute(world, tmp_path / "out", str(bad))
    assert res.returncode == 1
    assert f"{bad}:2: field 'ground_truth' is missing" in res.stderr
    assert not (tmp_path / "out").exists()  # nothing written half-way


# ── launch checks (before Ray) ──


def _argv(world, *extra, data=None):
    return ["--actor.model_name_or_path", world.gen, "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node",
            "1", "--data.prompt_dataset", data or world.data, "--data.label_key", "label", "--rollout.batch_size",
            "2", "--rollout.n_samples_per_prompt", "4", "--vllm.num_engines", "1", "--algo.advantage.estimator",
            "group_norm", "--algo.kl.init_coef", "1e-6", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
            "--vrcli.enable", *extra]


def test_launch_accepts_matching_baselines_and_replaces_the_engine_reward(world, precomputed):
    args = parse_args(_argv(world, data=precomputed))
    assert args.reward.remote_url == [PENDING_REWARD_FUNC_PATH]
    assert args.vrcli.reference_checksum == model_checksum(world.gen)
    online = parse_args(_argv(world, "--vrcli.baseline", "online"))  # rows without baselines are fine online
    assert online.vrcli.reference_checksum is None


def test_launch_refuses_baselines_of_another_model(world, precomputed, tmp_path):
    other = save_tiny_model(str(tmp_path / "other"), ["red", "blue"], seed=5)
    with pytest.raises(SystemExit, match=rf"^error: --data.prompt_dataset {precomputed}:1: datapoint 'train:0': "
                                         r"baseline_ppl was computed with model .*\(6 rows of .* have a problem\)"):
        parse_args(_argv(world, data=precomputed)[:1] + [other] + _argv(world, data=precomputed)[2:])
    with pytest.raises(SystemExit, match=rf"{world.data}:1: datapoint 'train:0' has no baseline_ppl: run "
                                         r"setup_data/vrcli_baseline_ppl.py --model"):
        parse_args(_argv(world))
    with pytest.raises(SystemExit, match="computed in bf16 but the reference model runs in fp16"):
        parse_args(_argv(world, "--ds.param_dtype", "fp16", data=precomputed))


@pytest.mark.parametrize("extra, message", [
    (["--algo.kl.init_coef", "0"], "creates only when --algo.kl.init_coef > 0"),
    (["--rollout.temperature", "0.7"], "use --rollout.temperature 1.0"),
    (["--reward.remote_url", "http://127.0.0.1:1/score"], "computes the main reward itself"),
    (["--classmate.model_name_or_path", "x"], "with a classmate is not supported"),
    (["--algo.dynamic_filtering_enable"], "drop it"),
    (["--vrcli.thresholds", "1", "0.5", "--vrcli.ladder_rewards", "0", "1", "2"], "increase strictly"),
    (["--vrcli.ladder_rewards", "0", "1"], "needs 4 rewards"),
    (["--vrcli.micro_batch_size", "0"], "--vrcli.micro_batch_size must be >= 1"),
    (["--vrcli.max_len", "-1"], "must be >= 0"),
])
def test_launch_refusals(world, extra, message):
    with pytest.raises(SystemExit, match="^error: .*" + message.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.").replace("*", r"\*").replace("+", r"\+").replace("[", r"\[")):
        parse_args(_argv(world, "--vrcli.baseline", "online", *extra))


def test_vrcli_options_without_enable_and_a_missing_label_key_are_refused(world):
    argv = [a for a in _argv(world) if a != "--vrcli.enable"]
    with pytest.raises(SystemExit, match=r"^error: --vrcli.mapping has no effect without --vrcli.enable"):
        parse_args(argv + ["--vrcli.mapping", "binary"])
    argv = _argv(world, "--vrcli.baseline", "online")
    i = argv.index("--data.label_key")
    with pytest.raises(SystemExit, match="set --data.label_key"):
        parse_args(argv[:i] + argv[i + 2:])


def test_registry_and_engine_side_reward_of_vrcli_rows(world):
    from openrlhf_classmate.rewards.pending_reward_func import reward_func
    from openrlhf_classmate.scoring import LabelError, get_scorer

    with pytest.raises(LabelError, match="data_source 'vrcli_story', field 'data_source': .* run with --vrcli.enable"):
        get_scorer("vrcli_story").check_label(world.labels[0])
    out = reward_func(["q"], ["p"], [world.rows[0]["label"]])
    assert out["rewards"] == 0.0 and out["extra_logs"]["main_valid"] == 0.0  # pending: invalid until scored


def test_policy_rows_carry_what_the_hook_needs(world):
    label = world.labels[0]
    assert label["messages"] == policy_messages(story(0, _colour(label))[0])
    assert label["data_source"] == "vrcli_story" and label["ground_truth"].split()[0] in ("red", "green", "blue", "gold")


# ── in the experience maker and the evaluation ──


class _ActorGroup:
    """The policy's forward (one rank): log-probs of 0, so only the rewards shape the advantages."""

    def async_run_method_batch(self, method_name, **kwargs):
        return [[torch.zeros(m.shape) for m in kwargs["action_mask"]]]

    def async_run_method(self, method_name, **kwargs):
        return [None]


def _group_responses(label):
    c = _colour(label)
    return [f"In summary: {c} {c}", f"In summary: {_other(c)}", "In summary: the and", "no marker"]


def test_the_hook_rewards_reach_upstreams_advantages_through_the_maker(world, fake_ray):
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from openrlhf_classmate.integration import patches
    from openrlhf_classmate.integration.experience.experience_maker import ClassmateExperienceMaker
    from openrlhf_classmate.integration.experience.reward_methods import build_reward_hooks

    patches.install_experience()
    args = parse_args(_argv(world, "--vrcli.baseline", "online", "--rollout.micro_batch_size", "4"))
    hooks = build_reward_hooks(args, world.tok)
    assert [type(h) for h in hooks] == [VrcliRewardHook]
    maker = ClassmateExperienceMaker(_ActorGroup(), None, None, in_process_reference_group(world.actor),
                                     FixedKLController(args.algo.kl.init_coef), SimpleNamespace(args=args), world.tok,
                                     reward_hooks=hooks)
    labels = world.labels[:2]
    samples = [_sample(world.tok, label, r) for label in labels for r in _group_responses(label)]
    experiences = maker.make_experience_batch(samples)
    advantages = {i: e.advantages[r][e.action_mask[r].bool()] for e in experiences for r, i in enumerate(e.index)}
    # group_norm over the valid rewards [1, 0, 0] of each group; the response without a plan is masked (0)
    high, low = (1 - 1 / 3) / (1 / 3) ** 0.5, (0 - 1 / 3) / (1 / 3) ** 0.5
    for g in range(2):
        expected = [high, low, low, 0.0]
        for k in range(4):
            row = advantages[4 * g + k]
            assert row.tolist() == pytest.approx([expected[k]] * len(row), abs=1e-4)
    info = {key: torch.cat([e.info[key] for e in experiences]) for key in experiences[0].info}
    assert torch.all(info["vrcli/ladder_n_ge_2"] == 2) and torch.all(info["vrcli/invalid"] == 2)
    assert info["reward"].mean().item() == pytest.approx(1 / 3, abs=1e-6)  # over valid samples only
    assert info["main_valid"].tolist() == [1, 1, 1, 0] * 2


def test_evaluation_scores_eval_samples_with_the_hook(world, fake_ray):
    from openrlhf_classmate.integration.experience.reward_methods import build_reward_hooks
    from openrlhf_classmate.integration.trainer import ClassmatePPOTrainer

    args = parse_args(_argv(world, "--vrcli.baseline", "online"))
    labels = world.labels[:2]
    samples = [_sample(world.tok, label, _group_responses(label)[k]) for label, k in zip(labels, (0, 3))]
    logged = []
    trainer = ClassmatePPOTrainer.__new__(ClassmatePPOTrainer)
    trainer.experience_maker = SimpleNamespace(initial_model_group=in_process_reference_group(world.actor),
                                               reward_hooks=build_reward_hooks(args, world.tok))
    trainer.samples_generator = SimpleNamespace(generate_eval_samples=lambda **kw: samples)
    trainer.eval_dataloader = [(["vrcli_story"] * 2, [s.prompts[0] for s in samples], [s.labels[0] for s in samples],
                                [None, None])]
    trainer.wandb_logger = None
    trainer.tensorboard_logger = SimpleNamespace(log_eval=lambda step, logs: logged.append((step, logs)))
    logs = trainer.evaluate(8, n_samples_per_prompt=1)
    assert logged == [(8, logs)]
    # gold plan: 1.0; no plan: invalid (--vrcli.missing_plan invalid), left out of pass1, not read as 0
    assert logs["eval_vrcli_story_pass1"] == pytest.approx(1.0) and logs["eval_main_valid_fraction"] == 0.5
    assert logs["eval_vrcli/invalid"] == 1 and logs["eval_vrcli/ladder_n_ge_2"] == 1
