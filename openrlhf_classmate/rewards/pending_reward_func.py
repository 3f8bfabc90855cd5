"""Engine-side reward function of runs whose main reward comes from a group-level reward hook (``--vrcli.enable``).

OpenRLHF calls a reward function per sample in the rollout engines, and needs one for evaluation too. When the
reward is computed later, in the experience maker (VR-CLI needs a forward pass of the reference model), this one
marks every sample "not scored yet": reward 0 and ``main_valid`` 0, which the hook overwrites for every sample it
scores. A sample that no hook scored therefore stays invalid and is masked, never trained on as a real 0.
"""

from __future__ import annotations


def reward_func(queries, prompts, labels, **kwargs):
    return {"rewards": 0.0, "scores": 0.0, "extra_logs": {"main_valid": 0.0}}
