"""`remedy verify` and `remedy bench build`."""


def register(app, bench_app) -> None:
    """Attach the verification commands."""
