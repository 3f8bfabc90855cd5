"""The rollout's tokenizer reaches each engine once; every prompt group's call carries a handle of a few bytes.

Upstream's ``_dispatch_prompts_to_vllm`` sends ``hf_tokenizer=self.tokenizer`` with each prompt's call: 2.4 MB and
0.15-0.25 s of unpickling on the engine per call at a 152k vocabulary (``bench/tokenizer_dispatch.py``)."""

import os
import pickle

import pytest
import ray

from openrlhf_classmate.integration.rollout import tokenizer_handle
from openrlhf_classmate.integration.rollout.tokenizer_handle import TokenizerHandle
from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ["0", "1", "2", "3", "4", "+", "=", "?"]


def test_a_handle_pickles_as_its_key_and_unpickles_as_the_tokenizer_this_process_holds():
    tokenizer = build_word_tokenizer(WORDS + [f"w{i}" for i in range(20_000)])
    handle = TokenizerHandle()
    tokenizer_handle.remember(handle.key, tokenizer)
    data = pickle.dumps(handle)
    assert len(data) < 200 < 100_000 < len(pickle.dumps(tokenizer))
    assert pickle.loads(data) is tokenizer
    assert pickle.loads(pickle.dumps([handle, handle]))[1] is tokenizer
    with pytest.raises(RuntimeError, match=r"was sent tokenizer handle 'nope' without the tokenizer \(remember_"):
        pickle.loads(pickle.dumps(TokenizerHandle("nope")))


class _Recorded:
    """An engine actor handle as the generator sees it, recording the size of each call's ``hf_tokenizer``."""

    def __init__(self, engine, with_remember: bool = True):
        self._actor_id, self.sizes, self.remembered = engine._actor_id, [], 0
        self.get_num_unfinished_requests = engine.get_num_unfinished_requests
        self.generate_responses = type("M", (), {"remote": self._generate})()
        self._engine = engine
        if with_remember:
            self.remember_tokenizer = type("M", (), {"remote": self._remember})()

    def _generate(self, **kwargs):
        self.sizes.append(len(pickle.dumps(kwargs["hf_tokenizer"])))
        return self._engine.generate_responses.remote(**kwargs)

    def _remember(self, key, tokenizer):
        self.remembered += 1
        return self._engine.remember_tokenizer.remote(key, tokenizer)


@pytest.mark.slow
def test_the_generator_gives_each_real_engine_the_tokenizer_once_through_upstreams_dispatch(tmp_path):
    from openrlhf_classmate.integration.launch.args import parse_args
    from openrlhf_classmate.integration.rollout.hf_engine import create_hf_engines
    from openrlhf_classmate.integration.rollout.samples_generator import ClassmateSamplesGenerator
    from openrlhf_classmate.testing.tiny_models import save_tiny_model

    path = save_tiny_model(str(tmp_path / "m"), WORDS, seed=3)
    tokenizer = build_word_tokenizer(WORDS)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": REPO, "DS_ACCELERATOR": "cpu"}})
    try:
        engines = create_hf_engines(num_engines=2, pretrain=path, max_model_len=64)
        generator = ClassmateSamplesGenerator.__new__(ClassmateSamplesGenerator)
        generator.args = parse_args(["--actor.model_name_or_path", path, "--data.prompt_dataset", "d.jsonl"])
        generator.tokenizer, generator.vllm_engines = tokenizer, [_Recorded(e) for e in engines]
        prompts = ["1 + 2 =", "3 + 4 =", "2 + 2 =", "0 + 1 ="]
        kwargs = dict(temperature=1.0, max_new_tokens=5, n_samples_per_prompt=2, max_len=32)
        for _ in range(2):  # two rollout batches: the tokenizer goes out with the first only
            outputs = ray.get(generator._dispatch_prompts_to_vllm(prompts, ["3"] * 4, **kwargs))
            assert generator.tokenizer is tokenizer
            for prompt, group in zip(prompts, outputs, strict=True):
                ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
                assert len(group) == 2  # the engines' executors tokenized with the real tokenizer
                for out in group:
                    assert out["observation_tokens"][:len(ids)] == ids and out["action_ranges"][0][0] == len(ids)
        assert [e.remembered for e in generator.vllm_engines] == [1, 1]
        assert sorted(len(e.sizes) for e in generator.vllm_engines) == [4, 4]
        assert max(s for e in generator.vllm_engines for s in e.sizes) < 200 < len(pickle.dumps(tokenizer))

        # an engine class without remember_tokenizer gets upstream's way: the tokenizer in every call
        plain = ClassmateSamplesGenerator.__new__(ClassmateSamplesGenerator)
        plain.args, plain.tokenizer = generator.args, tokenizer
        plain.vllm_engines = [_Recorded(engines[0], with_remember=False)]
        assert len(ray.get(plain._dispatch_prompts_to_vllm(prompts[:1], ["3"], **kwargs))[0]) == 2
        assert plain.vllm_engines[0].sizes == [len(pickle.dumps(tokenizer))]
    finally:
        ray.shutdown()
