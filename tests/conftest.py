"""Suite-wide setup: offline model loading, one torch thread, no telemetry."""

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH_DIR = Path(__file__).parents[1] / "bench"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.pop("REMEDY_KB", None)
os.environ.pop("REMEDY_LM", None)
os.environ.pop("REMEDY_SERVER", None)  # the CLI would go through a service instead of --kb
os.environ.pop("REMEDY_TOKEN", None)


@pytest.fixture
def bench_script():
    """Load a script of ``bench/`` as a module: ``bench_script("crash")`` (tests that run a bounded bench)."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"remedy_bench_{name}", BENCH_DIR / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module

    return load
