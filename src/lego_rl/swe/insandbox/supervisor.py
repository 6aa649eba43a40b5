"""lego-rl grader supervisor: runs the test command and carries its per-test records out of its reach.

Started by the grader as root with ``python3 -I -S supervisor.py CONFIG`` (isolated: no site directory, no
environment variables, nothing from the working directory is importable). It

1. writes a fresh random key as the first line of its stdout (the host's pipe), before any process of the
   test command exists, so no later process can have written before it;
2. makes itself non-dumpable (its /proc files, memory and descriptors become unreachable for processes
   without CAP_SYS_PTRACE, which no sandbox user has) and a child subreaper (every orphan of the command
   becomes its child, so none escapes the final kill);
3. starts the command as ``eval_user`` in a new session, stdout/stderr to a log file, with the writing end
   of a pipe as the only extra descriptor (its number in ``LEGO_GRADER_FD``);
4. forwards each complete line read from that pipe to its record file, sealed with an HMAC of the key
   and the line's index, so a line any other process adds or changes is detected by the host;
5. when the command exits (or the timeout passes, or the records grow past their cap), kills every process
   the command left (descendants, orphans reparented to it, and for a non-root ``eval_user`` every process
   of that uid), then writes its summary (``Z``) as the last sealed line.

Exit status: 0 done (whatever the tests did), 3 its record could not be written (a full disk: the test run's
doing), 70 a bug here (the host reports it as a grader error).
"""

import hashlib
import hmac
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


class RecordWriteError(Exception):
    pass


def _prctl(option, value):
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except Exception:  # no ctypes in a minimal image: the host's log says what is missing
        return False


class Sealer:
    """Writes ``<mac> <kind> <payload>`` lines; the MAC covers the line's index, so lines cannot be moved."""

    def __init__(self, path, key):
        self.key = key
        self.index = 0
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)

    def emit(self, kind, payload):
        line = kind + b" " + payload
        mac = hmac.new(self.key, str(self.index).encode() + b" " + line, hashlib.sha256).hexdigest()[:32]
        data = mac.encode() + b" " + line + b"\n"
        self.index += 1
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError as exc:
            raise RecordWriteError(str(exc))


def _descendants(me):
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and fields[0] not in (b"Z", b"X"):  # a zombie is already dead
            children.setdefault(int(fields[1]), []).append(int(name))
    found, stack = [], [me]
    while stack:
        for pid in children.get(stack.pop(), ()):
            found.append(pid)
            stack.append(pid)
    return found


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_uid(uid):
    """Every process of ``uid`` (not root): signalled as that uid, which needs no capability (a sandbox's root
    may lack CAP_KILL for other uids), and reaches orphans that were not reparented to us."""
    pid = os.fork()
    if pid == 0:
        try:
            try:
                os.setgroups([])
            except OSError:
                pass  # a user namespace that denies setgroups: the uid alone decides what kill(-1) reaches
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def kill_everything(uid, deadline_s=5.0):
    """Kill every process the command left; returns how many of its descendants were signalled."""
    if uid != 0:
        _kill_uid(uid)
    me, killed, refused = os.getpid(), set(), set()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        pids = [p for p in _descendants(me) if p not in refused]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
            except OSError:
                refused.add(pid)
        _reap()
        time.sleep(0.005)
    if uid != 0:
        _kill_uid(uid)  # what forked while the first pass ran
    _reap()
    return len(killed)


def run(cfg):
    key = os.urandom(32)
    os.write(1, b"K " + key.hex().encode() + b"\n")
    notes = []
    if not _prctl(PR_SET_DUMPABLE, 0):
        notes.append("supervisor: could not make itself non-dumpable (no ctypes?)")
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        notes.append("supervisor: not a child subreaper: orphans of a root command are left to the sandbox")
    sealer = Sealer(cfg["out"], key)
    uid, gid, env = 0, 0, dict(os.environ)
    if cfg["user"] != "root":
        import pwd

        pw = pwd.getpwnam(cfg["user"])
        uid, gid = pw.pw_uid, pw.pw_gid
        env.update(HOME=pw.pw_dir or "/", USER=cfg["user"], LOGNAME=cfg["user"])
    env.update(cfg.get("env", {}))
    for name, value in cfg.get("prepend", {}).items():
        env[name] = value + (":" + env[name] if env.get(name) else "")
    for name, value in cfg.get("append", {}).items():
        env[name] = (env[name] + " " if env.get(name) else "") + value
    r, w = os.pipe()
    env["LEGO_GRADER_FD"] = str(w)
    log_fd = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)

    def become_user():
        os.setsid()
        if uid != 0:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

    start = time.monotonic()
    child = subprocess.Popen(["bash", "-c", cfg["cmd"]], cwd=cfg["cwd"], env=env, stdin=subprocess.DEVNULL,
                             stdout=log_fd, stderr=log_fd, pass_fds=(w,), preexec_fn=become_user, close_fds=True)
    os.close(w)
    os.close(log_fd)
    os.set_blocking(r, False)
    deadline = start + float(cfg["timeout"])
    max_bytes, max_line = int(cfg["max_bytes"]), int(cfg["max_line"])
    buf, total, lines = b"", 0, 0
    timed_out = overflow = eof = False
    exited_at = None
    while True:
        now = time.monotonic()
        if now >= deadline:
            timed_out = child.poll() is None
            break
        if exited_at is None and child.poll() is not None:
            exited_at = now
        if exited_at is not None and (eof or now - exited_at > 0.2):
            break  # the command is gone; a copy of the channel held open by a leftover does not keep us
        ready = select.select([r], [], [], min(0.05, deadline - now))[0]
        if not ready:
            continue
        try:
            chunk = os.read(r, 1 << 16)
        except BlockingIOError:
            continue
        if not chunk:
            eof = True
            if exited_at is None:
                # Every copy of the channel is closed but the command still runs: wait for it (no more
                # records can come), within the timeout.
                try:
                    child.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    break
                exited_at = time.monotonic()
            continue
        total += len(chunk)
        buf += chunk
        if total > max_bytes:
            overflow = True
            break
        *complete, buf = buf.split(b"\n")
        for line in complete:
            if len(line) > max_line:
                overflow = True
                break
            sealer.emit(b"L", line)
            lines += 1
        if overflow or len(buf) > max_line:
            overflow = True
            break
    killed = kill_everything(uid)
    try:
        exit_code = child.wait(5)
    except subprocess.TimeoutExpired:
        exit_code = None
    os.close(r)
    summary = {
        "exit_code": None if timed_out or overflow else exit_code,
        "timed_out": timed_out,
        "overflow": overflow,
        "records_bytes": total,
        "lines": lines,
        "partial_line": bool(buf) and not overflow,
        "killed_after": killed,
        "duration_s": round(time.monotonic() - start, 3),
        "notes": notes,
    }
    sealer.emit(b"Z", json.dumps(summary, sort_keys=True).encode())


def main():
    try:
        with open(sys.argv[1]) as fh:
            cfg = json.load(fh)
        run(cfg)
    except RecordWriteError as exc:
        sys.stderr.write("lego-supervisor: cannot write its record: %s\n" % exc)
        return 3
    except BaseException:
        sys.stderr.write("lego-supervisor: internal error\n" + traceback.format_exc())
        return 70
    return 0


if __name__ == "__main__":
    sys.exit(main())
