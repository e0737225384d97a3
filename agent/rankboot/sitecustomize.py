"""Loaded by Python's ``site`` at the start of every Python process of a rank: the rank wrapper
(agent/rankexec.py) puts this directory first on the rank's PYTHONPATH and names, in
``RIGDECK_STACKS_DIR``, where the rank's stacks go.

It arms ``faulthandler`` on SIGUSR1: when rigdeck finds a job hung it signals each armed process
(agent/stacks.py), which writes every thread's Python stack into ``<dir>/pid-<pid>.txt`` from
inside the interpreter, even while the main thread is blocked in a collective call. The pid file
also tells the agent which processes are armed: a process without one is never signalled (its
default action for SIGUSR1 would kill it).

Then it hands over to the ``sitecustomize`` that would have loaded without this one (a conda or
virtualenv's own), so nothing of the user's environment is lost. Stdlib only, Python 3.9+; it
never raises: a rank must start whatever happens here.
"""
import os
import sys

_files = []  # type: list  # the dump files stay open for the life of the process: faulthandler writes to their fds


def _arm():
    target = os.environ.get("RIGDECK_STACKS_DIR")
    if not target:
        return
    try:
        import faulthandler
        import signal

        os.makedirs(target, exist_ok=True)
        # What faulthandler puts back when the interpreter finalizes: from then on a stack signal
        # is ignored instead of ending the process by SIGUSR1's default action (a rank slow to exit
        # after its last step, signalled for its stacks then, would otherwise die by signal 10).
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        f = open(os.path.join(target, "pid-%d.txt" % os.getpid()), "a")
        faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)
        _files.append(f)
        import atexit

        atexit.register(_exiting, target)  # the first hook registered: it runs after the user's
    except Exception:  # noqa: BLE001  # a rank without stacks still runs
        pass


def _exiting(target):
    """At the interpreter's exit: ``<dir>/exiting-<pid>`` says this process has left its program
    and is on its way out, so a watch does not judge its silence a hang (agent/stacks.py)."""
    try:
        os.close(os.open(os.path.join(target, "exiting-%d" % os.getpid()), os.O_WRONLY | os.O_CREAT, 0o644))
    except Exception:  # noqa: BLE001
        pass


_held = []  # type: list  # a warm standby's GPU claim descriptors, held for the life of the process


def _warm(names):
    """A standby's imports (its own thread's work: ``_standby``)."""
    import importlib
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass

    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  # the script's own import says it again, in its log
            pass


def _standby():
    """A warm standby (agent/standby.py): import what the script imports, then wait for the
    attempt that adopts this process: its environment, working directory and GPU claims. An end
    of the socket without them: nobody will, exit quietly."""
    fd = os.environ.pop("RIGDECK_STANDBY_FD", None)
    names = os.environ.pop("RIGDECK_STANDBY_IMPORTS", "")
    if fd is None:
        return
    import json
    import socket
    import threading

    # The imports run in a thread of the lowest priority (nice 19: a Linux thread has its own),
    # so a standby takes the CPU the job's ranks leave: a job that uses every core runs on as
    # fast while its standbys warm up. This thread, the one the rank then runs in, keeps its own.
    warm = threading.Thread(target=_warm, args=([n for n in names.split(",") if n],), name="rigdeck-standby",
                            daemon=True)
    warm.start()
    warm.join()
    sock = None
    try:
        sock = socket.socket(fileno=int(fd))
        sock.sendall(b"R")  # ready: the imports are done (the wrapper may have adopted us already)
    except Exception:  # noqa: BLE001  # its go is what counts
        pass
    fds = []
    body = bytearray()
    try:
        if sock is None:
            raise OSError("no socket")
        first, fds, _flags, _addr = socket.recv_fds(sock, 65536, 64)
        body.extend(first)
        while True:
            data = sock.recv(65536)
            if not data:
                break
            body.extend(data)
        sock.close()
        go = json.loads(bytes(body).decode()) if body else None
    except Exception:  # noqa: BLE001
        go = False if body else None  # a message cut short or unreadable: adopted, failing
    if go is None:
        os._exit(0)  # nothing came: the standby ended without an adoption
    if not isinstance(go, dict) or not isinstance(go.get("env"), dict):
        sys.stderr.write("rigdeck standby: the adoption's message cannot be read\n")
        os._exit(1)  # adopted, but not told what to run: the rank fails, it does not pass
    _held.extend(fds)
    os.environ.clear()
    os.environ.update(go["env"])
    os.chdir(go["cwd"])


def _chain():
    """Import the next ``sitecustomize`` on sys.path, as site would have without this one."""
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.pop(__name__, None)
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError as e:
        if getattr(e, "name", None) != "sitecustomize":  # theirs exists and failed inside
            import traceback

            traceback.print_exc()
    except Exception:  # noqa: BLE001  # theirs failing is theirs: site would print it and go on
        import traceback

        traceback.print_exc()
    finally:
        sys.path[:] = saved
        if me is not None and "sitecustomize" not in sys.modules:
            sys.modules[__name__] = me


if __name__ == "sitecustomize":
    _standby()
    _arm()
    _chain()
