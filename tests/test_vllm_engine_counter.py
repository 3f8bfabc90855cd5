"""The weight-update counter of the vLLM rollout actor: upstream's ``RolloutRayActor`` code runs underneath (its
``update_weight`` / ``update_weight_cuda_ipc`` forward to the engine's ``collective_rpc``, faked here), and the
launcher's rebinding makes upstream's ``create_vllm_engines`` build the counting class."""

import asyncio

from openrlhf_classmate.integration.rollout.vllm_engine import CountingRolloutActor


class FakeAsyncLLM:
    def __init__(self):
        self.rpc = []

    async def collective_rpc(self, method, args=()):
        self.rpc.append((method, args[0]))
        return [None]


def _actor():
    actor = CountingRolloutActor.__new__(CountingRolloutActor)  # no vLLM engine: only the methods under test
    actor.llm = FakeAsyncLLM()
    return actor


def test_counts_complete_syncs_over_nccl_and_cuda_ipc():
    actor = _actor()
    names = ["embed", "layer.0", "norm"]

    async def sync(method):
        for i, name in enumerate(names):
            last = i == len(names) - 1  # upstream flags the last parameter of a sync with empty_cache=True
            if method == "update_weight":
                await actor.update_weight(name, dtype="bf16", shape=(2,), empty_cache=last)
            else:
                await actor.update_weight_cuda_ipc(name, dtype="bf16", shape=(2,), ipc_handles={}, empty_cache=last)

    assert actor.get_num_weight_updates() == 0 and actor.get_num_weights_received() == 0
    asyncio.run(sync("update_weight"))
    asyncio.run(sync("update_weight_cuda_ipc"))
    assert actor.get_num_weight_updates() == 2 and actor.get_num_weights_received() == 6
    # the weights really went to the workers, through upstream's methods
    assert actor.llm.rpc == [("update_weight", n) for n in names] + [("update_weight_cuda_ipc", n) for n in names]


def test_launcher_rebinding_makes_create_vllm_engines_build_the_counter():
    import openrlhf.trainer.ray.vllm_engine as vllm_engine

    from openrlhf_classmate.integration import patches

    patches.install_vllm_engine_counter()
    assert vllm_engine.RolloutRayActor.__ray_actor_class__ is CountingRolloutActor
    first = vllm_engine.RolloutRayActor
    patches.install_vllm_engine_counter()  # idempotent
    assert vllm_engine.RolloutRayActor is first
    # the counter keeps every method OpenRLHF and the classmate stage call on an engine
    for name in ("generate", "generate_responses", "get_num_unfinished_requests", "sleep", "wake_up",
                 "init_process_group", "update_weight", "update_weight_cuda_ipc", "reset_prefix_cache"):
        assert callable(getattr(CountingRolloutActor, name)), name
