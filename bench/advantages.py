"""Benchmark: vectorised ``compute_advantages`` vs a straightforward per-sample Python loop of the same formulas.

    .venv/bin/python bench/advantages.py                      # issue sizes: 512 prompts x 8 samples, T = 4096
    .venv/bin/python bench/advantages.py --prompts 64 --seq-len 512 --repeats 3
    .venv/bin/python bench/advantages.py --device cuda        # where a GPU is available

Prints the median wall time of both implementations and their ratio (target: >= 50x), after checking that they
agree numerically, for the full call and for the per-sample part alone (the same rewards with T = 1, i.e. the
group statistics and the estimator formulas without the [B, T] token placement). The loop reference is timed on
fewer repeats (``--loop-repeats``) because it is slow. Not a test: timings depend on the machine and its load.

The loop reference fills each row with whole-row torch ops (the straightforward way to write it), so the token
placement, which dominates at T = 4096, costs about the same memory traffic in both versions: writing a [B, T]
float32 tensor is memory- and page-fault-bound on a CPU. ``--thp`` sets ``THP_MEM_ALLOC_ENABLE=1`` (PyTorch's
transparent-huge-page allocations) before torch is imported, which cuts the page-fault share for both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

if __name__ == "__main__" and "--thp" in sys.argv:
    os.environ["THP_MEM_ALLOC_ENABLE"] = "1"  # must be set before torch allocates

import torch  # noqa: E402

import openrlhf_classmate  # noqa: E402,F401  (CPU shims, like every entry point)
from openrlhf_classmate.algo.advantages import ESTIMATORS, TOKEN_MODES, compute_advantages  # noqa: E402


def loop_advantages(
    estimator: str,
    main_rewards: torch.Tensor,
    classmate_rewards: torch.Tensor,
    group_index: torch.Tensor,
    response_mask: torch.Tensor,
    cot_mask: torch.Tensor,
    token_mode: str,
    std_norm: bool,
    classmate_valid: torch.Tensor,
    weights: tuple[float, float] = (1.0, 1.0),
    eps: float = 1e-6,
) -> torch.Tensor:
    """Reference: the formulas of ``openrlhf_classmate.algo.advantages`` written as plain per-sample loops."""
    main = main_rewards.tolist()
    ok = classmate_valid.tolist()
    cm = [c if k else 0.0 for c, k in zip(classmate_rewards.tolist(), ok, strict=True)]
    groups = group_index.tolist()
    batch = len(main)
    members = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)

    def normalise(values: list[float], valid: list[bool]) -> tuple[list[float], list[bool]]:
        out, defined = [], []
        for i in range(batch):
            vals = [values[j] for j in members[groups[i]] if valid[j]]
            if not valid[i] or len(vals) < 2:
                out.append(0.0)
                defined.append(False)
                continue
            mean = sum(vals) / len(vals)
            std = (sum((x - mean) ** 2 for x in vals) / (len(vals) - 1)) ** 0.5
            centred = 0.0 if max(vals) == min(vals) else values[i] - mean
            out.append(centred / (std + eps) if std_norm else centred)
            defined.append(True)
        return out, defined

    a_m, _ = normalise(main, [True] * batch)
    a_c, _ = normalise(cm, ok)
    if estimator == "separated_non_neg":
        a_c = [max(x, 0.0) for x in a_c]
    on_cot = None
    if estimator in ("grpo", "grpo_w_classmate"):
        comb, defined = normalise([m + c for m, c in zip(main, cm, strict=True)], ok)
        on_cot = [c if d else m for c, d, m in zip(comb, defined, a_m, strict=True)]
        if estimator == "grpo":
            token_mode = "all"
    elif estimator in ("gdpo", "gdpo_wo_bn"):
        on_cot = [weights[0] * m + weights[1] * c for m, c in zip(a_m, a_c, strict=True)]
        if estimator == "gdpo":
            mean = sum(on_cot) / batch
            std = (sum((s - mean) ** 2 for s in on_cot) / max(batch - 1, 1)) ** 0.5
            on_cot = [(s - mean) / (std + eps) for s in on_cot]

    dtype = main_rewards.dtype if main_rewards.is_floating_point() else torch.float32
    adv = torch.zeros(response_mask.shape, dtype=dtype, device=response_mask.device)
    for i in range(batch):
        resp, cot = response_mask[i], cot_mask[i]
        if on_cot is None:  # separated: A^m on the response plus A^c on the CoT (or the response)
            cm_mask = cot if token_mode == "classmate_partial" else resp
            adv[i] = a_m[i] * resp + a_c[i] * cm_mask
        elif token_mode == "all":
            adv[i] = on_cot[i] * resp
        else:
            adv[i] = torch.where(cot, on_cot[i], a_m[i]) * resp
    return adv


def make_batch(prompts: int, samples: int, seq_len: int, seed: int = 0, device: str = "cpu"):
    gen = torch.Generator().manual_seed(seed)
    batch = prompts * samples
    group_index = torch.arange(prompts).repeat_interleave(samples)
    main = torch.randint(0, 11, (batch,), generator=gen).float()
    classmate = torch.randint(0, 11, (batch,), generator=gen).float()
    valid = torch.rand(batch, generator=gen) > 0.1
    lengths = torch.randint(1, seq_len + 1, (batch,), generator=gen)
    start = torch.ones(batch, dtype=torch.long)
    end = torch.minimum(start + (torch.rand(batch, generator=gen) * lengths).long(), lengths)
    pos = torch.arange(seq_len).unsqueeze(0)
    response_mask = pos < lengths.unsqueeze(1)
    cot = (pos >= start.unsqueeze(1)) & (pos < end.unsqueeze(1))
    return tuple(x.to(device) for x in (main, classmate, group_index, response_mask, cot, valid))


def timed(fn, repeats: int, device: str) -> tuple[float, object]:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times, out = [], None
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def vectorised(estimator, main, cm, groups, resp, cot, token_mode, std_norm, valid):
    return compute_advantages(estimator, main, cm, groups, response_mask=resp, cot_mask=cot, token_mode=token_mode,
                              baseline="group_norm" if std_norm else "dr_grpo", classmate_valid=valid)


def compare(label: str, call: tuple, repeats: int, loop_repeats: int, device: str) -> None:
    vectorised(*call)  # warm-up
    vec_s, vec_out = timed(lambda: vectorised(*call), repeats, device)
    loop_s, loop_out = timed(lambda: loop_advantages(*call), loop_repeats, device)
    max_diff = (vec_out["advantages"] - loop_out).abs().max().item()
    assert torch.allclose(vec_out["advantages"], loop_out, rtol=0, atol=1e-5), f"implementations differ: {max_diff}"
    print(f"{label}")
    print(f"  vectorised : median {vec_s * 1e3:9.2f} ms over {repeats} runs")
    print(f"  python loop: median {loop_s * 1e3:9.2f} ms over {loop_repeats} runs")
    print(f"  ratio      : {loop_s / vec_s:9.1f}x   (max |difference| {max_diff:.2e})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=11, help="timed runs of the vectorised version")
    parser.add_argument("--loop-repeats", type=int, default=3, help="timed runs of the loop reference")
    parser.add_argument("--estimator", default="gdpo", choices=ESTIMATORS)
    parser.add_argument("--token-mode", default="classmate_partial", choices=TOKEN_MODES)
    parser.add_argument("--no-std-norm", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--thp", action="store_true", help="set THP_MEM_ALLOC_ENABLE=1 before importing torch")
    args = parser.parse_args()

    std_norm = not args.no_std_norm
    main_r, cm_r, groups, resp, cot, valid = make_batch(args.prompts, args.samples, args.seq_len, device=args.device)
    print(
        f"compute_advantages({args.estimator}, {args.token_mode}, std_norm={std_norm}), "
        f"B = {args.prompts} x {args.samples} = {len(main_r)}, device {args.device}, torch threads "
        f"{torch.get_num_threads()}, THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}"
    )
    call = (args.estimator, main_r, cm_r, groups, resp, cot, args.token_mode, std_norm, valid)
    compare(f"full call, T = {args.seq_len}:", call, args.repeats, args.loop_repeats, args.device)
    # Same rewards and groups, one token per response: the per-sample part without the token placement.
    short = (args.estimator, main_r, cm_r, groups, resp[:, :1], cot[:, :1], args.token_mode, std_norm, valid)
    compare("per-sample part only (T = 1):", short, args.repeats, args.loop_repeats, args.device)


if __name__ == "__main__":
    main()
