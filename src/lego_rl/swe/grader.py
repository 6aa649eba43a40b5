"""The fresh-sandbox grader: the agent's patch against the official tests, in a new sandbox.

Order of steps, all as root unless noted, in a fresh sandbox of the task's image:

1. the row's pre-commands (the agent sandbox ran them too, so the patch has the same base), then, in one
   exec, a listing of the base tree (type, inode, change time, size), the probe of the test command's
   interpreter (cached per task) and a copy of the base files the agent patch names (``testinfra``). Steps
   are merged into as few execs as they can be: each is a round trip of 40-100 ms on a loaded machine,
   and an exec per step was most of what integrity cost (benchmarks/RESULTS.md);
2. the agent patch: ``git apply --3way``, then plain ``git apply``, then ``patch -p1``; the tree is
   restored between attempts, so a half-applied attempt never reaches the next one. A patch that
   applies in no way scores 0;
3. the test infrastructure is reset: what the patch changed outside the code under test (the
   runner's configuration of every name it reads, test folders but the official paths, the
   interpreter and its environment, metadata folders, shadows of what the interpreter imports) goes
   back to its base content or is removed (the rules and the reasons: ``testinfra`` and
   docs/grading.md); the Python code that stays is read for suspect constructs (``suspect``);
4. the official tests win: every path of the test patch is reset to HEAD (deleted when absent at
   HEAD), then the test patch is applied. This runs *after* the agent patch on purpose: an agent that
   rewrote or weakened an official test gets the official version back, and an agent that wrote its
   own file at an official test path does not make its (correct) patch unappliable. SWE-bench Pro
   rows use the last line of ``before_repo_set_cmd`` (which checks the official test files out) here;
5. canaries: copies of official tests, each with one assertion perturbed so it must fail, planted in
   the official test modules and classes under fresh names (``canary``); each must FAIL through its own
   assertion whenever its copied test passed;
6. the tests as ``eval_user`` with the grader timeout under the grader's supervisor (``supervised``,
   ``insandbox``): each test's outcome leaves the test process through a channel as it finishes, sealed
   by the supervisor, checked at the end against a snapshot of the runner taken before any repository
   code ran; every process the command left is killed before anything is read back. The verdict comes
   from the per-test records (never from the exit status where the runner reports per test):

   * SWE-bench Pro: the run script + the instance's parser; every fail-to-pass and pass-to-pass
     test ``PASSED``;
   * pytest (the grader's ``-p`` plugin) or ``python -m unittest`` (the grader's main in its place): the
     tests the row names (``fail_to_pass``/``pass_to_pass`` metadata) must pass; a row that names none
     is judged against a *baseline*, the same run with no agent patch in another fresh sandbox, run
     beside the candidate and shared by the task's grades (``swe/baseline.py``): the tests that failed
     there pass and no other test regresses;
   * any other command: its exit status, with the test infrastructure reset as the only defence
     (``verdict_source == "exit-status"``, and the log says so).

Reward is 1 only on success. Evidence that the test run rewrote results or the runner is reward 0 with the
policy label ``tampered``; a patch that makes grading impossible (the official tests do not apply after
it but do on the base commit, the reset cannot restore its tree, its run floods, cuts or destroys the
record, a file read back is over its cap) is reward 0 with ``grading_blocked``. Only what the grader's own
stack cannot do (create the sandbox, apply the *official* patch to the base commit, run the parser, get a
usable baseline, a bug of the supervisor) raises ``GraderError``: an infrastructure failure that the
rollout excludes from training, never a silent reward of 0.
``GradeResult.output`` keeps every step's complete output and the per-test outcomes.
docs/grading.md explains the rules and their reasons.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import random
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from lego_rl.errors import GraderError, SandboxError, TaskDataError
from lego_rl.sandbox.base import ExecResult, Sandbox
from lego_rl.swe.baseline import BASELINES, Baseline, BaselineCache
from lego_rl.swe.canary import Canary, plant
from lego_rl.swe.shell import GIT, format_step, q
from lego_rl.swe.suspect import Suspect, find_suspects
from lego_rl.swe.supervised import (
    MAX_RECORD_BYTES,
    RunPlan,
    Supervised,
    failure_frames,
    parse,
    shim_source,
    supervisor_source,
    unittest_command,
)
from lego_rl.swe.testinfra import (
    LIST_CMD,
    PROBE_SCRIPT,
    InfraContext,
    Listing,
    Probe,
    changes_tool_config,
    parse_listing,
    plan_reset,
    probe_shell,
    saved_paths,
)
from lego_rl.swe.testresults import (
    PASSED,
    TestRun,
    detect_runner,
    format_results,
    stops_early,
)
from lego_rl.swe.verdict import judge_baseline, judge_named, parse_parser_output
from lego_rl.tasks.model import TaskMetadata
from lego_rl.tasks.patchpaths import patch_paths
from lego_rl.termination import TerminationReason

SandboxOpener = Callable[[], AbstractAsyncContextManager[Sandbox]]
ApplyMethod = Literal["empty", "git-apply-3way", "git-apply", "patch"]
SuspectPolicy = Literal["zero", "keep"]
VerdictSource = Literal["named tests", "baseline", "swepro parser", "exit status"]
GRADER_DIR = "/tmp/lego-grader"
F2P_PATH = f"{GRADER_DIR}/test_f2p.py"
F2P_DEFAULT_CMD = f'"$(command -v python || command -v python3)" -m pytest -q -p no:cacheprovider {F2P_PATH}'
_SETUP_TIMEOUT = 900
READ_TIMEOUT_S = 60.0
"""Time cap of one read-back (after every process of the test run is gone, a capped file reads in well under
a second; more means our sandbox is failing)."""
MAX_LIST_BYTES = 64 << 20
MAX_LOG_BYTES = 256 << 10
"""What of the test command's own output the grader log keeps (its tail)."""
MAX_SWEPRO_LOG_BYTES = 256 << 20
CANARIES_PER_RUN = 3


class GradingBlocked(Exception):
    """The agent's tree or its test run made grading impossible: a verdict of 0, label ``grading_blocked``."""


@dataclass
class GradeResult:
    reward: float
    solved: bool
    reason: str
    """One line: why the reward is what it is (``tests passed``, ``agent patch does not apply``...)."""
    output: str = ""
    apply_method: ApplyMethod | None = None
    eval_exit_code: int | None = None
    timed_out: bool = False
    tests: dict[str, str] = field(default_factory=dict)
    """Per-test statuses of the graded run (canary tests left out); empty for an exit-status verdict."""
    verdict_source: VerdictSource | None = None
    """Where the verdict came from; ``None`` when no test ran (the patch did not apply)."""
    reset: list[str] = field(default_factory=list)
    """Test-infrastructure paths the grader reset after the agent patch (``restored ...``/``removed ...``)."""
    suspects: list[str] = field(default_factory=list)
    """Evidence (``file:line: what``) that the patch exists to fool comparisons (``swe/suspect.py``)."""
    label: str | None = None
    """A policy termination label the grader decided, else None: ``tampered`` (evidence that the test run
    rewrote results or the runner), ``grading_blocked`` (the patch made grading impossible: the official tests
    do not apply after it, its output overflowed the grader's caps...), ``suspect_patch``. Always with
    reward 0 except ``suspect_patch`` under ``grader.suspect_policy = keep``; termination.py has the rules."""


class _Log:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, title: str, cmd: str, res: ExecResult) -> ExecResult:
        self.parts.append(format_step(title, cmd, res))
        return res

    def note(self, title: str, body: str) -> None:
        self.parts.append(f"===== {title}\n{body.rstrip()}\n")

    @property
    def text(self) -> str:
        return "".join(self.parts)


async def _sh(sb: Sandbox, log: _Log, title: str, script: str, *, cwd: str, user: str = "root",
              timeout: float | None = _SETUP_TIMEOUT) -> ExecResult:
    return log.add(title, script, await sb.exec(["bash", "-c", script], user=user, cwd=cwd, timeout=timeout))


async def _must(sb: Sandbox, log: _Log, title: str, script: str, *, cwd: str) -> ExecResult:
    res = await _sh(sb, log, title, script, cwd=cwd)
    if not res.ok:
        raise GraderError(f"grader step '{title}' failed ({'timeout' if res.timed_out else res.exit_code}): "
                          f"{(res.stderr or res.stdout).strip()[-400:]}")
    return res


# Copies inside the grader keep ownership and times but never ACLs or xattrs (``cp -a`` would): an image's ACL
# naming a uid outside a user-namespaced sandbox's map makes the copy fail ("preserving permissions ...").
CP = "cp -dR --preserve=ownership,timestamps"
_RESTORE = f"cd {{wd}} && rm -rf -- {{paths}} && {CP} {GRADER_DIR}/infra-base/. ."
"""Between two attempts at the agent patch: the paths it names back to base (``_save_infra`` saved them)."""
_WRITE_FAILED = 97
"""Exit status of a step whose own files could not be written: our failure, never the agent's."""


async def _apply_agent_patch(sb: Sandbox, log: _Log, patch: bytes, workdir: str) -> ApplyMethod | None:
    """Try the three methods in order; the touched paths are restored after a failed attempt. The patch file and
    the base copies of what it names were written by ``_save_infra``."""
    pfile = f"{GRADER_DIR}/agent.patch"
    try:
        paths = " ".join(q(p) for p in patch_paths(patch.decode("utf-8", errors="surrogateescape")))
    except TaskDataError:  # an agent patch with absolute or '..' paths: let the appliers refuse it
        paths = ""
    attempts: list[tuple[ApplyMethod, str]] = [
        ("git-apply-3way", f"{GIT} apply --3way --whitespace=nowarn {pfile}"),
        ("git-apply", f"{GIT} apply --whitespace=nowarn {pfile}"),
        ("patch", (f"patch -p1 --batch --forward --dry-run -i {pfile} && "
                   f"patch -p1 --batch --forward --no-backup-if-mismatch -i {pfile}")),
    ]
    for method, cmd in attempts:
        res = await _sh(sb, log, f"agent patch ({method})", cmd, cwd=workdir)
        if res.ok:
            return method
        if paths:
            await _must(sb, log, "restore after failed attempt", _RESTORE.format(wd=q(workdir), paths=paths), cwd="/")
    return None


async def _official(sb: Sandbox, log: _Log, title: str, script: str, wd: str, patched: bool,
                    applies_at_base: str | None = None) -> None:
    """A step of the official tests: with the agent's patch applied, a failure whose cause is the agent's tree
    (the same step works on the base commit) is the agent's doing, not ours."""
    res = await _sh(sb, log, title, script, cwd=wd)
    if res.ok:
        return
    why = f"{(res.stderr or res.stdout).strip()[-400:]}"
    if patched and not res.timed_out and res.exit_code != _WRITE_FAILED:
        if applies_at_base is None or (await _sh(sb, log, "does the official test patch apply to the base commit?",
                                                 applies_at_base, cwd=wd)).ok:
            raise GradingBlocked(f"'{title}' fails after the agent's patch (the agent's tree is in its way): {why}")
    raise GraderError(f"grader step '{title}' failed ({'timeout' if res.timed_out else res.exit_code}): {why}")


async def _official_tests(sb: Sandbox, log: _Log, meta: TaskMetadata, patched: bool) -> None:
    wd = meta.workdir
    if meta.swepro is not None and meta.swepro.before_repo_set_cmd.strip():
        last = meta.swepro.before_repo_set_cmd.strip().splitlines()[-1]
        await _official(sb, log, "official test files (before_repo_set_cmd, last line)", last, wd, patched)
        return
    paths = meta.test_paths
    if not paths:
        return
    reset = " ; ".join(
        f"if {GIT} cat-file -e HEAD:{q(p)} 2>/dev/null; then {GIT} checkout -q HEAD -- {q(p)}; else rm -rf -- {q(p)}; fi"
        for p in paths
    )
    # Checking out HEAD's own files cannot fail on the base tree: only a tree the agent reshaped refuses it. The
    # test patch is written in the same exec (one round trip less).
    put = await _put(sb, {f"{GRADER_DIR}/test.patch": meta.test_patch.encode("utf-8", "surrogateescape")})
    await _official(sb, log, "reset official test paths to HEAD",
                    f"{{ mkdir -p {GRADER_DIR} && {put}; }} || exit {_WRITE_FAILED}; set -e; {reset}", wd, patched)
    at_base = (f"GIT_INDEX_FILE={GRADER_DIR}/base.index {GIT} read-tree HEAD && GIT_INDEX_FILE={GRADER_DIR}/base.index "
               f"{GIT} apply --cached --check --whitespace=nowarn {GRADER_DIR}/test.patch")
    await _official(sb, log, "apply official test patch", f"{GIT} apply --whitespace=nowarn {GRADER_DIR}/test.patch || "
                    f"patch -p1 --batch --forward --fuzz=0 -i {GRADER_DIR}/test.patch", wd, patched, at_base)


# ----- writing and reading in few execs: each exec is a round trip (~50-100 ms on a loaded box)

_INLINE_MAX = 80 << 10
"""What a step's own script may carry as base64 files (an argv string is capped at 128 KiB by the kernel); larger
files are written by their own exec first."""
_INLINE_READ = 8 << 20
"""What one read-back returns inside its exec's output, all files together; a file past it (under its cap) is read
by its own exec."""


async def _put(sb: Sandbox, files: dict[str, bytes]) -> str:
    """Shell that writes ``files`` inside the step that needs them; those over the inline budget are written now."""
    parts, budget = [], _INLINE_MAX
    for path, data in files.items():
        encoded = base64.b64encode(data).decode()
        if len(encoded) <= budget:
            budget -= len(encoded)
            parts.append(f"printf %s {q(encoded)} | base64 -d > {q(path)}")
        else:
            await sb.write_file(path, data)
    return " && ".join(parts) or "true"


_READ_FNS = r"""rd() {
  k=$(stat -c '%F|%s' -- "$2" 2>/dev/null) || { echo "R$1 N"; return 0; }
  s=${k##*|}; k=${k%|*}
  case $k in "regular file"|"regular empty file") ;; *) echo "R$1 K $k"; return 0;; esac
  if [ "$s" -gt "$3" ]; then echo "R$1 B $s"; elif [ "$s" -gt "${left:=$4}" ]; then echo "R$1 L $s"
  else left=$((left - s)); echo "R$1 F $s"; head -c "$s" -- "$2" | base64 -w0; echo; fi
}
tl() { if [ -f "$2" ] && [ ! -L "$2" ]; then echo "R$1 F 0"; tail -c "$3" -- "$2" | base64 -w0; echo; else echo "R$1 N"; fi; }
"""


@dataclass(frozen=True)
class Read:
    """One file to read back: at most ``limit`` bytes, or its last ``limit`` bytes (``tail``, for logs)."""

    path: str
    limit: int
    what: str = "a file"
    tail: bool = False


def _read_script(reads: list[Read], first: int = 0) -> str:
    return _READ_FNS + "\n".join(
        f"{'tl' if r.tail else 'rd'} {first + i} {q(r.path)} {r.limit} {_INLINE_READ}" for i, r in enumerate(reads))


def _parse_reads(out: str) -> dict[int, tuple[str, str, bytes]]:
    """index -> (kind, size or stat's file type, content) from ``_read_script``'s output."""
    found: dict[int, tuple[str, str, bytes]] = {}
    lines = out.split("\n")
    for n, line in enumerate(lines):
        head = re.fullmatch(r"R(\d+) ([NKBLF])(?: (.*))?", line)
        if head is None:
            continue
        idx, kind, arg = int(head.group(1)), head.group(2), head.group(3) or ""
        data = base64.b64decode(lines[n + 1]) if kind == "F" and n + 1 < len(lines) else b""
        found[idx] = (kind, arg, data)
    return found


async def _finish_reads(sb: Sandbox, reads: list[Read], found: dict[int, tuple[str, str, bytes]],
                        first: int = 0) -> list[bytes | None | GradingBlocked]:
    """Each read's bytes, None when absent, or the ``GradingBlocked`` it is (a symlink, a non-file, over its cap:
    only the test run or the agent's tree can put one where the grader reads)."""
    out: list[bytes | None | GradingBlocked] = []
    for i, r in enumerate(reads):
        got = found.get(first + i)
        if got is None:
            raise GraderError(f"reading back {r.path} gave no answer")
        kind, arg, data = got
        if kind == "N":
            out.append(None)
        elif kind == "K":
            out.append(GradingBlocked(f"{r.what} ({r.path}) is a {arg or 'missing file'}, not a regular file"))
        elif kind == "B":
            out.append(GradingBlocked(f"{r.what} ({r.path}) is {arg} bytes, over the grader's cap of {r.limit} bytes"))
        elif kind == "L":  # under its cap but too large for an exec's output: read on its own
            try:
                data = await asyncio.wait_for(sb.read_file(r.path), READ_TIMEOUT_S)
            except TimeoutError:
                raise GraderError(f"reading {r.path} ({arg} bytes) took over {READ_TIMEOUT_S:g} s") from None
            out.append(data if len(data) <= r.limit else GradingBlocked(
                f"{r.what} ({r.path}) grew past the grader's cap of {r.limit} bytes while read"))
        else:
            out.append(data)
    return out


async def read_many(sb: Sandbox, reads: list[Read]) -> list[bytes | None | GradingBlocked]:
    """Several capped reads in one exec (sizes checked before a byte is read: a sparse multi-GB file costs
    nothing); a read slower than ``READ_TIMEOUT_S`` is our sandbox failing (``GraderError``)."""
    if not reads:
        return []
    res = await sb.exec(["bash", "-c", _read_script(reads)], user="root", cwd="/", timeout=READ_TIMEOUT_S)
    if res.timed_out or not res.ok or res.truncated:
        raise GraderError(f"reading back {', '.join(r.path for r in reads)[:300]} failed "
                          f"({'timeout' if res.timed_out else res.exit_code}): {res.stderr.strip()[-300:]}")
    return await _finish_reads(sb, reads, _parse_reads(res.stdout))


async def read_capped(sb: Sandbox, path: str, limit: int, *, what: str) -> bytes | None:
    """``path``'s bytes, None when it does not exist; ``GradingBlocked`` for a symlink, a non-file or a file over
    ``limit`` bytes (``read_many``)."""
    (got,) = await read_many(sb, [Read(path, limit, what)])
    if isinstance(got, GradingBlocked):
        raise got
    return got


# ----- test infrastructure (testinfra.py decides, these steps carry it out in the sandbox)

INFRA_BASE = f"{GRADER_DIR}/infra-base"
_PROBE_PATH = f"{GRADER_DIR}/probe.py"
_RESET = r"""cd {wd} || exit 1
base={base}; status=0
while IFS= read -r -d '' p; do
  if [ -e "$p" ] || [ -L "$p" ]; then
    if [ ! -L "$p" ] && [ ! -L "$base/$p" ] && cmp -s -- "$base/$p" "$p"; then continue; fi
    echo "restored (changed by the agent): $p"
  else
    echo "restored (deleted by the agent): $p"
  fi
  rm -rf -- "$p"; mkdir -p -- "$(dirname -- "$p")" && cp -dR --preserve=ownership,timestamps -- "$base/$p" "$p" ||
    {{ echo "CANNOT RESTORE: $p"; status=3; }}
done < {restore}
while IFS= read -r -d '' p; do
  rm -rf -- "$p" && echo "removed (added by the agent): $p" || {{ echo "CANNOT REMOVE: $p"; status=3; }}
done < {remove}
exit $status
"""
_PROBES: OrderedDict[str, Probe | None] = OrderedDict()
"""Probe results by task (image, workdir, pre-commands, command): a property of the base image."""
_SUSPECT_FILES, _SUSPECT_BYTES = 200, 1 << 20


def _nul(paths: list[str]) -> bytes:
    return b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)


@dataclass
class _InfraBase:
    """What ``_save_infra`` learnt before the patch, for ``_reset_infra`` after it."""

    listing: Listing
    ctx: InfraContext
    saved: set[str]


def _listing_of(res: ExecResult, title: str) -> Listing | None:
    """The listing a step printed (``LIST <base64>``), None when its output was cut (read the file instead)."""
    if res.truncated:
        return None
    for line in res.stdout.splitlines():
        if line.startswith("LIST "):
            return parse_listing(base64.b64decode(line[5:]))
    raise GraderError(f"grader step '{title}' printed no listing")


def _probe_key(meta: TaskMetadata, cmd: str) -> str:
    return hashlib.sha256(json.dumps([meta.image, meta.workdir, meta.pre_commands, cmd]).encode()).hexdigest()


def _probe_of(res: ExecResult, log: _Log) -> tuple[Probe | None, bool]:
    """The probe's answer in a step's output (``PROBE <exit> <base64 stdout>``) and whether it may be cached."""
    line = next((x for x in res.stdout.splitlines() if x.startswith("PROBE ")), "PROBE 1 ")
    code, _, raw = line[6:].partition(" ")
    out = base64.b64decode(raw).decode("utf-8", "replace") if raw else ""
    probe: Probe | None = None
    try:
        probe = Probe.parse(out.strip().splitlines()[-1]) if code == "0" and out.strip() else None
    except (ValueError, KeyError, TypeError, IndexError):
        probe = None
    if probe is None:
        log.note("probe of the test command's interpreter", f"no answer (exit {code}); the fallback lists protect "
                 f"the standard library and the runners\n{out[-400:]}")
    else:
        log.note("probe of the test command's interpreter", f"prefix {probe.prefix}; {len(probe.path)} sys.path "
                 f"entries; runner configuration files: {', '.join(probe.configs) or '(not pytest)'}")
    return probe, code == "0"


def _official_paths(meta: TaskMetadata) -> list[str]:
    paths = list(meta.test_paths)
    if meta.swepro is not None:
        paths += list(meta.swepro.selected_test_files)
    return paths


async def _save_infra(sb: Sandbox, log: _Log, meta: TaskMetadata, patch: bytes) -> _InfraBase:
    """Before the agent patch, in one exec: the agent patch file, the base tree's listing, a copy of every base
    file the patch names (matched case-insensitively: ``saved_paths``), and the probe of the test command's
    interpreter (once per task: cached)."""
    wd, cmd = meta.workdir, _command(meta)
    try:
        named = patch_paths(patch.decode("utf-8", errors="surrogateescape"))
    except TaskDataError:
        named = []  # the appliers refuse it; anything it still changed cannot be restored: a verdict of 0
    key = _probe_key(meta, cmd)
    cached = key in _PROBES
    files = {f"{GRADER_DIR}/agent.patch": patch,
             f"{GRADER_DIR}/named.lst": "".join(f"{n}\n" for n in named if "\n" not in n).encode("utf-8",
                                                                                                  "surrogateescape")}
    if not cached:
        files[_PROBE_PATH] = PROBE_SCRIPT.encode()
    put = await _put(sb, files)
    gd = GRADER_DIR
    probe = "" if cached else (
        f"timeout 120 bash -c {q(probe_shell(cmd, wd, _PROBE_PATH, runner_of(meta)))} > {gd}/probe.out "
        f"2> {gd}/probe.err && pc=0 || pc=$?; printf 'PROBE %s ' $pc; base64 -w0 {gd}/probe.out; echo; ")
    # the listing's paths (field 5, "./"-prefixed), those the patch names (any case), copied with their folders
    script = (f"set -e; mkdir -p {INFRA_BASE}; {put}; {probe}cd {q(wd)}; {LIST_CMD} > {gd}/files-base; "
              f"cut -z -f5- < {gd}/files-base | sed -z 's|^\\./||' | {{ grep -z -i -x -F -f {gd}/named.lst || "
              f"true; }} | xargs -0 -r {CP} --parents -t {INFRA_BASE} --; printf 'LIST '; base64 -w0 {gd}/files-base")
    title = "list the base tree, save what the agent patch names" + ("" if cached else ", probe the interpreter")
    res = await _must(sb, log, title, script, cwd="/")
    listing = _listing_of(res, title)
    if listing is None:
        listing = parse_listing(await sb.read_file(f"{gd}/files-base"))
    if cached:
        probe_seen = _PROBES[key]
        _PROBES.move_to_end(key)
    else:
        probe_seen, cacheable = _probe_of(res, log)
        if cacheable or probe_seen is not None:
            _PROBES[key] = probe_seen
            while len(_PROBES) > 256:
                _PROBES.popitem(last=False)
    keep = saved_paths(listing, named)
    return _InfraBase(listing, InfraContext.build(listing, cmd, _official_paths(meta), probe_seen), set(keep))


async def _reset_infra(sb: Sandbox, log: _Log, meta: TaskMetadata, patch: bytes,
                       base: _InfraBase) -> tuple[list[str], bool, list[Suspect]]:
    """Reset the test infrastructure after the agent patch; returns (what changed, whether it all worked,
    the suspect constructs in the code that stays). Two execs: the listing, then the reset with the read-back of
    the Python files that stay (for ``suspect``).

    A path that cannot be restored is the agent's doing (a tree the patch reshaped, a file changed that
    its patch does not name), so it is a verdict of 0, not a grader error.
    """
    wd, gd = meta.workdir, GRADER_DIR
    title = "list the tree (files-patched)"
    res = await _must(sb, log, title, f"cd {q(wd)} && {LIST_CMD} > {gd}/files-patched && printf 'LIST ' && "
                      f"base64 -w0 {gd}/files-patched", cwd="/")
    now = _listing_of(res, title)
    if now is None:
        now = parse_listing(await sb.read_file(f"{gd}/files-patched"))
    plan = plan_reset(base.listing, now, base.ctx)
    judged = [p for p in plan.judge if p in base.saved
              and max(int(now[p][3] or 0), int(base.listing[p][3] or 0)) <= _SUSPECT_BYTES]
    pairs = await read_many(sb, [Read(f"{INFRA_BASE}/{p}", _SUSPECT_BYTES) for p in judged]
                            + [Read(f"{wd}/{p}", _SUSPECT_BYTES) for p in judged])
    for i, path in enumerate(judged):
        before, after = pairs[i], pairs[len(judged) + i]
        # read only what is small enough to be a configuration file; anything else goes back unread
        if isinstance(before, bytes) and isinstance(after, bytes) and not changes_tool_config(
                before.decode("utf-8", "replace"), after.decode("utf-8", "replace")):
            plan.kept.append(path)
    for path in plan.judge:
        if path not in plan.kept:
            plan.restore.append(path)
            plan.why[path] = "runner configuration (its [tool] table changed)"
    missing = [p for p in plan.restore if p not in base.saved]
    put = await _put(sb, {f"{gd}/restore.lst": _nul([p for p in plan.restore if p in base.saved]),
                          f"{gd}/remove.lst": _nul(plan.remove)})
    reset = _RESET.format(wd=q(wd), base=INFRA_BASE, restore=f"{gd}/restore.lst", remove=f"{gd}/remove.lst")
    sources = _suspect_reads(wd, plan.kept, now)
    script = (f"{{ {put}; }} || exit {_WRITE_FAILED}\n( {reset} )\nstatus=$?\n{_read_script(sources)}\n"
              "exit $status")
    res = await _sh(sb, log, "reset test infrastructure", script, cwd="/")
    if res.exit_code == _WRITE_FAILED or res.timed_out or res.truncated:
        raise GraderError(f"grader step 'reset test infrastructure' failed ({res.exit_code}): {res.stderr[-400:]}")
    done = [line for line in res.stdout.splitlines() if line.startswith(("restored", "removed", "CANNOT"))]
    done += [f"CANNOT RESTORE: {p} (changed, but the agent patch does not name it)" for p in missing]
    if plan.why:
        log.note("test-infrastructure rules (testinfra.py)", "\n".join(f"{p}: {plan.why[p]}" for p in sorted(plan.why)))
    texts = await _finish_reads(sb, sources, _parse_reads(res.stdout))
    found = {r.path[len(wd) + 1:]: t.decode("utf-8", "replace") for r, t in zip(sources, texts, strict=True)
             if isinstance(t, bytes)}
    suspects = find_suspects(found, patch.decode("utf-8", "surrogateescape")) if found else []
    return done, res.exit_code == 0 and not missing, suspects


def _suspect_reads(wd: str, kept: list[str], now: Listing) -> list[Read]:
    """The Python files the patch added or changed and the reset leaves in place (``swe/suspect.py`` reads them)."""
    return [Read(f"{wd}/{p}", _SUSPECT_BYTES, "a Python file of the patch")
            for p in [p for p in kept if p.lower().endswith(".py") and now[p][0] == "f"][:_SUSPECT_FILES]
            if int(now[p][3] or 0) <= _SUSPECT_BYTES]


# ----- canaries: official tests copied with a perturbed assertion (swe/canary.py), judged with the run


async def _plant_canaries(sb: Sandbox, log: _Log, meta: TaskMetadata, cmd: str) -> tuple[list[Canary], dict[str, bytes]]:
    """Up to ``CANARIES_PER_RUN`` canaries in the official test modules (after the official test patch), fresh
    each run; the log says where, and why none when none could be placed. Returns the canaries and the planted
    modules' new contents (written with the run's own files: one exec for all)."""
    if stops_early(cmd):
        log.note("canaries", "none planted: the command stops at its first failure (-x, --failfast...), so a "
                 "canary that fails would end the run before the official tests")
        return [], {}
    files = [F2P_PATH] if meta.f2p_script is not None and cmd.endswith(F2P_PATH) else [
        p for p in meta.test_paths if PurePosixPath(p).suffix == ".py"
        and (PurePosixPath(p).name.startswith("test") or PurePosixPath(p).stem.endswith("_test"))]
    rng = random.Random(secrets.randbits(64))
    rng.shuffle(files)
    planted: list[Canary] = []
    writes: dict[str, bytes] = {}
    notes: list[str] = []
    fulls = [p if p.startswith("/") else f"{meta.workdir}/{p}" for p in files[:8]]
    texts = await read_many(sb, [Read(f, 4 << 20, "an official test module") for f in fulls])
    for path, full, raw in zip(files, fulls, texts, strict=False):
        if len(planted) >= CANARIES_PER_RUN:
            break
        if isinstance(raw, GradingBlocked):  # the official patch wrote it: a symlink or a huge file is the task's
            notes.append(f"{path}: {raw}")
            continue
        if raw is None:
            notes.append(f"{path}: not present after the official test patch")
            continue
        new, canaries, what = plant(raw.decode("utf-8", "surrogateescape"), path, rng,
                                    CANARIES_PER_RUN - len(planted))
        notes.append(what)
        if canaries:
            writes[full] = new.encode("utf-8", "surrogateescape")
            planted += canaries
    if not files:
        notes.append("no official Python test module named by the row (test_*.py, *_test.py)")
    lines = [f"{c.path}: {c.qualname} copies {c.host} ({c.how}; line {c.line}"
             f"{'' if c.guaranteed else '; a helper call, likely but not certain to fail'})" for c in planted]
    if not planted:
        notes.append("no canary: the verdict rests on the channel, its integrity check and the official tests")
    log.note("canaries", "\n".join(notes + lines))
    return planted, writes


def _take_canaries(att: _Attempt) -> None:
    """Remove the canaries from the report; a canary whose copied test passed must have FAILED with an
    AssertionError at its perturbed line. Sets ``canary_problems`` (and ``tampered`` for a guaranteed canary
    that passed)."""
    report, sup = att.report, att.supervised
    assert report is not None and sup is not None
    seen: dict[str, tuple[str, str]] = {}
    for name in list(report.statuses):
        for c in att.canaries:
            if c.matches(name):
                seen[c.qualname + "@" + c.path] = (report.statuses.pop(name), sup.details.pop(name, ""))
    hosts: dict[str, str] = {}
    for name, status in report.statuses.items():
        for c in att.canaries:
            if Canary(c.path, c.cls, c.host.rsplit(".", 1)[-1], 0, 0, "", True, "").matches(name) and (
                    c.cls is None or c.host.startswith(c.cls + ".")):
                hosts[c.qualname + "@" + c.path] = status
    base = lambda c: c.path.rsplit("/", 1)[-1]  # noqa: E731
    for c in att.canaries:
        key = c.qualname + "@" + c.path
        host = hosts.get(key)
        if host != PASSED:
            continue  # the copied test did not pass: its canary says nothing (and the verdict fails on it anyway)
        status, detail = seen.get(key, ("MISSING", ""))
        assertion, frames = failure_frames(detail)
        at_line = any(f == f"{base(c)}:{n}" for f in frames for n in range(c.line, c.last + 1))
        if status == "FAILED" and (assertion and at_line or not detail):
            continue
        if status == PASSED:
            problem = (f"canary {c.qualname} (a copy of {c.host} with {c.how}) PASSED: assertions are disabled or "
                       "results rewritten")
            if c.guaranteed:
                att.tampered.append(problem)
            else:
                problem += " (or the helper ignores that argument: this canary was not certain to fail)"
        elif status == "FAILED":
            problem = (f"canary {c.qualname} (a copy of {c.host}) failed, but not through its own assertion at line "
                       f"{c.line} ({detail or 'no traceback'})")
        else:
            problem = f"canary {c.qualname} (a copy of {c.host}) must FAIL but was {status}"
        att.canary_problems.append(problem)


# ----- one run of the tests in a fresh sandbox


@dataclass
class _Attempt:
    log: _Log
    apply_method: ApplyMethod | None = "empty"
    reset: list[str] = field(default_factory=list)
    reset_ok: bool = True
    res: ExecResult | None = None
    report: TestRun | None = None
    canary_seen: bool = False
    canary_problems: list[str] = field(default_factory=list)
    suspects: list[Suspect] = field(default_factory=list)
    canaries: list[Canary] = field(default_factory=list)
    supervised: Supervised | None = None
    tampered: list[str] = field(default_factory=list)
    """Evidence that the test run rewrote results or the runner (label ``tampered``)."""
    blocked: str = ""
    """Why grading was impossible by the agent's doing (label ``grading_blocked``)."""


def _command(meta: TaskMetadata) -> str:
    if meta.f2p_script is not None and not meta.eval_cmd:
        return F2P_DEFAULT_CMD
    return meta.eval_cmd or ""


def runner_of(meta: TaskMetadata) -> str:
    """``swepro``, ``pytest``, ``unittest`` or ``none`` (exit status only) for the row's test command."""
    return "swepro" if meta.swepro is not None else detect_runner(_command(meta))


async def _kill_leftovers(sb: Sandbox, log: _Log, user: str) -> None:
    """After a command run without the supervisor: every process of a non-root ``eval_user`` goes before
    anything is read back (bwrap's execs end their PID namespace anyway; sunabako keeps processes alive)."""
    if user != "root":
        await _sh(sb, log, f"kill what {user} left running", "kill -9 -1 2>/dev/null; true", cwd="/", user=user,
                  timeout=60)


async def _run_swepro(sb: Sandbox, log: _Log, meta: TaskMetadata, timeout: float, att: _Attempt) -> None:
    assert meta.swepro is not None
    wd, user, sp = meta.workdir, meta.eval_user, meta.swepro
    for name in ("run_script", "parser"):
        host = Path(getattr(sp, name))
        if not host.is_file():
            raise GraderError(f"SWE-bench Pro {name} {host} does not exist on this host")
    await sb.write_file(f"{GRADER_DIR}/run_script.sh", Path(sp.run_script))
    await sb.write_file(f"{GRADER_DIR}/parser.py", Path(sp.parser))
    await _must(sb, log, "grader files readable", f"chmod -R a+rwX {GRADER_DIR}", cwd="/")
    files = q(",".join(sp.selected_test_files))
    run = f"bash {GRADER_DIR}/run_script.sh {files} > {GRADER_DIR}/stdout.log 2> {GRADER_DIR}/stderr.log"
    att.res = await _sh(sb, log, "run_script", run, cwd=wd, user=user, timeout=timeout)
    await _kill_leftovers(sb, log, user)
    if att.res.timed_out:
        return
    for name in ("stdout.log", "stderr.log"):  # the parser reads them whole: their size is capped first
        st = await sb.exec(["stat", "-c", "%s", "--", f"{GRADER_DIR}/{name}"], user="root", cwd="/", timeout=60)
        if st.ok and st.stdout.strip().isdigit() and int(st.stdout.strip()) > MAX_SWEPRO_LOG_BYTES:
            raise GradingBlocked(f"the test run's {name} is {st.stdout.strip()} bytes, over the grader's cap of "
                                 f"{MAX_SWEPRO_LOG_BYTES} bytes")
    py = "$(command -v python3 || command -v python)"
    await _must(sb, log, "parser", f"tail -c {MAX_LOG_BYTES} {GRADER_DIR}/stdout.log; {py} {GRADER_DIR}/parser.py "
                f"{GRADER_DIR}/stdout.log {GRADER_DIR}/stderr.log {GRADER_DIR}/output.json", cwd=wd)
    raw = await read_capped(sb, f"{GRADER_DIR}/output.json", MAX_RECORD_BYTES, what="the parser's output.json")
    if raw is None:
        raise GraderError("the SWE-bench Pro parser wrote no output.json")
    statuses = parse_parser_output(raw)
    att.report = TestRun("swepro-parser", statuses)


async def _run_files(sb: Sandbox, log: _Log, plan: RunPlan, files: dict[str, bytes], planted: dict[str, bytes]) -> str:
    """Shell that writes the supervised run's files and the modules the canaries were planted in, run by the exec
    that starts the supervisor (each exec is a round trip): the record's folder is root's only, the shim's
    folder readable by eval_user."""
    put = await _put(sb, {**files, **planted})
    log.note("grader run files (written by the supervised run's exec)",
             "\n".join(f"{path} ({len(data)} bytes)" for path, data in {**files, **planted}.items()))
    # one && chain: set -e does not hold inside the "{ ...; } || exit 97" the start wraps it in
    return (f"umask 022 && mkdir -p {GRADER_DIR} && chmod 711 {GRADER_DIR} && mkdir -m 700 {q(plan.run_dir)} && "
            f"mkdir -m 755 {q(plan.shim_dir)} && {put} && chmod 600 {q(plan.config)} {q(plan.supervisor)} && "
            f"chmod 644 {q(plan.shim)}")


_ENV_ASSIGN = r"(?<![\w$]){name}=(?:\"[^\"]*\"|'[^']*'|[^\s;&|]*)"


def _keep_our_env(cmd: str, plan: RunPlan) -> str:
    """A command that sets PYTHONPATH or PYTEST_ADDOPTS itself keeps the shim's entries (appended to its value)."""
    cmd = re.sub(_ENV_ASSIGN.format(name="PYTHONPATH"), lambda m: f"{m.group(0)}:{plan.shim_dir}", cmd)
    return re.sub(_ENV_ASSIGN.format(name="PYTEST_ADDOPTS"), lambda m: f"{m.group(0)}\" -p {plan.shim_module}\"", cmd)


async def _run_tests(sb: Sandbox, log: _Log, meta: TaskMetadata, timeout: float, att: _Attempt) -> None:
    cmd, runner = _command(meta), runner_of(meta)
    if meta.f2p_script is not None:
        await sb.write_file(F2P_PATH, meta.f2p_script)
    if runner == "none":
        att.res = await _sh(sb, log, f"eval as {meta.eval_user}", cmd, cwd=meta.workdir, user=meta.eval_user,
                            timeout=timeout)
        await _kill_leftovers(sb, log, meta.eval_user)
        return
    tok = secrets.token_hex(8)
    plan = RunPlan(f"{GRADER_DIR}/run-{tok}", tok)
    att.canaries, planted = await _plant_canaries(sb, log, meta, cmd)
    # A repository whose own configuration stops at the first failure (addopts = -x) would stop at a canary:
    # the official tests run to the end whatever it says (a -x on the command line plants no canary).
    opts = "--maxfail=2147483647" if att.canaries and runner == "pytest" else ""
    shown = cmd
    cmd = unittest_command(cmd, plan.shim) if runner == "unittest" else _keep_our_env(cmd, plan)
    config = plan.config_json(cmd, user=meta.eval_user, cwd=meta.workdir, timeout=timeout, runner=runner,
                              pytest_opts=opts)
    setup = await _run_files(sb, log, plan, {plan.supervisor: supervisor_source().encode(),
                                             plan.shim: shim_source(runner).encode(), plan.config: config}, planted)
    how = (f"pytest plugin -p {plan.shim_module} (PYTEST_ADDOPTS{' ' + opts if opts else ''}; PYTHONPATH "
           f"{plan.shim_dir})" if runner == "pytest" else f"unittest main {plan.shim} in place of -m unittest")
    log.note("grader's runner shim", f"{how}; per-test records to the supervisor (root, {plan.run_dir})")
    started = asyncio.get_running_loop().time()
    res = await sb.exec(plan.start(setup), user="root", cwd="/", timeout=timeout + 60)
    if res.exit_code == 97 and not res.stdout:  # the supervisor never started: writing its files failed
        raise GraderError(f"writing the grader's run files failed: {(res.stderr or res.stdout).strip()[-400:]}")
    if res.timed_out:  # the supervisor keeps its own timeout: only a stopped (SIGSTOP) supervisor gets here
        att.res = log.add(f"eval as {meta.eval_user} (supervised)", shown, res)
        return
    # every process of the run is gone (the supervisor killed them): the record and the log's tail in one exec
    record, tail = await read_many(sb, [Read(plan.record, 2 * MAX_RECORD_BYTES, "the supervisor's record"),
                                        Read(plan.log, MAX_LOG_BYTES, tail=True)])
    if isinstance(record, GradingBlocked):
        raise record
    sup = parse(res.stdout, record, exit_code=res.exit_code, stderr=res.stderr, runner=runner)
    output = tail.decode("utf-8", "replace") if isinstance(tail, bytes) else "(output not readable)"
    att.res = log.add(f"eval as {meta.eval_user} (supervised: per-test records through the grader's channel)",
                      shown, ExecResult(-1 if sup.exit_code is None else sup.exit_code, output, "",
                                        asyncio.get_running_loop().time() - started, sup.timed_out))
    if sup.notes:
        log.note("supervisor", "\n".join(sup.notes))
    att.supervised, att.report = sup, sup.run
    if sup.timed_out:
        return
    if sup.blocked:
        att.blocked = "; ".join(sup.blocked)
    if not sup.summary.get("overflow"):  # a flood's garbage lines are the flood, not separate evidence
        att.tampered += sup.evidence
    if att.canaries:
        _take_canaries(att)


async def _attempt(meta: TaskMetadata, data: bytes, open_sandbox: SandboxOpener, timeout: float) -> _Attempt:
    """Steps 1-6 of the module docstring in one fresh sandbox; ``GraderError`` for what is not the agent's,
    ``blocked`` for what the agent's tree or test run made impossible."""
    att = _Attempt(_Log())
    log = att.log
    try:
        async with contextlib.AsyncExitStack() as stack:
            sb = await stack.enter_async_context(open_sandbox())
            for n, cmd in enumerate(meta.pre_commands, start=1):
                await _must(sb, log, f"pre-command {n}", cmd, cwd=meta.workdir)
            try:
                if data.strip():
                    base = await _save_infra(sb, log, meta, data)
                    att.apply_method = await _apply_agent_patch(sb, log, data, meta.workdir)
                    if att.apply_method is None:
                        return att
                    att.reset, att.reset_ok, att.suspects = await _reset_infra(sb, log, meta, data, base)
                    if not att.reset_ok:
                        return att
                await _official_tests(sb, log, meta, patched=bool(data.strip()))
                if meta.swepro is not None:
                    await _run_swepro(sb, log, meta, timeout, att)
                else:
                    await _run_tests(sb, log, meta, timeout, att)
            except GradingBlocked as exc:
                if not data.strip():  # the base tree and the official tests alone: the task's problem
                    raise GraderError(f"the base tree cannot be graded: {exc}") from exc
                att.blocked = str(exc)
                log.note("grading blocked", att.blocked)
            return att
    except Exception as exc:
        # A provider may leak its SDK's own exception type; it is still not the agent's doing.
        if isinstance(exc, SandboxError):
            what = "grader sandbox failed"
        elif isinstance(exc, GraderError):
            what = "grader failed"
        else:
            what = f"grader crashed ({type(exc).__name__})"
        raise GraderError(f"{what} for {meta.instance_id}: {exc}", output=log.text) from exc


# ----- baselines


def _usable_baseline(meta: TaskMetadata, att: _Attempt, duration_s: float) -> Baseline:
    """A baseline that can decide a verdict, or ``GraderError`` (the task's tests are the problem)."""
    assert att.res is not None
    if att.res.timed_out:
        raise GraderError(f"baseline for {meta.instance_id}: the official tests time out on the base tree",
                          output=att.log.text)
    report = att.report
    assert report is not None
    why = report.problems + att.canary_problems + [f"tampering evidence on the base tree: {t}" for t in att.tampered]
    if att.blocked:
        why.append(att.blocked)
    if not why and not report.statuses and not report.collection_errors:
        why = ["no per-test results"]
    if why:
        raise GraderError(f"baseline for {meta.instance_id} is unusable: {'; '.join(why)}",
                          output=att.log.text)
    return Baseline(report, att.canary_seen, duration_s)


def named_tests(meta: TaskMetadata) -> tuple[list[str], list[str]] | None:
    """The row's ``fail_to_pass``/``pass_to_pass`` (also ``FAIL_TO_PASS``/``PASS_TO_PASS``; a list or a
    JSON list in a string, as SWE-bench rows have them), or None when it names no test."""
    extra = meta.model_extra or {}
    out: list[list[str]] = []
    for key in ("fail_to_pass", "pass_to_pass"):
        value = extra.get(key, extra.get(key.upper()))
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else []
            except json.JSONDecodeError:
                raise GraderError(f"metadata.{key} of {meta.instance_id} is a string but not a JSON list"
                                  ) from None
        if value is None:
            value = []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise GraderError(f"metadata.{key} of {meta.instance_id} must be a list of test names")
        out.append(value)
    return (out[0], out[1]) if out[0] or out[1] else None


# ----- the verdict


async def grade(meta: TaskMetadata, patch: bytes | str, *, open_sandbox: SandboxOpener,
                timeout: float = 180.0, baselines: BaselineCache | None = None,
                suspect_policy: SuspectPolicy = "zero") -> GradeResult:
    """Grade ``patch`` for the task ``meta`` in a fresh sandbox from ``open_sandbox()``.

    ``open_sandbox`` returns an async context manager of a new sandbox of the task's image, e.g.
    ``lambda: create_sandbox(meta.image, provider="bwrap", images=images)``; a baseline run, when the
    verdict needs one, opens another. ``baselines`` defaults to the process-wide ``BASELINES``.
    ``suspect_policy`` (``grader.suspect_policy``): what a patch built to fool comparisons scores.
    """
    data = patch.encode() if isinstance(patch, str) else patch
    cache = BASELINES if baselines is None else baselines
    runner = runner_of(meta)
    named = named_tests(meta) if runner in ("pytest", "unittest") else None
    baseline: asyncio.Future[Baseline] | None = None
    known = False
    if runner in ("pytest", "unittest") and named is None and data.strip():
        # started before the candidate's run and run beside it (swe/baseline.py says why)
        key = BaselineCache.key(meta, timeout)
        known = cache.known(key)
        baseline = cache.start(key, lambda: _run_baseline(meta, open_sandbox, timeout))
    started = asyncio.get_running_loop().time()
    att = await _attempt(meta, data, open_sandbox, timeout)
    log, res = att.log, att.res
    result = GradeResult(0.0, False, "", apply_method=att.apply_method, reset=att.reset)
    if att.apply_method is None:
        result.reason = "agent patch does not apply (3-way, plain, patch)"
    elif not att.reset_ok:
        result.reason = "grading blocked: the agent's tree keeps the test infrastructure from being reset: " + \
            "; ".join(r for r in att.reset if r.startswith("CANNOT"))
        result.label = TerminationReason.GRADING_BLOCKED
        log.note("verdict", f"NOT SOLVED (grading_blocked)\n{result.reason}")
    elif att.blocked and not att.tampered:
        result.reason, result.label = f"grading blocked: {att.blocked}", TerminationReason.GRADING_BLOCKED
        log.note("verdict", f"NOT SOLVED (grading_blocked)\n{att.blocked}")
    else:
        assert res is not None
        result.eval_exit_code = None if res.timed_out else res.exit_code
        if res.timed_out:
            result.reason, result.timed_out = f"tests timed out after {timeout:.0f} s", True
        elif runner == "none":
            result.verdict_source = "exit status"
            result.solved = res.exit_code == 0
            result.reason = "tests passed" if result.solved else f"tests failed (exit {res.exit_code})"
            log.note("verdict", f"{result.reason}: this command reports no per-test results (it runs "
                     "neither pytest nor python -m unittest), so its exit status decides, after the "
                     "test-infrastructure reset")
        else:
            await _judge(meta, att, runner, named, (baseline, known), timeout, cache, started, result)
    result.reward = float(result.solved)
    # Both reward 0: a patch with suspect constructs is labelled suspect_patch even when its run also showed
    # tampering (the evidence stays in the log), so the per-step suspect count sees every such patch.
    _judge_suspects(att, result, suspect_policy)
    result.output = log.text
    return result


def _judge_suspects(att: _Attempt, result: GradeResult, policy: SuspectPolicy) -> None:
    """Label a patch with suspect constructs ``suspect_patch``; under ``zero`` its reward is 0."""
    if not att.suspects or att.apply_method is None:
        return
    result.suspects, result.label = [str(s) for s in att.suspects], "suspect_patch"
    kept = policy == "keep"
    att.log.note("suspect patch (swe/suspect.py)", "\n".join(result.suspects) + "\n" + (
        f"grader.suspect_policy = keep: the verdict stands (reward {result.reward:g})" if kept else
        "grader.suspect_policy = zero: reward 0"))
    if not kept:
        result.solved, result.reward = False, 0.0
        result.reason = f"suspect patch: {result.suspects[0]}" + (
            f" (+{len(result.suspects) - 1} more)" if len(result.suspects) > 1 else "") + f"; was: {result.reason}"


async def _run_baseline(meta: TaskMetadata, open_sandbox: SandboxOpener, timeout: float) -> Baseline:
    t0 = asyncio.get_running_loop().time()
    att = await _attempt(meta, b"", open_sandbox, timeout)
    return _usable_baseline(meta, att, asyncio.get_running_loop().time() - t0)


async def _judge(meta: TaskMetadata, att: _Attempt, runner: str, named: tuple[list[str], list[str]] | None,
                 pending: tuple[asyncio.Future[Baseline] | None, bool], timeout: float, cache: BaselineCache,
                 started: float, result: GradeResult) -> None:
    report, log = att.report, att.log
    assert report is not None
    extra = [f"tampered: {t}" for t in att.tampered] + [f"canary: {p}" for p in att.canary_problems]
    if runner == "swepro":
        assert meta.swepro is not None
        verdict = judge_named(report, meta.swepro.fail_to_pass, meta.swepro.pass_to_pass)
        result.verdict_source = "swepro parser"
    elif named is not None:
        verdict = judge_named(report, *named)
        result.verdict_source = "named tests"
    else:
        result.verdict_source = "baseline"
        future, known = pending
        if future is None:  # the empty patch *is* the baseline run
            baseline = _usable_baseline(meta, att, asyncio.get_running_loop().time() - started)
            cache.put(BaselineCache.key(meta, timeout), baseline)
            how = "this run (empty patch)"
        else:
            try:
                baseline = await asyncio.shield(future)
            except GraderError as exc:
                raise GraderError(str(exc), output=log.text + "\n" + exc.output) from exc
            how = f"{'shared' if known else 'ran'}: {baseline.duration_s:.1f} s in its own fresh sandbox"
        log.note(f"baseline per-test results ({how})", format_results(baseline.report))
        verdict = judge_baseline(report, baseline.report)
    result.tests = dict(report.statuses)
    failing = extra + verdict.failing
    result.solved = not failing
    if att.tampered:
        result.label = TerminationReason.TAMPERED
    if att.canary_problems:
        canary = f"canaries ({len(att.canaries)}, left out above): NOT AS EXPECTED, see the verdict"
    elif att.canaries:
        canary = (f"canaries ({len(att.canaries)}, left out above): each failed through its own assertion, or "
                  "its copied test did not pass")
    else:
        canary = "canaries: none in this run (the canaries note says why)"
    log.note(f"per-test results ({report.runner})", format_results(report) + "\n" + canary)
    if att.tampered:
        log.note("tampering evidence (label tampered)", "\n".join(att.tampered))
    if result.solved:
        result.reason = "all fail-to-pass and pass-to-pass tests passed"
        if result.verdict_source == "baseline":
            result.reason = "the tests failing at baseline pass and none regressed"
    else:
        more = f" (+{len(failing) - 5} more)" if len(failing) > 5 else ""
        result.reason = "not passed: " + "; ".join(failing[:5]) + more
    status = att.res.exit_code if att.res else "-"
    verdict_line = f"{'SOLVED' if result.solved else 'NOT SOLVED'} ({result.verdict_source}; exit status {status} unused)"
    log.note("verdict", "\n".join([verdict_line, *failing]))
