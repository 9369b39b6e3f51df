"""Meta-rule mining, review state and report rendering. Not built yet: see the README."""

__all__: list[str] = []
