"""Pure-torch core of the classmate method: CoT spans, classmate inputs and rewards, advantages, policy losses.

No Ray, no DeepSpeed. ``losses`` imports openrlhf lazily (only when a loss is aggregated).

Each module's docstring writes out the formulas and rules it implements, so nothing here needs another document to
be read; where a rule departs from the reference implementation (the Classmate-CoT authors' code), the docstring says
how and why.

Public functions take their tensors (or other primary inputs) positionally and every option by keyword.
"""

from openrlhf_classmate.algo.advantages import (
    ESTIMATORS,
    TOKEN_MODES,
    compute_advantages,
    group_normalize,
    group_std,
)
from openrlhf_classmate.algo.classmate_prompt import (
    PROMPT_MODES,
    ClassmateInput,
    build_classmate_input,
    build_classmate_inputs,
    check_splice_compatible,
)
from openrlhf_classmate.algo.classmate_reward import CONDITIONS, combine_classmate_scores
from openrlhf_classmate.algo.losses import (
    LOSS_AGG_MODES,
    SeparatedPolicyLoss,
    VanillaClassmatePolicyLoss,
    aggregate,
)
from openrlhf_classmate.algo.spans import TRUNCATION_MODES, CotSpans, cot_mask, think_token_ids, truncate_cot

__all__ = [
    "CONDITIONS",
    "ESTIMATORS",
    "LOSS_AGG_MODES",
    "PROMPT_MODES",
    "TOKEN_MODES",
    "TRUNCATION_MODES",
    "ClassmateInput",
    "CotSpans",
    "SeparatedPolicyLoss",
    "VanillaClassmatePolicyLoss",
    "aggregate",
    "build_classmate_input",
    "build_classmate_inputs",
    "check_splice_compatible",
    "combine_classmate_scores",
    "compute_advantages",
    "cot_mask",
    "group_normalize",
    "group_std",
    "think_token_ids",
    "truncate_cot",
]
