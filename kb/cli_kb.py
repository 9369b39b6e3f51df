"""`remedy kb ...`, `remedy query`, `remedy case show` (knowledge-base issue)."""


def register(app, kb_app, case_app) -> None:
    """Attach the KB commands."""
