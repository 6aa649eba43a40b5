"""Keys nothing reads are refused when set; the list of such keys is kept honest against the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lego_rl.config.checks import run_checks
from lego_rl.config.resolve import resolve
from lego_rl.config.schema import SECTIONS
from lego_rl.config.unwired import UNWIRED
from lego_rl.errors import ConfigError
from lego_rl.compose.harnesses import harness_inventory

SRC = Path(__file__).resolve().parents[2] / "src" / "lego_rl"
REPO = SRC.parents[1]

READ_THROUGH_CONFIG = {
    "model.reasoning_effort": "derive() folds it into model.chat_template_kwargs",
    "model.moe": "lego validate's R3 check is what it is for",
    "rollout.guard_slack_s": "derive() folds it into rollout.guard_s",
    "paths.data_root": "derive() roots the other paths in it",
    "rollout.input_key": "config.dataset_scan.row_keys() hands it to the rollout's row loader",
    "rollout.label_key": "config.dataset_scan.row_keys() hands it to the rollout's row loader",
    "rollout.metadata_key": "config.dataset_scan.row_keys() hands it to the rollout's row loader",
    "agent.sandbox_image_metadata_key": "config.dataset_scan.row_keys() hands it to the rollout's row loader",
    "cluster.train_workers": "config.remote.training_nodes() hands it to cluster.ray_nodes, which starts Ray there",
    **{f"cluster.{k}": "config.placement.placement_plan() hands it to cluster.actors's placement groups"
       for k in ("trainer_nodes", "gpus_per_node", "engine_replicas", "cpus_per_actor", "trainer_placement",
                 "engine_placement", "trainer_resources", "engine_resources")},
}


def findings(path: Path, *overrides: str, environ: dict[str, str] | None = None) -> list:  # type: ignore[type-arg]
    r = resolve(path, environ=environ or {}, overrides=list(overrides))
    return run_checks(r, harnesses=harness_inventory(r, environ={}))


def test_a_set_unwired_key_is_an_error_naming_value_source_and_feature(base_toml: Path) -> None:
    base_toml.write_text(base_toml.read_text() + "\n[grader]\nmax_output_kb = 7\n")
    [f] = [f for f in findings(base_toml) if f.code == "not_implemented"]
    assert f.severity == "error" and f.keys == ("grader.max_output_kb",)
    assert f.message == ("not implemented yet: grader.max_output_kb = 7 (from lego.toml:10) — it has no effect "
                         f"until {UNWIRED['grader.max_output_kb']}")
    assert "1024" in f.fix


@pytest.mark.parametrize("key", sorted(UNWIRED))
def test_every_unwired_key_is_refused_when_set(base_toml: Path, key: str) -> None:
    section, field = key.split(".")
    info = SECTIONS[section].model_fields[field]
    default = info.get_default(call_default_factory=True)
    value = {bool: "false" if default else "true", list: '["10.0.0.9"]'}.get(type(default), None)
    if value is None:
        value = {"train.backend": '"megatron"', "train.algorithm": '"gspo"', "train.infra_failure_policy":
                 '"zero_reward"', "serving.reasoning_parser": '"none"'}.get(key, "7" if default != 7 else "8")
    if key in ("cluster.train_head", "cluster.gloo_socket_ifname", "cluster.ray_address", "sandbox.rootfs"):
        value = '"/somewhere"'
    codes = {(f.code, f.keys) for f in findings(base_toml, f"{key}={value}")}
    assert ("not_implemented", (key,)) in codes


def test_default_valued_and_derived_keys_are_not_findings(base_toml: Path) -> None:
    # The shipped lego.toml sets rollout.batch_size = 2 (the default): fine. Derived values (the
    # global batch size, the sandbox lifetime) were never set by anyone.
    found = findings(base_toml, "rollout.batch_size=2", "train.backend=\"torch\"")
    assert not [f for f in found if f.code == "not_implemented"]


def test_shipped_lego_toml_sets_no_unwired_key() -> None:
    r = resolve(REPO / "lego.toml", environ={})
    assert not [k for k in UNWIRED if r.is_explicit(k) and r.source(k).kind == "file"
                and getattr(getattr(r.config, k.split(".")[0]), k.split(".")[1])
                != SECTIONS[k.split(".")[0]].model_fields[k.split(".")[1]].get_default(call_default_factory=True)]


def _readers(section: str, field: str) -> list[str]:
    """Files outside lego_rl.config that read ``section.field``: directly, through a local alias of the
    section (``ro = cfg.rollout`` then ``ro.temperature``), or through a value typed as the section's
    model (``def f(s: SandboxConfig)`` then ``s.memory_mb``)."""
    found = []
    model = SECTIONS[section].__name__
    for path in SRC.rglob("*.py"):
        if path.parent.name == "config" and path.parent.parent == SRC:
            continue
        # Import lines name modules, not keys: `from lego_rl.train.backend import ...` reads no train.backend.
        text = re.sub(r"^\s*(?:from|import) .*$", "", path.read_text(), flags=re.M)
        aliases = set(re.findall(rf"\b(\w+) = \w+(?:\.config)?\.{section}\b", text))
        aliases |= set(re.findall(rf"\b(\w+): {model}\b", text))
        if re.search(rf"\.{section}\.{field}\b", text) or any(
            re.search(rf"\b{a}\.{field}\b", text) for a in aliases
        ):
            found.append(str(path.relative_to(SRC)))
    return found


@pytest.mark.parametrize("key", [f"{s}.{f}" for s, m in SECTIONS.items() for f in m.model_fields])
def test_unwired_list_matches_the_code(key: str) -> None:
    readers = _readers(*key.split("."))
    if key in UNWIRED:
        assert not readers, f"{key} is read by {readers}: remove it from config/unwired.py"
    elif key not in READ_THROUGH_CONFIG:
        assert readers, f"nothing outside lego_rl.config reads {key}: wire it or list it in config/unwired.py"


@pytest.mark.parametrize("value", [0, -4])
def test_global_batch_size_must_be_positive(workdir: Path, value: int) -> None:
    with pytest.raises(ConfigError, match=r"train.global_batch_size: Input should be greater than or equal to 1") \
            as info:
        resolve(environ={"GLOBAL_BATCH_SIZE": str(value)})
    assert info.value.parameter == "train.global_batch_size" and info.value.where == "$GLOBAL_BATCH_SIZE"


def test_one_sample_per_prompt_warns(base_toml: Path) -> None:
    [f] = [f for f in findings(base_toml, "rollout.samples_per_prompt=1") if f.code == "group_size_one"]
    assert f.severity == "warning" and "every advantage is zero" in f.message
    assert not [f for f in findings(base_toml, "rollout.samples_per_prompt=2") if f.code == "group_size_one"]
