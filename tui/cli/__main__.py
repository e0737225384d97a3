"""python -m tui.cli: the rigdeck command, the app included (the contract that keeps the CLI from
the app lets this one module through to ``tui.main``)."""

import sys

from tui.main import main

sys.exit(main())
