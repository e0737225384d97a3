"""rigdeck runtime: what training ranks import (stdlib at import time; torch loaded lazily)."""
