"""Sample files (JSONL and parquet) and the adapter's turn-record files as training input."""

from __future__ import annotations

import os

import pytest
from trajectory_records import bridged, rec

from lego_rl.errors import TrajectoryError
from lego_rl.termination import TerminationReason
from lego_rl.trajectory.export import load_turn_records, samples_from_turn_records_file
from lego_rl.trajectory.manager import build_samples
from lego_rl.trajectory.sample import Sample, load_samples, save_samples

SYS = [100, 101]


def rich_samples() -> list[Sample]:
    t0 = rec(0, SYS, [10, 11], weight_versions=[1, 1], nucleus_ids=[[10], [11, 3]],
             nucleus_probs=[[1.0], [0.5, 0.5]], routed_experts=[[[1, 2]], [[3, 4]]],
             prompt_routed_experts=[[[5, 6]], [[7, 8]]])
    t1 = rec(1, SYS + [9, 11, 7], [12], weight_versions=[2])  # drifted: a second segment
    samples, _ = build_samples([t0, t1], rollout_id="r1", group_index=2, index=5, reward=0.25,
                               termination=TerminationReason.TURN_LIMIT, metadata={"task": "x", "k": [1]})
    assert len(samples) == 2
    return samples


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_samples_round_trip_exactly(tmp_path, suffix):
    samples = rich_samples()
    path = save_samples(samples, tmp_path / f"step_0{suffix}")
    assert load_samples(path) == samples
    assert os.listdir(tmp_path) == [path.name]  # no temp file left behind


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_saving_never_overwrites(tmp_path, suffix):
    path = tmp_path / f"s{suffix}"
    save_samples(rich_samples(), path)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="never overwritten"):
        save_samples(rich_samples()[:1], path)
    assert path.read_bytes() == before and len(os.listdir(tmp_path)) == 1


def test_a_failed_write_leaves_nothing(tmp_path):
    class Boom(Exception):
        pass

    def gen():
        yield rich_samples()[0]
        raise Boom

    with pytest.raises(Boom):
        save_samples(gen(), tmp_path / "s.jsonl")
    assert os.listdir(tmp_path) == []


def test_unknown_format_and_bad_rows_are_named(tmp_path):
    with pytest.raises(ValueError, match="cannot tell the sample format"):
        save_samples([], tmp_path / "s.txt")
    bad = tmp_path / "bad.jsonl"
    good = rich_samples()[0].model_dump_json()
    bad.write_text(good + "\n" + good.replace('"loss_mask":[0,0,1,1]', '"loss_mask":[0,0,1]') + "\n")
    with pytest.raises(TrajectoryError, match=r"(?s)bad.jsonl:2: .*loss_mask has 3 entries but tokens has 4"):
        load_samples(bad)


def test_sample_validation_rejects_misaligned_columns():
    with pytest.raises(ValueError, match="rollout_logprobs has 1 entries but tokens has 2"):
        Sample(rollout_id="r", group_index=0, index=0, tokens=[1, 2], loss_mask=[0, 1], rollout_logprobs=[0.0])
    with pytest.raises(ValueError, match="only 0 and 1"):
        Sample(rollout_id="r", group_index=0, index=0, tokens=[1], loss_mask=[2], rollout_logprobs=[0.0])


def write_records(path, records) -> None:
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))


def test_turn_record_file_becomes_the_same_samples_as_in_memory(tmp_path):
    t0 = rec(0, SYS, [10, 11])
    t1 = bridged(1, t0, [200], [12])
    path = tmp_path / "sess.turns.jsonl"
    write_records(path, [t1, t0])  # order on disk does not matter: turns are sorted
    from_file, stats = samples_from_turn_records_file(path, rollout_id="r", group_index=0, index=0,
                                                      reward=1.0, termination=TerminationReason.COMPLETED)
    in_memory, _ = build_samples([t0, t1], rollout_id="r", group_index=0, index=0, reward=1.0,
                                 termination=TerminationReason.COMPLETED)
    assert [s.tokens for s in from_file] == [s.tokens for s in in_memory] == [t1.prompt_ids + t1.output_ids]
    assert from_file[0].metadata["turn_records"] == str(path) and stats.turns == 2


def test_turn_record_file_errors_name_the_file_line_and_sessions(tmp_path):
    with pytest.raises(TrajectoryError, match="does not exist"):
        load_turn_records(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(rec(0, SYS, [1]).model_dump_json() + "\n{\"turn\": -1}\n")
    with pytest.raises(TrajectoryError, match=r"bad.jsonl:2: not a valid turn record"):
        load_turn_records(bad)
    two = tmp_path / "two.jsonl"
    write_records(two, [rec(0, SYS, [1], session_id="a"), rec(0, SYS, [2], session_id="b")])
    with pytest.raises(TrajectoryError, match=r"holds 2 sessions \(a, b\); pass session_id"):
        samples_from_turn_records_file(two, rollout_id="r", group_index=0, index=0, reward=0.0)
    with pytest.raises(TrajectoryError, match="no turns of session 'c'"):
        samples_from_turn_records_file(two, rollout_id="r", group_index=0, index=0, reward=0.0, session_id="c")
    (b,), _ = samples_from_turn_records_file(two, rollout_id="r", group_index=0, index=0, reward=0.0,
                                             session_id="b")
    assert b.tokens == SYS + [2] and b.session_id == "b"
