"""The ``rigdeck`` command: the app with no arguments, the CLI's headless commands otherwise.

The one place that knows both faces: the CLI (``tui.cli``) never imports the app, so a command
that prints text loads no Textual, and the app is handed to it here as an opener.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from tui.cli.main import main as cli_main


def open_app(client: Any, onboarding: Any) -> None:
    from tui.app.shell import RigdeckApp  # only when the app opens: the commands never load Textual

    RigdeckApp(client, onboarding=onboarding).run()


def main(argv: Sequence[str] | None = None) -> int:
    return cli_main(argv, open_app=open_app)


if __name__ == "__main__":
    sys.exit(main())
