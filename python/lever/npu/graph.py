"""One decoder layer as a static-shape ONNX graph: the unit an NPU runs.

`layer_graph(config, rows, context, dtype)` builds, with `onnx.helper`, the
same arithmetic as the native layer (csrc/model/decoder_layer.cpp), each
block feature of the config switched on by its field: RMS norm, q/k/v
projections (+ biases when the model has them), RMS norms over each q / k
head (`qk_norm`), rotate-half RoPE on the first `rotary_dims` dims of each
head, grouped-query attention (queries scaled by `query_scale`) over
`context` cached rows + `rows` new rows under an additive mask, the output
projection (+ its RMS norm, `sandwich_norms`), and the gated MLP (SiLU or
GELU-tanh, + its RMS norm).  Every shape is fixed, as an NPU compiler
wants: one graph per (rows, context) bucket.  Nothing in the graph is a
weight: the layer's tensors are graph inputs (`WEIGHT_INPUTS`), so one
graph per bucket serves every layer, fed each streamed layer's weights as
they arrive.

What differs between layers of one model is an input too, so one graph
serves every kind of layer (`ModelConfig.layer_kinds`; the layer runner,
lever.npu.layers, feeds each layer its kind's inputs): the rotary tables
(global or local RoPE base; on a NoPE layer cos = 1 and sin = 0, which
leaves q and k exactly as they are) and the mask (a sliding-window layer's
hides the keys outside its window).  Frequencies, the linear factor and
the attention factor are in the tables.

Inputs (N = rows, C = context, H = hidden, D = head_dim, R = rotary dims,
h/g = query/kv heads):
  x [N, H]            the residual stream of the bucket's rows
  cos, sin [N, R]     rotary tables of each row's position (rotate-half:
                      both halves of a row hold the same angles)
  mask [N, C + N]     additive: 0 where a row attends a column, MASKED where not
  past_k, past_v [C, g*D]   cached keys (after RoPE) and values; rows past the
                      sequence's length are padding (finite, masked out)
  weights (see WEIGHT_INPUTS), shaped as torch writes them ([out, in]).
Outputs:
  y [N, H]            the residual stream after the layer
  k_new, v_new [N, g*D]     the rows' keys (after RoPE) and values, for the cache

dtype "float32" (the CPU EP) or "float16" (the HTP): every input, output and
intermediate has it.  No torch: the graph is written op by op so the run
path and `lever compile-npu` need onnx and onnxruntime only.
"""

from __future__ import annotations


import numpy as np

from ..errors import LeverError
from ..model_config import ModelConfig, unsupported_feature

OPSET = 17
IR_VERSION = 8                     # old enough for the runtimes phones ship (a context model keeps it)
GRAPH_DTYPES = ("float32", "float16")
ACTIVATIONS = ("x", "cos", "sin", "mask", "past_k", "past_v")
WEIGHT_INPUTS = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "wg", "wu", "wd")
BIAS_INPUTS = ("bq", "bk", "bv")                           # attention_bias
QK_NORM_INPUTS = ("q_norm", "k_norm")                      # qk_norm: [D] each
SANDWICH_INPUTS = ("attn_post_norm", "ffn_post_norm")      # sandwich_norms: [H] each
GELU_C = 0.7978845608028654                                # sqrt(2 / pi): GELU's tanh approximation
OUTPUTS = ("y", "k_new", "v_new")
# The block features (ModelConfig fields with a default) a static backend computes, every value
# of them: in the graph, in its inputs (the runner's tables and masks) or around it (the native
# decoder's embedding scale and soft-cap).  A feature added to ModelConfig later is refused
# (`unsupported`) until it is computed here.
BLOCK_FIELDS = frozenset({"qk_norm", "sandwich_norms", "activation", "rope_dims", "rope_theta_local",
                          "rope_scaling", "rope_linear", "rope_freq_factors", "rope_attn_factor",
                          "sliding_window", "layer_kinds", "attn_scale", "embed_scale", "logit_softcap"})
GRAPH_ACTIVATIONS = ("silu", "gelu_tanh")

# decoder layer tensor name (lever.model_config.layer_shapes) -> graph input
TENSOR_INPUT = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk", "self_attn.v_proj.weight": "wv",
    "self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk", "self_attn.v_proj.bias": "bv",
    "self_attn.o_proj.weight": "wo",
    "post_attention_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "wg", "mlp.up_proj.weight": "wu", "mlp.down_proj.weight": "wd",
    "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    "self_attn.post_norm.weight": "attn_post_norm", "mlp.post_norm.weight": "ffn_post_norm",
}


def unsupported(cfg: ModelConfig) -> str | None:
    """The first block feature of `cfg` a static backend cannot compute, as a
    phrase ("<field>", "activation '<name>'"), or None."""
    return unsupported_feature(cfg, BLOCK_FIELDS, GRAPH_ACTIVATIONS)


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Each weight input's shape (elements, torch order); q/k/v biases, q/k
    norms and the sandwich norms when the model has them."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.n_heads * d, cfg.n_kv_heads * d
    shapes = {"attn_norm": (h,), "wq": (q, h), "wk": (kv, h), "wv": (kv, h), "wo": (h, q),
              "ffn_norm": (h,), "wg": (i, h), "wu": (i, h), "wd": (h, i)}
    if cfg.attention_bias:
        shapes.update({"bq": (q,), "bk": (kv,), "bv": (kv,)})
    if cfg.qk_norm:
        shapes.update({"q_norm": (d,), "k_norm": (d,)})
    if cfg.sandwich_norms:
        shapes.update({"attn_post_norm": (h,), "ffn_post_norm": (h,)})
    return shapes


def input_shapes(cfg: ModelConfig, rows: int, context: int) -> dict[str, tuple[int, ...]]:
    """Every graph input's shape, activations first."""
    r, kv = cfg.rotary_dims, cfg.n_kv_heads * cfg.head_dim
    shapes = {"x": (rows, cfg.hidden_size), "cos": (rows, r), "sin": (rows, r),
              "mask": (rows, context + rows), "past_k": (context, kv), "past_v": (context, kv)}
    shapes.update(weight_shapes(cfg))
    return shapes


class _Builder:
    """Collects nodes and constants; `op` returns the name of its output."""

    def __init__(self, dtype: str):
        from onnx import helper
        self.helper = helper
        self.np_dtype = np.dtype(dtype)
        self.nodes, self.inits = [], []
        self._n = 0

    def op(self, kind: str, *inputs: str, **attrs) -> str:
        self._n += 1
        out = f"{kind.lower()}_{self._n}"
        self.nodes.append(self.helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    def const(self, value, dtype=None) -> str:
        from onnx import numpy_helper
        self._n += 1
        name = f"const_{self._n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype or self.np_dtype), name))
        return name

    def shape(self, *dims: int) -> str:
        return self.const(np.asarray(dims, dtype=np.int64), np.int64)


def _rms_norm(b: _Builder, x: str, weight: str, eps: float) -> str:
    """x / sqrt(mean(x^2) + eps) * weight, as one fused RMS-norm op (onnxruntime's
    SimplifiedLayerNormalization; QNN maps it to its RmsNorm).  Written out op by
    op, float16 squares overflow beyond |x| = 255 (activations reach ~2e4 in
    SmolLM2) and the HTP's float16 reductions lose the small entries of a row."""
    return b.op("SimplifiedLayerNormalization", x, weight, axis=-1, epsilon=float(eps))


def _linear(b: _Builder, x: str, w: str, bias: str | None = None) -> str:
    """x [N, in] times w [out, in] transposed (+ bias [out])."""
    return b.op("Gemm", x, w, *([bias] if bias else []), transB=1)


def _rope(b: _Builder, x: str, heads: int, cfg: ModelConfig, cos: str, sin: str, rows: int,
          norm: str | None) -> str:
    """x [N, heads*D]: each head RMS-normed by `norm` [D] (None: not), then
    rotate-half RoPE on its first R = rotary_dims dims, x*cos + concat(-x2, x1)*sin
    (the dims past R pass through)."""
    d, r = cfg.head_dim, cfg.rotary_dims
    half = r // 2
    xh = b.op("Reshape", x, b.shape(rows, heads, d))
    if norm is not None:
        xh = _rms_norm(b, xh, norm, cfg.rms_norm_eps)
    xr = b.op("Slice", xh, b.shape(0), b.shape(r), b.shape(2)) if r < d else xh
    x1 = b.op("Slice", xr, b.shape(0), b.shape(half), b.shape(2))
    x2 = b.op("Slice", xr, b.shape(half), b.shape(r), b.shape(2))
    rotated = b.op("Concat", b.op("Neg", x2), x1, axis=2)
    c = b.op("Reshape", cos, b.shape(rows, 1, r))
    s = b.op("Reshape", sin, b.shape(rows, 1, r))
    out = b.op("Add", b.op("Mul", xr, c), b.op("Mul", rotated, s))
    if r < d:
        out = b.op("Concat", out, b.op("Slice", xh, b.shape(r), b.shape(d), b.shape(2)), axis=2)
    return b.op("Reshape", out, b.shape(rows, heads * d))


def _gate(b: _Builder, gate: str, activation: str) -> str:
    """The gate's activation (one of GRAPH_ACTIVATIONS, checked by layer_graph):
    SiLU, g * sigmoid(g), or GELU's tanh approximation
    0.5 g (1 + tanh(sqrt(2/pi) g (1 + 0.044715 g^2))) (g^2, not g^3: float16 range)."""
    if activation == "silu":
        return b.op("Mul", gate, b.op("Sigmoid", gate))
    inner = b.op("Mul", gate, b.op("Add", b.const(1.0), b.op("Mul", b.const(0.044715), b.op("Mul", gate, gate))))
    t = b.op("Tanh", b.op("Mul", b.const(GELU_C), inner))
    return b.op("Mul", b.op("Mul", b.const(0.5), gate), b.op("Add", b.const(1.0), t))


def _attention(b: _Builder, q: str, k_all: str, v_all: str, mask: str, cfg: ModelConfig,
               rows: int, context: int) -> str:
    """Grouped-query attention: q [N, h*D] over k_all, v_all [C+N, g*D] -> [N, h*D]."""
    h, g, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    group, cols = h // g, context + rows
    # query head j uses kv head j // group: heads are grouped kv-major
    q = b.op("Mul", q, b.const(cfg.query_scale))                                     # scaled first: float16 range
    qh = b.op("Transpose", b.op("Reshape", q, b.shape(rows, h, d)), perm=[1, 0, 2])    # [h, N, D]
    qg = b.op("Reshape", qh, b.shape(g, group * rows, d))                              # [g, group*N, D]
    kt = b.op("Transpose", b.op("Reshape", k_all, b.shape(cols, g, d)), perm=[1, 2, 0])  # [g, D, C+N]
    vh = b.op("Transpose", b.op("Reshape", v_all, b.shape(cols, g, d)), perm=[1, 0, 2])  # [g, C+N, D]
    scores = b.op("MatMul", qg, kt)                                                    # [g, group*N, C+N]
    scores = b.op("Add", b.op("Reshape", scores, b.shape(h, rows, cols)), mask)       # mask [N, C+N] broadcasts
    probs = b.op("Reshape", b.op("Softmax", scores, axis=-1), b.shape(g, group * rows, cols))
    out = b.op("Reshape", b.op("MatMul", probs, vh), b.shape(h, rows, d))             # [h, N, D]
    return b.op("Reshape", b.op("Transpose", out, perm=[1, 0, 2]), b.shape(rows, h * d))


def layer_graph(cfg: ModelConfig, rows: int, context: int, dtype: str = "float32"):
    """The decoder layer of `cfg` for `rows` new rows over `context` cached rows,
    as an `onnx.ModelProto` (see the module docstring for inputs and outputs)."""
    if dtype not in GRAPH_DTYPES:
        raise LeverError(f"graph dtype must be one of {', '.join(GRAPH_DTYPES)}, got {dtype!r}")
    problem = unsupported(cfg)
    if problem:
        raise LeverError(f"the static-shape graph: {problem} is not supported")
    if rows < 1 or context < 1:
        raise LeverError(f"a bucket needs rows >= 1 and context >= 1, got rows={rows}, context={context}")
    if cfg.n_heads % cfg.n_kv_heads or cfg.rotary_dims % 2:
        raise LeverError(f"unsupported head layout: {cfg.n_heads} heads over {cfg.n_kv_heads} kv heads of "
                         f"{cfg.head_dim}, {cfg.rotary_dims} rotated")
    from onnx import TensorProto, helper
    b = _Builder(dtype)
    elem = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    shapes = input_shapes(cfg, rows, context)
    bias = cfg.attention_bias
    eps = cfg.rms_norm_eps

    qk_norm = ("q_norm", "k_norm") if cfg.qk_norm else (None, None)
    n = _rms_norm(b, "x", "attn_norm", eps)
    q = _rope(b, _linear(b, n, "wq", "bq" if bias else None), cfg.n_heads, cfg, "cos", "sin", rows, qk_norm[0])
    k_new = _rope(b, _linear(b, n, "wk", "bk" if bias else None), cfg.n_kv_heads, cfg, "cos", "sin", rows,
                  qk_norm[1])
    v_new = _linear(b, n, "wv", "bv" if bias else None)
    b.nodes.append(helper.make_node("Identity", [k_new], ["k_new"]))
    b.nodes.append(helper.make_node("Identity", [v_new], ["v_new"]))
    k_all = b.op("Concat", "past_k", k_new, axis=0)
    v_all = b.op("Concat", "past_v", v_new, axis=0)
    attn = _attention(b, q, k_all, v_all, "mask", cfg, rows, context)
    a = _linear(b, attn, "wo")
    if cfg.sandwich_norms:
        a = _rms_norm(b, a, "attn_post_norm", eps)
    x1 = b.op("Add", "x", a)
    m = _rms_norm(b, x1, "ffn_norm", eps)
    act = b.op("Mul", _gate(b, _linear(b, m, "wg"), cfg.activation), _linear(b, m, "wu"))
    out = _linear(b, act, "wd")
    if cfg.sandwich_norms:
        out = _rms_norm(b, out, "ffn_post_norm", eps)
    b.nodes.append(helper.make_node("Add", [x1, out], ["y"]))

    kv = cfg.n_kv_heads * cfg.head_dim
    inputs = [helper.make_tensor_value_info(name, elem, list(shape)) for name, shape in shapes.items()]
    outputs = [helper.make_tensor_value_info("y", elem, [rows, cfg.hidden_size]),
               helper.make_tensor_value_info("k_new", elem, [rows, kv]),
               helper.make_tensor_value_info("v_new", elem, [rows, kv])]
    graph = helper.make_graph(b.nodes, f"lever_layer_r{rows}_c{context}", inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              producer_name="lever")
    model.ir_version = IR_VERSION
    return model
