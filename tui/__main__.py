"""python -m tui: the rigdeck command."""

import sys

from tui.main import main

sys.exit(main())
