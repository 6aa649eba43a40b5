"""`lego tasks check` throughput: tasks checked per minute on this machine, and where the time goes.

Checks a generated dataset (tests/support/task_dataset.py: the example tasks, some broken on purpose) in real
bwrap sandboxes at several concurrency limits; the baseline is concurrency 1 measured in the same run. Every
row gets the full check: agent workspace + probe, base run, reference run, second (determinism) run. Then a
resumed run over the same output (nothing re-judged). Prints rows/min, the ratio to the baseline, and the
cost split (sandbox create/seed/destroy, setup = the agent-side install and probe, tests = grading).

    .venv/bin/python benchmarks/tasks_check_bench.py [--rows 20] [--concurrency 1 2 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.task_dataset import generate  # noqa: E402

from lego_rl.images import load_images_json  # noqa: E402
from lego_rl.swe.dataset_check import CheckOptions, check_dataset, read_dataset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ds = generate(Path(tmp) / "data", rows=args.rows, broken_each=1)
        rows = read_dataset(ds.path)
        options = CheckOptions(images=load_images_json(ds.images))
        base_rate = None
        print(f"{args.rows} rows ({sum(e != 'valid' for e in ds.expected.values())} broken), bwrap, full check")
        print(f"{'concurrency':>11} {'wall s':>7} {'rows/min':>8} {'vs c=1':>7} {'sandbox s':>9} {'setup s':>8}"
              f" {'tests s':>8} {'per row s':>9}")
        last_out = None
        for c in args.concurrency:
            out = Path(tmp) / f"verdicts-{c}.jsonl"
            result = asyncio.run(check_dataset(rows, dataset_dir=ds.path.parent, options=options, output=out,
                                               concurrency=c))
            s = result.summary()
            rate = s["rows_per_min"]
            base_rate = base_rate or rate
            cost = s["cost_s"]
            work = sum(cost.values())
            print(f"{c:>11} {s['wall_s']:>7.1f} {rate:>8.1f} {rate / base_rate:>6.2f}x {cost['sandbox']:>9.1f}"
                  f" {cost['setup']:>8.1f} {cost['tests']:>8.1f} {work / s['checked']:>9.2f}")
            share = {k: f"{v / work:.0%}" for k, v in cost.items()}
            print(f"{'':>11} cost split: sandbox {share['sandbox']}, setup {share['setup']}, tests {share['tests']};"
                  f" valid {s['valid']}, invalid {s['invalid']}, error {s['error']}")
            last_out = out
        assert last_out is not None
        start = time.monotonic()
        resumed = asyncio.run(check_dataset(rows, dataset_dir=ds.path.parent, options=options, output=last_out,
                                            concurrency=args.concurrency[-1]))
        took = time.monotonic() - start
        print(f"resumed run: {resumed.reused}/{len(rows)} reused, {took:.2f} s "
              f"({len(rows) / took * 60:.0f} rows/min, {len(rows) / took * 60 / base_rate:.0f}x the baseline)")


if __name__ == "__main__":
    main()
