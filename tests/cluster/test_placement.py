"""The placement ``cluster.*`` asks for, and how a cluster's nodes fall short of it (no Ray needed: pure data).

The nodes are what ``ray.nodes()`` reports per alive node; the two-node test checks the same findings against a
live cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from lego_rl.config.placement import placement_plan, shortfalls
from lego_rl.config.remote import ray_findings
from lego_rl.config.resolve import ResolvedConfig, resolve
from lego_rl.errors import ConfigError

# The reference example's training side: two 8-GPU nodes (the 2 sandbox nodes are sunabako's, not Ray's).
H200_NODE = {"CPU": 128.0, "GPU": 8.0, "memory": 1e12, "node:10.0.0.1": 1.0}


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def cfg(*overrides: str) -> ResolvedConfig:
    return resolve(environ={}, overrides=["cluster.mode=\"ray\"", *overrides])


def test_gpu_layout_one_bundle_per_rank_and_replica(here: Path) -> None:
    r = cfg("cluster.trainer_nodes=2", "cluster.gpus_per_node=8", "cluster.engine_replicas=4",
            "cluster.gpus_per_engine=1", "cluster.cpus_per_actor=4")
    plan = placement_plan(r.config)
    assert plan.trainer.bundles == [{"CPU": 4.0, "GPU": 1.0}] * 16 and plan.trainer.strategy == "PACK"
    assert plan.engine.bundles == [{"CPU": 4.0, "GPU": 1.0}] * 4
    assert r.config.train.data_parallel == 16  # derived: the torch backend's ranks are all data parallel
    # 16 trainer GPUs + 4 engine GPUs on two 8-GPU nodes: the GPU total names both groups' shares.
    assert shortfalls(plan, [H200_NODE, H200_NODE]) == [
        ("GPU", "GPU: the placement needs 20 (trainer 16 + engine 4), the cluster has 16 over 2 node(s)")]
    assert shortfalls(plan, [H200_NODE] * 3) == []


def test_cpu_ray_mode_runs_one_rank_per_trainer_node(here: Path) -> None:
    r = cfg("cluster.trainer_nodes=2")
    assert placement_plan(r.config).trainer.bundles == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert r.config.train.data_parallel == 2
    # Local mode keeps its meaning: one CPU process whatever trainer_nodes says (torchrun starts the ranks).
    local = resolve(environ={}, overrides=["cluster.trainer_nodes=2"])
    assert local.config.train.data_parallel == 1


def test_custom_resources_and_strict_strategies(here: Path) -> None:
    r = cfg("cluster.trainer_nodes=2", "cluster.trainer_placement=\"STRICT_SPREAD\"",
            "cluster.engine_resources={rollout_node = 1}", "cluster.engine_replicas=2",
            "cluster.engine_placement=\"STRICT_PACK\"")
    plan = placement_plan(r.config)
    one = {"CPU": 2.0}
    assert shortfalls(plan, [one, {"CPU": 2.0, "rollout_node": 2.0}]) == []
    found = dict(shortfalls(plan, [one, one]))
    assert found == {"rollout_node": "rollout_node: the placement needs 2 (engine 2), the cluster has 0 over "
                                     "2 node(s)"}
    # Enough CPUs in total, but one node: STRICT_SPREAD cannot put the two ranks apart.
    found = dict(shortfalls(plan, [{"CPU": 8.0, "rollout_node": 2.0}]))
    assert found == {"CPU": "CPU: trainer placement STRICT_SPREAD needs 2 nodes that each hold a bundle "
                            "{'CPU': 1.0}, the cluster has 1"}
    # The two engine bundles must share a node that holds both.
    found = dict(shortfalls(plan, [{"CPU": 2.0, "rollout_node": 1.0}, {"CPU": 2.0, "rollout_node": 1.0}]))
    assert found == {"rollout_node": "rollout_node: engine placement STRICT_PACK needs {'CPU': 2.0, "
                                     "'rollout_node': 2.0} on one node, no node has that"}


def test_a_bundle_larger_than_every_node_is_named(here: Path) -> None:
    plan = placement_plan(cfg("cluster.cpus_per_actor=16").config)
    found = dict(shortfalls(plan, [{"CPU": 12.0}, {"CPU": 12.0}, {"CPU": 12.0}]))
    assert found == {"CPU": "CPU: one trainer bundle needs 16 on one node, the largest node has 12"}


def test_remote_findings_name_the_key_to_change(here: Path) -> None:
    r = cfg("cluster.trainer_nodes=2", "cluster.gpus_per_node=8", "cluster.engine_resources={rollout = 1}",
            "cluster.ray_address=\"10.0.0.1:6379\"")
    found = ray_findings(r, [H200_NODE])
    assert [(f.code, f.severity, f.keys) for f in found] == [
        ("ray_resources", "error", ("cluster.gpus_per_node",)),
        ("ray_resources", "error", ("cluster.engine_resources",)),
    ]
    assert found[0].message == ("Ray cluster 10.0.0.1:6379: GPU: the placement needs 16 (trainer 16), the cluster "
                                "has 8 over 1 node(s)")
    assert ray_findings(r, [{**H200_NODE, "rollout": 1.0}, H200_NODE]) == []


def test_bad_cluster_values_are_refused_naming_the_key(here: Path) -> None:
    with pytest.raises(ConfigError) as info:
        cfg("cluster.trainer_placement=\"SCATTER\"")
    assert info.value.parameter == "cluster.trainer_placement"
    with pytest.raises(ConfigError) as info:
        cfg("cluster.gpus_per_engine=2")
    assert info.value.parameter == "cluster.gpus_per_engine"


def test_megatron_ray_mode_splits_the_ranks_into_tensor_and_data_parallel(here: Path) -> None:
    """Ray places Megatron ranks like torch ones: one bundle per rank; DP is what TP leaves of them."""
    r = cfg("train.backend=\"megatron\"", "cluster.trainer_nodes=2", "cluster.gpus_per_node=8",
            "train.tensor_parallel=2")
    assert placement_plan(r.config).trainer.bundles == [{"CPU": 1.0, "GPU": 1.0}] * 16
    assert r.config.train.data_parallel == 8


def test_ray_mode_under_torchrun_is_refused(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lego_rl.compose.train_session import start_ranks

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="run one `lego train`, not 2 under torchrun") as info:
        start_ranks(cfg("cluster.trainer_nodes=2").config)
    assert info.value.parameter == "cluster.mode"
