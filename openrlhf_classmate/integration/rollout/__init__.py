"""The policy's rollout and its main scores: the engines (``vllm_engine``, the HF stand-in ``hf_engine``; Ray actors),
the executor that scores each response in its engine (``policy_executor``), the samples generator that drives them
from the controller (``samples_generator``), the contract of the main score's validity flag (``main_scores``) and the
train-inference mismatch of the engines' log-probs (``mismatch``)."""
