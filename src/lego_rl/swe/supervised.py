"""The host side of a supervised test run: the files the grader puts in the sandbox, and the per-test report
read back from the supervisor's sealed record (the sandbox side is ``swe/insandbox``; docs/grading.md,
"Trust model", says why it is built this way).

What the host trusts, in order:

* the first line of the supervisor's stdout, ``K <key>``: written before any process of the test command
  existed, so no test process can have written before it;
* the record file's lines, each sealed with an HMAC of that key and the line's index: a line another process
  adds, changes or moves fails its seal (``evidence``: tampered), a record cut short has no summary;
* inside the record, the runner's own lines (``S`` start, ``N``/``M`` the tests collected and their count,
  ``P`` one phase or result of a test as it is reported, ``T`` one per test as it finishes, ``C`` collection
  error, ``X`` evidence from the end-of-run integrity check, ``E`` end): consecutive sequence numbers from 0,
  one start, one collection, one end whose test count matches, results only for collected tests; anything
  else is evidence of a forged, repeated or dropped record. A test's status is the worst of its records
  (a forged pass never hides a failure). Nothing after ``E`` counts (and anything there is evidence).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from lego_rl.errors import GraderError
from lego_rl.swe.testresults import ERROR, FAILED, PASSED, SKIPPED, XFAIL, TestRun, replace_unittest_module

INSANDBOX = Path(__file__).resolve().parent / "insandbox"
MAX_RECORD_BYTES = 32 << 20
"""What the runner may send through the channel in one run (about 150 bytes a test: 200k tests)."""
MAX_LINE = 64 << 10
MAX_EVIDENCE = 50
SUPERVISOR_BUG = 70
RECORD_UNWRITABLE = 3
_STATUSES = (PASSED, FAILED, ERROR, SKIPPED, XFAIL)
_FAILED_IMPORT = ("unittest.loader._FailedTest.", "unittest.loader.ModuleImportFailure.")


def shim_source(runner: str) -> str:
    """The runner shim as one file: the common part, then the pytest plugin or the unittest main."""
    common = (INSANDBOX / "shim_common.py").read_text()
    return common + "\n\n" + (INSANDBOX / f"shim_{runner}.py").read_text()


def supervisor_source() -> str:
    return (INSANDBOX / "supervisor.py").read_text()


@dataclass(frozen=True)
class RunPlan:
    """Where one supervised run keeps its files in the sandbox, and how it is started."""

    run_dir: str
    tok: str

    @property
    def supervisor(self) -> str:
        return f"{self.run_dir}/supervisor.py"

    @property
    def config(self) -> str:
        return f"{self.run_dir}/config.json"

    @property
    def record(self) -> str:
        return f"{self.run_dir}/record"

    @property
    def log(self) -> str:
        return f"{self.run_dir}/output.log"

    @property
    def shim_dir(self) -> str:
        """Readable by eval_user (the test interpreter imports from it); run_dir itself is root's only."""
        return f"{self.run_dir}-shim"

    @property
    def shim_module(self) -> str:
        return f"lego_shim_{self.tok}"

    @property
    def shim(self) -> str:
        return f"{self.shim_dir}/{self.shim_module}.py"

    def start(self, setup: str = "") -> list[str]:
        """The exec's argv: ``setup`` (shell that writes the run's files, silent; exit 97 when it fails), then the
        image's Python in place of bash (nothing else holds the supervisor's stdout)."""
        py = 'exec "$(command -v python3 || command -v python)" -I -S "$0" "$1"'
        return ["bash", "-c", f"{{ {setup}\n}} || exit 97\n{py}" if setup else py, self.supervisor, self.config]

    def config_json(self, cmd: str, *, user: str, cwd: str, timeout: float, runner: str,
                    pytest_opts: str = "") -> bytes:
        env: dict[str, str] = {"LEGO_GRADER_WORKDIR": cwd}
        prepend: dict[str, str] = {}
        append: dict[str, str] = {}
        if runner == "pytest":
            prepend["PYTHONPATH"] = self.shim_dir
            append["PYTEST_ADDOPTS"] = f"-p {self.shim_module}" + (f" {pytest_opts}" if pytest_opts else "")
        return json.dumps({
            "cmd": cmd, "user": user, "cwd": cwd, "timeout": timeout, "out": self.record, "log": self.log,
            "env": env, "prepend": prepend, "append": append, "max_bytes": MAX_RECORD_BYTES, "max_line": MAX_LINE,
        }).encode()


def unittest_command(cmd: str, shim_path: str) -> str:
    """``cmd`` with ``-m unittest`` replaced by the unittest shim at ``shim_path``."""
    return replace_unittest_module(cmd, shlex.quote(shim_path))


@dataclass
class Supervised:
    """What a supervised run reported, and what the host found wrong with the reporting itself."""

    run: TestRun
    details: dict[str, str] = field(default_factory=dict)
    """Test -> ``when=A;file:line,...`` for its failing phases (``A`` an AssertionError, ``E`` anything else)."""
    evidence: list[str] = field(default_factory=list)
    """Why the record cannot be the runner's own (forged, repeated or dropped records, a changed runner)."""
    blocked: list[str] = field(default_factory=list)
    """Why the record could not be read at all, by the test run's doing (oversized, destroyed, cut)."""
    complete: bool = False
    timed_out: bool = False
    exit_code: int | None = None
    notes: list[str] = field(default_factory=list)
    summary: dict[str, object] = field(default_factory=dict)


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append({"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}.get(nxt, nxt))
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _key(stdout: str) -> bytes:
    first = stdout.split("\n", 1)[0].strip()
    if not first.startswith("K ") or len(first) != 66:
        raise GraderError(f"the grader's supervisor did not start (first line {first[:80]!r})")
    return bytes.fromhex(first[2:])


def parse(stdout: str, record: bytes | None, *, exit_code: int | None, stderr: str, runner: str) -> Supervised:
    """The supervised run's report. ``record`` is None when the record file is gone. ``GraderError`` only for
    what no test process can cause: the supervisor never started, or failed by a bug of its own."""
    if exit_code == SUPERVISOR_BUG:
        raise GraderError(f"the grader's supervisor failed: {stderr.strip()[-1500:]}")
    key = _key(stdout)
    out = Supervised(TestRun(f"{runner}-shim"))
    if record is None:
        out.blocked.append("the supervisor's record file is gone (removed by the test run)")
        return out
    lines = record.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    summary: dict[str, object] | None = None
    child: list[bytes] = []
    for index, line in enumerate(lines):
        mac, _, rest = line.partition(b" ")
        want = hmac.new(key, str(index).encode() + b" " + rest, hashlib.sha256).hexdigest()[:32].encode()
        if not hmac.compare_digest(mac, want):
            out.evidence.append(f"line {index} of the supervisor's record was not written by the supervisor")
            break
        if summary is not None:
            out.evidence.append("lines were added to the supervisor's record after its summary")
            break
        kind, _, payload = rest.partition(b" ")
        if kind == b"L":
            child.append(payload)
        elif kind == b"Z":
            try:
                summary = json.loads(payload)
            except ValueError:
                raise GraderError(f"the supervisor's summary is not JSON: {payload[:200]!r}") from None
    if summary is None:
        if exit_code == RECORD_UNWRITABLE:
            out.blocked.append(f"the supervisor could not write its record: {stderr.strip()[-300:]}")
        elif not out.evidence:
            out.blocked.append(f"the supervisor's record ends without its summary (the supervisor was killed, "
                               f"exit {exit_code}, or its record was cut)")
    else:
        out.summary = summary
        out.timed_out = bool(summary.get("timed_out"))
        code = summary.get("exit_code")
        out.exit_code = code if isinstance(code, int) else None
        notes = summary.get("notes")
        out.notes += [str(n) for n in notes] if isinstance(notes, list) else []
        if summary.get("overflow"):
            out.blocked.append(f"the test run sent more than the per-test records' cap ({MAX_RECORD_BYTES >> 20} "
                               f"MiB, {MAX_LINE >> 10} KiB a line) through the grader's channel")
        if summary.get("killed_after"):
            out.notes.append(f"{summary['killed_after']} process(es) the test command left running were killed "
                             "before anything was read back")
    _read_runner(child, out)
    return out


def _put(out: Supervised, name: str, status: str, detail: str) -> None:
    run = out.run
    if name.startswith(_FAILED_IMPORT):
        if status != PASSED and name.split(".", 3)[-1] not in run.collection_errors:
            run.collection_errors.append(name.split(".", 3)[-1])
        return
    prev = run.statuses.get(name)
    run.statuses[name] = status if prev in (None, PASSED) else prev  # a result never improves by a second one
    if detail and detail not in out.details.get(name, ""):
        out.details[name] = (out.details.get(name, "") + " " + detail).strip()


def _read_runner(lines: list[bytes], out: Supervised) -> None:
    run = out.run
    expected, started, ended, tests, after = 0, False, False, 0, 0
    collected: set[str] = set()
    listed: int | None = None
    named: list[str] = []
    for raw in lines:
        if ended:
            after += 1
            continue
        fields = [_unescape(f) for f in raw.decode("utf-8", "surrogateescape").split("\t")]
        kind = fields[0]
        try:
            seq = int(fields[1])
        except (IndexError, ValueError):
            out.evidence.append(f"a malformed record on the grader's channel: {raw[:120]!r}")
            continue
        if seq != expected:
            out.evidence.append(f"record {seq} arrived where {expected} was due: a record was forged, "
                                "repeated or dropped on the grader's channel")
        expected = seq + 1
        args = fields[2:]
        if kind == "S":
            if started:
                out.evidence.append("a second start record on the grader's channel")
            started = True
            if len(args) >= 3 and args[2].strip():
                out.notes.append(f"repository modules imported before the grader's shim: {args[2][:500]}")
            if len(args) >= 4 and args[3].strip():
                out.notes.append(f"the runner is code under test (its modules are in the repository: {args[3][:500]}): "
                                 "its own modules are not compared, only the channel and the canaries hold")
        elif not started:
            out.evidence.append(f"a {kind!r} record before the runner's start record")
        elif kind in ("T", "P") and len(args) >= 2:
            name, status = args[0], args[1]
            if status not in _STATUSES:
                out.evidence.append(f"test {name!r} reported with an unknown status {status!r}")
                continue
            tests += kind == "T"
            named.append(name)
            _put(out, name, status, args[2] if len(args) > 2 else "")
        elif kind == "N":
            if listed is not None:
                out.evidence.append("tests listed after the runner's collection was complete")
            collected.update(args)
        elif kind == "M" and args:
            if listed is not None:
                out.evidence.append("a second collection record on the grader's channel")
            listed = len(collected)
            if args[0] != str(listed):
                out.evidence.append(f"the collection record counts {args[0]} tests but {listed} were listed")
        elif kind == "C" and args:
            run.collection_errors.append(args[0])
        elif kind == "X" and args:
            out.evidence.append(f"integrity check: {args[0]}")
        elif kind == "E" and args:
            ended = True
            if args[0] != str(tests):
                out.evidence.append(f"the runner's end record counts {args[0]} tests but {tests} arrived")
        else:
            out.evidence.append(f"an unknown record {kind!r} on the grader's channel")
    if after:
        # The shim writes nothing after its end record, so another writer did: evidence, and never counted.
        out.evidence.append(f"{after} record(s) on the grader's channel after the runner's end record "
                            "(ignored for the verdict)")
    if listed is not None:
        strays = sorted({n for n in named if n not in collected and not _fixture_error(n)})
        out.evidence += [f"a result for {n!r}, which the runner never collected" for n in strays[:20]]
    if len(out.evidence) > MAX_EVIDENCE:
        out.evidence[MAX_EVIDENCE:] = [f"(+{len(out.evidence) - MAX_EVIDENCE} more like these)"]
    out.complete = ended
    if not started:
        run.problems.append("the runner never started the grader's shim (the command did not run the tests "
                            "through pytest or unittest, or ended before)")
    elif not ended:
        run.problems.append("the test run ended before the runner's final record (os._exit, a crash, a kill "
                            "or the timeout)")


def _fixture_error(name: str) -> bool:
    """unittest reports a failing setUpClass/setUpModule as ``setUpClass (test_x.Case)``, never collected."""
    return name.startswith(("setUpClass (", "setUpModule (", "tearDownClass (", "tearDownModule (")) or \
        name.startswith(_FAILED_IMPORT)


def failure_frames(detail: str) -> tuple[bool, set[str]]:
    """From a test's ``details``: whether a phase failed with an AssertionError, and every ``file:line``."""
    assertion, frames = False, set[str]()
    for part in detail.split():
        body = part.split("=", 1)[-1]  # pytest names the phase (``call=``), unittest does not
        kind, _, where = body.partition(";")
        assertion = assertion or kind == "A"
        frames.update(f for f in where.split(",") if f)
    return assertion, frames
