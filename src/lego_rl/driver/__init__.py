"""The RL driver: what turns rollouts into optimizer steps, and nothing else. It reads no config and imports
no Ray: every class here takes typed settings (projected once by ``lego_rl.compose``) and plain objects, so a
test or a Ray actor (``lego_rl.cluster``) can drive it the same way.

* ``loop.TrainLoop``: admit, advantages, pack, train, sync, checkpoint, evaluate; ``LoopSettings``.
* ``scheduler.RolloutScheduler``: rollout slots kept busy across steps under ``max_staleness``.
* ``sft.SftRunner``: the supervised warm start on demonstrations, through the same trainer backend.
* ``weight_sync``: new weights to the engines (in place, or through vLLM's routes).
* ``task_signal``: per-task zero-variance streaks; ``metrics_sink`` + ``wandb_sink``: metrics rows to TensorBoard and W&B.
* ``runner.RolloutRunner``: N rollouts in flight over a list of specs.
* ``environments`` (+ ``toy_env``): verifiable environments from the entry point group ``lego_rl.environments``.
"""
