"""A resume that changes a key shaping training is refused with the key and both values, unless overridden."""

from __future__ import annotations

import json
from pathlib import Path

from lego_rl.config.checks import resume_changes
from lego_rl.config.resolve import config_json, resolve
from lego_rl.config.resume_keys import SHAPING_KEYS, changes_on_resume, newest_config
from lego_rl.config.schema import SECTIONS, LegoConfig


def _launch(root: Path, name: str, *overrides: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    r = resolve(None, environ={}, overrides=[f'paths.run_root="{root}"', *overrides])
    (root / name).write_text(json.dumps(config_json(r), default=str))


def _findings(root: Path, *overrides: str) -> list:
    r = resolve(None, environ={}, overrides=[f'paths.run_root="{root}"', "train.resume=true", *overrides])
    return list(resume_changes(r))


def test_every_shaping_key_exists() -> None:
    fields = {f"{s}.{k}" for s in SECTIONS for k in type(getattr(LegoConfig(), s)).model_fields}
    assert set(SHAPING_KEYS) <= fields, set(SHAPING_KEYS) - fields


def test_a_changed_lr_is_refused_naming_the_key_and_both_values(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _launch(root, "config.json", "train.lr=3e-4")
    (f,) = _findings(root, "train.lr=3e-3")
    assert f.code == "resume_changed" and f.severity == "error" and f.keys == ("train.lr",)
    assert "train.lr = 0.003" in f.message and "trained with 0.0003 (config.json)" in f.message
    assert "--override train.lr" in f.fix


def test_an_unchanged_resume_passes_and_the_newest_launch_is_the_reference(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _launch(root, "config.json", "train.lr=3e-4")
    assert _findings(root, "train.lr=3e-4") == []
    _launch(root, "config.resume-1.json", "train.lr=3e-3")  # an overridden resume recorded 3e-3
    _launch(root, "config.resume-2.json", "train.lr=3e-3")
    assert newest_config(root) == root / "config.resume-2.json"
    assert _findings(root, "train.lr=3e-3") == []
    (f,) = _findings(root, "train.lr=3e-4")
    assert "(config.resume-2.json)" in f.message


def test_override_lets_the_named_key_change_and_only_it(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _launch(root, "config.json", "train.lr=3e-4", 'train.environment="first_letter"',
            'rollout.prompt_data="a.jsonl"')
    found = _findings(root, "train.lr=3e-3", 'train.environment="other"', 'rollout.prompt_data="b.jsonl"',
                      'train.resume_override=["train.lr"]')
    assert sorted(f.keys[0] for f in found) == ["rollout.prompt_data", "train.environment"]
    assert any("'first_letter'" in f.message and "'other'" in f.message for f in found)
    r = resolve(None, environ={}, overrides=[f'paths.run_root="{root}"', "train.lr=3e-3",
                                             'train.environment="first_letter"', 'rollout.prompt_data="a.jsonl"'])
    (ch,) = changes_on_resume(root, config_json(r))
    assert (ch.key, ch.before, ch.after) == ("train.lr", 3e-4, 3e-3)


def test_keys_that_do_not_shape_training_change_freely_and_cannot_be_overridden(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _launch(root, "config.json")
    assert _findings(root, "train.checkpoint_every=5", "serving.port=18100", "train.num_rollout=9") == []
    (f,) = _findings(root, 'train.resume_override=["train.checkpoint_every"]')
    assert f.code == "resume_override_unknown"


def test_a_fresh_run_is_not_compared(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _launch(root, "config.json", "train.lr=3e-4")
    r = resolve(None, environ={}, overrides=[f'paths.run_root="{root}"', "train.lr=3e-3"])
    assert list(resume_changes(r)) == []
