"""A Python program started once and forked once per run, so each run skips the interpreter's start-up and the
imports it shares with the others (EvalScope's `perf` costs about 1.7 s of CPU to import, paid by every point).

Run as a script by whichever interpreter the program needs (a pinned client's own environment included), so it
imports nothing but the standard library:

    PYTHON forkserver.py MODULE [MODULE ...]

It imports the MODULEs it can (one it cannot is left to the run, which then imports it itself), answers
{"ready": true}, then reads one JSON request per line from stdin: {"argv": [...], "log": PATH, "env": {...},
"cwd": PATH} where argv is what follows the interpreter on a command line (`-m MODULE ARG...` or `SCRIPT
ARG...`). Per request it forks a child that becomes the leader of a new session, dies with the server (which dies
with whoever started it), writes stdout and stderr to the log, takes the request's environment and folder and runs
the module or script as `__main__`, exactly what the command line would run. The server answers {"pid": N} once
the child is started and {"pid": N, "returncode": R} once it has ended; one run at a time. It ends when stdin
closes.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import json
import os
import runpy
import signal
import sys
import traceback

PR_SET_PDEATHSIG = 1


def _answer(out, **fields) -> None:
    out.write(json.dumps(fields) + "\n")
    out.flush()


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # what `sys.exit("message")` prints before exiting 1
    return 1


def _child(request: dict, server_pid: int, protocol: list) -> None:
    """Become the run; never returns."""
    code = 1
    try:
        os.setsid()
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != server_pid:
            os._exit(1)  # the server died before the setting took hold
        for stream in protocol:
            stream.close()
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        argv = list(request["argv"])
        if argv[0] == "-m":
            # as on a command line: the folder first on the path, the module not imported before it runs as
            # __main__ (runpy warns otherwise)
            sys.path.insert(0, os.getcwd())
            sys.modules.pop(argv[1], None)
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.realpath(argv[0])))  # the script's folder, as on a command line
            sys.argv = argv
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001  (the run's own failure: printed into its log, as Python would)
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> int:
    # Python put this file's folder first on the path: harness's own modules (config, schema, report, ...)
    # would shadow any top-level module of that name the program imports.
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.dirname(os.path.realpath(__file__)):
        sys.path.pop(0)
    # The protocol gets its own descriptors; fd 1 becomes fd 2, so what an import prints cannot corrupt it.
    requests = os.fdopen(os.dup(0), "r")
    answers = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    for module in sys.argv[1:]:
        try:
            importlib.import_module(module)
        except BaseException:  # noqa: BLE001  (left to the run, whose log then shows why)
            traceback.print_exc()
    _answer(answers, ready=True)
    server_pid = os.getpid()
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, server_pid, [requests, answers])
        _answer(answers, pid=pid)
        _, status = os.waitpid(pid, 0)
        _answer(answers, pid=pid, returncode=os.waitstatus_to_exitcode(status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
