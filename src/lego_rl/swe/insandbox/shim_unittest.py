"""lego-rl grader: the unittest side (after shim_common.py in the same file), run in place of ``-m unittest``.

Started as ``python <this file> ARGS``: the standard library's unittest is imported while this file's folder,
not the working directory, is ``sys.path[0]`` (a ``unittest.py`` in the repository cannot replace it), the
snapshot is taken, and only then does the working directory take its place, as ``-m unittest`` would have it.
Each test's record is sent from ``stopTest``, as the test finishes.
"""

import unittest as _unittest
import unittest.case  # noqa: F401
import unittest.loader  # noqa: F401
import unittest.main  # noqa: F401
import unittest.result  # noqa: F401
import unittest.runner  # noqa: F401
import unittest.suite  # noqa: F401

_UT_MODS = [_sys.modules[n] for n in ("unittest.case", "unittest.result", "unittest.suite", "unittest.runner",
                                      "unittest.loader", "unittest.main")]
_ORDER = {"PASSED": 0, "SKIPPED": 1, "XFAIL": 2, "FAILED": 3, "ERROR": 4}


class _Result(_unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super(_Result, self).__init__(*args, **kwargs)
        self._lego = {}

    def _put(self, test, status, err=None):
        name = test.id()
        prev = self._lego.get(name)
        detail = ""
        if err is not None:
            detail = ("A;" if issubclass(err[0], AssertionError) else "E;") + frames_of(err[2])
        send("P", name, status, detail)  # now: what was recorded cannot be changed later (worst wins)
        if prev is None or _ORDER[status] > _ORDER[prev[0]]:
            self._lego[name] = (status, detail or (prev[1] if prev else ""))
        if not _isinstance(test, _unittest.TestCase) or _getattr(test, "_lego_started", False) is not True:
            self._flush(name)  # class/module fixtures and import failures never start as tests

    def _flush(self, name):
        got = self._lego.pop(name, None)
        if got is not None:
            send("T", name, got[0], got[1])

    def startTest(self, test):
        super(_Result, self).startTest(test)
        try:
            test._lego_started = True
        except Exception:
            pass

    def stopTest(self, test):
        super(_Result, self).stopTest(test)
        _check_instance(self)
        self._flush(test.id())

    def addSuccess(self, test):
        super(_Result, self).addSuccess(test)
        self._put(test, "PASSED")

    def addFailure(self, test, err):
        super(_Result, self).addFailure(test, err)
        self._put(test, "FAILED", err)

    def addError(self, test, err):
        super(_Result, self).addError(test, err)
        self._put(test, "ERROR", err)

    def addSkip(self, test, reason):
        super(_Result, self).addSkip(test, reason)
        self._put(test, "SKIPPED")

    def addExpectedFailure(self, test, err):
        super(_Result, self).addExpectedFailure(test, err)
        self._put(test, "XFAIL")

    def addUnexpectedSuccess(self, test):
        super(_Result, self).addUnexpectedSuccess(test)
        self._put(test, "FAILED")

    def addSubTest(self, test, subtest, err):
        super(_Result, self).addSubTest(test, subtest, err)
        if err is not None:
            self._put(test, "FAILED" if issubclass(err[0], test.failureException) else "ERROR", err)


_PROBLEMS = []


def _check_instance(result):
    """A method set on the result object itself would bypass the class the snapshot checked."""
    for name, value in list(_getattr(result, "__dict__", {}).items()):
        if name.startswith(("add", "start", "stop", "_put", "_flush")) and callable(value):
            problem = "the result object's %s was replaced on the instance" % name
            if problem not in _PROBLEMS:
                _PROBLEMS.append(problem)


def _ids(test):
    try:
        children = list(test)
    except TypeError:
        return [test.id()]
    out = []
    for child in children:
        out += _ids(child)
    return out


class _Runner(_unittest.TextTestRunner):
    resultclass = _Result

    def run(self, test):
        send_collected(_ids(test))
        return super(_Runner, self).run(test)


def _own():
    return dict((k, v) for k, v in list(globals().items()) if _type(v).__name__ == "function")


def _run():
    snapshot = Snapshot(_UT_MODS + [_sys.modules[__name__]], _own())
    send("S", "unittest", _sys.version.split()[0], "")
    _sys.argv[0] = "python -m unittest"
    _sys.path[0] = _os.getcwd()  # what python -m puts there (this file's folder must not stay importable)
    snapshot.path[0] = _sys.path[0]
    prog = _unittest.main(module=None, testRunner=_Runner, exit=False)
    result = prog.result
    _check_instance(result)
    problems = list(_PROBLEMS)
    for name in list(result._lego):
        problems.append("%s: a result without the end of its test" % name)
    finish(snapshot, _own(), problems)
    _sys.exit(not result.wasSuccessful())


if __name__ == "__main__":
    _run()
