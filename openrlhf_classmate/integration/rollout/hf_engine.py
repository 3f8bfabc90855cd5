"""An HF-transformers generation engine with the Ray interface of OpenRLHF's ``RolloutRayActor``.

Used where vLLM is not installed (CPU machines, tests, debugging) or with ``--engine.backend hf``. It implements the
methods OpenRLHF and openrlhf_classmate call on an engine: ``generate`` (returns an object shaped like vLLM's
``RequestOutput``, including ``prompt_logprobs`` when asked), ``generate_responses`` (through the same agent executor
as upstream, so custom reward functions run unchanged), ``get_num_unfinished_requests``, sleep/wake, and a weight
update from the policy actor through the Ray object store (``load_weights``), which makes CPU runs on-policy.

Concurrent requests are collected and generated in batches (left padding) to keep CPU runs fast.

Log-probs (``SamplingParams.logprobs``): those of the distribution the token was sampled from, after temperature and
the other logits processors, as vLLM's ``logprobs_mode="processed_logprobs"`` (what the launcher asks vLLM for:
``integration/rollout/mismatch.py``) and as the actor computes them (``log_softmax(logits / temperature)``; the two agree
while top-k / top-p / min-p / min_tokens leave the distribution whole). Only that mode exists here.

Fault injection (tests): ``OPENRLHF_CLASSMATE_FAULT_DROP_WEIGHT_SYNCS`` = comma-separated 1-based numbers of the
``load_weights`` calls this engine receives and drops (the weights are not loaded and not counted), as a weight sync
that silently fails would; the mismatch metrics must then show it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from openrlhf_classmate.algo.response_split import load_stop_token_ids
from openrlhf_classmate.integration.rollout import tokenizer_handle


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class _Request:
    prompt_token_ids: list[int]
    params: Any
    future: asyncio.Future
    key: tuple = field(default=())


def _sampling_key(params) -> tuple:
    return (
        float(params.temperature),
        float(params.top_p),
        int(params.top_k if params.top_k is not None else -1),
        float(getattr(params, "min_p", 0.0) or 0.0),
        float(getattr(params, "repetition_penalty", 1.0)),
        params.max_tokens,
        int(getattr(params, "min_tokens", 0) or 0),
        params.logprobs is not None,
        params.prompt_logprobs is not None,
        tuple(params.stop_token_ids or ()),
    )


# vLLM sampling options the HF engine cannot honour: refused rather than silently ignored (value = vLLM's default)
_UNSUPPORTED = {"n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "stop": [], "bad_words": [],
                "logit_bias": None, "allowed_token_ids": None, "ignore_eos": False, "flat_logprobs": False}


def check_supported(params) -> None:
    """Raise ``ValueError`` for a vLLM sampling option set to something the HF engine would ignore."""
    for name, default in _UNSUPPORTED.items():
        value = getattr(params, name, default)
        if value not in (default, None) and not (default == [] and not value):
            raise ValueError(f"the HF engine does not support SamplingParams.{name}={value!r} (vLLM default "
                             f"{default!r}); use the vLLM engine (--engine.backend vllm)")


class HFEngine:
    """Plain class (wrapped with ``ray.remote`` by :func:`create_hf_engines`), so it can be tested without Ray."""

    def __init__(
        self,
        model: str,
        seed: int = 0,
        max_model_len: int | None = None,
        agent_func_path: str | None = None,
        remote_rm_url: str | list[str] | None = None,
        max_batch: int = 64,
        device: str | None = None,
        **_ignored_vllm_kwargs,
    ):
        from openrlhf.utils.agent import SingleTurnAgentExecutor
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if max_batch < 1:  # 0 would never take a request off the queue: every generate call would wait forever
            raise ValueError(f"max_batch (--engine.hf_max_batch) must be >= 1, got {max_batch}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype, trust_remote_code=True).to(self.device)
        self.model.eval()
        tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=True)
        self.eos_token_id = tokenizer.eos_token_id
        # vLLM stops on every eos id of the generation config (Qwen3: <|im_end|> and <|endoftext|>), so do we
        self.stop_token_ids = list(load_stop_token_ids(model, tokenizer))
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_id
        self.max_model_len = max_model_len
        self.seed = seed
        self.max_batch = max_batch
        self._batch_counter = itertools.count()
        self._pending: list[_Request] = []
        self._drain_task: asyncio.Task | None = None
        self._in_flight = 0
        self.num_weight_updates = 0
        self._weight_syncs_received = 0
        drops = os.environ.get("OPENRLHF_CLASSMATE_FAULT_DROP_WEIGHT_SYNCS", "")
        self._drop_weight_syncs = {int(n) for n in drops.split(",") if n.strip()}
        self.asleep = False
        if agent_func_path:
            from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

            self.executor = _load_agent_executor(agent_func_path)
        else:
            self.executor = SingleTurnAgentExecutor(remote_rm_url)

    # ── generation ──

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None) -> RequestOutput:
        if multi_modal_data:
            raise NotImplementedError("the HF engine does not support multi-modal inputs")
        check_supported(sampling_params)
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(list(prompt_token_ids), sampling_params, future, _sampling_key(sampling_params)))
        self._in_flight += 1
        if self._drain_task is None or self._drain_task.done():
            self._drain_task = asyncio.create_task(self._drain())
        try:
            return await future
        finally:
            self._in_flight -= 1

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0.005)  # let concurrent requests of this rollout join the batch
            key = self._pending[0].key
            batch = [r for r in self._pending if r.key == key][: self.max_batch]
            self._pending = [r for r in self._pending if not any(r is b for b in batch)]
            try:
                outputs = await asyncio.to_thread(self._generate_batch, batch)
            except Exception as e:  # deliver the error to every waiting request, never hang them
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(e)
                continue
            for r, out in zip(batch, outputs):
                if not r.future.done():
                    r.future.set_result(out)

    @torch.no_grad()
    def _generate_batch(self, batch: list[_Request]) -> list[RequestOutput]:
        params = batch[0].params
        prompts = [r.prompt_token_ids for r in batch]
        max_new = params.max_tokens
        if self.max_model_len is not None:
            room = self.max_model_len - max(len(p) for p in prompts)
            if room < 1:
                raise ValueError(f"prompt of {max(len(p) for p in prompts)} tokens leaves no room in max_model_len "
                                 f"{self.max_model_len}")
            max_new = room if max_new is None else min(max_new, room)
        seeds = [r.params.seed for r in batch if getattr(r.params, "seed", None) is not None]
        # One RNG stream per batch: seeded by the engine seed, the batch number and the requests' own seeds.
        torch.manual_seed(hash((self.seed, next(self._batch_counter), tuple(seeds))) % (2**63))

        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)

        greedy = params.temperature is None or params.temperature < 1e-5  # vLLM's greedy threshold
        eos_ids = [*self.stop_token_ids, *(params.stop_token_ids or [])]
        min_p = float(getattr(params, "min_p", 0.0) or 0.0)
        min_new = int(getattr(params, "min_tokens", 0) or 0)
        if max_new is not None:
            min_new = min(min_new, max_new)
        gen = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=not greedy,
            temperature=None if greedy else float(params.temperature),
            top_p=None if greedy else float(params.top_p),
            # vLLM's top_k <= 0 means "off"; transformers needs an explicit 0 (None falls back to its default 50)
            top_k=None if greedy else max(int(params.top_k if params.top_k is not None else 0), 0),
            min_p=None if greedy or min_p <= 0 else min_p,
            repetition_penalty=float(getattr(params, "repetition_penalty", 1.0)),
            min_new_tokens=min_new or None,
            max_new_tokens=max_new,
            eos_token_id=eos_ids,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_scores=params.logprobs is not None,
        )
        new_tokens = gen.sequences[:, width:].tolist()
        step_logprobs = None
        if params.logprobs is not None:
            # scores are the processed logits (temperature/top-k applied), as vLLM's "processed_logprobs" mode
            step_logprobs = torch.stack(gen.scores, dim=1).float().log_softmax(-1)
        prompt_logprobs = self._prompt_logprobs(prompts) if params.prompt_logprobs is not None else None

        outputs = []
        for i, tokens in enumerate(new_tokens):
            end = next((t + 1 for t, tok in enumerate(tokens) if tok in eos_ids), None)
            finish = "stop" if end is not None else "length"
            tokens = tokens[:end] if end is not None else tokens
            logprobs = None
            cumulative = None
            if step_logprobs is not None:
                values = [float(step_logprobs[i, t, tok]) for t, tok in enumerate(tokens)]
                logprobs = [{tok: Logprob(v)} for tok, v in zip(tokens, values)]
                cumulative = sum(values)
            outputs.append(
                RequestOutput(
                    request_id=f"hf-{id(batch[i])}",
                    prompt_token_ids=prompts[i],
                    prompt_logprobs=prompt_logprobs[i] if prompt_logprobs is not None else None,
                    outputs=[CompletionOutput(0, "", tokens, cumulative, logprobs, finish)],
                )
            )
        return outputs

    def _prompt_logprobs(self, prompts: list[list[int]]) -> list[list[dict[int, Logprob] | None]]:
        """log p(token_t | tokens_<t) for every prompt position, vLLM's ``prompt_logprobs=0`` format."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p)
            mask[i, : len(p)] = 1
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits.float()
        logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:].to(self.device).unsqueeze(-1)).squeeze(-1)
        result = []
        for i, p in enumerate(prompts):
            row: list[dict[int, Logprob] | None] = [None]
            row += [{p[t]: Logprob(float(logp[i, t - 1]))} for t in range(1, len(p))]
            result.append(row)
        return result

    async def generate_responses(self, prompt, label, sampling_params, max_length, hf_tokenizer, num_samples=1,
                                 images=None):
        """Same contract as ``RolloutRayActor.generate_responses``: ``num_samples`` executor runs of one prompt."""
        tasks = [
            self.executor.execute(
                prompt=prompt,
                label=label,
                sampling_params=sampling_params,
                max_length=max_length,
                hf_tokenizer=hf_tokenizer,
                llm_engine=self,
                images=images,
            )
            for _ in range(num_samples)
        ]
        return await asyncio.gather(*tasks)

    def get_num_unfinished_requests(self) -> int:
        return self._in_flight

    def remember_tokenizer(self, key: str, tokenizer) -> None:
        """Keep the rollout's tokenizer, which later calls name by key (``tokenizer_handle.py``)."""
        tokenizer_handle.remember(key, tokenizer)

    # ── lifecycle (no GPU memory to release: bookkeeping only, so callers' sleep/wake order is observable) ──

    async def sleep(self, level: int = 1) -> None:
        self.asleep = True

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self.asleep = False

    async def reset_prefix_cache(self) -> None:
        return None

    async def pause_generation(self) -> None:
        return None

    async def resume_generation(self) -> None:
        return None

    # ── weights ──

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> int:
        """Load the policy's weights (sent through the Ray object store by the controller)."""
        self._weight_syncs_received += 1
        if self._weight_syncs_received in self._drop_weight_syncs:
            print(f"[openrlhf_classmate.hf_engine] fault injection: weight sync {self._weight_syncs_received} dropped "
                  "(OPENRLHF_CLASSMATE_FAULT_DROP_WEIGHT_SYNCS)", file=sys.stderr, flush=True)
            return self.num_weight_updates
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        real_missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied embeddings
        if real_missing or unexpected:
            raise RuntimeError(f"weight update does not match the engine model: missing {real_missing[:5]}, "
                               f"unexpected {unexpected[:5]}")
        self.num_weight_updates += 1
        return self.num_weight_updates

    def get_num_weight_updates(self) -> int:
        return self.num_weight_updates

    def get_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def init_process_group(self, *args, **kwargs):
        raise RuntimeError("the HF engine receives weights through the Ray object store, not an NCCL group")

    def update_weight(self, *args, **kwargs):
        raise RuntimeError("the HF engine receives weights through load_weights (Ray object store)")


def create_hf_engines(
    num_engines: int,
    tensor_parallel_size: int = 1,
    pretrain: str = "",
    seed: int = 0,
    full_determinism: bool = False,
    enable_prefix_caching: bool = False,
    enforce_eager: bool = False,
    max_model_len: int | None = None,
    shared_pg=None,
    gpu_memory_utilization=None,
    vllm_enable_sleep: bool = False,
    logprobs_mode=None,
    agent_func_path: str | None = None,
    remote_rm_url=None,
    max_images_per_prompt: int = 0,
    max_batch: int = 64,
) -> list:
    """Same parameters as upstream ``create_vllm_engines``. HF engines reserve no GPU in Ray's bookkeeping (they use
    the device torch sees), so placement arguments are accepted and ignored."""
    import ray

    if max_images_per_prompt:
        raise NotImplementedError("the HF engine does not support multi-modal prompts")
    if logprobs_mode not in (None, "processed_logprobs"):
        raise ValueError(f"the HF engine reports processed log-probs (after temperature) only, not logprobs_mode="
                         f"{logprobs_mode!r}; use the vLLM engine (--engine.backend vllm)")
    actor_cls = ray.remote(HFEngine)
    return [
        actor_cls.options(num_cpus=0, num_gpus=0, max_concurrency=1000).remote(
            model=pretrain,
            seed=seed + i,
            max_model_len=max_model_len,
            agent_func_path=agent_func_path,
            remote_rm_url=remote_rm_url,
            max_batch=max_batch,
        )
        for i in range(num_engines)
    ]
