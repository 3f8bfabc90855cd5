"""The gold chapter's likelihood under the reference model, batched: shared by the VR-CLI reward hook, the
baseline-perplexity precompute (``setup_data/vrcli_baseline_ppl.py``) and ``bench/vrcli_reward.py``.

* :func:`generator_inputs` renders (system, user, assistant = gold chapter) with the model's chat template and
  returns the token ids and the index of the first scored token. The generation prompt and the assistant turn are
  tokenised separately and concatenated (as a generated response follows its prompt), so the scored span is found
  from the rendered template, not by searching for EOS tokens (a search that assumes one template and unpadded
  single sequences), and every variant of a
  datapoint's prompt (baseline, any plan) scores exactly the same tokens: the chapter plus its end-of-turn tokens.
* :func:`gold_mean_nll` packs the sequences into micro-batches (longest first, at most ``micro_batch_size`` rows and
  ``max_tokens`` padded tokens each), right-pads them, marks the scored span as the "action" span and runs them through
  a forward function that returns action log-probs per micro-batch, as upstream's ``ReferenceModelActor.forward`` and
  ``Actor.forward`` do.
* :func:`group_forward` is that function for a ``RayActorGroup`` of reference actors: one
  ``async_run_method_batch(method_name="forward", ...)`` call for the whole batch, results flattened as upstream's
  ``RemoteExperienceMaker._flatten_results`` does. Every rank gets the same number of micro-batches (padded with a
  one-row dummy whose result is dropped), because ZeRO-3 ranks gather parameters collectively in every forward and a
  rank with one forward fewer would leave the others waiting forever.
* :func:`model_checksum` identifies the weights, config and tokenizer files of a model, so that a precomputed
  baseline can be checked against the reference model at launch.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable, Sequence

import torch

from openrlhf_classmate.algo.vrcli_reward import mean_nll

# (sequences [B, L], action_mask [B, L-1], attention_mask [B, L]) per micro-batch -> action log-probs [B, L-1] each
Forward = Callable[[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]], list[torch.Tensor]]


class TemplateError(ValueError):
    """The chat template does not render the assistant turn as a continuation of its generation prompt."""


def generator_inputs(tokenizer, messages: list[dict[str, str]]) -> tuple[list[int], int]:
    """Token ids of the chat-templated ``messages`` (the last one is the assistant's gold chapter) and the index of
    the first scored token (the first token of the assistant content)."""
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    if not full.startswith(prompt):
        raise TemplateError("the chat template renders the assistant turn differently from its generation prompt "
                            "(the rendered conversation does not start with the rendered prompt), so the gold "
                            "chapter's tokens cannot be located")
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    gold_ids = tokenizer(full[len(prompt):], add_special_tokens=False)["input_ids"]
    if not prompt_ids or not gold_ids:
        raise TemplateError("empty generator prompt or gold chapter after tokenisation")
    return list(prompt_ids) + list(gold_ids), len(prompt_ids)


def plan_micro_batches(lengths: Sequence[int], micro_batch_size: int, max_tokens: int | None,
                       ranks: int = 1) -> list[list[int]]:
    """Row indices per micro-batch, laid out rank by rank: rank r gets the contiguous chunk r of ``len / ranks``
    micro-batches (as ``RayActorGroup.async_run_method_batch`` splits). A micro-batch ``[-1]`` is a dummy.

    Rows are sorted longest first and packed greedily (padding stays small); the micro-batches are then dealt to the
    ranks in snake order by padded size, so that the ranks get equal counts and similar amounts of work."""
    if micro_batch_size < 1:
        raise ValueError("micro_batch_size must be >= 1")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # sorted longest first: the first row of a micro-batch sets its padded width
        full = len(current) >= micro_batch_size
        too_many_tokens = max_tokens is not None and current and lengths[current[0]] * (len(current) + 1) > max_tokens
        if current and (full or too_many_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    if not batches:
        return []
    while len(batches) % ranks:
        batches.append([-1])
    cost = [lengths[b[0]] * len(b) if b[0] >= 0 else 0 for b in batches]
    per_rank: list[list[list[int]]] = [[] for _ in range(ranks)]
    for round_start in range(0, len(batches), ranks):
        by_cost = sorted(range(len(batches)), key=lambda j: -cost[j])[round_start : round_start + ranks]
        lanes = range(ranks) if (round_start // ranks) % 2 == 0 else reversed(range(ranks))
        for lane, j in zip(lanes, by_cost):
            per_rank[lane].append(batches[j])
    return [b for lane in per_rank for b in lane]


def _micro_batch_tensors(items: Sequence[tuple[list[int], int]], rows: list[int], pad_id: int):
    width = max(len(items[i][0]) for i in rows)
    sequences = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    action_mask = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    for b, i in enumerate(rows):
        ids, start = items[i]
        sequences[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[b, : len(ids)] = 1
        action_mask[b, start - 1 : len(ids) - 1] = True  # log-prob t scores token t + 1
    return sequences, action_mask, attention_mask


def gold_mean_nll(forward: Forward, items: Sequence[tuple[list[int], int]], *, pad_id: int,
                  micro_batch_size: int = 8, max_tokens: int | None = None, ranks: int = 1) -> list[float]:
    """Mean NLL of the scored tokens of each ``(ids, first_scored)`` item, through ``forward`` in micro-batches."""
    if not items:
        return []
    for ids, start in items:
        if not 1 <= start < len(ids):
            raise ValueError(f"scored span starts at {start} in a sequence of {len(ids)} tokens")
    lengths = [len(ids) for ids, _ in items]
    plan = plan_micro_batches(lengths, micro_batch_size, max_tokens, ranks)
    shortest = min(range(len(items)), key=lambda i: lengths[i])
    tensors = [_micro_batch_tensors(items, rows if rows[0] >= 0 else [shortest], pad_id) for rows in plan]
    outputs = forward([t[0] for t in tensors], [t[1] for t in tensors], [t[2] for t in tensors])
    if len(outputs) != len(plan):
        raise RuntimeError(f"the forward returned {len(outputs)} results for {len(plan)} micro-batches")
    nll = [float("nan")] * len(items)
    for rows, (_, action_mask, _), log_probs in zip(plan, tensors, outputs):
        if rows[0] < 0:
            continue
        values = mean_nll(log_probs.float()[:, -action_mask.shape[1]:], action_mask)
        for b, i in enumerate(rows):
            nll[i] = float(values[b])
    return nll


def effective_ranks(group) -> int:
    """Data-parallel ranks of a ``RayActorGroup`` (ring-attention / tensor-parallel copies count once), 1 for
    anything else (a local model)."""
    handlers = getattr(group, "_actor_handlers", None)
    if handlers is None:
        return 1
    return max(1, len(handlers) // max(1, getattr(group, "duplicate_actors", 1)))


def group_forward(group, *, empty_cache: bool = False) -> Forward:
    """A :data:`Forward` through ``group``'s ``forward`` method (upstream ``ReferenceModelActor.forward``): one batched
    call for all micro-batches, then upstream's flattening (one result list per data-parallel chunk, duplicates of
    ring-attention / tensor-parallel ranks dropped). ``empty_cache`` frees the actors' cache afterwards, as upstream
    does when models share GPUs."""
    import ray

    def forward(sequences, action_mask, attention_mask):
        refs = group.async_run_method_batch(method_name="forward", sequences=sequences, action_mask=action_mask,
                                            attention_mask=attention_mask)
        results = ray.get(refs)
        if empty_cache:
            ray.get(group.async_run_method(method_name="empty_cache"))
        duplicate = max(1, getattr(group, "duplicate_actors", 1))
        return list(itertools.chain.from_iterable(results[::duplicate]))

    return forward


def local_forward(model, device: torch.device | str = "cpu") -> Forward:
    """A :data:`Forward` through an in-process model with upstream ``Actor.forward``'s signature."""

    @torch.no_grad()
    def forward(sequences, action_mask, attention_mask):
        return [model(s.to(device), m.to(device), a.to(device)).float().cpu()
                for s, m, a in zip(sequences, action_mask, attention_mask)]

    return forward


# ── model identity ──

_IDENTITY_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json",
                   "merges.txt")


def _is_weight_file(name: str) -> bool:
    return name.endswith(".safetensors") or (name.startswith("pytorch_model") and name.endswith(".bin"))


def resolve_model_dir(name_or_path: str) -> str:
    """A local directory holding the model: the path itself, else the Hugging Face cache (downloaded if absent)."""
    if os.path.isdir(name_or_path):
        return name_or_path
    from huggingface_hub import snapshot_download

    patterns = ["*.safetensors", "pytorch_model*.bin", *_IDENTITY_FILES]
    try:
        return snapshot_download(name_or_path, allow_patterns=patterns, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached yet: fetch what training would fetch anyway
        return snapshot_download(name_or_path, allow_patterns=patterns)


def model_checksum(name_or_path: str) -> str:
    """sha256 over the weight files (``*.safetensors``, ``pytorch_model*.bin``), ``config.json`` and the tokenizer and
    chat-template files of a model: two models with the same checksum give the same perplexities."""
    path = resolve_model_dir(name_or_path)
    files = sorted(f for f in os.listdir(path) if _is_weight_file(f) or f in _IDENTITY_FILES)
    if not any(_is_weight_file(f) for f in files):
        raise FileNotFoundError(f"no weight files (*.safetensors, pytorch_model*.bin) in {path}")
    total = hashlib.sha256()
    for name in files:
        digest = hashlib.sha256()
        with open(os.path.join(path, name), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                digest.update(chunk)
        total.update(f"{name}\0{digest.hexdigest()}\n".encode())
    return total.hexdigest()
