"""Composition: the one reader of the resolved config outside ``config`` and ``cli``. It projects ``LegoConfig``
once into the typed settings of every part (loop, scheduler, loss, trainer backends, rollout, serving stack)
and wires the parts together; the rooms below it never see the config.

* ``stack``: the serving stack (engine + adapter) of a run.
* ``harnesses``: ``[harness.<name>]`` tables to plugin options; the harness factory.
* ``rollout_check``: the config projected into ``RolloutSettings``; ``lego rollout-check``'s job.
* ``train_session``: ``lego train``: backends, loss, loop, weight sync, rollouts, all from one config.
* ``sft_session``: ``lego train`` with ``train.sft_data``.
* ``engine_checks``: ``lego validate``'s checks that need an engine install.
* ``sessions``: the work of the other commands (``tasks check``, ``tasks screen``, ``audit``).
"""
