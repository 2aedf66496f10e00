"""The training runtime: everything around one GSPO step that is not the algorithm.

Engines (torch, DeepSpeed) and their precision, gradient sync, LR schedule and DeepSpeed config;
the process group; launches (torchrun / deepspeed, orphan cleanup, the per-rank entry points);
checkpoints, resume checks and run folders; the training run itself (:mod:`training_run`: load
the policy, loop over :meth:`components.gspo.trainer.GSPOTrainer.train_step`, checkpoint, write
the final model) and its plots. The algorithm (:mod:`components.gspo`) sees the runtime only
through :class:`components.gspo.policy_engine.PolicyEngine`, which the engines here satisfy.
"""
