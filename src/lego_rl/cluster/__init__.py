"""Cluster mode (``cluster.mode = "ray"``): the Ray-facing classes, each wrapping a plain Ray-free one from
``lego_rl.driver`` or ``lego_rl.train`` (a trainer rank, an engine replica, a weight sync). The only room that
imports Ray (with ``config.remote``'s reachability check), loaded only in Ray mode.

* ``actors``: placement groups, trainer-rank and engine-replica actors, ``RayTrainerBackend``, ``RayWeightSync``.
* ``ray_nodes``: ``ray start`` on the training nodes over OpenSSH (no Ray import), under ``ray_node_agent``.
"""
