"""Suite-wide setup: offline model loading, one torch thread, no telemetry."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.pop("REMEDY_KB", None)
os.environ.pop("REMEDY_LM", None)
os.environ.pop("REMEDY_SERVER", None)  # the CLI would go through a service instead of --kb
os.environ.pop("REMEDY_TOKEN", None)
