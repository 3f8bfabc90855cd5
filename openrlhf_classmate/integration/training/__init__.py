"""The policy update, in the DeepSpeed workers (Ray actors of the actor and reference models): the actor and its loss
(``actor``, the chunked LM head's log-probs in ``chunked_actor``), the DeepSpeed strategy and checkpoints
(``strategy``, ``checkpoints``, ``disk_full``), the guards of an update and a load (``nonfinite``, ``weight_check``)
and the weight sync to the policy engines (``weight_sync``)."""
