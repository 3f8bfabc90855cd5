"""The chunked LM-head log-probs (``algo/chunked_logprobs.py``) against upstream's full-logits path, on CPU.

Upstream's path here is the code of ``openrlhf/models/actor.py`` (``Actor.forward``: the head's logits upcast to
float32, divided in place by the temperature) with upstream's own ``log_probs_from_logits`` and ``compute_entropy``
(its uncompiled body: compiling it takes ~80 s on this CPU and computes the same function).

Tolerances: float32 to 1e-6 (log-probs and entropies relative to the logsumexp they are computed from, as they are
differences of fp32 numbers of that size; gradients relative to their largest entry, since an entry is a sum whose
terms may cancel): the chunks run the same operations on the same rows, and only the GEMM
blocking for a different number of rows and the closed-form backward change the last bits (checked against float64
while writing this: both paths are within 2e-6 of it on gradients of size ~4). bfloat16: the logits are the same bf16 GEMM output upcast, so
the values agree to one bf16 rounding of the logits (2^-8 relative): |d logp| <= 2 * 2^-8 * max|logit| / T; the
measured difference is asserted below as well. The weight gradient is a sum over tokens: upstream rounds the full
GEMM once to bf16, the chunked path sums the chunks in fp32 and rounds once (on CPU each chunk's product is rounded
to bf16 first, as CPU GEMMs have no fp32 output for bf16 inputs), so it may differ by a few bf16 roundings:
2^-6 x max|grad| absolute.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from openrlhf.models.utils import compute_entropy, log_probs_from_logits
from torch.utils._python_dispatch import TorchDispatchMode

from openrlhf_classmate.algo.chunked_logprobs import chunked_lm_head_stats, chunked_logprobs

upstream_entropy = compute_entropy._torchdynamo_orig_callable


def upstream(hidden, weight, bias, targets, temperature, with_entropy):
    """openrlhf 0.11.2 Actor.forward from the head's output on (one micro-batch row of packed tokens)."""
    logits = torch.nn.functional.linear(hidden, weight, bias).to(torch.float32)
    if temperature != 1.0:
        logits.div_(temperature)
    logp = log_probs_from_logits(logits.unsqueeze(0), targets.unsqueeze(0))[0]
    return logp, (upstream_entropy(logits) if with_entropy else None)


def _inputs(n, v, h, dtype, *, bias, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g) * 2).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(dtype).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.5).to(dtype).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    # random upstream gradients of both outputs, so every term of the backward is exercised
    g_logp, g_ent = torch.randn(n, generator=g), torch.randn(n, generator=g)
    return hidden, weight, b, targets, g_logp, g_ent


def _run(fn, hidden, weight, bias, targets, g_logp, g_ent, with_entropy):
    params = [t for t in (hidden, weight, bias) if t is not None]
    for t in params:
        t.grad = None
    logp, ent = fn()
    loss = (logp * g_logp).sum() + ((ent * g_ent).sum() if with_entropy else 0)
    loss.backward()
    return logp.detach(), (ent.detach() if with_entropy else None), [t.grad.clone() for t in params]


OPTIONS = list(itertools.product([1.0, 0.7], [False, True], [False, True]))  # temperature, bias, entropy
# every shape x chunk size (1 token, a partial last chunk, one chunk), the options cycling; all options at (37, 64, 8)
CASES = [(shape, chunk, *OPTIONS[i % len(OPTIONS)])
         for i, (shape, chunk) in enumerate(itertools.product([(1, 11, 3), (7, 50, 16), (37, 64, 8)], [1, 5, 64]))]
CASES += [((37, 64, 8), 5, *options) for options in OPTIONS]


@pytest.mark.parametrize("shape,chunk,temperature,bias,with_entropy", CASES)
def test_float32_equals_upstream_to_1e6(shape, chunk, temperature, bias, with_entropy):
    n, v, h = shape
    hidden, weight, b, targets, g_logp, g_ent = _inputs(n, v, h, torch.float32, bias=bias, seed=n + v)
    ref = _run(lambda: upstream(hidden, weight, b, targets, temperature, with_entropy), hidden, weight, b, targets,
               g_logp, g_ent, with_entropy)
    out = _run(lambda: chunked_logprobs(hidden, weight, targets, bias=b, temperature=temperature, chunk_size=chunk,
                                        with_entropy=with_entropy), hidden, weight, b, targets, g_logp, g_ent,
               with_entropy)
    # log-probs and entropies are differences of fp32 numbers as large as the logsumexp: 1e-6 of that scale
    with torch.no_grad():
        logits = torch.nn.functional.linear(hidden, weight, b) / temperature
        scale = max(1.0, float(torch.logsumexp(logits, -1).abs().max()))
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=1e-6 * scale)
    if with_entropy:
        torch.testing.assert_close(out[1], ref[1], rtol=0, atol=1e-6 * scale)
    assert len(out[2]) == len(ref[2]) == (3 if bias else 2)
    for mine, theirs in zip(out[2], ref[2]):
        # a gradient entry is a sum over tokens or vocabulary whose terms can cancel: 1e-6 of the largest entry
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6 * max(1.0, float(theirs.abs().max())))


@pytest.mark.parametrize("temperature,with_entropy", [(1.0, True), (0.6, True), (1.3, False)])
def test_bfloat16_within_one_rounding_of_the_logits(temperature, with_entropy):
    n, v, h = 200, 600, 64
    hidden, weight, b, targets, g_logp, g_ent = _inputs(n, v, h, torch.bfloat16, bias=False, seed=3)
    ref = _run(lambda: upstream(hidden, weight, None, targets, temperature, with_entropy), hidden, weight, None,
               targets, g_logp, g_ent, with_entropy)
    out = _run(lambda: chunked_logprobs(hidden, weight, targets, temperature=temperature, chunk_size=64,
                                        with_entropy=with_entropy), hidden, weight, None, targets, g_logp, g_ent,
               with_entropy)
    max_logit = float((hidden.detach().float() @ weight.detach().float().t()).abs().max())
    bound = 2 * 2**-8 * max_logit / temperature
    assert ref[0].dtype == out[0].dtype == torch.float32
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=bound)
    if with_entropy:
        torch.testing.assert_close(out[1], ref[1], rtol=0, atol=bound)
    for mine, theirs in zip(out[2], ref[2]):
        assert mine.dtype == theirs.dtype == torch.bfloat16
        torch.testing.assert_close(mine.float(), theirs.float(), rtol=0, atol=2**-6 * float(theirs.abs().max()))
    # the measured differences (CPU): the same bf16 logits, so the values are equal to float32 rounding
    assert float((out[0] - ref[0]).abs().max()) < 1e-5


def test_inputs_that_do_not_need_gradients_get_none_and_bad_shapes_are_refused():
    hidden, weight, _, targets, _, _ = _inputs(6, 20, 4, torch.float32, bias=False, seed=1)
    weight.requires_grad_(False)  # a frozen head (LoRA): only the hidden states get a gradient
    chunked_logprobs(hidden, weight, targets, chunk_size=4)[0].sum().backward()
    assert weight.grad is None and hidden.grad is not None
    with pytest.raises(ValueError, match="weight"):
        chunked_lm_head_stats(hidden, weight[:, :3], targets)
    with pytest.raises(ValueError, match="targets"):
        chunked_lm_head_stats(hidden, weight, targets[:2])
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_lm_head_stats(hidden, weight, targets, chunk_size=0)


class LargestTensor(TorchDispatchMode):
    """Records the largest numel of any tensor an op creates (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


def _largest(fn, n, v, h, with_entropy=True):
    hidden, weight, _, targets, g_logp, g_ent = _inputs(n, v, h, torch.float32, bias=False, seed=5)
    with LargestTensor() as mode:
        _run(lambda: fn(hidden, weight, targets), hidden, weight, None, targets, g_logp, g_ent, with_entropy)
    return mode.max_numel


def test_no_tensor_grows_with_tokens_times_vocabulary():
    v, h, chunk = 1000, 16, 32

    def chunked(hidden, weight, targets):
        return chunked_logprobs(hidden, weight, targets, chunk_size=chunk, with_entropy=True)

    def stock(hidden, weight, targets):
        return upstream(hidden, weight, None, targets, 0.7, True)

    sizes = {n: _largest(chunked, n, v, h) for n in (256, 1024)}
    # the largest tensor is one chunk's logits (chunk x vocabulary), whatever the number of tokens
    assert sizes[256] == sizes[1024] == chunk * v
    assert sizes[1024] < 1024 * v / (1024 / chunk) * 2
    assert _largest(stock, 1024, v, h) >= 1024 * v  # upstream materialises [tokens, vocabulary]
