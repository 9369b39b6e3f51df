"""The bundled all-MiniLM-L6-v2 run by ONNX Runtime: the service's encoder, twice as fast as numpy.

The service spends most of a query's CPU encoding it (one 54-token summary is about 1.1 GFLOP).
This module runs the same BERT forward pass as :mod:`.light_embedder` (same weight file, same
tokenizer, same mean pooling and unit norm) as an ONNX graph built here, in memory, from the
memory-mapped ``model.safetensors``: nothing is exported through torch, written to disk or
downloaded. ONNX Runtime fuses the bias, GELU and skip-layer-norm steps the numpy pass runs one
by one, runs the whole pass without the GIL, and its matrix kernels suit these small products:
one query 7.6 ms on one thread against 15 ms in numpy (quiet 2-core machine,
``bench/service.py --encoders``). ``tests/retrieval/test_onnx_embedder.py`` holds it to the other
two encoders: cosine >= 0.999 and the same top-10 on every bundled example.

Building the graph and the session takes about 0.4 s and ``import onnxruntime`` more, so the cold
CLI keeps the numpy encoder; a long-running service pays it once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .light_embedder import _NAME, load_tokenizer, mapped_weights, minilm_path

__all__ = ["OnnxMiniLMEmbedder", "minilm_onnx_graph"]

#: sentences per ONNX Runtime call: a padded batch costs its longest sentence's length for every row,
#: so a large batch is split (after sorting by length) into runs of this many
ONNX_BATCH = 8
_OPSET = 20  # LayerNormalization (17) and Gelu (20) as single standard operators


def minilm_onnx_graph(folder: Path) -> bytes:
    """A serialized ONNX model of BERT + mean pooling for the weights in ``folder``.

    Inputs ``input_ids`` and ``attention_mask`` (int64, batch x length, padded with mask 0);
    output ``pooled`` (float32, batch x hidden), the mask-weighted mean of the last layer's
    token states (not yet unit-norm).
    """
    from onnx import TensorProto, helper, numpy_helper

    config = json.loads((folder / "config.json").read_text())
    heads, layers, eps = (
        int(config["num_attention_heads"]),
        int(config["num_hidden_layers"]),
        float(config["layer_norm_eps"]),
    )
    hidden = int(config["hidden_size"])
    w = mapped_weights(folder)
    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: Any, dtype: Any = np.int64) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(np.asarray(value, dtype=dtype)), name))
        return name

    def op(kind: str, inputs: list[str], outputs: list[str] | None = None, **attrs: Any) -> str:
        outs = outputs or [f"{kind}_{len(nodes)}"]
        nodes.append(helper.make_node(kind, inputs, outs, **attrs))
        return outs[0]

    def linear(x: str, name: str, weight: np.ndarray, bias: np.ndarray) -> str:
        # torch's Linear stores (out, in); MatMul wants (in, out)
        return op(
            "Add", [op("MatMul", [x, const(f"{name}.wT", weight.T, np.float32)]), const(f"{name}.b", bias, np.float32)]
        )

    def layer_norm(x: str, name: str) -> str:
        gamma, beta = (
            const(f"{name}.g", w[f"{name}.weight"], np.float32),
            const(f"{name}.b", w[f"{name}.bias"], np.float32),
        )
        return op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps)

    def dense(x: str, name: str) -> str:
        return linear(x, name, w[f"{name}.weight"], w[f"{name}.bias"])

    # embeddings: word + position (the first `length` rows) + token type 0, then layer norm
    length = op("Slice", [op("Shape", ["input_ids"]), const("one", [1]), const("two", [2])])
    word = op("Gather", [const("word", w["embeddings.word_embeddings.weight"], np.float32), "input_ids"])
    pos_table = const("pos", w["embeddings.position_embeddings.weight"], np.float32)
    pos = op("Slice", [pos_table, const("zero", [0]), length, const("axis0", [0])])
    x = op("Add", [op("Add", [word, pos]), const("type0", w["embeddings.token_type_embeddings.weight"][0], np.float32)])
    x = layer_norm(x, "embeddings.LayerNorm")
    # attention mask: 0 on real keys, -10000 on padding (BERT's additive mask), shape batch x 1 x 1 x length
    mask = op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    keys = op("Unsqueeze", [mask, const("axes12", [1, 2])])
    additive = op("Mul", [op("Sub", [keys, const("onef", 1.0, np.float32)]), const("big", 10000.0, np.float32)])
    d = hidden // heads
    split, to_heads, to_hidden = (
        const("split", [hidden] * 3),
        const("heads", [0, 0, heads, d]),
        const("hid", [0, 0, hidden]),
    )
    scale = const("scale", 1.0 / np.sqrt(d), np.float32)
    for i in range(layers):
        p = f"encoder.layer.{i}"
        s = f"{p}.attention.self"
        qkv_w = np.concatenate([w[f"{s}.{n}.weight"] for n in ("query", "key", "value")])
        qkv_b = np.concatenate([w[f"{s}.{n}.bias"] for n in ("query", "key", "value")])
        q, k, v = (f"{s}.{n}" for n in "qkv")
        op("Split", [linear(x, f"{s}.qkv", qkv_w, qkv_b), split], [q, k, v], axis=-1)
        q = op("Transpose", [op("Reshape", [q, to_heads])], perm=[0, 2, 1, 3])
        k = op("Transpose", [op("Reshape", [k, to_heads])], perm=[0, 2, 3, 1])
        v = op("Transpose", [op("Reshape", [v, to_heads])], perm=[0, 2, 1, 3])
        scores = op("Add", [op("Mul", [op("MatMul", [q, k]), scale]), additive])
        ctx = op("MatMul", [op("Softmax", [scores], axis=-1), v])
        ctx = op("Reshape", [op("Transpose", [ctx], perm=[0, 2, 1, 3]), to_hidden])
        x = layer_norm(op("Add", [x, dense(ctx, f"{p}.attention.output.dense")]), f"{p}.attention.output.LayerNorm")
        ff = dense(op("Gelu", [dense(x, f"{p}.intermediate.dense")]), f"{p}.output.dense")
        x = layer_norm(op("Add", [x, ff]), f"{p}.output.LayerNorm")
    # mean over the real tokens
    weights = op("Unsqueeze", [mask, const("axis2", [2])])
    total = op("ReduceSum", [op("Mul", [x, weights]), const("axis1", [1])], keepdims=0)
    op("Div", [total, op("ReduceSum", [mask, "axis1"], keepdims=1)], ["pooled"])
    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2",
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "length"])
            for n in ("input_ids", "attention_mask")
        ],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
    model.ir_version = 10  # what onnxruntime 1.2x reads
    return bytes(model.SerializeToString())


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 through ONNX Runtime: an :class:`~remedy.retrieval.embedder.Embedder`.

    Same name, dimension and vectors (to float32 rounding) as the numpy and sentence-transformers
    encoders, so an index built by any of them is searched by the others. Thread-safe.

    ``threads`` is ONNX Runtime's intra-op pool (default: up to 2 cores); ``spin`` lets its
    threads spin between operators (faster alone, but the spinning takes CPU that HTTP handling
    in the same process needs, so the service keeps it off).
    """

    name: str = _NAME
    dim: int = 384

    def __init__(self, threads: int | None = None, *, spin: bool = False, folder: Path | None = None) -> None:
        import onnxruntime as ort

        folder = folder or minilm_path()
        self._tokenizer = load_tokenizer(folder)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or max(1, min(2, os.cpu_count() or 1))
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        options.log_severity_level = 3  # errors only: the optimizer's notes are not for users
        self._session = ort.InferenceSession(minilm_onnx_graph(folder), options, providers=["CPUExecutionProvider"])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``; float32 ``(len(texts), 384)``, rows unit-norm; empty input gives ``(0, 384)``."""
        texts = list(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        seqs = [e.ids for e in self._tokenizer.encode_batch(texts)]
        order = sorted(range(len(texts)), key=lambda i: len(seqs[i]))  # similar lengths pad little
        for start in range(0, len(order), ONNX_BATCH):
            idx = order[start : start + ONNX_BATCH]
            out[idx] = self._pooled([seqs[i] for i in idx])
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)

    def _pooled(self, seqs: list[list[int]]) -> np.ndarray:
        width = max(len(s) for s in seqs)
        ids = np.zeros((len(seqs), width), dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for row, s in enumerate(seqs):
            ids[row, : len(s)] = s
            mask[row, : len(s)] = 1
        return np.asarray(self._session.run(["pooled"], {"input_ids": ids, "attention_mask": mask})[0])
