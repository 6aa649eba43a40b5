"""lego-rl grader: the pytest side (after shim_common.py in the same file), loaded with ``-p <random name>``.

pytest imports ``-p`` plugins right after its own default plugins and before conftest files, entry-point
plugins and test modules, so the snapshot sees the runner before any repository code (a ``-p`` of the
repository's own ini file comes earlier: the start record lists repository modules already imported).

Per test, the record's status comes from pytest's final reports (``pytest_runtest_logreport``, after its
own wrappers turned xfails and unittest skips into their statuses) checked against the raw outcome of each
phase (``CallInfo.excinfo``, read in the innermost makereport wrapper, before any other wrapper can rewrite
the report): a report that says passed while the phase raised is evidence of a rewritten report, as is a test whose item or function changed after
collection, a plugin registered from repository code other than a conftest, or a verdict hook served by
a function that is not its plugin's.
"""

_RUNNER_MODULES = (
    "_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.unittest", "_pytest.main", "_pytest.outcomes",
    "_pytest.python_api", "_pytest.skipping", "pytest", "pluggy", "pluggy._callers", "pluggy._hooks",
    "pluggy._manager", "pluggy.callers", "pluggy.hooks", "pluggy.manager")  # the last three: pluggy < 1.0
_runner = [_sys.modules[name] for name in _RUNNER_MODULES if name in _sys.modules]
# A repository that *is* the runner (pytest-dev/pytest, pluggy): those modules are the code under test, which the
# fix changes on purpose and which registers its own plugins as it runs. They are left out of the snapshot and
# their frames are not "repository code" for the plugin check: for such a row only the canaries and the channel
# stand between the code under test and its verdict (the start record says so).
_RUNNER_IN_REPO = sorted(set(_os.path.dirname(_os.path.realpath(m.__file__)) for m in _runner
                             if _under(_getattr(m, "__file__", None), _WORKDIRS)))
_pytest_mods = [m for m in _runner if not _under(_getattr(m, "__file__", None), _WORKDIRS)]
if "unittest.case" not in _sys.modules:
    import unittest.case  # noqa: F401  (imported here, from the standard library, before the repository)
_pytest_mods += [_sys.modules["unittest.case"], _sys.modules["unittest.result"], _sys.modules["unittest.suite"]]
_SKIP_TYPES = ("Skipped", "XFailed")
_VERDICT_HOOKS = ("pytest_runtest_protocol", "pytest_runtest_setup", "pytest_runtest_call",
                  "pytest_runtest_teardown", "pytest_runtest_makereport", "pytest_runtest_logreport",
                  "pytest_report_teststatus", "pytest_pyfunc_call", "pytest_runtest_logfinish")
_EARLY = sorted(name for name, m in list(_sys.modules.items())
                if _under(_getattr(m, "__file__", None), _WORKDIRS))
_STATE = {"phases": {}, "raw": {}, "items": {}, "problems": [], "pm": None, "hooks": {}}
_ORDER = {"PASSED": 0, "SKIPPED": 1, "XFAIL": 2, "FAILED": 3, "ERROR": 4}


def _marker():
    import pluggy

    return pluggy.HookimplMarker("pytest")


_hookimpl = _marker()


try:
    _hookimpl(wrapper=True)
    _NEW_STYLE = True
except TypeError:  # pluggy < 1.1 has old-style hook wrappers only
    _NEW_STYLE = False


def _raw(call):
    """What the phase itself raised, read before any outer wrapper can rewrite the report."""
    if call.excinfo is None:
        return None
    value = call.excinfo.value
    skip = _type(value).__name__ in _SKIP_TYPES
    kind = "A" if _isinstance(value, AssertionError) else "E"
    return (skip, _type(value).__name__, kind + ";" + frames_of(call.excinfo.tb))


def _record_raw(item, call):
    _STATE["raw"].setdefault(item.nodeid, {})[call.when] = _raw(call)


def _status(rep):
    """The final report's status for one phase (after pytest's own wrappers: xfail, unittest skips...)."""
    when, outcome = rep.when, rep.outcome
    if outcome == "failed":
        return "FAILED" if when == "call" else "ERROR"
    if outcome == "skipped":
        return "XFAIL" if _getattr(rep, "wasxfail", None) is not None else "SKIPPED"
    return "PASSED"


@_hookimpl
def pytest_runtest_logreport(report):
    when = _getattr(report, "when", None)
    if when is None:
        return
    status = _status(report)
    raw = _STATE["raw"].get(report.nodeid, {})
    got = raw.get(when, False)  # False: no raw view here (an xdist worker's report)
    detail = ""
    if got:
        skip, name, detail = got
        if status == "PASSED" and not skip and _getattr(report, "wasxfail", None) is None:
            _STATE["problems"].append("%s: pytest's %s report says passed but the test raised %s" % (
                report.nodeid, when, name))
    if status not in ("FAILED", "ERROR"):
        detail = ""
    # Sent now, phase by phase: what was recorded cannot be changed later, only added to (worst wins).
    send("P", report.nodeid, status, when + "=" + detail if detail else "")
    _STATE["phases"].setdefault(report.nodeid, []).append((when, status, detail))


try:
    _hookimpl(wrapper=True)
    _NEW_STYLE = True
except TypeError:  # pluggy < 1.1 has old-style hook wrappers only
    _NEW_STYLE = False


if _NEW_STYLE:
    @_hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_makereport(item, call):
        # Innermost wrapper (registered first, trylast): nothing runs between the reporting impls and us.
        rep = yield
        _record_raw(item, call)
        return rep

    @_hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(item):
        _STATE["items"].setdefault(item.nodeid, {})["called"] = True
        return (yield)
else:
    @_hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_makereport(item, call):
        yield
        _record_raw(item, call)

    @_hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_call(item):
        _STATE["items"].setdefault(item.nodeid, {})["called"] = True
        yield


@_hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    for item in items:
        fn = _function(item)
        _STATE["items"][item.nodeid] = {
            "runtest": _getattr(_type(item), "runtest", None), "obj": fn, "code": _getattr(fn, "__code__", None),
            "item": item,
        }


def _function(item):
    """The plain function a test item runs (a bound method is made anew at each access: its __func__)."""
    fn = _getattr(item, "obj", None)
    return _getattr(fn, "__func__", fn)


@_hookimpl(trylast=True)
def pytest_collection_finish(session):
    send_collected([item.nodeid for item in session.items])


@_hookimpl
def pytest_collectreport(report):
    if report.failed:
        send("C", report.nodeid or "?")


@_hookimpl
def pytest_runtest_logfinish(nodeid, location):
    phases = _STATE["phases"].pop(nodeid, [])
    _STATE["raw"].pop(nodeid, None)
    if not phases:
        return
    status = "PASSED"
    details = []
    for when, st, detail in phases:
        if _ORDER[st] > _ORDER[status]:
            status = st
        if detail:
            details.append(when + "=" + detail)
    seen = _STATE["items"].get(nodeid)
    if seen is not None and "item" in seen:
        item = seen["item"]
        fn = _function(item)
        if ("runtest" in _getattr(item, "__dict__", {}) or _getattr(_type(item), "runtest", None) is not seen["runtest"]
                or fn is not seen["obj"]
                or _getattr(fn, "__code__", None) is not seen["code"]):
            _STATE["problems"].append("%s: its test function or runner changed after collection" % nodeid)
        if status == "PASSED" and not seen.get("called"):
            _STATE["problems"].append("%s: reported passed but its test function was never called" % nodeid)
    for problem in tracer_problems(_WORKDIRS):
        _STATE["problems"].append("%s: %s" % (nodeid, problem))
    send("T", nodeid, status, " ".join(details))


@_hookimpl(tryfirst=True)
def pytest_plugin_registered(plugin, manager):
    if _STATE["pm"] is None:
        return
    frame = _sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if (_under(filename, _WORKDIRS) and _os.path.basename(filename) != "conftest.py"
                and not _under(filename, _RUNNER_IN_REPO)):
            _STATE["problems"].append("a pytest plugin was registered from repository code (%s:%d): %r" % (
                filename, frame.f_lineno, plugin))
            break
        frame = frame.f_back


@_hookimpl(tryfirst=True)
def pytest_configure(config):
    pm = config.pluginmanager
    _STATE["pm"] = pm
    _STATE["hooks"] = dict((name, _getattr(pm.hook, name, None)) for name in _VERDICT_HOOKS)
    _STATE["hookexec"] = _getattr(pm, "_inner_hookexec", None)  # the objects, held: compared with ``is``
    send("S", "pytest", _getattr(_sys.modules.get("pytest"), "__version__", "?"), " ".join(_EARLY),
         " ".join(_RUNNER_IN_REPO))


def _hook_problems(pm):
    out = []
    if _getattr(pm, "_inner_hookexec", None) is not _STATE.get("hookexec"):
        out.append("pytest's plugin manager runs hooks through a replaced function")
    for name in _VERDICT_HOOKS:
        caller = _getattr(pm.hook, name, None)
        if caller is not _STATE["hooks"].get(name):
            out.append("the %s hook caller was replaced" % name)
            continue
        impls = caller.get_hookimpls() if caller is not None else []
        for impl in impls:
            plugin, fn = impl.plugin, impl.function
            if not pm.is_registered(plugin):
                out.append("%s runs an implementation of an unregistered plugin %r" % (name, plugin))
                continue
            attr = _getattr(plugin, _getattr(fn, "__name__", name), None)
            if attr is not None and _getattr(attr, "__func__", attr) is not _getattr(fn, "__func__", fn):
                out.append("%s runs a function that is not %r's own" % (name, plugin))
    return out


@_hookimpl(trylast=True)
def pytest_unconfigure(config):
    pm = _STATE["pm"] or config.pluginmanager
    for nodeid in list(_STATE["phases"]):  # phases with no logfinish: the test protocol was cut short
        _STATE["problems"].append("%s: reported without finishing its test protocol" % nodeid)
    finish(_SNAPSHOT, _own(), _STATE["problems"] + _hook_problems(pm))


def _own():
    return dict((k, v) for k, v in list(globals().items()) if _type(v).__name__ == "function")


_SNAPSHOT = Snapshot(_pytest_mods + [_sys.modules[__name__]], _own())
