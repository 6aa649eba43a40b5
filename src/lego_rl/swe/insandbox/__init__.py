"""Code the grader copies into its sandbox; lego never imports these modules itself.

* ``supervisor.py`` runs as root with ``python3 -I -S``: it starts the test command as ``eval_user``, holds the
  reading end of the per-test channel, seals every record it forwards with a key only it and the host know,
  enforces the timeout and kills every process the command left before it exits.
* ``shim_common.py`` + ``shim_pytest.py`` (a pytest plugin loaded with ``-p``) or ``shim_common.py`` +
  ``shim_unittest.py`` (the main that replaces ``-m unittest``): the runner side, joined into one file under
  an unguessable name, loaded before any repository code; it sends one record per test as the test finishes
  and checks, at the end, that what it relied on was not replaced.

They run under whatever Python the task image has (3.6 and later), so they use nothing newer.
docs/grading.md ("Trust model") says what each part defends against and what stays reachable.
"""
