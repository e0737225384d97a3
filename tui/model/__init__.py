"""model room of the controller side (see docs/architecture.md)."""
