"""DARLING's diversity-aware reward as pure functions (Li et al., arXiv 2509.02534).

Notation, for one prompt group of n responses r_1..r_n with quality rewards q_i:

* pair verdicts: ``same[(a, b)]`` for a < b is True (equivalent), False (different) or None (unknown: the
  classifier failed). Classes C(i) are the connected components of the True pairs (all-pairs union-find, i.e. the
  transitive closure), not NoveltyBench's greedy partition.
* partition diversity: ``Div_i = (n - |C(i)|) / (n - 1)``, the fraction of the other n-1 responses outside i's
  class, floored: ``Div_i = max(Div_i, floor)`` (floor 0.1 in the reference).
* ``partition_correct``: the same over the k correct responses only (q_i > 0): ``(k - |C(i) ∩ correct|) / (k - 1)``;
  incorrect responses, and every response of a group with k <= 1, get the floor.
* ``ngram``: the fraction of response i's word 4-grams that occur in no other response of the group (0 for a
  response with no 4-gram; no floor), the lexical baseline.
* combination (``combine``):
    multiplicative       R_i = q_i * Div_i
    additive             R_i = λ_q * q_i + λ_d * Div_i
    normalize_then_sum   R_i = λ_q * z(q)_i + λ_d * z(Div)_i,  z(x) = (x - mean) / (std + 1e-6) within the group,
                         0 for a group whose std is 0 (std: the unbiased sample std, as torch.std)
  with, optionally, ``q_i -= min_j q_j`` per group first (``min_shift``, the reference's ``add_bias``).

A response whose class is not determined (an unknown pair joins its class to another one that it is not already
connected to) has an undetermined diversity; :func:`combine` then reports which rewards depend on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

DIVERSITY_KINDS = ("partition", "partition_correct", "ngram")
COMBINE_MODES = ("multiplicative", "additive", "normalize_then_sum")
NORM_EPS = 1e-6

PairVerdicts = Mapping[tuple[int, int], bool | None]


def all_pairs(n: int) -> list[tuple[int, int]]:
    """The n(n-1)/2 index pairs (a, b) with a < b, in order."""
    return [(a, b) for a in range(n) for b in range(a + 1, n)]


def short_answer_rule(a: str, b: str, *, max_words: int = 5) -> bool | None:
    """DARLING's shortcut for short answers, decided without the classifier: when the longer of the two responses
    has at most ``max_words`` lower-cased whitespace tokens, they are equivalent iff ``2 * |common unigrams| >=``
    that length. None: the rule does not apply (ask the classifier)."""
    wa, wb = a.lower().split(), b.lower().split()
    longest = max(len(wa), len(wb))
    if longest > max_words:
        return None
    return 2 * len(set(wa) & set(wb)) >= longest


def truncate_words(text: str, max_words: int) -> str:
    """The first ``max_words`` whitespace-separated words of ``text``, joined by single spaces."""
    return " ".join(text.split()[:max_words])


def pair_text(a: str, b: str, *, cls: str, sep: str, max_len: int) -> str:
    """The classifier input ``CLS a SEP b SEP``, each response cut to its first ``(max_len - 3) // 2`` words (the
    prompt is not included)."""
    keep = max(1, (max_len - 3) // 2)
    return f"{cls}{truncate_words(a, keep)}{sep}{truncate_words(b, keep)}{sep}"


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def partition(n: int, same: PairVerdicts) -> tuple[list[int], list[bool]]:
    """Classes of a group from its pair verdicts (union-find over the True pairs).

    Returns ``(class_of, determined)``: ``class_of[i]`` is the smallest index of i's class, and ``determined[i]`` is
    False when an unknown pair links i's class to a different class (an unknown pair inside one class, whose two
    ends are already connected, changes nothing).
    """
    uf = _UnionFind(n)
    for (a, b), verdict in same.items():
        if verdict:
            uf.union(a, b)
    class_of = [uf.find(i) for i in range(n)]
    open_classes: set[int] = set()
    for (a, b), verdict in same.items():
        if verdict is None and class_of[a] != class_of[b]:
            open_classes.update((class_of[a], class_of[b]))
    return class_of, [c not in open_classes for c in class_of]


def class_sizes(class_of: Sequence[int]) -> list[int]:
    """|C(i)| for every response."""
    counts: dict[int, int] = {}
    for c in class_of:
        counts[c] = counts.get(c, 0) + 1
    return [counts[c] for c in class_of]


def partition_diversity(class_of: Sequence[int], *, floor: float = 0.1) -> list[float]:
    """``max((n - |C(i)|) / (n - 1), floor)``; a group of one response gets the floor."""
    n = len(class_of)
    if n < 2:
        return [floor] * n
    return [max((n - size) / (n - 1), floor) for size in class_sizes(class_of)]


def partition_correct_diversity(class_of: Sequence[int], correct: Sequence[bool], *, floor: float = 0.1) -> list[float]:
    """Diversity among the k correct responses: ``max((k - |C(i) ∩ correct|) / (k - 1), floor)`` for a correct
    response, the floor for an incorrect one and for every response when k <= 1."""
    k = sum(bool(c) for c in correct)
    if k <= 1:
        return [floor] * len(class_of)
    correct_per_class: dict[int, int] = {}
    for c, ok in zip(class_of, correct, strict=True):
        if ok:
            correct_per_class[c] = correct_per_class.get(c, 0) + 1
    return [max((k - correct_per_class[c]) / (k - 1), floor) if ok else floor
            for c, ok in zip(class_of, correct, strict=True)]


def ngram_diversity(texts: Sequence[str], *, n: int = 4) -> list[float]:
    """Per response, the fraction of its distinct word n-grams that occur in no other response of the group."""
    grams = [{tuple(w[i : i + n]) for i in range(len(w) - n + 1)} for w in (t.split() for t in texts)]
    out = []
    for i, own in enumerate(grams):
        if not own:
            out.append(0.0)
            continue
        others = set().union(*(g for j, g in enumerate(grams) if j != i))
        out.append(len(own - others) / len(own))
    return out


def _zscore(x: Sequence[float], rows: Sequence[int]) -> dict[int, float]:
    """z-scores of ``x`` over ``rows`` (the rows that take part in the group statistics)."""
    values = [x[i] for i in rows]
    if len(values) < 2:
        return {i: 0.0 for i in rows}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    if std == 0.0:
        return {i: 0.0 for i in rows}
    return {i: (x[i] - mean) / (std + NORM_EPS) for i in rows}


def combine(quality: Sequence[float], diversity: Sequence[float], *, mode: str = "multiplicative",
            lambda_quality: float = 1.0, lambda_diversity: float = 1.0, min_shift: bool = False,
            quality_known: Sequence[bool] | None = None,
            diversity_known: Sequence[bool] | None = None) -> tuple[list[float], list[bool]]:
    """Combine one group's quality and diversity (formulas in the module docstring).

    ``quality_known[i]`` / ``diversity_known[i]`` say whether the value is real (a failed reward function, an
    unknown classifier pair). Rows with an unknown quality take no part in the group statistics (the min-shift, the
    z-scores), get reward 0 and are undetermined. Returns ``(rewards, determined)``; a reward is also undetermined
    when it depends on an unknown diversity: multiplicative, only where the shifted quality is not 0; additive, that
    row; normalize_then_sum, every row of the group (through the group statistics).
    """
    if mode not in COMBINE_MODES:
        raise ValueError(f"unknown combination mode {mode!r}; choose one of {COMBINE_MODES}")
    n = len(quality)
    if len(diversity) != n:
        raise ValueError(f"{n} quality values but {len(diversity)} diversity values")
    q_known = [True] * n if quality_known is None else [bool(k) for k in quality_known]
    d_known = [True] * n if diversity_known is None else [bool(k) for k in diversity_known]
    rows = [i for i in range(n) if q_known[i]]
    q = [float(v) for v in quality]
    if min_shift and rows:
        low = min(q[i] for i in rows)
        q = [v - low for v in q]
    d = [float(v) for v in diversity]
    rewards, determined = [0.0] * n, [False] * n
    use_diversity = lambda_diversity != 0.0 or mode == "multiplicative"
    if mode == "normalize_then_sum":
        zq = _zscore(q, rows)
        zd = _zscore(d, rows) if use_diversity else {i: 0.0 for i in rows}
        group_known = not use_diversity or all(d_known[i] for i in rows)
        for i in rows:
            rewards[i] = lambda_quality * zq[i] + lambda_diversity * zd[i]
            determined[i] = group_known
        return rewards, determined
    for i in rows:
        if mode == "multiplicative":
            rewards[i] = q[i] * d[i]
            determined[i] = d_known[i] or q[i] == 0.0
        else:
            rewards[i] = lambda_quality * q[i] + (lambda_diversity * d[i] if use_diversity else 0.0)
            determined[i] = d_known[i] or not use_diversity
    return rewards, determined
