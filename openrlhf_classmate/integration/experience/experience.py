"""``ClassmateExperience``: upstream's ``Experience`` plus the per-token tensors of the classmate method.

The new fields use the ``step`` role, so upstream's concat/split/padding-removal/collate functions treat them like
``advantages``. Those functions resolve ``Experience`` through their module globals, which is why
:func:`openrlhf_classmate.integration.patches.install_experience` rebinds the name in every such module (without it
the fields are silently dropped by ``split_experience_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from openrlhf.trainer.ppo_utils.experience import Experience, tensor_field


@dataclass
class ClassmateExperience(Experience):
    # (B, A) classmate advantages of the separated estimators; ``advantages`` then holds the main advantages
    classmate_advantages: torch.Tensor = tensor_field("step", default=None)
    # (B, A) bool, the CoT tokens handed to the classmate (after truncation)
    cot_mask: torch.Tensor = tensor_field("step", default=None)
    # (B, A) classmate log-probs of the main CoT tokens (vanilla_classmate only; -inf outside the CoT)
    classmate_log_probs: torch.Tensor = tensor_field("step", default=None)


CLASSMATE_FIELDS = ("classmate_advantages", "cot_mask", "classmate_log_probs")
