"""lego-rl grader: the runner side of the per-test channel (joined with shim_pytest.py or shim_unittest.py).

Loaded before any repository code is imported. At load it takes the channel descriptor out of the
environment, keeps it close-on-exec (a test's subprocess never inherits it), binds the few builtins it
uses to local names, and snapshots what the verdict relies on; every record is one line
``kind <TAB> seq <TAB> fields...`` with consecutive sequence numbers, sent only from the process that
loaded it (a forked test process sends nothing). At the end ``finish`` compares the snapshot with the
state after the tests and sends each difference as an ``X`` record, then the ``E`` record.
"""

import builtins as _builtins_mod
import os as _os
import sys as _sys

_str, _len, _getattr, _isinstance, _type = str, len, getattr, isinstance, type
# The other builtins the checks call, bound here before any repository code runs: a module global wins over
# ``builtins``, so a ``builtins.sorted`` replaced later (one line, no need to find this module) cannot blind the
# end-of-run comparison; replacing these globals in this module is itself a difference the snapshot reports.
sorted, list, dict, set, callable, any, all, zip = sorted, list, dict, set, callable, any, all, zip  # noqa: A001
_write, _getpid, _PID = _os.write, _os.getpid, _os.getpid()
_FIELD_CAP = 2000
_FD = -1
try:
    _raw_fd = int(_os.environ.pop("LEGO_GRADER_FD", "-1"))
    if _raw_fd >= 0:
        try:
            _FD = _os.dup2(_raw_fd, 500 + _PID % 400)
            _os.close(_raw_fd)
        except OSError:
            _FD = _raw_fd
        _os.set_inheritable(_FD, False)
except (ValueError, OSError):
    _FD = -1
_SEQ = [0]
_TESTS = [0]


def _esc(value):
    text = _str(value)
    if _len(text) > _FIELD_CAP:
        text = text[:_FIELD_CAP] + "..."
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def send(kind, *fields):
    if _FD < 0 or _getpid() != _PID:
        return
    line = "\t".join([kind, _str(_SEQ[0])] + [_esc(f) for f in fields]) + "\n"
    _SEQ[0] += 1
    if kind == "T":
        _TESTS[0] += 1
    data = line.encode("utf-8", "surrogateescape")
    try:
        while data:
            data = data[_write(_FD, data):]
    except OSError:
        pass  # the channel is gone: the host sees the records stop, never a forged end


def send_collected(names):
    """The tests the runner collected, before any runs: ``N`` records of names, then ``M`` with the count. The
    host refuses a result for a test that is not among them (a record forged for a test that never ran)."""
    batch, size = [], 0
    for name in names:
        batch.append(name)
        size += _len(name) + 1
        if size > 30000 or _len(batch) >= 200:
            send("N", *batch)
            batch, size = [], 0
    if batch:
        send("N", *batch)
    send("M", _len(names))


def frames_of(tb):
    """``file:line`` of each frame in a traceback, innermost last (what a canary's failure is checked by)."""
    out = []
    while tb is not None and _len(out) < 40:
        code = tb.tb_frame.f_code
        out.append(_os.path.basename(code.co_filename) + ":" + _str(tb.tb_lineno))
        tb = tb.tb_next
    return ",".join(out)


# ----- the snapshot: what the verdict relies on, by identity
#
# The snapshot holds the objects themselves and compares them with ``is``, never their ``id()``: an id is an
# address, and an object freed by ``del Cls.method`` hands its address to the next object of its size, so a
# replacement allocated right after the original was freed has the original's id (a loop of ``def``s finds
# it within a few hundred tries). Holding the original keeps its address taken for the whole run.

_BUILTINS = ("__import__", "AssertionError", "Exception", "BaseException", "isinstance", "issubclass", "type",
             "getattr", "setattr", "compile", "exec", "eval", "open", "len", "str", "repr", "id", "bool", "sorted",
             "list", "dict", "set", "callable", "any", "all", "zip")
_MISSING = object()


def _callables_of(module):
    """name -> every function/class of ``module`` and every function in those classes' dicts (the objects)."""
    out = {}
    modname = _getattr(module, "__name__", "?")
    for name, value in list(_getattr(module, "__dict__", {}).items()):
        if _isinstance(value, _type) and _getattr(value, "__module__", None) == modname:
            out[modname + "." + name] = value
            for attr, member in list(value.__dict__.items()):
                if callable(member) or _isinstance(member, (staticmethod, classmethod, property)):
                    out[modname + "." + name + "." + attr] = member
        elif callable(value) and not name.startswith("__"):
            out[modname + "." + name] = value
    return out


def _under(path, roots):
    if not path or not _isinstance(path, _str) or not _os.path.isabs(path):
        return False  # "<frozen runpy>", "<string>", built-in modules: not files of the repository
    path = _os.path.realpath(path)
    return any(path == r or path.startswith(r + _os.sep) for r in roots)


def _same(a, b):
    return _len(a) == _len(b) and all(x is y for x, y in zip(a, b))


class Snapshot:
    def __init__(self, modules, own):
        self.modules = list(modules)
        self.callables = {}
        for module in self.modules:
            self.callables.update(_callables_of(module))
        self.own = dict((name, (fn, _getattr(fn, "__code__", None))) for name, fn in own.items())
        self.builtins = dict((n, _getattr(_builtins_mod, n, None)) for n in _BUILTINS)
        self.executable = _sys.executable
        self.path = list(_sys.path)
        self.meta_path = list(_sys.meta_path)
        self.path_hooks = list(_sys.path_hooks)

    def differences(self, own, workdirs):
        out = []
        now = {}
        for module in self.modules:
            now.update(_callables_of(module))
        for name, value in self.callables.items():  # no sorted(): the order is the modules' own
            if now.get(name, _MISSING) is not value:
                out.append("%s was replaced" % name if name in now else "%s was removed" % name)
        for name, (fn, code) in self.own.items():
            current = own.get(name)
            if current is not fn or _getattr(current, "__code__", None) is not code:
                out.append("the grader shim's %s was replaced" % name)
        for name, value in self.builtins.items():
            if _getattr(_builtins_mod, name, None) is not value:
                out.append("builtins.%s was replaced" % name)
        if _sys.executable != self.executable:
            out.append("sys.executable changed: %r -> %r" % (self.executable, _sys.executable))
        position = 0
        for entry in self.path:  # entries may be added (pytest inserts rootdirs), never removed or reordered
            try:
                position = _sys.path.index(entry, position) + 1
            except ValueError:
                out.append("sys.path lost or reordered %r" % entry)
        kept = [f for f in _sys.meta_path if any(f is k for k in self.meta_path)]
        if not _same(kept, self.meta_path):
            out.append("sys.meta_path lost or reordered the finders it had before the tests")
        for finder in _sys.meta_path:
            if not any(finder is k for k in self.meta_path):
                where = _getattr(_sys.modules.get(_type(finder).__module__), "__file__", None)
                if _under(where, workdirs):
                    out.append("an import finder from the repository was added to sys.meta_path: %r" % (finder,))
        if not _same(list(_sys.path_hooks)[:_len(self.path_hooks)], self.path_hooks):
            out.append("sys.path_hooks changed")
        out += tracer_problems(workdirs)
        return out


def tracer_problems(workdirs):
    """A trace or profile function defined in the repository can skip lines (``frame.f_lineno = ...``)."""
    out = []
    for what, fn in (("sys.settrace", _sys.gettrace()), ("sys.setprofile", _sys.getprofile())):
        code = _getattr(fn, "__code__", None) or _getattr(_getattr(fn, "__func__", None), "__code__", None)
        if fn is not None and code is not None and _under(code.co_filename, workdirs):
            out.append("%s holds a function from the repository (%s)" % (what, code.co_filename))
    return out


def workdirs():
    roots = [_os.path.realpath(_os.getcwd())]
    extra = _os.environ.get("LEGO_GRADER_WORKDIR")
    if extra:
        roots.append(_os.path.realpath(extra))
    return roots


_WORKDIRS = workdirs()


_DATA = (_FD, _SEQ, _TESTS)


def finish(snapshot, own, extra_problems):
    problems = list(extra_problems) + snapshot.differences(own, _WORKDIRS)
    if _FD != _DATA[0] or _SEQ is not _DATA[1] or _TESTS is not _DATA[2]:
        problems.append("the grader shim's channel or counters were replaced")
    for problem in problems[:200]:
        send("X", problem)
    send("E", _TESTS[0], len(problems))
