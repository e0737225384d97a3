"""python -m tui.cli: the rigdeck command."""

import sys

from tui.cli.main import main

sys.exit(main())
