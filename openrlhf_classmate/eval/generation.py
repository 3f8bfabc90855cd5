"""Generation backends of ``openrlhf_classmate.cli.evaluate``: vLLM (``LLM.generate`` on token-id prompts, vLLM 0.29
API) and plain transformers ``generate`` (CPU, or GPU machines without vLLM). Both take prompt token ids and return,
per prompt, ``n`` generations (token ids including a final EOS, and why generation stopped).

Greedy decoding (temperature 0) with ``n > 1`` generates once and repeats the result ``n`` times: the samples would
be identical anyway, and vLLM refuses ``SamplingParams(n > 1, temperature=0)``."""

from __future__ import annotations

import gc
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

BACKENDS = ("auto", "vllm", "hf")
VLLM_DTYPES = {"auto": "auto", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class GenParams:
    max_new_tokens: int
    temperature: float = 0.0
    """0 = greedy."""
    top_p: float = 1.0
    top_k: int = -1
    """-1 = off."""
    n: int = 1
    """Samples per prompt."""
    seed: int = 0


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    """Generated ids, ending with the stop (EOS) token when generation stopped on one."""
    finish_reason: str
    """vLLM's reason, unchanged: ``stop`` (a stop token), ``length`` (``max_new_tokens`` or the context reached),
    ``repetition`` (vLLM's repetition detection cut it), ``abort`` / ``error`` (the request did not complete: see
    :data:`FAILED_FINISH_REASONS`). The HF backend produces ``stop`` and ``length`` only."""


FAILED_FINISH_REASONS = ("abort", "error")
"""Finish reasons of generations that are no answer at all; ``evaluate`` marks their scores invalid."""


def is_greedy(temperature: float) -> bool:
    """vLLM decodes greedily at temperature 0 (it raises any positive temperature below 0.01 to 0.01)."""
    return temperature < 1e-5


def generate_n(generate_one: Callable, prompts: Sequence[Sequence[int]], params: GenParams, desc: str
               ) -> list[list[Generation]]:
    """``generate_one(prompts, params, desc)`` for ``params.n`` samples; greedy with ``n > 1`` runs once with
    ``n = 1`` and repeats each generation ``n`` times (identical by definition of greedy decoding)."""
    if params.n > 1 and is_greedy(params.temperature):
        return [[gens[0]] * params.n for gens in generate_one(prompts, replace(params, n=1), desc)]
    return generate_one(prompts, params, desc)


def real_vllm_available() -> bool:
    """True when the real vLLM is importable (not openrlhf_classmate's CPU stand-in)."""
    from openrlhf_classmate import shims

    spec = importlib.util.find_spec("vllm")
    return spec is not None and not (spec.origin or "").startswith(shims.SHIM_DIRS["vllm"])


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if backend == "auto":
        return "vllm" if real_vllm_available() else "hf"
    if backend == "vllm" and not real_vllm_available():
        raise RuntimeError("--backend vllm: vLLM is not installed on this machine (use --backend hf or auto)")
    return backend


class VLLMGenerator:
    """``vllm.LLM`` on token-id prompts (``TokensPrompt``) with one ``SamplingParams`` for the batch."""

    def __init__(self, model: str, *, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.85,
                 max_model_len: int | None = None, dtype: str = "auto", seed: int = 0, progress: bool = True,
                 enforce_eager: bool = False, llm_cls: Callable | None = None):
        if llm_cls is None:
            from vllm import LLM as llm_cls  # noqa: N811
        kwargs = dict(model=model, tensor_parallel_size=tensor_parallel_size,
                      gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, seed=seed, trust_remote_code=True)
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if enforce_eager:
            kwargs["enforce_eager"] = True
        self.llm = llm_cls(**kwargs)
        self.progress = progress

    def generate(self, prompts: Sequence[Sequence[int]], params: GenParams, desc: str = "generating"
                 ) -> list[list[Generation]]:
        return generate_n(self._generate, prompts, params, desc)

    def _generate(self, prompts: Sequence[Sequence[int]], params: GenParams, desc: str) -> list[list[Generation]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sampling = SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=params.max_new_tokens,
            seed=params.seed,
            skip_special_tokens=False,
        )
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, sampling_params=sampling, use_tqdm=self.progress)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        return [[Generation(list(c.token_ids), str(c.finish_reason)) for c in out.outputs] for out in outputs]

    def close(self) -> None:
        """Shut the engine down and free its GPU memory, so that the next ``LLM`` (the classmate's) gets it: vLLM
        runs the engine core in a subprocess that dropping the ``LLM`` object alone does not reliably end."""
        llm, self.llm = self.llm, None
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            engine_core.shutdown()
        del llm, engine_core
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass


class HFGenerator:
    """transformers ``generate`` in left-padded batches of ``batch_size`` prompts."""

    def __init__(self, model: str, *, batch_size: int = 8, dtype: str = "auto", device: str | None = None,
                 progress: bool = True):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        else:
            torch_dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
                           "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}[dtype]
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype, trust_remote_code=True)
        self.model.to(self.device).eval()
        tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=True)
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
            eos.append(tokenizer.eos_token_id)
        self.stop_ids = set(eos)
        self.eos = eos
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.model.generation_config.pad_token_id
        self.pad_id = int(pad if pad is not None else (eos[0] if eos else 0))
        self.batch_size = max(1, batch_size)
        self.progress = progress

    def generate(self, prompts: Sequence[Sequence[int]], params: GenParams, desc: str = "generating"
                 ) -> list[list[Generation]]:
        return generate_n(self._generate, prompts, params, desc)

    def _generate(self, prompts: Sequence[Sequence[int]], params: GenParams, desc: str) -> list[list[Generation]]:
        import torch
        from tqdm.auto import tqdm

        torch.manual_seed(params.seed)
        sample = not is_greedy(params.temperature)
        kwargs = dict(max_new_tokens=params.max_new_tokens, do_sample=sample, num_return_sequences=params.n,
                      pad_token_id=self.pad_id, eos_token_id=self.eos or None)
        if sample:
            kwargs.update(temperature=max(params.temperature, 0.01), top_p=params.top_p,  # vLLM's floor too
                          top_k=params.top_k if params.top_k > 0 else None)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        results: list[list[Generation]] = []
        bar = tqdm(total=len(prompts) * params.n, desc=desc, unit="sample", disable=not self.progress, leave=False)
        for start in range(0, len(prompts), self.batch_size):
            batch = [list(p) for p in prompts[start:start + self.batch_size]]
            width = max(len(p) for p in batch)
            ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, p in enumerate(batch):
                ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
                mask[i, width - len(p):] = 1
            with torch.no_grad():
                out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kwargs)
            new = out[:, width:].tolist()
            for i in range(len(batch)):
                results.append([self._trim(new[i * params.n + j], params.max_new_tokens) for j in range(params.n)])
            bar.update(len(batch) * params.n)
        bar.close()
        return results

    def _trim(self, tokens: list[int], max_new_tokens: int) -> Generation:
        for k, t in enumerate(tokens):
            if t in self.stop_ids:
                return Generation(tokens[: k + 1], "stop")
        return Generation(tokens[:max_new_tokens], "length")

    def close(self) -> None:
        self.model = None
        gc.collect()


def make_generator(backend: str, model: str, *, batch_size: int = 8, dtype: str = "auto", seed: int = 0,
                   tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.85,
                   max_model_len: int | None = None, progress: bool = True, enforce_eager: bool = False):
    """A generator for ``model`` on the resolved ``backend`` (``auto``: vLLM when installed, else HF)."""
    if resolve_backend(backend) == "vllm":
        return VLLMGenerator(model, tensor_parallel_size=tensor_parallel_size,
                             gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                             dtype=VLLM_DTYPES[dtype], seed=seed, progress=progress, enforce_eager=enforce_eager)
    return HFGenerator(model, batch_size=batch_size, dtype=dtype, progress=progress)
