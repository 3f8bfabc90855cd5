"""``integration/training/weight_sync.py``: the colocated weight sync in buckets (one CUDA-IPC handle and one engine call per
bucket instead of per parameter). The packing is exact (every parameter arrives bit for bit, under its name, in its
shape); the actor's sync sends every parameter once, in buckets no larger than asked, the last one flagged; the
worker loads a bucket in one ``load_weights`` call; the engines name our worker extension where upstream names its
own; and the actor keeps upstream's sync wherever the bucketed one does not apply. The IPC handle itself only works
between CUDA processes: on a GPU, the mismatch metrics and the engines' update counts check it
(``bench/gpu_validate.py``)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.integration.training import weight_sync


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 16), torch.nn.Linear(16, 50)).to(
        torch.bfloat16)


def test_buckets_hold_consecutive_parameters_of_one_dtype_up_to_the_size():
    bf16, f32 = torch.bfloat16, torch.float32
    sizes = [(400, bf16), (300, bf16), (200, bf16), (900, bf16), (100, bf16), (100, f32), (100, f32), (50, bf16)]
    assert weight_sync.plan_buckets(sizes, 1000) == [[0, 1, 2], [3, 4], [5, 6], [7]]
    # a parameter larger than a bucket goes alone, and so does each after it when none fits beside it
    assert weight_sync.plan_buckets([(3000, bf16), (10, bf16), (2000, bf16)], 1000) == [[0], [1], [2]]
    assert weight_sync.plan_buckets([], 1000) == []


def test_pack_and_unpack_give_every_tensor_back_exactly_as_views_of_one_buffer():
    named = list(_model().named_parameters())
    flat, metas = weight_sync.pack([(n, p.data) for n, p in named])
    assert flat.numel() == sum(p.numel() for _, p in named) and flat.dtype == torch.bfloat16
    assert [m[0] for m in metas] == [n for n, _ in named] and metas[1] == ("1.weight", "torch.bfloat16", (16, 8), 400,
                                                                           128)
    back = weight_sync.unpack(flat, metas)
    for (name, p), (got_name, got) in zip(named, back, strict=True):
        assert got_name == name and got.shape == p.shape and torch.equal(got, p.data)
        assert got.data_ptr() >= flat.data_ptr()  # a view, no copy
    # a ZeRO-3 parameter travels under its full shape (ds_shape)
    _, metas = weight_sync.pack([("w", torch.zeros(6))], shapes=[(2, 3)])
    assert metas == [("w", "torch.float32", (2, 3), 0, 6)]
    with pytest.raises(ValueError, match=r"a bucket holds one dtype, got \['torch.bfloat16', 'torch.float32'\]"):
        weight_sync.pack([("a", torch.zeros(2, dtype=torch.bfloat16)), ("b", torch.zeros(2))])


class _Engine:
    """An engine actor as the actor's sync sees it: ``update_weights_cuda_ipc_bucket.remote`` (Ray's call form)."""

    def __init__(self):
        self.calls = []
        self.update_weights_cuda_ipc_bucket = SimpleNamespace(remote=self._update)

    def _update(self, metas, ipc_handles, empty_cache=False):
        self.calls.append((metas, ipc_handles, empty_cache))
        return len(metas)


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    from openrlhf_classmate import ports

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports.free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_actor_sends_every_parameter_once_in_buckets_the_last_flagged(monkeypatch, one_rank_group):
    import openrlhf.trainer.ray.utils as ray_utils
    import openrlhf.utils.distributed_util as distributed_util
    import ray

    model = _model()
    engines = [_Engine(), _Engine()]
    barriers = []
    monkeypatch.setattr(ray_utils, "get_physical_gpu_id", lambda: "GPU-0")  # no CUDA device here
    monkeypatch.setattr(distributed_util, "torch_dist_barrier_and_cuda_sync", lambda: barriers.append(1))
    monkeypatch.setattr(ray, "get", lambda refs: refs)
    args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl"])
    trainer = SimpleNamespace(strategy=SimpleNamespace(args=args), vllm_engines=engines,
                              actor=SimpleNamespace(model=SimpleNamespace(module=model)))
    bucket = 2 * (8 * 16 + 16)  # bytes: the first Linear's weight and bias in bf16
    weight_sync.sync_buckets(trainer, bucket)
    for engine in engines:
        names = [m[0] for metas, _, _ in engine.calls for m in metas]
        assert names == [n for n, _ in model.named_parameters()]  # each once, in order
        assert [last for _, _, last in engine.calls] == [False] * (len(engine.calls) - 1) + [True]
        assert [[m[0] for m in metas] for metas, _, _ in engine.calls] == [
            ["0.weight"], ["1.weight", "1.bias"], ["2.weight"], ["2.bias"]]  # 800 B alone, 288 B, 800 B, 100 B
        assert all(set(handles) == {"GPU-0"} for _, handles, _ in engine.calls)
    assert len(barriers) == len(engines[0].calls) + 1  # one per bucket (its buffer lives until loaded), one at the end


class _VllmModel(torch.nn.Module):
    """What a vLLM worker's ``model_runner.model`` offers the load: ``load_weights`` over (name, tensor) pairs."""

    def __init__(self, like: torch.nn.Module):
        super().__init__()
        self.inner = _model()
        for p in self.inner.parameters():
            torch.nn.init.zeros_(p)
        self.loads = 0

    def load_weights(self, weights):
        self.loads += 1
        own = dict(self.inner.named_parameters())
        for name, tensor in weights:
            own[name].data.copy_(tensor)


def test_the_worker_loads_a_bucket_in_one_call_and_refuses_another_dtype(monkeypatch):
    import openrlhf.trainer.ray.utils as ray_utils

    monkeypatch.setattr(ray_utils, "get_physical_gpu_id", lambda: "GPU-0")
    source = _model()
    flat, metas = weight_sync.pack([(n, p.data) for n, p in source.named_parameters()])
    worker = weight_sync.BucketWorkerWrap.__new__(weight_sync.BucketWorkerWrap)
    worker.model_config = SimpleNamespace(dtype=torch.bfloat16)
    worker.device = SimpleNamespace(index=0)
    worker.model_runner = SimpleNamespace(model=_VllmModel(source))
    rebuilt = []
    # the handle as torch's reduce_tensor makes it for a CUDA tensor: (rebuild function, its arguments, of which the
    # 7th is the device index that the worker replaces with its own)
    handle = (lambda *a: rebuilt.append(a[6]) or flat, ("cls", 0, 0, 0, 0, 0, 7, 0))
    worker.update_weights_cuda_ipc_bucket(metas, {"GPU-0": handle, "GPU-1": None}, empty_cache=True)
    assert rebuilt == [0] and worker.model_runner.model.loads == 1
    for (name, want), (_, got) in zip(source.named_parameters(), worker.model_runner.model.inner.named_parameters(),
                                      strict=True):
        assert torch.equal(got, want), name
    worker.model_config = SimpleNamespace(dtype=torch.float16)
    with pytest.raises(TypeError, match=r"weight sync: 0.weight arrives as torch.bfloat16, the engine's model is "
                                        r"torch.float16"):
        worker.update_weights_cuda_ipc_bucket(metas, {"GPU-0": handle})


def test_the_engines_get_our_worker_extension_where_upstream_names_its_own():
    from openrlhf.trainer.ray import vllm_engine as upstream

    from openrlhf_classmate.integration.rollout import vllm_engine

    # upstream 0.11.2's create_vllm_engines names this class: if that changes, the swap below silently stops
    assert f'"worker_extension_cls": "{vllm_engine.UPSTREAM_WORKER_EXTENSION}"' in inspect.getsource(
        upstream.create_vllm_engines)
    kwargs = vllm_engine.engine_kwargs({"worker_extension_cls": vllm_engine.UPSTREAM_WORKER_EXTENSION, "seed": 1},
                                       environ={})
    assert kwargs == {"worker_extension_cls": "openrlhf_classmate.integration.training.weight_sync.BucketWorkerWrap", "seed": 1}
    assert vllm_engine.engine_kwargs({"worker_extension_cls": "my.Ext"}, environ={}) == {"worker_extension_cls": "my.Ext"}
    # the engine actor forwards a bucket and counts its parameters and, at the last bucket, one complete sync
    assert "update_weights_cuda_ipc_bucket" in dir(vllm_engine.CountingRolloutActor)


@pytest.mark.parametrize("flags, cuda_ipc, expected", [
    ([], True, "buckets"),
    (["--engine.weight_sync_bucket_mb", "0"], True, "upstream"),  # the switch back to upstream's sync
    ([], False, "upstream"),  # NCCL / gloo broadcast (not colocated)
    (["--ds.tensor_parallel_size", "2", "--engine.backend", "vllm"], True, "upstream"),  # AutoTP gathers its own way
])
def test_the_actor_uses_buckets_only_where_upstream_would_send_cuda_ipc(monkeypatch, flags, cuda_ipc, expected):
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    from openrlhf_classmate.integration.training import actor as actor_module

    ran = []
    monkeypatch.setattr(ActorPPOTrainer, "broadcast_to_vllm", lambda self: ran.append("upstream"))
    monkeypatch.setattr(weight_sync, "sync_buckets", lambda trainer, size: ran.append(("buckets", size)))
    trainer = actor_module.ClassmateActorPPOTrainer.__new__(actor_module.ClassmateActorPPOTrainer)
    args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl", *flags])
    trainer.strategy, trainer.use_cuda_ipc, trainer.actor = SimpleNamespace(args=args), cuda_ipc, SimpleNamespace()
    for _ in range(4):
        trainer.broadcast_to_vllm()
    assert ran == ([("buckets", 512 << 20)] if expected == "buckets" else ["upstream"]) * 4
