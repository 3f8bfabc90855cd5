"""``--ds.lora.rank`` in a classmate run: upstream's real ``Actor`` wraps the policy in a peft LoRA model; the engines
must get the merged weights under the base model's names, and everything frozen (classmate, reference) stays the
base model."""

from __future__ import annotations

import json
import os

import pytest
import torch
from openrlhf.models.actor import Actor

from openrlhf_classmate.integration.rollout.hf_engine import HFEngine
from openrlhf_classmate.integration.training.actor import engine_state_dict
from openrlhf_classmate.testing.e2e import (
    WORDS,
    build_world,
    launcher_argv,
    max_weight_change,
    run_launcher,
    tensorboard_scalars,
)
from openrlhf_classmate.testing.tiny_models import save_tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lora_actor(path: str) -> Actor:
    actor = Actor(path, attn_implementation="sdpa", param_dtype="bf16", lora_rank=4, lora_alpha=8,
                  target_modules="all-linear")
    actor.model.float()  # exact comparisons below; the merge itself is dtype-preserving
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in actor.model.named_parameters():
            if "lora_B" in name:  # peft starts B at 0 (adapter = identity): give it a trained-looking value
                p.normal_(0, 0.5)
    return actor


def _unreachable_answers(data: str) -> None:
    """Every row's ground truth becomes -1, which the world's vocabulary (digits 0-4, no minus) cannot write: every
    score is 0 in every run, so what moves the policy does not depend on what it happened to sample."""
    with open(data, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    with open(data, "w", encoding="utf-8") as f:
        for row in rows:
            row["label"] = json.dumps({**json.loads(row["label"]), "ground_truth": "-1"})
            f.write(json.dumps(row) + "\n")


def test_the_engine_gets_the_merged_lora_weights_and_serves_the_trained_policy(tmp_path):
    path = save_tiny_model(str(tmp_path / "policy"), WORDS, hidden_size=32, num_heads=4)
    actor = _lora_actor(path)
    state = engine_state_dict(actor.model)
    base = HFEngine(model=path, seed=0, device="cpu")  # also what a self-classmate engine loads: the base model
    assert set(state) == set(base.get_state_dict())  # the base model's names, no adapter tensors
    engine = HFEngine(model=path, seed=0, device="cpu")
    engine.load_weights(state)
    x = torch.tensor([[1, 5, 3, 6, 2, 7, 4]])
    with torch.no_grad():
        trained = actor.model(input_ids=x).logits
        served = engine.model(input_ids=x).logits
        frozen = base.model(input_ids=x).logits
    assert torch.allclose(served, trained, atol=1e-5), float((served - trained).abs().max())
    assert (frozen - trained).abs().max() > 1e-2  # the adapter really moved the policy away from the base
    # the training weights are untouched: still the adapter on the base weights, nothing merged in place
    q = actor.model.get_base_model().model.layers[0].self_attn.q_proj
    on_disk = base.get_state_dict()["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(q.base_layer.weight, on_disk.to(torch.bfloat16).float())  # the actor loaded it in bf16
    assert not q.merged


@pytest.mark.slow
def test_a_lora_classmate_run_trains_the_adapter_and_keeps_the_self_classmate_the_base(tmp_path):
    """One launcher step with --ds.lora.rank 4 (ZeRO-2, HF engines) whose classmate is the initial policy itself: the
    policy engine loads the merged weights (a PeftModel state dict would be refused by its strict load), the
    classmate engine never receives a weight, and the saved model is the trained adapter over the base."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    world = build_world(str(tmp_path / "world"))
    root = world["root"]
    _unreachable_answers(world["data"])
    argv = launcher_argv(world, classmate=False, max_samples=4) + [
        "--classmate.model_name_or_path", world["policy"], "--classmate.max_new_tokens", "8",
        "--classmate.estimator", "separated", "--ds.lora.rank", "4", "--ds.lora.alpha", "8",
        # the gradient that moves the adapter: every score is 0 here (zero advantages, and the KL term's gradient
        # is 0 at the first step); left to the sampled rewards, the adapter stayed at its zero init in one CI run
        "--actor.entropy_coef", "0.01"]
    argv[argv.index("--algo.advantage.estimator"):argv.index("--algo.advantage.estimator") + 2] = []
    log = str(tmp_path / "run.log")
    code = run_launcher(argv, log, cwd=REPO)
    assert code == 0, open(log).read()[-6000:]
    with open(os.path.join(root, "ckpt", "engine_weight_updates.json")) as f:
        assert json.load(f) == {"policy": [1], "classmate": [0]}  # the self-classmate stays the base model
    tb = tensorboard_scalars(os.path.join(root, "tb"))
    assert set(tb["train/classmate/classmate_loss"]) == {1}
    assert tb["train/reward"] == {1: 0.0} and tb["train/actor_grad_norm"][1] > 0
    final = os.path.join(root, "hf_final")
    assert os.path.isfile(os.path.join(final, "adapter_config.json"))  # upstream saves the adapter, not a merge
    base = AutoModelForCausalLM.from_pretrained(world["policy"], dtype=torch.float32)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    trained = PeftModel.from_pretrained(base, final).merge_and_unload()
    assert max_weight_change(before, trained.state_dict()) > 1e-4  # the adapter moved the policy
