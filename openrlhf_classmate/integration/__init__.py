"""The OpenRLHF 0.11.2 glue: launcher, engines, experience maker, actor. Every rebinding of upstream names lives in
:mod:`openrlhf_classmate.integration.patches`; the algorithm itself is in :mod:`openrlhf_classmate.algo`.

One training step
-----------------

Upstream's controller (``openrlhf/trainer/ppo_trainer.py``: ``fit`` then ``train_step``) holds the order; ours subclass
it (``integration/trainer.py``). Processes: the *driver* is the launcher's process; the *controller* is the trainer's
Ray actor (async runs, ``--train.async_enable``: a rollout actor does stages 1-3, and the classmate dispatch of stage 5,
while a training actor does the rest); the *engine actors* are the vLLM (or HF) engines of the policy and the classmate;
the *DeepSpeed workers* are the Ray actors of the actor and reference models, one per GPU. Paths are relative to
``openrlhf_classmate/``.

0. launch (driver, once): parse, preflight, start Ray, the engine groups and the models --
   ``cli/train_ppo_ray.py``, ``integration/launch/args.py``, ``integration/launch/preflight.py``
1. prompts (controller): the next rollout batch from upstream's prompt dataloader --
   ``integration/rollout/samples_generator.py``
2. rollout (engine actors): the policy engines generate the responses --
   ``integration/rollout/vllm_engine.py``, ``integration/rollout/hf_engine.py``
3. main scores (engine actors): each response scored in its engine, with a validity flag --
   ``integration/rollout/policy_executor.py``, ``reward_func.py``; the flag's contract (controller):
   ``integration/rollout/main_scores.py``
4. reward hooks (controller): group-level main rewards (DARLING, VR-CLI) over the whole batch --
   ``integration/experience/experience_maker.py``, ``integration/experience/reward_methods.py``
5. classmate dispatch (controller; classmate engine actors): the CoT of each response sent to the classmate
   engines; with ``--classmate.dispatch`` per prompt group already during stage 2 --
   ``integration/classmate/classmate_stage.py``, ``integration/classmate/classmate_executor.py``
6. forwards (DeepSpeed workers): the actor's and reference's log-probs of the responses, while the classmate
   generates -- ``integration/experience/experience_maker.py``, ``integration/training/actor.py``,
   ``integration/training/chunked_actor.py``
7. classmate gather (controller): the classmate answers collected and scored (before stage 6 with
   ``--classmate.placement colocate``) -- ``integration/classmate/classmate_stage.py``,
   ``integration/classmate/classmate_scoring.py``
8. advantages (controller): both streams' advantages over the valid scores --
   ``integration/experience/experience_maker.py``, ``algo/advantages.py``
9. loss and update (DeepSpeed workers): the PPO update with the classmate's per-token terms --
   ``integration/training/actor.py``, ``algo/losses.py``, ``integration/training/nonfinite.py``
10. weight sync (DeepSpeed workers to the policy's engine actors) -- ``integration/training/weight_sync.py``,
    ``integration/training/actor.py``, ``integration/rollout/vllm_engine.py``
11. report (controller): the step's metrics, judge health, mismatch and start-up lines, then upstream's logs and
    checkpoints -- ``integration/trainer.py``, ``integration/experience/step_health.py``,
    ``integration/rollout/mismatch.py``, ``integration/training/checkpoints.py``

The packages, each importing only those after it in this list (``tests/test_import_layers.py``): ``launch``,
``experience``, ``rollout``, ``classmate``, ``training``. At the root: ``integration/trainer.py`` (the controllers,
above all of them), ``integration/patches.py`` (every rebinding of an upstream name), and what every stage reads: the
flag declarations (``integration/classmate_config.py``) and the benchmark switches (``integration/bench_switches.py``).
"""
