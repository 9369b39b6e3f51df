"""Calibration bench, shared: rates with their Wilson intervals, and where the figures go (``bench/out``)."""

from __future__ import annotations

from pathlib import Path

from scipy.stats import binomtest

OUT = Path(__file__).resolve().parent / "out"
JSON_PATH = OUT / "calibration.json"
REAL_JSONL = OUT / "calibration_real.jsonl"


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson 95% interval of a rate k/n (scipy's binomtest)."""
    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def rate(k: int, n: int) -> dict:
    """A rate with its Wilson interval, JSON-ready."""
    low, high = wilson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else float("nan"), "low": low, "high": high}


def fmt(r: dict) -> str:
    return f"{r['rate']:6.2%} [{r['low']:5.1%}, {r['high']:5.1%}]"
