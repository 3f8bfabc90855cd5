"""Token log-probs (and entropy) through the LM head, chunk by chunk over tokens: no [tokens, vocab] tensor for the
whole sequence ever exists, in the forward or in the backward.

Notation: h_n (hidden state of token n, [H]), W ([V, H]) and b ([V], optional) the LM head, y_n the target token,
T the sampling temperature. Upstream (``openrlhf/models/actor.py`` + ``models/utils.py``, 0.11.2) computes

    l_n = (W h_n + b)                 in the model dtype (bf16 matmul, fp32 accumulation inside the GEMM)
    z_n = float32(l_n) / T
    logp_n = z_n[y_n] - logsumexp(z_n)                      (fp32)
    H_n = logsumexp(z_n) - sum_v softmax(z_n)_v z_n,v        (entropy, fp32)

for all tokens at once. :func:`chunked_lm_head_stats` computes exactly these values, ``chunk_size`` tokens at a time,
with the same operations in the same dtypes (so in bf16 it differs from upstream only where the GEMM or the
reduction order of a chunk differs from the full-size one). Its backward recomputes each chunk's l_n (one more GEMM
per chunk instead of keeping [N, V] for the backward) and uses, with p = softmax(z_n), g the incoming gradients:

    d logp_n / d z_n = onehot(y_n) - p
    d H_n / d z_n    = -p * (log p + H_n) = -p * (z_n - E_p[z_n])
    d / d l_n        = (g_logp * (onehot - p) - g_H * p * (z_n - E_p[z_n])) / T     (cast to the model dtype)

then dh = dl W and dW = sum_chunks dl^T h, accumulated in fp32 over the chunks (rounded once to the weight's dtype,
as upstream's single GEMM rounds once).

On CUDA the per-chunk elementwise work (upcast, scaling, logsumexp, gather, entropy; and the gradient formula) runs
as ``torch.compile`` d kernels that read the model-dtype logits once, instead of materialising float32 copies.
"""

from __future__ import annotations

import warnings

import torch

DEFAULT_CHUNK_SIZE = 2048


def _chunk_stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    """(lse, logp, entropy, E_p[z]) of one chunk's logits [C, V] (model dtype), each [C] fp32 (the last two None
    without entropy)."""
    z = logits.float()  # (C, V)
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return lse, logp, None, None
    mean_z = (torch.softmax(z, dim=-1) * z).sum(-1)
    return lse, logp, lse - mean_z, mean_z  # entropy as upstream's compute_entropy, term for term


def _chunk_grad(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, mean_z: torch.Tensor | None,
                grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """Gradient w.r.t. one chunk's logits [C, V], in the logits' dtype (see the module docstring)."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    p = torch.exp(z - lse.unsqueeze(-1))
    coef = grad_logp.unsqueeze(-1)
    if grad_entropy is not None:
        # z - lse + H = z - E_p[z]; E_p[z] was kept from the forward (lse - H would cancel digits)
        coef = coef + grad_entropy.unsqueeze(-1) * (z - mean_z.unsqueeze(-1))
    # + g_logp at the target: a comparison with the vocabulary index, so that the whole formula is one elementwise pass
    vocab = torch.arange(z.shape[-1], device=z.device)
    grad = torch.where(vocab == targets.unsqueeze(-1), grad_logp.unsqueeze(-1), 0.0) - p * coef
    if temperature != 1.0:
        grad = grad / temperature
    return grad.to(logits.dtype)


class _CompiledOnCuda:
    """``fn`` eagerly on CPU; on CUDA compiled, so the chunk's elementwise work and reductions fuse into kernels
    reading the model-dtype logits directly. Automatic dynamic shapes: the first compile is for a full chunk, a
    different row count (the last chunk) recompiles once with a symbolic row count; the vocabulary stays static. If compiling fails, ``fn`` runs eagerly
    from then on (same values, more memory traffic) and ``error`` says why."""

    def __init__(self, fn):
        self.fn = fn
        self.compiled = None
        self.error: str | None = None

    def __call__(self, logits: torch.Tensor, *args):
        if not logits.is_cuda or self.error is not None:
            return self.fn(logits, *args)
        if self.compiled is None:
            self.compiled = torch.compile(self.fn)
        try:
            return self.compiled(logits, *args)
        except Exception as e:  # noqa: BLE001 - an inductor/triton failure must not stop training
            self.error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            warnings.warn(f"chunked log-probs: torch.compile of {self.fn.__name__} failed ({self.error}); running it "
                          "eagerly", stacklevel=2)
            return self.fn(logits, *args)


chunk_stats = _CompiledOnCuda(_chunk_stats)
chunk_grad = _CompiledOnCuda(_chunk_grad)


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # the same GEMM as the model's nn.Linear head: model dtype in and out, fp32 accumulation inside
    return torch.nn.functional.linear(hidden, weight, bias)


def _weight_grad(grad_logits: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """grad_logits^T hidden ([V, H]) in fp32: the GEMM's own fp32 result where the device offers it (CUDA), else
    the model-dtype product upcast (CPU)."""
    global _MM_OUT_DTYPE
    if grad_logits.dtype == torch.float32:
        return grad_logits.t() @ hidden
    if grad_logits.is_cuda and _MM_OUT_DTYPE:
        try:
            return torch.mm(grad_logits.t(), hidden, out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_OUT_DTYPE = False  # this torch has no fp32-output GEMM for these inputs
    return (grad_logits.t() @ hidden).float()


_MM_OUT_DTYPE = True


def _chunks(n: int, chunk_size: int):
    for start in range(0, n, chunk_size):
        yield start, min(start + chunk_size, n)


class ChunkedLMHead(torch.autograd.Function):
    """stats [N, 1 or 2] = (logp, [entropy]) of the targets; see :func:`chunked_lm_head_stats`."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, with_entropy):
        n = hidden.shape[0]
        stats = torch.empty((n, 2 if with_entropy else 1), dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        mean_z = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for start, end in _chunks(n, chunk_size):
            logits = _logits(hidden[start:end], weight, bias)  # (C, V), model dtype: the only vocabulary-sized tensor
            chunk_lse, logp, entropy, chunk_mean_z = chunk_stats(logits, targets[start:end], temperature, with_entropy)
            del logits
            lse[start:end] = chunk_lse
            stats[start:end, 0] = logp
            if with_entropy:
                stats[start:end, 1] = entropy
                mean_z[start:end] = chunk_mean_z
        ctx.save_for_backward(hidden, weight, bias, targets, lse, mean_z)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        return stats

    @staticmethod
    def backward(ctx, grad_stats):
        hidden, weight, bias, targets, lse, mean_z = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_stats = grad_stats.float()
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
        for start, end in _chunks(hidden.shape[0], ctx.chunk_size):
            h = hidden[start:end]
            logits = _logits(h, weight, bias)  # recomputed: nothing vocabulary-sized was kept from the forward
            chunk_mean_z = mean_z[start:end] if ctx.with_entropy else None
            grad_entropy = grad_stats[start:end, 1] if ctx.with_entropy else None
            grad_logits = chunk_grad(logits, targets[start:end], lse[start:end], chunk_mean_z,
                                     grad_stats[start:end, 0], grad_entropy, ctx.temperature)
            del logits
            if need_hidden:
                grad_hidden[start:end] = grad_logits @ weight
            if need_weight:
                grad_weight += _weight_grad(grad_logits, h)
            if need_bias:
                grad_bias += grad_logits.float().sum(0)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def chunked_lm_head_stats(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                          bias: torch.Tensor | None = None, temperature: float = 1.0,
                          chunk_size: int = DEFAULT_CHUNK_SIZE, with_entropy: bool = False) -> torch.Tensor:
    """``[N, 1]`` (log-prob of each target) or ``[N, 2]`` (log-prob, entropy) in fp32, for hidden states ``[N, H]``,
    LM-head ``weight [V, H]`` (``bias [V]``), ``targets [N]``, as upstream computes them from the full logits
    (module docstring); differentiable w.r.t. ``hidden``, ``weight`` and ``bias``."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden [N, H] and weight [V, H] expected, got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets [N={hidden.shape[0]}] expected, got {tuple(targets.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return ChunkedLMHead.apply(hidden, weight, bias, targets.long(), float(temperature), int(chunk_size),
                               bool(with_entropy))


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                     bias: torch.Tensor | None = None, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK_SIZE,
                     with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs [N], entropy [N] or None): :func:`chunked_lm_head_stats` split into its columns."""
    stats = chunked_lm_head_stats(hidden, weight, targets, bias=bias, temperature=temperature, chunk_size=chunk_size,
                                  with_entropy=with_entropy)
    return stats[:, 0], (stats[:, 1] if with_entropy else None)
