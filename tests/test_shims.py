"""The CPU import shims: they make openrlhf importable, stay out of the way of real installs, and fail loudly."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import openrlhf_classmate
from openrlhf_classmate import shims

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the stand-in's own behaviour can only be checked where it is in use (on the GPU machine the real vLLM wins)
needs_vllm_shim = pytest.mark.skipif("vllm" not in openrlhf_classmate.SHIMMED, reason="the real vLLM is installed")


def _run(code: str, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = extra_path + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )


@needs_vllm_shim
def test_ppo_path_of_openrlhf_imports_with_the_shims():
    res = _run(
        """
        import openrlhf_classmate, openrlhf.trainer.ppo_trainer, openrlhf.cli.train_ppo_ray
        import openrlhf.trainer.ray.vllm_engine, openrlhf.trainer.ray.ppo_actor, openrlhf.models.ring_attn_utils
        import vllm, flash_attn
        print(sorted(openrlhf_classmate.SHIMMED), vllm.__version__)
        """
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("['flash_attn', 'vllm'] 0.29.0")


@pytest.mark.parametrize("name", ["vllm", "flash_attn"])
def test_shim_never_shadows_a_real_install(tmp_path, name):
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '9.9.9-real'\n")
    res = _run(
        f"""
        import openrlhf_classmate
        from openrlhf_classmate import shims
        import {name}
        assert {name}.__version__ == '9.9.9-real', {name}.__file__
        assert not shims.is_shim({name})
        assert '{name}' not in openrlhf_classmate.SHIMMED
        assert shims.SHIM_DIRS['{name}'] not in __import__('sys').path
        print('real', {name}.__file__)
        """,
        extra_path=str(tmp_path),
    )
    assert res.returncode == 0, res.stderr
    assert str(tmp_path) in res.stdout


def test_install_is_a_no_op_when_the_real_module_is_already_imported(monkeypatch):
    import types

    real = types.ModuleType("vllm")
    monkeypatch.setitem(sys.modules, "vllm", real)
    assert "vllm" not in shims.install()


def test_flash_attn_stays_unavailable_to_transformers():
    from transformers.utils import is_flash_attn_2_available

    assert "flash_attn" in openrlhf_classmate.SHIMMED
    assert is_flash_attn_2_available() is False


@needs_vllm_shim
def test_vllm_stand_ins_raise_a_clear_error_for_real_work():
    import vllm
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup

    assert shims.is_shim(vllm)
    for call in (
        lambda: vllm.LLM(model="x"),
        lambda: vllm.AsyncEngineArgs(model="x"),
        lambda: vllm.AsyncLLMEngine.from_engine_args(None),
        lambda: PyNcclCommunicator(None, device="cpu"),
        lambda: StatelessProcessGroup.create(host="127.0.0.1", port=1, rank=0, world_size=1),
    ):
        with pytest.raises(RuntimeError, match="vLLM is not installed"):
            call()


def test_vllm_sampling_params_carry_the_fields_openrlhf_and_we_use():
    # runs against the real vLLM too: the stand-in's names and formats are vLLM's
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.utils import random_uuid

    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_tokens=12, min_tokens=1, seed=3,
                        skip_special_tokens=False, logprobs=1, prompt_logprobs=0, n=2)
    assert (sp.temperature, sp.top_k, sp.prompt_logprobs, sp.logprobs, sp.n) == (0.7, 5, 0, 1, 2)
    assert TokensPrompt(prompt_token_ids=[1, 2])["prompt_token_ids"] == [1, 2]
    a, b = random_uuid(), random_uuid()
    assert a != b and len(a) == 16 and int(a, 16) >= 0  # 16 hex characters, as vLLM 0.26-0.29


def test_bert_padding_round_trip_matches_the_mask():
    from flash_attn.bert_padding import index_first_axis, pad_input, unpad_input

    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    flat, indices, cu_seqlens, max_len, used = unpad_input(hidden, mask)
    assert flat.shape == (5, 3)
    assert indices.tolist() == [0, 1, 4, 5, 6]
    assert cu_seqlens.tolist() == [0, 2, 5] and max_len == 3 and used.tolist() == [2, 3]
    assert torch.equal(index_first_axis(hidden.reshape(8, 3), indices), flat)
    back = pad_input(flat, indices, batch=2, seqlen=4)
    assert torch.equal(back, hidden * mask.unsqueeze(-1))


def test_pytest_collects_this_projects_tests_not_the_openrlhf_wheels():
    import openrlhf

    site_packages = os.path.dirname(os.path.dirname(openrlhf.__file__))
    # The hazard is real: the openrlhf wheel ships a top-level `tests` package next to openrlhf ...
    assert os.path.isfile(os.path.join(site_packages, "tests", "__init__.py"))
    # ... and this module was still collected from the repository's tests/ directory.
    assert os.path.dirname(os.path.abspath(__file__)) == os.path.join(REPO, "tests")
