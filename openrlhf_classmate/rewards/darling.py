"""DARLING as a reward hook of the experience maker: the ``--darling.*`` flag group and the hook itself.

Once all n samples of every prompt exist (the hook sees the whole rollout batch; the n samples of a prompt are
consecutive), the hook decodes the responses, partitions each group into equivalence classes (short-answer rule,
then the pair classifier on the remaining pairs, all pairs, union-find), computes the diversity and combines it with
the quality reward the reward function gave (``sample.rewards``), in place. Formulas: :mod:`openrlhf_classmate.algo
.darling`. The advantage is then the group mean baseline without std division, i.e. upstream's
``--algo.advantage.estimator dr_grpo`` (enforced at launch), also per stream in a classmate run.

A sample whose reward cannot be determined (its quality was invalid, or its class touches a pair the classifier could
not answer and its reward depends on it, or with ``partition_correct`` it is correct and another answer's quality in
its group was invalid, so that the number of correct answers is unknown) is marked ``info["main_valid"] = 0``: masked out of the group statistics,
never scored as 0. Per-step metrics (``darling/*``): quality, diversity, number of classes and largest class per
group, all-correct / all-incorrect group counts, pairs classified / decided by the short-answer rule / unknown,
classifier retries and time, and the samples left undetermined.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import torch

from openrlhf_classmate.algo.darling import (
    COMBINE_MODES,
    DIVERSITY_KINDS,
    all_pairs,
    class_sizes,
    combine,
    ngram_diversity,
    pair_text,
    partition,
    partition_correct_diversity,
    partition_diversity,
    short_answer_rule,
)
from openrlhf_classmate.config_fields import POSITIVE_INT, REQUEST_TIMEOUT_S, Bound
from openrlhf_classmate.rewards.pair_classifier import ClassifierSettings, PairClassifier

URLS_ENV = "DARLING_CLASSIFIER_URLS"
PARTITION_KINDS = ("partition", "partition_correct")


@dataclass
class DarlingConfig:
    """DARLING diversity-aware reward (off unless --darling.diversity is set)"""

    diversity: str = field(
        default="none",
        metadata={"help": "Turns DARLING on and picks the diversity term. partition: the fraction of the group outside "
                          "the response's equivalence class, (n - |C|)/(n - 1), floored (the paper's); "
                          "partition_correct: the same among the correct responses only (others get the floor); "
                          "ngram: the fraction of the response's word n-grams no other response has (lexical, no "
                          "server); none: DARLING off", "choices": ("none", *DIVERSITY_KINDS)},
    )
    combine: str = field(
        default="multiplicative",
        metadata={"help": "How quality q and diversity d make the reward. multiplicative: q*d (the paper's; wrong "
                          "answers of a 1/0 quality get 0); additive: lambda_quality*q + lambda_diversity*d; "
                          "normalize_then_sum: the same on per-group z-scores of q and d",
                  "choices": COMBINE_MODES},
    )
    lambda_quality: float = field(
        default=1.0, metadata={"help": "additive / normalize_then_sum: weight of the quality term (any real)", "range": None}
    )
    lambda_diversity: float = field(
        default=1.0,
        metadata={"help": "additive / normalize_then_sum: weight of the diversity term; not 0 (that is a "
                          "quality-only run: drop --darling.diversity)", "range": None},
    )
    min_shift: bool = field(
        default=False,
        metadata={"help": "Shift each group's quality by minus its minimum before combining, so q >= 0 (the "
                          "reference's add_bias; for reward-model qualities that can be negative)"},
    )
    quality_values: list[float] | None = field(
        default=None,
        metadata={"help": "Map the quality to two values: CORRECT (reward > 0) and INCORRECT (otherwise), e.g. 1 -1 "
                          "(discourages diverse wrong answers) or 2 1 (rewards them)", "default_help": "unset (the reward as given)",
                  "range": None,
                  "nargs": 2, "metavar": ("CORRECT", "INCORRECT")},
    )
    diversity_floor: float = field(
        default=0.1, metadata={"help": "partition variants: lower bound of the diversity", "range": Bound(0, 1)}
    )
    ngram_n: int = field(default=4, metadata={"help": "ngram: the n of the word n-grams", "range": POSITIVE_INT})
    classifier_urls: list[str] | None = field(
        default=None,
        metadata={"help": "partition variants: the pair-classifier servers (vLLM --runner pooling), e.g. "
                          "http://127.0.0.1:8010/v1; requests go round-robin and fail over to the next server. "
                          "Needed by the partition variants",
                  "default_help": f"the comma-separated ${URLS_ENV} (train_scripts/darling.sh sets it)",
                  "nargs": "+"},
    )
    classifier_model: str | None = field(
        default=None, metadata={"help": "Model name sent to the classifier servers",
                                "default_help": "each server's first /v1/models id"}
    )
    threshold: float = field(
        default=0.5,
        metadata={"help": "A pair is equivalent when P(similar) > this, in (0, 1): 0.5 for the math classifier "
                          "(Qwen3-Embedding-4B fine-tune), 0.32 for the ModernBERT one", "range": Bound(0, 1, lo_open=True, hi_open=True)},
    )
    cls_token: str = field(
        default="<|im_start|>",
        metadata={"help": "Text opening a pair input CLS a SEP b SEP: the classifier tokenizer's CLS (the default is "
                          "the Qwen3-Embedding classifier's; [CLS] for ModernBERT)"},
    )
    sep_token: str = field(
        default="<|im_end|>",
        metadata={"help": "Separator and end of a pair input ([SEP] for ModernBERT)"},
    )
    max_len: int = field(
        default=4096,
        metadata={"help": "Each response is cut to its first (max_len - 3) // 2 words in a pair input (the default "
                          "is the math reference's; 2048 for ModernBERT)", "range": Bound(lo=5)},
    )
    short_answer_words: int = field(
        default=5,
        metadata={"help": "Pairs whose longer response has at most this many words are decided without the "
                          "classifier: equivalent iff 2*|common words| >= that length (0 = never)", "range": Bound(lo=0)},
    )
    pairs_per_request: int = field(
        default=1, metadata={"help": "Pair texts per /classify request (the default is the reference's)",
                             "range": POSITIVE_INT}
    )
    max_concurrency: int = field(
        default=32, metadata={"help": "Classifier requests in flight per server", "range": POSITIVE_INT}
    )
    timeout_s: float = field(
        default=600.0, metadata={"help": "Per-request classifier time limit in seconds (the default is the "
                                         "reference's)", "range": REQUEST_TIMEOUT_S}
    )
    max_retries: int = field(
        default=2,
        metadata={"help": "Further attempts of a failed classifier request, each on the next server (the default 2 "
                          "makes the reference's 3 attempts); after them its pairs are unknown (counted; the "
                          "affected rewards are masked, never read as different)", "range": Bound(lo=0)},
    )
    backoff_s: float = field(
        default=1.0, metadata={"help": "Seconds to wait before retrying a server already tried, doubling",
                              "range": Bound(lo=0)}
    )


def classifier_urls(cfg: DarlingConfig) -> list[str]:
    """The flag's URLs, else those of the environment variable (comma-separated)."""
    if cfg.classifier_urls:
        return list(cfg.classifier_urls)
    return [u.strip() for u in os.environ.get(URLS_ENV, "").split(",") if u.strip()]


def needs_classifier(cfg: DarlingConfig) -> bool:
    return cfg.diversity in PARTITION_KINDS


def _response_text(sample, tokenizer) -> str:
    ids = sample.sequences[0, 1:][sample.action_mask[0].bool()]
    return tokenizer.decode(ids.tolist(), skip_special_tokens=True)


def _valid(sample) -> bool:
    flag = sample.info.get("main_valid")
    return True if flag is None else float(flag.flatten()[0]) != 0.0


@dataclass
class _Group:
    texts: list[str]
    quality: list[float]
    quality_known: list[bool]
    correct: list[bool]
    same: dict = field(default_factory=dict)


class DarlingRewardHook:
    """The reward hook (``ClassmateExperienceMaker.reward_hooks``); see the module docstring."""

    def __init__(self, cfg: DarlingConfig, n_samples_per_prompt: int):
        self.cfg = cfg
        self.n = n_samples_per_prompt
        self.classifier = None
        if needs_classifier(cfg):
            self.classifier = PairClassifier(ClassifierSettings(
                urls=tuple(classifier_urls(cfg)), model=cfg.classifier_model, max_concurrency=cfg.max_concurrency,
                timeout_s=cfg.timeout_s, max_retries=cfg.max_retries, backoff_s=cfg.backoff_s,
                pairs_per_request=cfg.pairs_per_request))
        self._reported: set[str] = set()

    def __call__(self, maker, rollout_samples: list) -> dict[str, float]:
        texts = [_response_text(s, maker.tokenizer) for s in rollout_samples]
        return self.apply(rollout_samples, texts)

    # ── the hook body, on decoded texts ──

    def apply(self, samples: list, texts: list[str]) -> dict[str, float]:
        cfg, n = self.cfg, self.n
        if len(samples) % n:
            raise ValueError(f"DARLING: {len(samples)} rollout samples is not a whole number of groups of "
                             f"--rollout.n_samples_per_prompt {n}")
        groups = []
        for start in range(0, len(samples), n):
            raw = [float(s.rewards.flatten()[0]) for s in samples[start : start + n]]
            valid = [_valid(s) for s in samples[start : start + n]]
            correct = [r > 0 and ok for r, ok in zip(raw, valid, strict=True)]  # an invalid score is not "wrong"
            quality = ([cfg.quality_values[0] if c else cfg.quality_values[1] for c in correct]
                       if cfg.quality_values else raw)
            groups.append(_Group(texts[start : start + n], quality, valid, correct))
        metrics = self._classify(groups) if cfg.diversity in PARTITION_KINDS else {}

        rewards, determined, diversities, diversity_known = [], [], [], []
        num_classes, largest = [], []
        for g in groups:
            if cfg.diversity == "ngram":
                div, known = ngram_diversity(g.texts, n=cfg.ngram_n), [True] * n
            else:
                class_of, known = partition(n, g.same)
                if cfg.diversity == "partition":
                    div = partition_diversity(class_of, floor=cfg.diversity_floor)
                else:
                    div = partition_correct_diversity(class_of, g.correct, floor=cfg.diversity_floor)
                    if not all(g.quality_known):
                        # k, the number of correct answers, is unknown while an answer's score is: so is the
                        # diversity of every correct answer (an incorrect one gets the floor whatever k is)
                        known = [k and not c for k, c in zip(known, g.correct, strict=True)]
                num_classes.append(len(set(class_of)))
                largest.append(max(class_sizes(class_of)))
            r, ok = combine(g.quality, div, mode=cfg.combine, lambda_quality=cfg.lambda_quality,
                            lambda_diversity=cfg.lambda_diversity, min_shift=cfg.min_shift,
                            quality_known=g.quality_known, diversity_known=known)
            rewards += r
            determined += ok
            diversities += div
            diversity_known += known

        undetermined = 0
        for s, r, ok in zip(samples, rewards, determined, strict=True):
            s.rewards = torch.tensor([r], dtype=s.rewards.dtype if s.rewards.is_floating_point() else torch.float32)
            s.info["reward"] = s.rewards.clone()
            if not ok:
                undetermined += int(_valid(s))
                s.info["main_valid"] = torch.tensor([0.0])

        known_q = [q for g in groups for q, k in zip(g.quality, g.quality_known) if k]
        known_d = [d for d, k in zip(diversities, diversity_known) if k]
        scored = [r for r, ok in zip(rewards, determined) if ok]
        metrics.update({
            "darling/quality": sum(known_q) / len(known_q) if known_q else 0.0,
            "darling/diversity": sum(known_d) / len(known_d) if known_d else 0.0,
            "darling/reward": sum(scored) / len(scored) if scored else 0.0,
            # over each group's valid answers (a group without one is neither)
            "darling/all_correct": float(sum(any(g.quality_known) and all(
                c for c, k in zip(g.correct, g.quality_known, strict=True) if k) for g in groups)),
            "darling/all_incorrect": float(sum(any(g.quality_known) and not any(g.correct) for g in groups)),
            "darling/undetermined": float(undetermined),
        })
        if num_classes:
            metrics["darling/num_classes"] = sum(num_classes) / len(num_classes)
            metrics["darling/largest_class"] = sum(largest) / len(largest)
        return metrics

    def _classify(self, groups: list[_Group]) -> dict[str, float]:
        """Fill every group's pair verdicts: the short-answer rule, then the classifier for the rest."""
        cfg = self.cfg
        asks: list[tuple[_Group, tuple[int, int]]] = []
        texts: list[str] = []
        short = 0
        for g in groups:
            for a, b in all_pairs(len(g.texts)):
                if cfg.diversity == "partition_correct" and not (g.correct[a] and g.correct[b]):
                    continue  # only the correct responses are partitioned
                verdict = short_answer_rule(g.texts[a], g.texts[b], max_words=cfg.short_answer_words) \
                    if cfg.short_answer_words > 0 else None
                if verdict is not None:
                    g.same[(a, b)] = verdict
                    short += 1
                else:
                    asks.append((g, (a, b)))
                    texts.append(pair_text(g.texts[a], g.texts[b], cls=cfg.cls_token, sep=cfg.sep_token,
                                           max_len=cfg.max_len))
        if not texts:
            return {"darling/pairs_classified": 0.0, "darling/pairs_short_rule": float(short),
                    "darling/pairs_unknown": 0.0, "darling/classifier_retries": 0.0, "darling/classifier_time": 0.0}
        from openrlhf_classmate.scoring.aio import run_sync

        started = time.monotonic()
        probs = run_sync(self.classifier.classify(texts))
        for (g, pair), p in zip(asks, probs, strict=True):
            g.same[pair] = None if p is None else p > cfg.threshold
        stats = self.classifier.stats
        for error in stats.errors:
            if error not in self._reported:
                self._reported.add(error)
                print(f"[openrlhf_classmate.darling] classifier request failed: {error}", file=sys.stderr, flush=True)
        return {"darling/pairs_classified": float(len(texts)), "darling/pairs_short_rule": float(short),
                "darling/pairs_unknown": float(stats.failed_pairs),
                "darling/classifier_retries": float(stats.retries),
                "darling/classifier_time": time.monotonic() - started}
