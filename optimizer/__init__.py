"""Prompt-program optimization jobs against verified outcomes (DSPy). Not built yet: see the README."""

__all__: list[str] = []
