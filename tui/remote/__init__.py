"""remote room of the controller side (see docs/architecture.md).

Every module here that speaks SSH imports paramiko, whose ``paramiko.config`` imports ``invoke``
(a paramiko dependency since 4.0) only to run the ``Match exec`` lines of an ssh_config. That
import costs every rigdeck command about 80 ms before it can reach a host, so ``invoke`` is
deferred: until something asks it for a name (``invoke.Context``), ``sys.modules`` holds a stand-in
module whose ``__getattr__`` (PEP 562) imports the real one then and answers from it. A plain
``importlib.util.LazyLoader`` would not do: ``import invoke`` reads the module's ``__spec__``,
which runs it at once.

paramiko before 3.5 reads ciphers that newer ``cryptography`` releases moved to their
``decrepit`` module (TripleDES, Blowfish), and each read warns on stderr at import: every rigdeck
command on such a paramiko (the oldest the pin allows is 3.4.0) would start with two lines of
``CryptographyDeprecationWarning`` before its own output. Those warnings, raised from paramiko's
modules, are not shown; any other warning is."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import warnings
from typing import Any

# Only those ciphers' moves, and only where paramiko's own code reads them.
PARAMIKO_CIPHER_WARNINGS = r"(TripleDES|Blowfish|CAST5|IDEA|SEED) has been (moved|deprecated)"
warnings.filterwarnings("ignore", message=PARAMIKO_CIPHER_WARNINGS, module=r"paramiko(\.|$)")


def _deferred(name: str) -> None:
    """``import name`` answered now by a stand-in that imports ``name`` on its first use."""
    if name in sys.modules:
        return
    try:
        if importlib.util.find_spec(name) is None:
            return  # not installed: the importer's own ImportError path stands
    except (ImportError, ValueError):
        return
    stand_in = types.ModuleType(name, f"{name}, imported on first use (tui.remote)")

    def __getattr__(attr: str) -> Any:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
        real = importlib.import_module(name)
        value = getattr(real, attr)
        setattr(stand_in, attr, value)
        return value

    stand_in.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[name] = stand_in


_deferred("invoke")
