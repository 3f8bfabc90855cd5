"""``--logprobs.chunked`` under real DeepSpeed ZeRO-3 (CPU accelerator, one process): our policy worker class builds
upstream's ``PolicyModelActor`` state (``strategy.prepare``: the engine partitions every parameter, the tied LM head
included), then the same micro-batch runs through upstream's forward and the chunked one. The chunked head gathers
the partitioned weight through DeepSpeed's module hooks for the forward and again for the backward; log-probs and
the full gradients (``safe_get_full_grad``) must agree with upstream's within bf16 tolerance (the engine runs in
bf16: see ``test_chunked_logprobs.py`` for the bound). Our reference worker, a ZeRO-3 eval engine, builds the
chunked actor as well and gives the same log-probs."""

from __future__ import annotations

import os
import socket

import pytest
import torch

from openrlhf_classmate.testing.ds_policy import reset_deepspeed_state

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def cpu_worker(monkeypatch):
    """The process state a Ray actor worker has (CPU runtime patches, rank environment), restored afterwards."""
    from openrlhf_classmate.integration import patches
    from openrlhf_classmate.testing.ds_policy import cpu_runtime

    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.setenv(key, os.environ.get(key, ""))  # the worker's __init__ sets them
    monkeypatch.setenv("LOCAL_RANK", "0")
    with cpu_runtime(monkeypatch):
        patches.install_experience()
        reset_deepspeed_state()  # whatever an earlier test in this process left
        yield
        reset_deepspeed_state()  # the group and DeepSpeed's cache of it: a later engine in this process starts clean


def test_zero3_chunked_log_probs_and_gradients_equal_upstream(tmp_path, cpu_worker):
    import deepspeed
    from deepspeed.utils import safe_get_full_grad
    from openrlhf.utils import get_strategy

    from openrlhf_classmate.integration.launch.args import parse_args
    from openrlhf_classmate.integration.training.actor import ClassmatePolicyModelActor, ClassmateReferenceModelActor
    from openrlhf_classmate.integration.training.chunked_actor import ChunkedLogprobActor
    from openrlhf_classmate.testing.tiny_models import ragged_batch, save_random_lm
    from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

    path = save_random_lm(str(tmp_path / "policy"), vocab_size=300, hidden_size=32, tie=True)
    build_word_tokenizer([str(i) for i in range(10)]).save_pretrained(path)  # the worker loads one
    args = parse_args([
        "--actor.model_name_or_path", path, "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--data.prompt_dataset", "unused.jsonl", "--vllm.num_engines", "0", "--rollout.batch_size", "3",
        "--rollout.micro_batch_size", "3", "--rollout.n_samples_per_prompt", "1", "--train.batch_size", "3",
        "--train.micro_batch_size", "3", "--ds.zero_stage", "3", "--ds.param_dtype", "bf16",
        "--ds.attn_implementation", "sdpa", "--actor.gradient_checkpointing_enable", "--rollout.temperature", "0.8",
        "--algo.advantage.estimator", "reinforce", "--engine.backend", "hf", "--logprobs.chunked",
        "--logprobs.chunk_size", "4",
    ])
    strategy = get_strategy(args)
    worker = ClassmatePolicyModelActor.__new__(ClassmatePolicyModelActor)
    ClassmatePolicyModelActor.__init__(worker, 1, 0, "127.0.0.1", _free_port())
    worker.init_model_from_pretrained(strategy, path, max_steps=10)
    actor = worker.actor
    assert isinstance(actor, ChunkedLogprobActor) and actor.chunk_size == 4
    engine = actor.model
    head = engine.module.get_output_embeddings()
    assert head.weight is engine.module.get_input_embeddings().weight  # tied
    assert head.weight.numel() == 0 and head.weight.ds_numel == 300 * 32  # partitioned outside a forward

    sequences, attention, action_mask = ragged_batch(300, [4, 6, 2], [5, 2, 7])
    results = {}
    for mode in ("stock", "chunked"):
        actor.chunk_size = None if mode == "stock" else 4
        old = worker.forward(sequences, action_mask, attention)  # the old / reference log-prob forward (no grad)
        engine.optimizer.zero_grad()
        log_probs, output = actor(sequences, action_mask, attention_mask=attention, return_output=True,
                                  return_entropy=False)
        g = torch.Generator().manual_seed(1)
        strategy.backward((log_probs * torch.randn(log_probs.shape, generator=g)).sum(), actor, None)
        grads = {name: safe_get_full_grad(p).float().clone() for name, p in engine.module.named_parameters()}
        results[mode] = (old, log_probs.detach(), grads)
    norm = engine.module.model.norm
    with deepspeed.zero.GatheredParameters([head.weight, norm.weight]), torch.no_grad():
        # |logit| <= |RMSNorm output| x |head row| <= sqrt(H) max|gamma| x max_v |w_v|
        max_logit = float(32**0.5 * norm.weight.float().abs().max() * head.weight.float().norm(dim=1).max())
    (old_s, lp_s, grads_s), (old_c, lp_c, grads_c) = results["stock"], results["chunked"]
    bound = 2 * 2**-8 * max(1.0, max_logit) / 0.8
    torch.testing.assert_close(old_c, old_s, rtol=0, atol=bound)
    torch.testing.assert_close(lp_c, lp_s, rtol=0, atol=bound)
    assert (lp_c[~action_mask] == 0).all() and lp_c[action_mask].lt(0).all()
    assert grads_s.keys() == grads_c.keys() and "model.embed_tokens.weight" in grads_s
    for name, ref in grads_s.items():
        assert ref.abs().max() > 0, name
        torch.testing.assert_close(grads_c[name], ref, rtol=0, atol=2**-6 * float(ref.abs().max()), msg=name)

    # the reference worker (a ZeRO-3 eval engine of the same weights) builds the chunked Actor too
    reference = ClassmateReferenceModelActor.__new__(ClassmateReferenceModelActor)
    ClassmateReferenceModelActor.__init__(reference, 1, 0, "127.0.0.1", _free_port())
    reference.init_model_from_pretrained(strategy, path)
    assert isinstance(reference.model, ChunkedLogprobActor) and reference.model.chunk_size == 4
    torch.testing.assert_close(reference.forward(sequences, action_mask, attention), old_c, rtol=0, atol=bound)
