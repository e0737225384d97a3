# The agent's entry point, also the zipapp's __main__.py (tui/remote/bundle.py). Its first lines
# run on whatever Python the host has: written for any Python 2.7 or 3, they check the version
# before any agent module (3.9 syntax) is imported, and say what is wrong where it is wrong.
import sys

MIN_PYTHON = (3, 9)

if sys.version_info[:2] < MIN_PYTHON:  # noqa: UP036 (the point: run on an old Python to say so)
    sys.stderr.write("rigdeck agent: needs Python %d.%d or newer; %s is Python %s\n" % (
        MIN_PYTHON + (sys.executable or "this interpreter", sys.version.split()[0])))
    sys.exit(4)

from agent.entry import run  # noqa: E402  # the internal commands a job starts many of

code = run(sys.argv[1:])
if code is None:
    from agent.cli import main

    code = main()
sys.exit(code)
