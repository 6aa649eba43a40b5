"""Benchmark: assembling a long branched trajectory into Samples, against a naive baseline.

The trajectory: a 2k-token first prompt, then turns of ~400 context tokens and ~220 sampled tokens, so
100 turns end near 64k tokens. Every 20th turn re-renders the history with one drifted token in an
earlier answer (a new segment), and every 33rd turn is a retry of the previous prompt (a sibling branch).

Baselines (same run, same records, same Samples out): the naive assembler that, at every turn,
re-concatenates the whole history of each candidate segment from its turns (tokens, loss mask,
logprobs, weight versions) and compares the prompt against that rebuilt stream; once with in-place
list extends (the strong baseline), once with ``a = a + b`` (as often written).

Ours is measured three ways: records as the adapter holds them in memory (prompt lists share their
int objects with the previous turn's), records read back from JSON lines (every id a fresh object:
the slowest case for the full prefix comparison), and with ``verify_bridged_prefix=False``.

Run: ``nice .venv/bin/python benchmarks/trajectory_bench.py [--turns 100]``
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
import tracemalloc
from collections.abc import Callable

from lego_rl.trajectory.manager import TrajectoryOptions, build_samples
from lego_rl.trajectory.records import TurnRecord
from lego_rl.trajectory.sample import Sample

FIRST_PROMPT, SUFFIX, OUTPUT = 2000, 400, 220


def make_records(turns: int, seed: int = 0) -> list[TurnRecord]:
    """In-memory records, built the way the adapter bridges (prefix lists are concatenated, not copied)."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(1000, 150_000) for _ in range(n)]

    def record(t: int, prompt: list[int], mode: str, bridge: int, source: int | None) -> TurnRecord:
        out = ids(OUTPUT)
        return TurnRecord(
            session_id="bench", turn=t, protocol="anthropic", prompt_ids=prompt, output_ids=out,
            logprobs=[-rng.random() for _ in out], render_mode=mode, bridge_prefix_len=bridge,  # type: ignore[arg-type]
            bridge_from_turn=source,
            finish_reason="stop", weight_versions=[t // 10] * len(out),
        )

    records = [record(0, ids(FIRST_PROMPT), "full", 0, None)]
    for t in range(1, turns):
        prev = records[-1]
        if t % 33 == 0:  # retry: same prompt as the previous turn, a fresh sample
            records.append(record(t, prev.prompt_ids, prev.render_mode, prev.bridge_prefix_len,
                                  prev.bridge_from_turn))
            continue
        history = prev.prompt_ids + prev.output_ids
        if t % 20 == 0:  # re-render drift: one token of an earlier answer changes
            history = list(history)
            history[len(history) - OUTPUT // 2] += 1
            records.append(record(t, history + ids(SUFFIX), "full", 0, None))
        else:
            records.append(record(t, history + ids(SUFFIX), "bridged", len(history), prev.turn))
    return records


def from_disk(records: list[TurnRecord]) -> list[TurnRecord]:
    """The same records after a JSON round trip: no int object is shared any more."""
    return [TurnRecord.model_validate(json.loads(r.model_dump_json())) for r in records]


Columns = tuple[list[int], list[int], list[float], list[int]]


def _extend(cols: Columns, r: TurnRecord) -> Columns:
    """Append one turn's new context and output in place (C-level list extends)."""
    tokens, mask, logprobs, versions = cols
    ctx = r.prompt_ids[len(tokens):]
    tokens.extend(ctx)
    tokens.extend(r.output_ids)
    mask.extend([0] * len(ctx))
    mask.extend([1] * len(r.output_ids))
    logprobs.extend([0.0] * len(ctx))
    logprobs.extend(r.logprobs)
    versions.extend([-1] * len(ctx))
    versions.extend(r.weight_versions)
    return cols


def _concat(cols: Columns, r: TurnRecord) -> Columns:
    """The same with ``a = a + b``: every append copies the history built so far."""
    tokens, mask, logprobs, versions = cols
    ctx = r.prompt_ids[len(tokens):]
    return (
        tokens + ctx + r.output_ids,
        mask + [0] * len(ctx) + [1] * len(r.output_ids),
        logprobs + [0.0] * len(ctx) + r.logprobs,
        versions + [-1] * len(ctx) + r.weight_versions,
    )


def naive(records: list[TurnRecord], join: Callable[[Columns, TurnRecord], Columns] = _extend) -> list[Sample]:
    """Per turn, rebuild each candidate segment's whole history by re-concatenation, then compare."""

    def rebuild(turns: list[TurnRecord]) -> Columns:
        cols: Columns = ([], [], [], [])
        for r in turns:
            cols = join(cols, r)
        return cols

    segments: list[list[TurnRecord]] = []
    for rec in records:
        for turns in reversed(segments):
            tokens = rebuild(turns)[0]
            if rec.prompt_ids[: len(tokens)] == tokens:
                turns.append(rec)
                break
        else:
            segments.append([rec])
    out = []
    for k, turns in enumerate(segments):
        tokens, mask, logprobs, versions = rebuild(turns)
        out.append(Sample(rollout_id="r", group_index=0, index=0, segment=k, num_segments=len(segments),
                          tokens=tokens, loss_mask=mask, rollout_logprobs=logprobs, weight_versions=versions,
                          turns=[r.turn for r in turns], reward=1.0))
    return out


def ours(records: list[TurnRecord], verify: bool = True) -> list[Sample]:
    samples, _ = build_samples(records, rollout_id="r", group_index=0, index=0, reward=1.0,
                               options=TrajectoryOptions(verify_bridged_prefix=verify))
    return samples


def measure(fns: dict[str, Callable[[], list[Sample]]], repeat: int) -> dict[str, tuple[float, float, list[Sample]]]:
    """Best wall time (s) over ``repeat`` rounds, the configurations interleaved round-robin so that a
    burst of load from other processes hits all of them alike; then traced peak memory (MiB) of one run."""
    best = dict.fromkeys(fns, float("inf"))
    results: dict[str, list[Sample]] = {}
    for _ in range(repeat):
        for name, fn in fns.items():
            gc.collect()
            t0 = time.perf_counter()
            results[name] = fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    out = {}
    for name, fn in fns.items():
        gc.collect()
        tracemalloc.start()
        fn()
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        out[name] = (best[name], peak, results[name])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, nargs="+", default=[25, 50, 100])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    for turns in args.turns:
        mem = make_records(turns)
        disk = from_disk(mem)
        final = len(mem[-1].prompt_ids) + len(mem[-1].output_ids)
        held = sum(len(r.prompt_ids) + len(r.output_ids) for r in mem)
        runs = measure({
            "naive, list extend": lambda d=disk: naive(d),
            "naive, list +": lambda d=disk: naive(d, _concat),
            "ours, records from JSONL": lambda d=disk: ours(d),
            "ours, records in memory": lambda m=mem: ours(m),
            "ours, trusted bridges": lambda d=disk: ours(d, verify=False),
        }, args.repeat)
        t_naive, m_naive, ref = runs.pop("naive, list extend")
        t_plus, m_plus, ref_plus = runs.pop("naive, list +")
        assert [s.tokens for s in ref_plus] == [s.tokens for s in ref]
        rows = runs
        sample_tokens = sum(len(s.tokens) for s in ref)
        print(f"\n{turns} turns: final stream {final} tokens, records hold {held} ids, {len(ref)} segments, "
              f"{sample_tokens} sample tokens")
        print(f"  naive, list extend         {t_naive * 1e3:8.1f} ms  peak {m_naive:6.1f} MiB")
        print(f"  naive, list +              {t_plus * 1e3:8.1f} ms  peak {m_plus:6.1f} MiB")
        for name, (t, m, got) in rows.items():
            assert [s.tokens for s in got] == [s.tokens for s in ref], f"{name}: samples differ from naive"
            assert [s.loss_mask for s in got] == [s.loss_mask for s in ref]
            assert [s.rollout_logprobs for s in got] == [s.rollout_logprobs for s in ref]
            print(f"  {name:26s} {t * 1e3:8.1f} ms  peak {m:6.1f} MiB  x{t_naive / t:4.1f} vs extend, "
                  f"x{t_plus / t:5.1f} vs +, memory x{m_naive / m:3.1f} less  {t / held * 1e9:4.1f} ns/held id  "
                  f"{t / sample_tokens * 1e9:4.0f} ns/sample token")


if __name__ == "__main__":
    main()
