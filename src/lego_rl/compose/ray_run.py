"""``cluster.mode = "ray"``: the config projected into what ``lego_rl.cluster.actors.ray_cluster`` takes, and the
run's serving config pointed at the replicas it started. Imported only in Ray mode: it imports Ray."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from lego_rl.cluster.actors import RayCluster, ReplicaOptions, ray_cluster
from lego_rl.compose.stack import model_dir
from lego_rl.config.placement import placement_plan
from lego_rl.config.schema import LegoConfig
from lego_rl.runstore import RunLayout

if TYPE_CHECKING:
    from lego_rl.train.megatron_backend import MegatronTrainSettings
    from lego_rl.train.torch_backend import TorchTrainSettings


def cluster_for(c: LegoConfig, settings: TorchTrainSettings | MegatronTrainSettings
                ) -> AbstractAsyncContextManager[RayCluster]:
    """The trainer ranks and engine replicas ``cluster.*`` places, for the policy in ``model.checkpoint``."""
    audit = RunLayout(Path(c.paths.run_root or "runs/unnamed").resolve()).audit if c.train.audit else None
    replicas = ReplicaOptions(dtype=c.model.dtype, max_batch=c.serving.max_batch_size,
                              max_model_len=c.model.max_context_tokens)
    return ray_cluster(c.cluster, placement_plan(c), model_dir(c.model.checkpoint), settings=settings,
                       replicas=replicas, audit=audit)


def serving_on_replicas(c: LegoConfig, cluster: RayCluster) -> LegoConfig:
    """``c`` with the replicas as its serving URLs: the client and the adapter reach them like vLLM servers."""
    serving = c.serving.model_copy(update={"backend": "vllm", "urls": list(cluster.urls)})
    return c.model_copy(update={"serving": serving})
