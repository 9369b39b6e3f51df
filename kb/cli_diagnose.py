"""`remedy diagnose`, `remedy fix`, `remedy bench run|curve`, `remedy demo`."""


def register(app, bench_app) -> None:
    """Attach the diagnosis commands."""
