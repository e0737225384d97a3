"""rigdeck host agent: runs on each GPU host (Python 3.9+, stdlib at import time)."""
