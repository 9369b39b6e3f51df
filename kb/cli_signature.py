"""`remedy signature RUN_DIR`."""


def register(app) -> None:
    """Attach the signature command."""
