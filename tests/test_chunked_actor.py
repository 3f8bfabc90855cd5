"""``--logprobs.chunked`` through upstream's real ``Actor`` (``integration/training/chunked_actor.py``): the same action
log-probs, entropies and parameter gradients as upstream's forward, packed and unpadded, with temperature, LoRA and
gradient checkpointing; no [tokens, vocabulary] tensor; the flags' launch checks.

The models are float32 (tolerance 1e-6 of the largest value, as in ``test_chunked_logprobs.py``). Upstream's
``compute_entropy`` is ``torch.compile`` d (~80 s to compile on this CPU): its uncompiled body is used here.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from openrlhf.models import actor as upstream_actor_module
from openrlhf.models.actor import Actor
from openrlhf.models.utils import compute_entropy

from openrlhf_classmate.integration import patches
from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.integration.training.chunked_actor import ChunkedLogprobActor, chunked_actor_class
from openrlhf_classmate.integration.training.logprobs_options import check_model_config, validate_logprobs_args
from openrlhf_classmate.testing.tiny_models import ragged_batch, save_random_lm

PROMPTS, RESPONSES = [4, 6, 2], [5, 2, 7]  # per row; prompts left-padded, responses right-padded (upstream's layout)


@pytest.fixture(autouse=True)
def uncompiled_entropy(monkeypatch):
    monkeypatch.setattr(upstream_actor_module, "compute_entropy", compute_entropy._torchdynamo_orig_callable)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_lm(str(tmp_path_factory.mktemp("chunked") / "tied"), vocab_size=300)


def batch(vocab=300, prompts=PROMPTS, responses=RESPONSES, seed=0):
    return ragged_batch(vocab, prompts, responses, seed)


def build(cls, path, *, packing=False, temperature=1.0, seed=0, **kwargs):
    torch.manual_seed(seed)  # LoRA's random init
    actor = cls(path, attn_implementation="sdpa", param_dtype="bf16", packing_samples=packing,
                temperature=temperature, **kwargs)
    actor.model.float()
    return actor


def step(actor, sequences, attention, action_mask, *, entropy):
    """What ActorPPOTrainer.training_step does with the actor's outputs, with random weights on each token."""
    for p in actor.parameters():
        p.grad = None
    log_probs, output = actor(sequences, action_mask, attention_mask=attention, return_output=True,
                              return_entropy=entropy)
    g = torch.Generator().manual_seed(1)
    loss = (log_probs * torch.randn(log_probs.shape, generator=g)).sum()
    ent = None
    if entropy:
        ent = output.entropy[:, -action_mask.shape[1]:] * action_mask
        loss = loss + (ent * torch.randn(ent.shape, generator=g)).sum()
        ent = ent.detach()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in actor.named_parameters() if p.grad is not None}
    return log_probs.detach(), ent, grads


def assert_close(mine, theirs, rel=1e-6):
    torch.testing.assert_close(mine, theirs, rtol=0, atol=rel * max(1.0, float(theirs.abs().max())))


@pytest.mark.parametrize("packing,temperature,entropy", [(False, 1.0, False), (False, 0.7, True), (True, 1.0, True),
                                                         (True, 0.6, False)])
def test_actor_log_probs_entropy_and_gradients_equal_upstream(model_dir, packing, temperature, entropy):
    sequences, attention, action_mask = batch()
    stock = step(build(Actor, model_dir, packing=packing, temperature=temperature), sequences, attention,
                 action_mask, entropy=entropy)
    chunked_actor = build(chunked_actor_class(4), model_dir, packing=packing, temperature=temperature)
    mine = step(chunked_actor, sequences, attention, action_mask, entropy=entropy)
    assert int(action_mask.sum()) > 4  # several chunks
    assert_close(mine[0], stock[0])
    assert (mine[0][~action_mask] == 0).all()
    if entropy:
        assert_close(mine[1], stock[1])
    assert mine[2].keys() == stock[2].keys() and len(stock[2]) > 10  # every parameter, the tied head included
    for name in stock[2]:
        assert_close(mine[2][name], stock[2][name])


def test_reference_forward_and_every_position_log_probs_equal_upstream(model_dir):
    sequences, attention, action_mask = batch(seed=4)
    for packing in (False, True):
        stock, mine = (build(cls, model_dir, packing=packing) for cls in (Actor, chunked_actor_class(3)))
        with torch.no_grad():  # the reference / old-log-prob forward
            assert_close(mine(sequences, action_mask, attention), stock(sequences, action_mask, attention))
            all_mine = mine(sequences, attention_mask=attention, return_logprobs=True)
            all_stock = stock(sequences, attention_mask=attention, return_logprobs=True)
            assert all_mine.shape == all_stock.shape == (3, sequences.shape[1] - 1)
            assert_close(all_mine, all_stock)
            # a call that wants the logits themselves runs upstream's forward
            output = mine(sequences, attention_mask=attention, return_output=True)
            assert output["logits"].shape[-1] == 300


def test_lora_with_gradient_checkpointing_equals_upstream(model_dir):
    sequences, attention, action_mask = batch(seed=2)
    results = []
    for cls in (Actor, chunked_actor_class(5)):
        actor = build(cls, model_dir, lora_rank=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], seed=7)
        actor.gradient_checkpointing_enable()
        actor.train()
        results.append(step(actor, sequences, attention, action_mask, entropy=True))
    stock, mine = results
    assert all("lora" in name for name in stock[2]) and len(stock[2]) == 8  # only the adapters train
    assert_close(mine[0], stock[0])
    for name in stock[2]:
        assert_close(mine[2][name], stock[2][name])


def test_a_model_that_changes_the_head_output_is_stopped(model_dir):
    sequences, attention, action_mask = batch()
    actor = build(chunked_actor_class(4), model_dir)

    def softcap(module, args, output):  # what a model with logit soft-capping does after its head
        output["logits"] = torch.tanh(output["logits"] / 30) * 30
        return output

    actor.model.register_forward_hook(softcap)
    with pytest.raises(RuntimeError, match="changed its LM head's output"):
        actor(sequences, action_mask, attention)
    assert "forward" not in actor.model.lm_head.__dict__  # the head's own forward is back


class VocabularySizedTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """The largest numel of any tensor with a vocabulary-sized last dimension that an op creates."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab, self.max_numel = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab:
                self.max_numel = max(self.max_numel, t.numel())
        return out


def test_no_vocabulary_sized_tensor_grows_with_the_tokens(tmp_path):
    vocab, chunk = 2000, 16
    path = save_random_lm(str(tmp_path / "wide"), vocab_size=vocab, hidden_size=16)
    peaks = {}
    for name, cls in (("stock", Actor), ("chunked", chunked_actor_class(chunk))):
        actor = build(cls, path)
        for rows in (2, 8):
            sequences, attention, action_mask = batch(vocab, prompts=[12] * rows, responses=[20] * rows)
            with VocabularySizedTensors(vocab) as mode:
                step(actor, sequences, attention, action_mask, entropy=True)
            peaks[name, rows] = mode.max_numel
    tokens = 8 * 32
    assert peaks["stock", 8] >= tokens * vocab  # upstream: [batch, seq, vocabulary] float32 logits
    # chunked: one chunk's logits at most (the head's weight [vocab, 16] is chunk x vocab here), whatever the tokens
    assert peaks["chunked", 2] == peaks["chunked", 8] == chunk * vocab
    assert peaks["chunked", 8] < tokens * vocab / (tokens / chunk) * 2


# ── flags and wiring ──

BASE = ["--actor.model_name_or_path", "policy", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--data.prompt_dataset", "d.jsonl", "--rollout.batch_size", "4", "--rollout.micro_batch_size", "2",
        "--rollout.n_samples_per_prompt", "4", "--vllm.num_engines", "1"]


def test_the_flag_has_three_states_auto_by_default_and_bare_means_on(tmp_path):
    assert parse_args(BASE).logprobs.chunked == "auto"
    assert parse_args(BASE + ["--logprobs.chunked"]).logprobs.chunked == "on"  # bare, as before (scripts, configs)
    bare_then_flag = parse_args(BASE + ["--logprobs.chunked", "--logprobs.chunk_size", "1024"]).logprobs
    assert (bare_then_flag.chunked, bare_then_flag.chunk_size) == ("on", 1024)
    for state in ("auto", "on", "off"):
        assert parse_args(BASE + ["--logprobs.chunked", state]).logprobs.chunked == state
    with pytest.raises(SystemExit):
        parse_args(BASE + ["--logprobs.chunked", "yes"])
    # a --config file: YAML 1.1 reads on/off/true/false as booleans; auto as text
    for text, state in (("on", "on"), ("off", "off"), ("true", "on"), ("false", "off"), ("auto", "auto")):
        (tmp_path / "c.yaml").write_text(f"logprobs:\n  chunked: {text}\n")
        assert parse_args(BASE + ["--config", str(tmp_path / "c.yaml")]).logprobs.chunked == state, text


def test_chunk_size_applies_with_auto_and_on_and_is_refused_with_off():
    assert parse_args(BASE).logprobs.chunk_size == 2048
    assert parse_args(BASE + ["--logprobs.chunk_size", "512"]).logprobs.chunk_size == 512  # auto
    with pytest.raises(SystemExit, match="--logprobs.chunk_size sets the chunk of --logprobs.chunked"):
        parse_args(BASE + ["--logprobs.chunked", "off", "--logprobs.chunk_size", "512"])
    with pytest.raises(SystemExit, match="--logprobs.chunk_size"):
        parse_args(BASE + ["--logprobs.chunked", "--logprobs.chunk_size", "0"])


LORA_HEAD = ["--ds.lora.rank", "4", "--ds.lora.target_modules", "q_proj", "lm_head"]
# ring attention and AutoTP: refused on this CPU machine by the model-option checks already (no flash-attn, HF
# engines); where those pass (a GPU with vLLM), the chunked head still refuses them: set after parsing
UNSUPPORTED_FLAGS = [("ring_attn_size", "--ds.ring_attn_size 2", "the chunked LM head is not verified"),
                     ("tensor_parallel_size", "--ds.tensor_parallel_size 2", "a tensor-parallel LM head")]


def test_explicit_on_refuses_the_combinations_the_chunked_head_does_not_support():
    with pytest.raises(SystemExit, match="drop lm_head from --ds.lora.target_modules"):
        parse_args(BASE + ["--logprobs.chunked"] + LORA_HEAD)
    for attr, flag, why in UNSUPPORTED_FLAGS:
        args = parse_args(BASE + ["--logprobs.chunked", "on"])
        setattr(args.ds, attr, 2)
        with pytest.raises(SystemExit, match=f"--logprobs.chunked with {flag}: {why}"):
            validate_logprobs_args(args)


def _notes(capsys) -> list[str]:
    """The stderr lines about --logprobs.* since the last call (parse_args logs other resolved values too)."""
    return [line for line in capsys.readouterr().err.splitlines() if "--logprobs" in line]


def test_auto_falls_back_to_upstream_with_one_note_for_each_unsupported_flag(capsys):
    args = parse_args(BASE + LORA_HEAD)  # auto
    notes = _notes(capsys)
    assert args.logprobs.chunked == "off" and len(notes) == 1
    assert "upstream's" in notes[0] and "lm_head in --ds.lora.target_modules" in notes[0]
    for attr, flag, _ in UNSUPPORTED_FLAGS:
        args = parse_args(BASE)
        assert args.logprobs.chunked == "auto" and _notes(capsys) == []  # supported so far: no note
        setattr(args.ds, attr, 2)
        validate_logprobs_args(args)
        notes = _notes(capsys)
        assert args.logprobs.chunked == "off" and len(notes) == 1
        assert "--logprobs.chunked auto" in notes[0] and flag in notes[0] and "upstream's" in notes[0]
    # chunk_size given with auto, then a fallback: not refused (it would have applied)
    assert parse_args(BASE + LORA_HEAD + ["--logprobs.chunk_size", "64"]).logprobs.chunked == "off"


MODEL_CONFIGS = [(SimpleNamespace(vision_config={}), "vision-language"),
                 (SimpleNamespace(final_logit_softcapping=30.0), "final_logit_softcapping=30.0"),
                 (SimpleNamespace(logit_scale=0.0625), "logit_scale=0.0625")]


def test_the_model_config_check_refuses_vision_and_rescaled_logits_when_on():
    args = parse_args(BASE + ["--logprobs.chunked"])
    assert "plain LM head" in check_model_config(args, lambda p: SimpleNamespace(final_logit_softcapping=None))
    for config, what in MODEL_CONFIGS:
        with pytest.raises(SystemExit, match=what):
            check_model_config(args, lambda p, c=config: c)
    assert check_model_config(parse_args(BASE + ["--logprobs.chunked", "off"])) is None  # off: nothing loaded


def test_the_model_config_check_under_auto_turns_it_on_or_falls_back_with_one_note(capsys):
    args = parse_args(BASE)
    line = check_model_config(args, lambda p: SimpleNamespace(final_logit_softcapping=None))
    assert "plain LM head" in line and args.logprobs.chunked == "on" and _notes(capsys) == []
    for config, what in MODEL_CONFIGS:
        args = parse_args(BASE)
        capsys.readouterr()
        line = check_model_config(args, lambda p, c=config: c)
        notes = _notes(capsys)
        assert args.logprobs.chunked == "off" and len(notes) == 1 and what in notes[0] and what in line
        assert "--logprobs.chunked auto" in notes[0] and "upstream's" in notes[0]


def test_the_launch_preflight_resolves_auto_from_the_policy_folder(model_dir, tmp_path, capsys):
    import json
    import shutil

    from openrlhf_classmate.integration.launch.preflight import (
        PreflightError,
        PreflightReport,
        check_chunked_logprobs_model,
    )

    def preflight_chunked(path, *flags):
        args = parse_args(BASE + list(flags))
        args.actor.model_name_or_path = path
        report = PreflightReport()
        check_chunked_logprobs_model(args, report)
        return args.logprobs.chunked, report.lines

    state, lines = preflight_chunked(model_dir)
    assert state == "on" and any("plain LM head" in line for line in lines)
    capped = str(tmp_path / "capped")
    shutil.copytree(model_dir, capped)
    config = json.loads(open(f"{capped}/config.json").read())
    with open(f"{capped}/config.json", "w") as f:
        json.dump(config | {"final_logit_softcapping": 30.0}, f)
    capsys.readouterr()
    state, lines = preflight_chunked(capped)
    assert state == "off" and len(_notes(capsys)) == 1
    with pytest.raises(PreflightError, match="final_logit_softcapping=30.0"):
        preflight_chunked(capped, "--logprobs.chunked", "on")
    assert preflight_chunked(capped, "--logprobs.chunked", "off") == ("off", [])


def test_the_workers_build_the_chunked_actor_unless_off(monkeypatch, model_dir):
    import openrlhf.trainer.ray.launcher as launcher
    import openrlhf.trainer.ray.ppo_actor as ppo_actor

    from openrlhf_classmate.integration.training.actor import install_worker_actor
    from openrlhf_classmate.integration.training.weight_check import LoadCheckedActor

    monkeypatch.setattr(ppo_actor, "Actor", Actor)
    monkeypatch.setattr(launcher, "Actor", Actor)
    assert not install_worker_actor(parse_args(BASE + ["--logprobs.chunked", "off"]))
    for module in (ppo_actor, launcher):  # upstream's Actor with the load check only
        assert module.Actor is LoadCheckedActor and not issubclass(module.Actor, ChunkedLogprobActor)
    assert install_worker_actor(parse_args(BASE + ["--logprobs.chunked", "--logprobs.chunk_size", "64"]))
    for module in (ppo_actor, launcher):
        assert issubclass(module.Actor, ChunkedLogprobActor) and module.Actor.chunk_size == 64
        assert issubclass(module.Actor, LoadCheckedActor)
    auto = parse_args(BASE)  # a hub id the preflight left to the workers: resolved from the config they load
    auto.actor.model_name_or_path = model_dir
    assert install_worker_actor(auto) and auto.logprobs.chunked == "on"
    monkeypatch.delattr(launcher, "Actor")
    with pytest.raises(patches.UpstreamChangedError, match="launcher"):
        patches.install_actor_model(chunked_actor_class(8))


def test_the_launcher_gives_upstream_our_reference_worker(monkeypatch):
    import openrlhf.cli.train_ppo_ray as cli
    import openrlhf.trainer.ppo_trainer as ppo_trainer
    import openrlhf.trainer.ppo_trainer_async as ppo_trainer_async
    import openrlhf.trainer.ray.vllm_engine as vllm_engine

    from openrlhf_classmate.integration.training.actor import ClassmateReferenceModelActor

    for module, name in ((cli, "create_vllm_engines"), (cli, "PolicyModelActor"), (cli, "ReferenceModelActor"),
                         (cli, "placement_group"), (cli, "get_strategy"), (ppo_trainer, "PPOTrainer"),
                         (ppo_trainer_async, "PPOTrainerAsync"), (vllm_engine, "RolloutRayActor")):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    reference = object()
    patches.install_launcher(object(), object(), object(), reference)
    assert cli.ReferenceModelActor is reference
    from openrlhf.trainer.ray.launcher import ReferenceModelActor

    assert issubclass(ClassmateReferenceModelActor, ReferenceModelActor.__ray_actor_class__)
