"""The supervisor inside real sandboxes: nothing the test command starts is alive after the supervised exec.

This is where bwrap and sunabako differ: each bwrap exec ends its PID namespace with its first process, so a
daemon dies there anyway; sunabako keeps processes alive between execs, so there the supervisor's own kill
(child subreaper, then every process of a non-root eval_user) is what ends them. Checked with a later exec in
the same sandbox: no process of the command remains and its late write never happens.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import pytest

from lego_rl.sandbox.base import Sandbox
from lego_rl.swe.supervised import RunPlan, parse, supervisor_source

Opener = Callable[[], AbstractAsyncContextManager[Sandbox]]

# A double-forked daemon in a new session that outlives the command, then writes: a late forger of results.
DAEMON = ("(setsid sh -c 'sleep 2; echo late > /tmp/lego-late' </dev/null >/dev/null 2>&1 &); "
          "(nohup sleep 300 </dev/null >/dev/null 2>&1 &); echo started")


@pytest.mark.parametrize("user", ["root", "agent"])
async def test_no_process_of_the_command_survives_the_supervised_exec(opener: Opener, user: str) -> None:
    async with opener() as sb:
        await sb.exec("id -u agent >/dev/null 2>&1 || useradd -m agent", user="root", check=True)
        tok = secrets.token_hex(8)
        plan = RunPlan(f"/tmp/lego-grader/run-{tok}", tok)
        await sb.exec(["mkdir", "-p", "-m", "700", plan.run_dir], user="root", check=True)
        await sb.write_file(plan.supervisor, supervisor_source())
        await sb.write_file(plan.config, plan.config_json(DAEMON, user=user, cwd="/tmp", timeout=60, runner="none"))
        res = await sb.exec(plan.start(), user="root", cwd="/", timeout=120)
        record = await sb.read_file(plan.record)
        sup = parse(res.stdout, record, exit_code=res.exit_code, stderr=res.stderr, runner="none")
        assert sup.summary.get("exit_code") == 0 and not sup.blocked, (res, sup)
        assert int(str(sup.summary.get("killed_after", 0))) >= 1 or user != "root", sup.summary
        await sb.exec("sleep 3", user="root", timeout=30)
        left = await sb.exec("test -e /tmp/lego-late && echo LATE-WRITTEN; for p in /proc/[0-9]*; do "
                             "c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); case \"$c\" in sleep*|sh\\ -c\\ sleep*) "
                             "echo \"ALIVE $c\";; esac; done; true", user="root", timeout=30)
        assert "LATE-WRITTEN" not in left.stdout and "ALIVE" not in left.stdout, left.stdout
        assert json.loads(json.dumps(sup.summary))  # the summary is plain data
