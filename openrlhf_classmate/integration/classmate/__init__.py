"""The classmate stage: requests built from the policy's CoT and sent to the classmate engines (``classmate_stage``,
in the controller), the executor those engines run (``classmate_executor``) and the scoring of their answers
(``classmate_scoring``)."""
