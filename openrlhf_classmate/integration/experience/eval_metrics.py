"""Upstream's in-training evaluation metrics over valid main scores only.

OpenRLHF's ``compute_eval_metrics`` (``--eval.steps``; sync and async trainers) averages ``sample.rewards`` per
prompt, so an invalid score (a judge that did not answer, a reward hook that could not score the sample) would count
as its placeholder 0 in ``eval_<ds>_pass1`` and ``eval_<ds>_pass<n>``. :func:`masked_eval_metrics` keeps upstream's
keys and values where every score is valid; otherwise ``pass1`` is the mean of each prompt's valid scores and
``pass<n>`` their maximum, averaged over the prompts that have one (a data source without any loses both keys rather
than reading 0), and ``eval_main_valid_fraction`` says how many scores were valid. ``patches.install_samples_generator``
rebinds upstream's name to it.
"""

from __future__ import annotations

from openrlhf.trainer import ppo_trainer

from openrlhf_classmate.integration.rollout.main_scores import main_validity

upstream_eval_metrics = ppo_trainer.compute_eval_metrics  # captured before the rebinding


def masked_eval_metrics(eval_dataloader, samples_list, n_samples_per_prompt: int) -> dict[str, float]:
    logs = upstream_eval_metrics(eval_dataloader, samples_list, n_samples_per_prompt)
    if not samples_list:
        return logs
    valid = main_validity(samples_list)
    if bool(valid.all()):
        return logs  # upstream's own values
    source = {p: ds for datasources, prompts, _labels, _images in eval_dataloader
              for p, ds in zip(prompts, datasources)}
    n = n_samples_per_prompt
    per_ds: dict[str, list[tuple[float, float]]] = {}  # data source -> (mean, max) of each prompt's valid scores
    for start in range(0, len(samples_list) - len(samples_list) % n, n):
        rows = [(float(s.rewards.flatten()[0]), bool(ok)) for s, ok in zip(samples_list[start : start + n],
                                                                         valid[start : start + n])]
        scores = [r for r, ok in rows if ok]
        ds = source.get(samples_list[start].prompts[0], "unknown")
        per_ds.setdefault(ds, [])
        if scores:
            per_ds[ds].append((sum(scores) / len(scores), max(scores)))
    for ds, prompts in per_ds.items():
        for key, value in ((f"eval_{ds}_pass1", lambda p: p[0]), (f"eval_{ds}_pass{n}", lambda p: p[1])):
            if key not in logs:
                continue
            if prompts:
                logs[key] = sum(value(p) for p in prompts) / len(prompts)
            else:
                del logs[key]
    logs["eval_main_valid_fraction"] = float(valid.float().mean())
    return logs
