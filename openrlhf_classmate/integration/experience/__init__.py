"""From rollout samples to trainable experiences, in the controller: the experience maker (``experience_maker``: reward
hooks, classmate dispatch and gather around upstream's forwards, both streams' advantages), the experience with the
classmate's per-token tensors (``experience``), the main-reward methods and their flags (``reward_methods``), the
step's judge health (``step_health``) and evaluation metrics over valid scores (``eval_metrics``)."""
