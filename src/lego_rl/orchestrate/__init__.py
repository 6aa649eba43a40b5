"""Orchestration: what drives many rollouts (and, later, the training loop, the asynchronous scheduler,
weight sync and Ray actors). It sits above ``rollout`` and ``train`` and imports them; neither imports
it. Classes here are plain asyncio; a Ray actor wraps one of them, never the other way round.

* ``runner``: ``RolloutRunner`` keeps N rollouts in flight over a list of specs (``plan`` builds them).
* ``rollout_check``: ``lego rollout-check``'s job: config → ``RolloutSettings``, the runner over a
  dataset, the report; ``check_session`` adds the serving stack, the run directory and the baseline.
"""
