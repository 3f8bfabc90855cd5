"""The classmate stage of one training step, run by the controller: CoT spans → classmate inputs → classmate engines
→ scores → classmate reward.

``dispatch`` sends every request and returns at once (Ray object refs), ``gather`` waits, decodes, scores and
combines; the experience maker puts the actor/ref forward passes in between when the classmate does not share their
GPUs. The classmate engine handles live here and never in ``vllm_engines``, so they never receive policy weights.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from openrlhf_classmate.algo.classmate_prompt import ClassmateInput, build_classmate_inputs
from openrlhf_classmate.algo.classmate_reward import combine_classmate_scores
from openrlhf_classmate.algo.response_split import at_char_boundaries, load_stop_token_ids
from openrlhf_classmate.algo.spans import cot_mask, prompt_opens_think, think_token_ids, truncate_cot
from openrlhf_classmate.integration.classmate.classmate_scoring import ClassmateAnswer, Scorer, registry_scorer
from openrlhf_classmate.integration.classmate_config import warn

# Conditions that read the main score (classmate_reward.CONDITIONS).
CONDITIONS_ON_MAIN = ("no_classmate_when_main_incorrect", "neg_classmate_when_main_incorrect")

# vLLM finish reasons of a request that did not complete (client abort, engine-side error): its text is no answer,
# so the call is masked like a failed score; "stop", "length" and "repetition" are real (possibly cut) answers
FAILED_FINISH_REASONS = ("abort", "error")


class ClassmateInputError(ValueError):
    """A rollout sample cannot be turned into a classmate request (bad label, missing messages)."""


def response_ids_of(sample) -> torch.Tensor:
    """Response token ids of a single-sample rollout ``Experience`` (``action_mask`` is aligned with seq[1:])."""
    return sample.sequences[0, 1:][sample.action_mask[0].bool()]


def prompt_ids_of(sample) -> torch.Tensor:
    """Prompt token ids of a single-sample rollout ``Experience`` (everything before the first action token)."""
    action = sample.action_mask[0].bool()
    first = int(action.nonzero()[0]) + 1 if action.any() else sample.sequences.shape[1]
    return sample.sequences[0, :first]


def label_dict(label, index: int) -> dict:
    if isinstance(label, dict):
        return label
    try:
        parsed = json.loads(label)
    except (TypeError, json.JSONDecodeError) as e:
        raise ClassmateInputError(f"rollout sample {index}: the label is not JSON ({e}); classmate training needs "
                                  "a JSON label (see setup_data/README.md)") from e
    if not isinstance(parsed, dict):
        raise ClassmateInputError(f"rollout sample {index}: the label must be a JSON object, got {type(parsed).__name__}")
    return parsed


def messages_of(label: dict, index: int) -> list[dict]:
    messages = label.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ClassmateInputError(
            f"rollout sample {index} (data_source {label.get('data_source')!r}): the label has no 'messages' list; "
            "the classmate needs the prompt's full message list, which the setup_data scripts write into the label"
        )
    return messages


@dataclass
class Spans:
    """Per rollout sample, in response-token space."""

    response_ids: list[torch.Tensor]
    cot: list[torch.Tensor]  # bool [R_i], kept CoT tokens
    cot_length: torch.Tensor  # [N] tokens of the (untruncated) CoT
    has_answer: torch.Tensor  # [N] bool
    skip: torch.Tensor  # [N] bool
    prompt_opened: torch.Tensor  # [N] bool, the prompt ended inside a think block (the response starts in the CoT)


class ClassmateRollout(list):
    """A rollout batch (list of single-sample experiences) that carries its in-flight classmate requests: from the
    async generator to the training actor (the queue pickles the list with this attribute), or from a generator that
    dispatched them per prompt group to the experience maker."""

    def __init__(self, samples, classmate_pending=None):
        super().__init__(samples)
        self.classmate_pending = classmate_pending


@dataclass
class PendingClassmate:
    spans: Spans
    labels: list[dict]
    prompts: list[str]  # the main prompt texts (what upstream hands a reward function)
    inputs: list[list[ClassmateInput]]  # [K][N]
    refs: dict = field(default_factory=dict)  # (i, k, s) -> ObjectRef
    dispatched_at: float = 0.0
    dispatch_time: float = 0.0  # building the classmate inputs and sending the requests
    per_group: bool = False  # sent prompt group by prompt group during the rollout (merge_pending)


def merge_pending(parts: list[PendingClassmate]) -> PendingClassmate:
    """The requests of several dispatches (prompt groups, in the order their samples sit in the rollout batch) as
    one batch's: sample indices shifted by the samples before them, dispatched at the first one's time."""
    if not parts:
        raise ValueError("merge_pending: no dispatch to merge")
    spans = Spans(
        response_ids=[r for p in parts for r in p.spans.response_ids],
        cot=[c for p in parts for c in p.spans.cot],
        cot_length=torch.cat([p.spans.cot_length for p in parts]),
        has_answer=torch.cat([p.spans.has_answer for p in parts]),
        skip=torch.cat([p.spans.skip for p in parts]),
        prompt_opened=torch.cat([p.spans.prompt_opened for p in parts]),
    )
    merged = PendingClassmate(
        spans, [x for p in parts for x in p.labels], [x for p in parts for x in p.prompts],
        [[x for p in parts for x in p.inputs[k]] for k in range(len(parts[0].inputs))],
        dispatched_at=min(p.dispatched_at for p in parts), dispatch_time=sum(p.dispatch_time for p in parts),
        per_group=True,
    )
    offset = 0
    for p in parts:
        for (i, k, s), ref in p.refs.items():
            merged.refs[(i + offset, k, s)] = ref
        offset += len(p.labels)
    return merged


@dataclass
class ClassmateResult:
    reward: torch.Tensor  # [N] after λ and the condition
    valid: torch.Tensor  # [N] bool
    raw_mean: torch.Tensor  # [N] mean classmate score before λ / condition
    cot: list[torch.Tensor]  # per sample, bool [R_i]
    classmate_log_probs: list[torch.Tensor] | None  # per sample, float [R_i] (-inf outside the CoT)
    metrics: dict[str, float]
    finished_at: float


class ClassmateStage:
    def __init__(self, args, main_tokenizer, engines: list[list], classmate_tokenizers: list,
                 scorer: Scorer | None = None):
        self.args = args
        self.cfg = args.classmate
        self.main_tokenizer = main_tokenizer
        self.engines = engines
        self.tokenizers = classmate_tokenizers
        self.open_id, self.close_id = think_token_ids(main_tokenizer, self.cfg.think_open, self.cfg.think_close)
        # every id the policy engines stop on (the generation config's eos list), as the main reward uses
        self.stop_ids = load_stop_token_ids(getattr(args.actor, "model_name_or_path", None), main_tokenizer)
        self.generator = torch.Generator().manual_seed(int(args.train.seed))
        self.request_seeds = np.random.default_rng([int(args.train.seed), 7])
        self.seed_requests = bool(getattr(self.cfg, "seed_requests", False))
        self.vanilla = self.cfg.loss == "vanilla_classmate"
        self.score = scorer if scorer is not None else registry_scorer()
        self._next_engine = [0] * len(engines)
        self._said_context = False
        self.last_scores: tuple[list, list[bool]] = ([], [])
        """(score results of the classmate answers, per-sample validity) of the last ``gather``, for judge health"""

    def _say_context_skips(self, skipped: int, total: int) -> None:
        """Classmate calls skipped because the input does not fit ``--classmate.max_context``: said once, with the
        step's counts (the metric classmate/skip_over_max_context counts them every step)."""
        if skipped and not self._said_context:
            self._said_context = True
            warn(
                f"classmate: {skipped} of {total} requests of this step were skipped: the classmate input (prompt + "
                f"CoT) + --classmate.max_new_tokens {self.cfg.max_new_tokens} exceeds --classmate.max_context "
                f"{self.cfg.max_context}; those responses get no classmate reward (masked); raise "
                "--classmate.max_context (said once; classmate/skip_over_max_context counts them every step)")

    # ── spans ──

    def spans(self, samples) -> Spans:
        responses = [response_ids_of(s) for s in samples]
        width = max(1, max(len(r) for r in responses))
        ids = torch.full((len(responses), width), int(self.main_tokenizer.pad_token_id or 0), dtype=torch.long)
        mask = torch.zeros((len(responses), width), dtype=torch.bool)
        for i, r in enumerate(responses):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = True
        tags = dict(think_open_id=self.open_id, think_close_id=self.close_id)
        opened = torch.tensor([prompt_opens_think(prompt_ids_of(s), **tags) for s in samples], dtype=torch.bool)
        full = cot_mask(ids, mask, **tags, stop_ids=self.stop_ids, starts_in_think=opened)
        kept, skip = truncate_cot(full, mode=self.cfg.truncation, keep_min=self.cfg.keep_min,
                                  keep_max=self.cfg.keep_max, generator=self.generator)
        # a truncated CoT ends on a character boundary: never between the byte tokens of one character
        kept = at_char_boundaries(self.main_tokenizer, responses, full, kept)
        cot = [kept.mask[i, : len(r)] for i, r in enumerate(responses)]
        return Spans(responses, cot, full.length, full.has_answer, skip, opened)

    # ── dispatch / gather ──

    def _sampling_params(self, seed: int | None):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            top_k=self.cfg.top_k,
            max_tokens=self.cfg.max_new_tokens,
            seed=seed,
            prompt_logprobs=0 if self.vanilla else None,
            skip_special_tokens=True,
            # the classmate executor reads the finished answer's token ids only (the stage decodes them itself):
            # one output per request instead of a cumulative copy per generated token, and no incremental
            # detokenisation in the engine's single Python thread, which otherwise sets the pace of a decode step
            output_kind=RequestOutputKind.FINAL_ONLY,
            detokenize=False,
        )

    def _engine(self, k: int):
        engine = self.engines[k][self._next_engine[k] % len(self.engines[k])]
        self._next_engine[k] += 1
        return engine

    def dispatch(self, samples, first_index: int = 0) -> PendingClassmate:
        """Send the classmate requests of ``samples`` (a rollout batch, or one prompt group of it whose first sample
        is the batch's ``first_index``: the index error messages name)."""
        labels = [label_dict(s.labels[0], first_index + i) for i, s in enumerate(samples)]
        messages = [messages_of(label, first_index + i) for i, label in enumerate(labels)]
        spans = self.spans(samples)
        cot_ids = [r[c].tolist() for r, c in zip(spans.response_ids, spans.cot)]
        inputs = [
            build_classmate_inputs(
                tok, messages, cot_ids, self.main_tokenizer, mode=self.cfg.prompt_mode,
                think_open=self.cfg.classmate_think_open, think_close=self.cfg.classmate_think_close,
                max_context=self.cfg.max_context, max_new_tokens=self.cfg.max_new_tokens,
                skip=spans.skip.tolist(),
            )
            for tok in self.tokenizers
        ]
        prompts = [str(s.prompts[0]) if s.prompts else "" for s in samples]
        pending = PendingClassmate(spans, labels, prompts, inputs, dispatched_at=time.time())
        for k, per_model in enumerate(inputs):
            for i, request in enumerate(per_model):
                if not request.valid:
                    continue
                prompt = {"input_ids": request.input_ids, "cot_offset": request.cot_offset,
                          "cot_len": request.cot_token_count}
                for s in range(self.cfg.samples):
                    # a fresh seed per request with --classmate.seed_requests; none otherwise: vLLM samples seeded
                    # requests one by one at every decode step, unseeded ones in one go
                    seed = int(self.request_seeds.integers(0, 2**31 - 1)) if self.seed_requests else None
                    pending.refs[(i, k, s)] = self._engine(k).generate_responses.remote(
                        prompt=prompt, label=None, sampling_params=self._sampling_params(seed),
                        max_length=self.cfg.max_context, hf_tokenizer=None, num_samples=1,
                    )
        pending.dispatch_time = time.time() - pending.dispatched_at
        return pending

    def gather(self, pending: PendingClassmate, main_rewards: torch.Tensor,
               main_valid: torch.Tensor | None = None) -> ClassmateResult:
        import ray

        keys = list(pending.refs)
        outputs = dict(zip(keys, ray.get([pending.refs[key] for key in keys]))) if keys else {}
        n, k_models, s_samples = len(pending.labels), len(self.tokenizers), self.cfg.samples

        answers, where = [], []
        lengths, finished_at = [], [pending.dispatched_at]
        reasons = Counter()
        cot_texts: dict[int, str] = {}
        for (i, k, s), out in outputs.items():
            out = out[0]
            lengths.append(len(out["output_token_ids"]))
            finished_at.append(out["finished_at"])
            if out.get("finish_reason") in FAILED_FINISH_REASONS:
                reasons[f"generation_{out['finish_reason']}"] += 1  # stays invalid: masked, never scored 0
                continue
            if i not in cot_texts:
                cot_ids = pending.spans.response_ids[i][pending.spans.cot[i]].tolist()
                cot_texts[i] = self.main_tokenizer.decode(cot_ids, skip_special_tokens=True)
            answers.append(ClassmateAnswer(
                text=self.tokenizers[k].decode(out["output_token_ids"], skip_special_tokens=True),
                label=pending.labels[i], prompt=pending.prompts[i], cot=cot_texts[i],
                prompt_opens_think=bool(pending.spans.prompt_opened[i]),
            ))
            where.append((i, k, s))
        t_score = time.time()
        results = self.score(answers) if answers else []
        score_time = time.time() - t_score

        scores = torch.zeros((n, k_models, s_samples), dtype=torch.float64)
        valid = torch.zeros((n, k_models, s_samples), dtype=torch.bool)
        for (i, k, s), result in zip(where, results):
            scores[i, k, s] = float(result.score) if result.valid else 0.0
            valid[i, k, s] = bool(result.valid)
            if not result.valid:
                reasons["invalid_score"] += 1
        for per_model in pending.inputs:
            for request in per_model:
                if not request.valid:
                    reasons[_reason_key(request.skip_reason)] += s_samples
        self._say_context_skips(reasons["over_max_context"], n * k_models * s_samples)
        reward, sample_valid, raw_mean = combine_classmate_scores(
            scores, valid, main_rewards.double(),
            weights=self.cfg.weights, lam=self.cfg.reward_weight, condition=self.cfg.condition,
        )
        if main_valid is not None and self.cfg.condition in CONDITIONS_ON_MAIN:
            # the condition reads the main score; without a valid one the classmate reward is undefined too
            lost = int((sample_valid & ~main_valid.bool()).sum())
            reasons["main_score_invalid"] += lost * k_models * s_samples  # in requests, like the other reasons
            sample_valid = sample_valid & main_valid.bool()
            reward = torch.where(sample_valid, reward, 0.0)
        log_probs = None
        if self.vanilla:
            log_probs = []
            for i, cot in enumerate(pending.spans.cot):
                row = torch.full(cot.shape, float("-inf"))
                out = outputs.get((i, 0, 0))
                if out is not None and out[0]["cot_logprobs"] is not None and pending.inputs[0][i].cot_token_count:
                    values = torch.tensor(out[0]["cot_logprobs"], dtype=torch.float32)
                    row[cot.nonzero().squeeze(-1)[: len(values)]] = values[: int(cot.sum())]
                log_probs.append(row)
            # vanilla_classmate's loss reads c_t on every CoT token: a row whose CoT log-probs the engine did not
            # return in full (-inf, NaN) has no usable classmate signal, whatever its score
            missing = torch.tensor([bool(cot.any()) and not bool(torch.isfinite(row[cot]).all())
                                    for row, cot in zip(log_probs, pending.spans.cot)], dtype=torch.bool)
            reasons["cot_logprobs_missing"] += int((sample_valid & missing).sum()) * k_models * s_samples
            sample_valid = sample_valid & ~missing
            reward = torch.where(sample_valid, reward, 0.0)
        self.last_scores = (list(results), sample_valid.tolist())

        total_requests = n * k_models * s_samples
        metrics = {
            "classmate/valid_fraction": float(sample_valid.float().mean()) if n else 0.0,
            "classmate/request_fraction": len(keys) / max(total_requests, 1),
            "classmate/output_length": float(np.mean(lengths)) if lengths else 0.0,
            "classmate/cot_length": float(pending.spans.cot_length.float().mean()) if n else 0.0,
            "classmate/has_answer_fraction": float(pending.spans.has_answer.float().mean()) if n else 0.0,
            # where the stage's time goes (seconds; the step-time benchmark reads these)
            "classmate/dispatch_time": pending.dispatch_time,
            "classmate/generation_time": max(finished_at) - pending.dispatched_at,
            "classmate/score_time": score_time,
        }
        for reason, count in reasons.items():
            metrics[f"classmate/skip_{reason}"] = count / max(total_requests, 1)
        return ClassmateResult(
            reward=reward.float(), valid=sample_valid, raw_mean=raw_mean.float(), cot=pending.spans.cot,
            classmate_log_probs=log_probs, metrics=metrics, finished_at=max(finished_at),
        )


def _reason_key(reason: str | None) -> str:
    """Metric-friendly name of a skip reason (the full text is in the debug log)."""
    reason = reason or ""
    if "exceeds max_context" in reason:
        return "over_max_context"
    if "empty CoT" in reason:
        return "empty_cot"
    return "other"
