"""``--logprobs.*``: token log-probs of the actor and reference forwards without the full logits.

Upstream's ``Actor.forward`` (``openrlhf/models/actor.py``, 0.11.2) runs the causal LM, upcasts the whole
``[batch, seq, vocabulary]`` logits to float32, divides them by the rollout temperature and takes the log-softmax
(and the entropy) of every position. With ``--logprobs.chunked`` (auto, the default, or on) the actor and reference
workers build :class:`ChunkedLogprobActor` instead (rebound in ``integration/patches.py``): the same model call, but
for that call
the model's output layer (``lm_head``, an ``nn.Linear``, possibly tied to the embedding) runs
:func:`openrlhf_classmate.algo.chunked_logprobs.chunked_lm_head_stats` on the positions whose log-probs are needed
(the action tokens; every position for ``return_logprobs``), ``--logprobs.chunk_size`` tokens at a time, and returns
``[n, 1 or 2]`` (log-prob, entropy) instead of the logits. The head is still called as the module, so DeepSpeed's
ZeRO-3 hooks gather its partitioned weight for the forward and again for the backward, and the rest of the model
(PEFT/LoRA wrapper, gradient checkpointing, MoE router losses) is untouched. The results are scattered back to
upstream's layout: ``action_log_probs`` equal upstream's (zero outside the action mask, as upstream multiplies by it),
``output.entropy`` is upstream's at the action positions and 0 elsewhere (upstream reads it only through the action
mask). A call that wants the logits themselves (no ``action_mask``, no ``return_logprobs``) runs upstream's forward.

Not served: ring attention, DeepSpeed tensor parallelism (a vocabulary-split head), LoRA on ``lm_head``,
vision-language models and models whose config rescales the logits after the head (soft-capping, logit scales).
``auto`` (the default; on since the H100 runs of bench/GPU_RESULTS.md held its targets: >= 1.10x tokens/s and
<= 0.80x peak memory, for every loss) falls back to
upstream's path for those with one note line, ``on`` refuses them at launch with one line, ``off`` is upstream's
path. At run time a model that changes the head's output anyway is stopped with one line.
"""

from __future__ import annotations

import contextlib

import torch
from openrlhf.models import Actor
from openrlhf.models.ring_attn_utils import unpad_and_slice_tensor

from openrlhf_classmate.algo.chunked_logprobs import chunked_lm_head_stats

# ── the actor ────────────────────────────────────────────────────────────────────────────────────────────────────


def output_head(model: torch.nn.Module) -> torch.nn.Linear:
    """The LM head of ``model`` (a DeepSpeed engine, a PEFT model or a transformers causal LM)."""
    import deepspeed

    if isinstance(model, deepspeed.DeepSpeedEngine):
        model = model.module
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise RuntimeError(f"--logprobs.chunked needs the model's output layer to be a plain torch.nn.Linear, found "
                           f"{type(head).__name__} (LoRA on lm_head, a quantised head?): drop --logprobs.chunked")
    return head


@contextlib.contextmanager
def _head_returns_stats(head: torch.nn.Linear, n_tokens: int, rows: torch.Tensor, targets: torch.Tensor, *,
                        temperature: float, chunk_size: int, with_entropy: bool):
    """For the duration of the block, ``head(hidden [.., n_tokens, H])`` returns the chunked stats [len(rows), k]
    of the hidden states at ``rows`` (of the flattened tokens) instead of the logits; the block gets the list they are
    appended to."""
    calls: list[torch.Tensor] = []

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])  # (tokens, H)
        if calls or flat.shape[0] != n_tokens:
            raise RuntimeError(f"--logprobs.chunked: the LM head ran {len(calls) + 1} time(s) on {flat.shape[0]} "
                               f"tokens in one forward, expected once on {n_tokens}: drop --logprobs.chunked")
        calls.append(chunked_lm_head_stats(flat.index_select(0, rows), head.weight, targets, bias=head.bias,
                                           temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy))
        return calls[-1]

    saved = head.__dict__.get("forward")  # an instance-level forward (e.g. an accelerate hook) is put back
    head.forward = forward
    try:
        yield calls
    finally:
        if saved is None:
            del head.forward
        else:
            head.forward = saved


def _scatter(values: torch.Tensor, positions: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """values at the flat padded positions (b * seqlen + s) of a zero [batch, seqlen] float32 tensor."""
    out = torch.zeros(batch * seqlen, dtype=torch.float32, device=values.device)
    return out.index_copy(0, positions, values).view(batch, seqlen)


class ChunkedLogprobActor(Actor):
    """Upstream's ``Actor`` whose log-probs (and entropy) come from the chunked LM head (module docstring).

    ``chunk_size`` is set on the subclass :func:`chunked_actor_class` makes (upstream constructs the class with its
    own arguments); None (or 0) on an instance runs upstream's forward unchanged (the benchmark compares both)."""

    chunk_size: int | None = None

    def forward(self, sequences, action_mask=None, attention_mask=None, return_output=False, allgather_logits=False,
                return_logprobs=False, ring_attn_group=None, packed_seq_lens=None, return_entropy=False, **mm_inputs):
        if not self.chunk_size or (action_mask is None and not return_logprobs):
            return super().forward(sequences, action_mask, attention_mask, return_output=return_output,
                                   allgather_logits=allgather_logits, return_logprobs=return_logprobs,
                                   ring_attn_group=ring_attn_group, packed_seq_lens=packed_seq_lens,
                                   return_entropy=return_entropy, **mm_inputs)
        if ring_attn_group is not None or mm_inputs or getattr(self, "is_vlm", False):
            raise RuntimeError("--logprobs.chunked supports neither ring attention nor vision-language inputs "
                               "(refused at launch): drop --logprobs.chunked")
        assert not return_entropy or return_output  # as upstream
        batch, seqlen = sequences.size()
        # what upstream feeds the model (openrlhf/models/actor.py, Actor.forward)
        if self.packing_samples:
            model_sequences, position_ids, rolled, _, indices = unpad_and_slice_tensor(sequences, attention_mask, None)
            forward_attention_mask = None
        else:
            model_sequences = sequences
            rolled = torch.roll(sequences, shifts=-1, dims=1)
            forward_attention_mask = attention_mask
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids.masked_fill_(attention_mask == 0, 1)
            indices = None
        n_tokens = rolled.numel()  # tokens the model runs on (flattened)

        # positions (flat b * seqlen + s of the padded batch) whose log-prob is needed: log-prob s scores token s + 1
        if action_mask is not None:
            b, j = action_mask.nonzero(as_tuple=True)
            positions = b * seqlen + (seqlen - 1 - action_mask.shape[1]) + j
        else:  # return_logprobs: every position the model ran on
            positions = indices if indices is not None else torch.arange(n_tokens, device=sequences.device)
        if indices is None:
            rows = positions
        else:  # packed: the model's token t sits at padded position indices[t]
            lookup = torch.full((batch * seqlen,), -1, dtype=torch.long, device=sequences.device)
            lookup[indices] = torch.arange(n_tokens, device=sequences.device)
            rows = lookup[positions]
            positions, rows = positions[rows >= 0], rows[rows >= 0]  # upstream gives padding 0 (then masked)

        head = output_head(self.model)
        with _head_returns_stats(head, n_tokens, rows, rolled.reshape(-1)[rows], temperature=self.temperature,
                                 chunk_size=self.chunk_size, with_entropy=return_entropy) as returned:
            output = self.model(model_sequences, attention_mask=forward_attention_mask, position_ids=position_ids)
        # the head's stats as the model returned them (under ZeRO-3 wrapped by DeepSpeed's backward hooks, a view of
        # the same storage); anything else means the model computed something from the head's output
        stats = output["logits"]
        if (not returned or not isinstance(stats, torch.Tensor) or stats.shape != returned[0].shape
                or stats.data_ptr() != returned[0].data_ptr()):
            raise RuntimeError("--logprobs.chunked: the model changed its LM head's output (logit scaling or "
                               "soft-capping?), so chunked log-probs would differ from upstream's: drop "
                               "--logprobs.chunked for this model")
        output["logits"] = None  # no logits were computed

        log_probs = _scatter(stats[:, 0], positions, batch, seqlen)[:, :-1]
        if return_entropy:
            output.entropy = _scatter(stats[:, 1], positions, batch, seqlen)[:, :-1]
        if action_mask is None:
            return (log_probs, output) if return_output else log_probs
        action_log_probs = log_probs[:, -action_mask.shape[1] :] * action_mask.float()
        return (action_log_probs, output) if return_output else action_log_probs


def chunked_actor_class(chunk_size: int) -> type[ChunkedLogprobActor]:
    """A :class:`ChunkedLogprobActor` subclass with ``chunk_size`` set, for upstream to construct as its ``Actor``."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return type("ChunkedLogprobActor", (ChunkedLogprobActor,), {"chunk_size": chunk_size})
