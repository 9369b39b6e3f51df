"""`remedy patch check`."""


def register(patch_app) -> None:
    """Attach the patch commands."""
