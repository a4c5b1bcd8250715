"""Hugging Face front-end: a `config.json` + safetensors folder -> an `isa.graph.Graph`.

Supports GPT-2 (GPT2LMHeadModel), Llama (LlamaForCausalLM: RMSNorm, RoPE, SwiGLU, grouped-
query attention, tied or untied LM head) and BERT (BertModel, and BertForMaskedLM whose encoder
is read: the output is last_hidden_state). The math follows transformers 5's modeling files;
anything those models can be configured to do that the graph would not reproduce is refused
with one line (FrontendError) rather than silently approximated.

Weights are referenced, not read: only the safetensors headers are parsed, to check that every
tensor exists with the expected shape. Graph weight names are family-independent
(docs/graph.md, "Weight naming"), each WeightRef records the HF key it comes from.
"""

from __future__ import annotations

import json
from pathlib import Path

from wse_emu.isa.graph import T, Graph, GraphBuilder, GraphConfig, GraphError, Op, WeightRef
from wse_emu.isa.tensors import TensorError, safetensors_index

SUPPORTED_ARCHITECTURES = {
    "GPT2LMHeadModel": "gpt2",
    "LlamaForCausalLM": "llama",
    "BertModel": "bert",
    "BertForMaskedLM": "bert",
}
_FAMILY_ARCHITECTURE = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "bert": "BertModel"}
_CONFIG_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_STORED_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
# transformers' activation names -> graph ops, for the ones whose math the graph reproduces.
_GELUS = {"gelu_new": Op.GELU_TANH, "gelu_pytorch_tanh": Op.GELU_TANH,
          "gelu_python_tanh": Op.GELU_TANH, "gelu": Op.GELU_ERF, "gelu_python": Op.GELU_ERF}


class FrontendError(ValueError):
    """A model folder this front-end cannot read; the message is one line naming the problem."""


class _Config:
    """config.json with typed accessors whose errors name the file and the key."""

    def __init__(self, folder: Path):
        self.path = folder / "config.json"
        try:
            self.raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            raise FrontendError(f"{self.path}: no such file (expected a Hugging Face model "
                                f"folder)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise FrontendError(f"{self.path}: not valid JSON ({e})") from None
        if not isinstance(self.raw, dict):
            raise FrontendError(f"{self.path}: expected a JSON object")
        dtype = self.raw.get("dtype", self.raw.get("torch_dtype")) or "float32"
        if dtype not in _CONFIG_DTYPES:
            raise FrontendError(f"{self.path}: dtype {dtype!r} is not supported "
                                f"(supported: {', '.join(_CONFIG_DTYPES)})")
        self.dtype = _CONFIG_DTYPES[dtype]

    def fail(self, msg: str):
        raise FrontendError(f"{self.path}: {msg}")

    def get(self, key: str, default=None):
        value = self.raw.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None) -> int:
        value = self.get(key, default)
        if value is None:
            self.fail(f"missing key '{key}'")
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            self.fail(f"'{key}' must be a positive integer, got {value!r}")
        return value

    def float(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            self.fail(f"'{key}' must be a positive number, got {value!r}")
        return float(value)

    def refuse(self, key: str, unsupported, why: str) -> None:
        if self.get(key) == unsupported:
            self.fail(f"'{key}': {unsupported!r} is not supported ({why})")

    def choose(self, key: str, default: str, table: dict):
        value = self.get(key, default)
        if value not in table:
            self.fail(f"'{key}' = {value!r} is not supported (supported: {', '.join(table)})")
        return table[value]


class _Tensors:
    """The tensors of the folder's safetensors file(s), by key: (file, dtype, shape).

    In shape-only mode there are none, and `ref` returns shape-only WeightRefs.
    """

    def __init__(self, folder: Path, dtype: str, shape_only: bool):
        self.dtype = dtype
        self.prefix = ""
        self.index: dict[str, tuple[Path, str, tuple[int, ...]]] | None = None
        self.where = str(folder / "model.safetensors")
        if shape_only:
            return
        single, sharded = folder / "model.safetensors", folder / "model.safetensors.index.json"
        if single.is_file():
            files = [single]
        elif sharded.is_file():
            self.where = str(sharded)
            try:
                weight_map = json.loads(sharded.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise FrontendError(f"{sharded}: not a safetensors index ({e})") from None
            files = sorted({folder / name for name in weight_map.values()})
        else:
            raise FrontendError(f"{folder}: no model.safetensors (or model.safetensors.index"
                                f".json); compile with --shape-only (Python: shape_only=True) to build "
                                f"from config.json alone")
        self.index = {}
        for path in files:
            try:
                header, _ = safetensors_index(path)
            except TensorError as e:
                raise FrontendError(str(e)) from None
            _check_complete(path, header, _)
            for key, info in header.items():
                if key != "__metadata__":
                    self.index[key] = (path, info.get("dtype"), tuple(info.get("shape", ())))

    def choose_prefix(self, prefixes: tuple[str, ...], anchor: str) -> None:
        """The prefix the base model's keys carry in this file (`transformer.`, `model.`...)."""
        if self.index is None:
            return
        for p in prefixes:
            if p + anchor in self.index:
                self.prefix = p
                return
        tried = ", ".join(repr(p + anchor) for p in prefixes[1:])
        raise FrontendError(f"{self.where}: tensor '{prefixes[0] + anchor}' is missing "
                            f"(also tried {tried})")

    def ref(self, key: str, stored: tuple[int, ...], *, transpose: bool = False,
            rows: tuple[int, int] | None = None, shape: tuple[int, ...] | None = None,
            base: bool = True) -> WeightRef:
        """The WeightRef of HF tensor `key`, expected stored as `stored`, seen through the view."""
        logical = tuple(reversed(stored)) if transpose else tuple(stored)
        if rows is not None:
            logical = (rows[1] - rows[0],) + logical[1:]
        logical = shape or logical
        if self.index is None:
            return WeightRef(logical, self.dtype)
        full_key = (self.prefix if base else "") + key
        if full_key not in self.index:
            raise FrontendError(f"{self.where}: tensor '{full_key}' is missing")
        path, st_dtype, found = self.index[full_key]
        if found != tuple(stored):
            raise FrontendError(f"{path}: tensor '{full_key}' has shape {list(found)}, expected "
                                f"{list(stored)}")
        if st_dtype not in _STORED_DTYPES:
            raise FrontendError(f"{path}: tensor '{full_key}' has dtype {st_dtype}, supported: "
                                f"{', '.join(_STORED_DTYPES)}")
        return WeightRef(logical, _STORED_DTYPES[st_dtype], str(path.resolve()), full_key,
                         transpose, rows)


def _check_complete(path: Path, header: dict, base: int) -> None:
    """FrontendError now, at compile time, for a safetensors file shorter than its header
    says (a download cut short): every tensor's bytes must lie inside the file."""
    try:
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (KeyError, TypeError, ValueError, IndexError):
        raise FrontendError(f"{path}: not a safetensors file (a tensor without data_offsets)") \
            from None
    need, size = base + max(ends, default=0), path.stat().st_size
    if size < need:
        raise FrontendError(f"{path}: truncated: {size:,} bytes, its header describes "
                            f"{need:,} (download it again)")


_CHECKPOINT_DTYPES = {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "float32": "fp32",
                      "float16": "fp16", "bfloat16": "bf16"}


def checkpoint_dtype(model_dir, shape_only: bool = False) -> str | None:
    """The storage dtype a model's checkpoint uses ("fp32", "fp16", "bf16"), the default of
    `compile --dtype`: that of its floating-point matrices (the most bytes of them), or with
    shape_only config.json's torch_dtype (dtype); None when unknown (not an HF folder)."""
    folder = Path(model_dir)
    if not (folder / "config.json").is_file():
        return None
    if not shape_only:
        try:
            tensors = _Tensors(folder, "f32", False)
        except FrontendError:
            tensors = None  # the compile says what is wrong
        if tensors is not None and tensors.index:
            size: dict[str, int] = {}
            for _, st, shape in tensors.index.values():
                if st in _CHECKPOINT_DTYPES:
                    n = 1
                    for d in shape:
                        n *= int(d)
                    size[_CHECKPOINT_DTYPES[st]] = size.get(_CHECKPOINT_DTYPES[st], 0) + n
            if size:
                return max(size, key=size.get)
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = raw.get("torch_dtype", raw.get("dtype")) if isinstance(raw, dict) else None
    return _CHECKPOINT_DTYPES.get(value) if isinstance(value, str) else None


def load_hf(model_dir, shape_only: bool = False, max_context: int | None = None) -> Graph:
    """The graph of the Hugging Face model in `model_dir` (config.json + model.safetensors).

    shape_only builds the same graph from config.json alone (WeightRefs without file or key,
    in the config's dtype). max_context (default: the model's max positions) sizes the KV
    caches. Raises FrontendError (one line) for anything unsupported or inconsistent.
    """
    folder = Path(model_dir)
    cfg = _Config(folder)
    family = _family(cfg)
    tensors = _Tensors(folder, cfg.dtype, shape_only)
    try:
        return _BUILDERS[family](cfg, tensors, max_context)
    except GraphError as e:
        raise FrontendError(f"{folder}: the model does not make a valid graph: {e}") from None


def _family(cfg: _Config) -> str:
    archs = cfg.get("architectures", [])
    model_type = cfg.get("model_type")
    supported = ", ".join(SUPPORTED_ARCHITECTURES)
    if archs:
        arch = archs[0] if isinstance(archs, list) else archs
        if not isinstance(arch, str) or arch not in SUPPORTED_ARCHITECTURES:
            cfg.fail(f"unsupported architecture '{arch}' (supported: {supported})")
        family = SUPPORTED_ARCHITECTURES[arch]
        if model_type is not None and model_type != family:
            cfg.fail(f"architecture '{arch}' does not match model_type '{model_type}'")
        return family
    if not isinstance(model_type, str) or model_type not in _FAMILY_ARCHITECTURE:
        cfg.fail(f"unsupported model_type {model_type!r} (supported: "
                 f"{', '.join(_FAMILY_ARCHITECTURE)}; architectures: {supported})")
    return model_type


def _context(cfg: _Config, max_context, positions: int, learned: bool) -> int:
    if max_context is None:
        return positions
    if not isinstance(max_context, int) or isinstance(max_context, bool) or max_context <= 0:
        raise FrontendError(f"max_context must be a positive int, got {max_context!r}")
    if learned and max_context > positions:
        cfg.fail(f"max_context {max_context} exceeds the model's {positions} learned positions")
    return max_context


def _heads(cfg: _Config, hidden: int, heads: int) -> int:
    if hidden % heads:
        cfg.fail(f"hidden size {hidden} is not a multiple of {heads} attention heads")
    return hidden // heads


def _linear(b: GraphBuilder, x: int, name: str, weight: WeightRef,
            bias: WeightRef | None = None) -> int:
    args = [x, b.weight(f"{name}.weight", weight)]
    if bias is not None:
        args.append(b.weight(f"{name}.bias", bias))
    return b.op(Op.MATMUL, *args, name=name)


def _layernorm(b: GraphBuilder, tensors: _Tensors, x: int, name: str, key: str, hidden: int,
               eps: float) -> int:
    w = b.weight(f"{name}.weight", tensors.ref(f"{key}.weight", (hidden,)))
    bias = b.weight(f"{name}.bias", tensors.ref(f"{key}.bias", (hidden,)))
    return b.op(Op.LAYERNORM, x, w, bias, name=name, eps=eps)


def _gpt2(cfg: _Config, tensors: _Tensors, max_context) -> Graph:
    hidden, layers = cfg.int("n_embd"), cfg.int("n_layer")
    heads, vocab, positions = cfg.int("n_head"), cfg.int("vocab_size"), cfg.int("n_positions")
    inner = cfg.int("n_inner", 4 * hidden)
    eps = cfg.float("layer_norm_epsilon", 1e-5)
    act = cfg.choose("activation_function", "gelu_new", _GELUS)
    cfg.refuse("add_cross_attention", True, "cross-attention needs an encoder")
    head_dim = _heads(cfg, hidden, heads)
    tied = cfg.get("tie_word_embeddings", True)
    ctx = _context(cfg, max_context, positions, learned=True)
    tensors.choose_prefix(("transformer.", ""), "wte.weight")

    b = GraphBuilder(GraphConfig("gpt2", hidden, layers, heads, heads, head_dim, inner, vocab,
                                 ctx, cfg.dtype))
    ids, pos = b.input("input_ids", (T,), "i32"), b.input("position_ids", (T,), "i32")
    tok = b.weight("tok_embed.weight", tensors.ref("wte.weight", (vocab, hidden)))
    x = b.op(Op.EMBEDDING, ids, tok, name="tok_embed")
    wpe = b.weight("pos_embed.weight", tensors.ref("wpe.weight", (positions, hidden)))
    x = b.op(Op.ADD, x, b.op(Op.POS_EMBEDDING, pos, wpe, name="pos_embed"), name="embed")
    for i in range(layers):
        hf, n = f"h.{i}.", f"layers.{i}."
        h = _layernorm(b, tensors, x, n + "attn_norm", hf + "ln_1", hidden, eps)
        qkv = []
        for j, part in enumerate("qkv"):
            # c_attn is one Conv1D (in, 3*hidden): q, k, v are row blocks of its transpose.
            rows = (j * hidden, (j + 1) * hidden)
            w = tensors.ref(hf + "attn.c_attn.weight", (hidden, 3 * hidden), transpose=True,
                            rows=rows)
            bias = tensors.ref(hf + "attn.c_attn.bias", (3 * hidden,), rows=rows)
            qkv.append(_linear(b, h, f"{n}attn.{part}", w, bias))
        scale = head_dim ** -0.5 if cfg.get("scale_attn_weights", True) else 1.0
        if cfg.get("scale_attn_by_inverse_layer_idx", False):
            scale /= i + 1
        a = b.op(Op.ATTENTION, *qkv, name=n + "attn", n_heads=heads, n_kv_heads=heads,
                 head_dim=head_dim, causal=True, scale=scale, max_context=ctx)
        o = _linear(b, a, n + "attn.o",
                    tensors.ref(hf + "attn.c_proj.weight", (hidden, hidden), transpose=True),
                    tensors.ref(hf + "attn.c_proj.bias", (hidden,)))
        x = b.op(Op.ADD, x, o, name=n + "attn_residual")
        h = _layernorm(b, tensors, x, n + "mlp_norm", hf + "ln_2", hidden, eps)
        u = _linear(b, h, n + "mlp.up",
                    tensors.ref(hf + "mlp.c_fc.weight", (hidden, inner), transpose=True),
                    tensors.ref(hf + "mlp.c_fc.bias", (inner,)))
        g = b.op(act, u, name=n + "mlp.act")
        d = _linear(b, g, n + "mlp.down",
                    tensors.ref(hf + "mlp.c_proj.weight", (inner, hidden), transpose=True),
                    tensors.ref(hf + "mlp.c_proj.bias", (hidden,)))
        x = b.op(Op.ADD, x, d, name=n + "mlp_residual")
    x = _layernorm(b, tensors, x, "final_norm", "ln_f", hidden, eps)
    head = tok if tied else b.weight("lm_head.weight", tensors.ref("lm_head.weight",
                                                                   (vocab, hidden), base=False))
    b.output("logits", b.op(Op.LM_HEAD, x, head, name="lm_head"))
    return b.build()


def _rope_theta(cfg: _Config) -> float:
    # transformers 5 writes rope_parameters; older configs have rope_theta and rope_scaling.
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, dict):
        cfg.fail(f"'rope_parameters' must be an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        cfg.fail(f"RoPE type '{rope_type}' is not supported (only 'default' RoPE)")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        cfg.fail("partial_rotary_factor is not supported (RoPE over the whole head only)")
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        cfg.fail(f"rope_theta must be a positive number, got {theta!r}")
    return float(theta)


def _llama(cfg: _Config, tensors: _Tensors, max_context) -> Graph:
    hidden, layers = cfg.int("hidden_size"), cfg.int("num_hidden_layers")
    heads, vocab = cfg.int("num_attention_heads"), cfg.int("vocab_size")
    inter, positions = cfg.int("intermediate_size"), cfg.int("max_position_embeddings")
    kv_heads = cfg.int("num_key_value_heads", heads)
    if heads % kv_heads:
        cfg.fail(f"{heads} attention heads are not a multiple of {kv_heads} key/value heads")
    head_dim = (cfg.int("head_dim") if cfg.get("head_dim") is not None
                else _heads(cfg, hidden, heads))
    eps = cfg.float("rms_norm_eps", 1e-6)
    cfg.choose("hidden_act", "silu", {"silu": Op.SILU, "swish": Op.SILU})
    theta = _rope_theta(cfg)
    attn_bias, mlp_bias = bool(cfg.get("attention_bias", False)), bool(cfg.get("mlp_bias", False))
    tied = cfg.get("tie_word_embeddings", False)
    ctx = _context(cfg, max_context, positions, learned=False)
    tensors.choose_prefix(("model.", ""), "embed_tokens.weight")

    def linear(x: int, name: str, key: str, n_out: int, n_in: int, bias: bool) -> int:
        return _linear(b, x, name, tensors.ref(f"{key}.weight", (n_out, n_in)),
                       tensors.ref(f"{key}.bias", (n_out,)) if bias else None)

    def rmsnorm(x: int, name: str, key: str) -> int:
        w = b.weight(f"{name}.weight", tensors.ref(f"{key}.weight", (hidden,)))
        return b.op(Op.RMSNORM, x, w, name=name, eps=eps)

    b = GraphBuilder(GraphConfig("llama", hidden, layers, heads, kv_heads, head_dim, inter,
                                 vocab, ctx, cfg.dtype))
    ids, pos = b.input("input_ids", (T,), "i32"), b.input("position_ids", (T,), "i32")
    tok = b.weight("tok_embed.weight", tensors.ref("embed_tokens.weight", (vocab, hidden)))
    x = b.op(Op.EMBEDDING, ids, tok, name="tok_embed")
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    for i in range(layers):
        hf, n = f"layers.{i}.", f"layers.{i}."
        h = rmsnorm(x, n + "attn_norm", hf + "input_layernorm")
        q = linear(h, n + "attn.q", hf + "self_attn.q_proj", q_dim, hidden, attn_bias)
        k = linear(h, n + "attn.k", hf + "self_attn.k_proj", kv_dim, hidden, attn_bias)
        v = linear(h, n + "attn.v", hf + "self_attn.v_proj", kv_dim, hidden, attn_bias)
        q = b.op(Op.ROPE, q, pos, name=n + "attn.q_rope", head_dim=head_dim, theta=theta)
        k = b.op(Op.ROPE, k, pos, name=n + "attn.k_rope", head_dim=head_dim, theta=theta)
        a = b.op(Op.ATTENTION, q, k, v, name=n + "attn", n_heads=heads, n_kv_heads=kv_heads,
                 head_dim=head_dim, causal=True, scale=head_dim ** -0.5, max_context=ctx)
        o = linear(a, n + "attn.o", hf + "self_attn.o_proj", hidden, q_dim, attn_bias)
        x = b.op(Op.ADD, x, o, name=n + "attn_residual")
        h = rmsnorm(x, n + "mlp_norm", hf + "post_attention_layernorm")
        gate = linear(h, n + "mlp.gate", hf + "mlp.gate_proj", inter, hidden, mlp_bias)
        up = linear(h, n + "mlp.up", hf + "mlp.up_proj", inter, hidden, mlp_bias)
        s = b.op(Op.SWIGLU, gate, up, name=n + "mlp.act")
        d = linear(s, n + "mlp.down", hf + "mlp.down_proj", hidden, inter, mlp_bias)
        x = b.op(Op.ADD, x, d, name=n + "mlp_residual")
    x = rmsnorm(x, "final_norm", "norm")
    head = tok if tied else b.weight("lm_head.weight", tensors.ref("lm_head.weight",
                                                                   (vocab, hidden), base=False))
    b.output("logits", b.op(Op.LM_HEAD, x, head, name="lm_head"))
    return b.build()


def _bert(cfg: _Config, tensors: _Tensors, max_context) -> Graph:
    hidden, layers = cfg.int("hidden_size"), cfg.int("num_hidden_layers")
    heads, vocab = cfg.int("num_attention_heads"), cfg.int("vocab_size")
    inter, positions = cfg.int("intermediate_size"), cfg.int("max_position_embeddings")
    types = cfg.int("type_vocab_size", 2)
    eps = cfg.float("layer_norm_eps", 1e-12)
    act = cfg.choose("hidden_act", "gelu", _GELUS)
    cfg.refuse("is_decoder", True, "BERT is read as an encoder only")
    cfg.refuse("add_cross_attention", True, "cross-attention needs an encoder")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        cfg.fail(f"position_embedding_type '{cfg.get('position_embedding_type')}' is not "
                 f"supported (only 'absolute')")
    head_dim = _heads(cfg, hidden, heads)
    ctx = _context(cfg, max_context, positions, learned=True)
    tensors.choose_prefix(("bert.", ""), "embeddings.word_embeddings.weight")

    def linear(x: int, name: str, key: str, n_out: int, n_in: int) -> int:
        return _linear(b, x, name, tensors.ref(f"{key}.weight", (n_out, n_in)),
                       tensors.ref(f"{key}.bias", (n_out,)))

    b = GraphBuilder(GraphConfig("bert", hidden, layers, heads, heads, head_dim, inter, vocab,
                                 ctx, cfg.dtype))
    ids, pos = b.input("input_ids", (T,), "i32"), b.input("position_ids", (T,), "i32")
    e = "embeddings."
    tok = b.weight("tok_embed.weight", tensors.ref(e + "word_embeddings.weight", (vocab, hidden)))
    x = b.op(Op.EMBEDDING, ids, tok, name="tok_embed")
    # Every position has token type 0: its embedding is row 0 of the type table.
    type0 = tensors.ref(e + "token_type_embeddings.weight", (types, hidden), rows=(0, 1),
                        shape=(hidden,))
    x = b.op(Op.ADD, x, b.weight("type_embed.weight", type0), name="type_embed")
    wpe = b.weight("pos_embed.weight", tensors.ref(e + "position_embeddings.weight",
                                                   (positions, hidden)))
    x = b.op(Op.ADD, x, b.op(Op.POS_EMBEDDING, pos, wpe, name="pos_embed"), name="embed")
    x = _layernorm(b, tensors, x, "embed_norm", e + "LayerNorm", hidden, eps)
    for i in range(layers):
        hf, n = f"encoder.layer.{i}.", f"layers.{i}."
        qkv = [linear(x, f"{n}attn.{part}", f"{hf}attention.self.{key}", hidden, hidden)
               for part, key in (("q", "query"), ("k", "key"), ("v", "value"))]
        a = b.op(Op.ATTENTION, *qkv, name=n + "attn", n_heads=heads, n_kv_heads=heads,
                 head_dim=head_dim, causal=False, scale=head_dim ** -0.5, max_context=ctx)
        o = linear(a, n + "attn.o", hf + "attention.output.dense", hidden, hidden)
        # BERT is post-norm: the residual sum is normalised.
        x = b.op(Op.ADD, o, x, name=n + "attn_residual")
        x = _layernorm(b, tensors, x, n + "attn_norm", hf + "attention.output.LayerNorm",
                       hidden, eps)
        u = linear(x, n + "mlp.up", hf + "intermediate.dense", inter, hidden)
        g = b.op(act, u, name=n + "mlp.act")
        d = linear(g, n + "mlp.down", hf + "output.dense", hidden, inter)
        x = b.op(Op.ADD, d, x, name=n + "mlp_residual")
        x = _layernorm(b, tensors, x, n + "mlp_norm", hf + "output.LayerNorm", hidden, eps)
    b.output("last_hidden_state", x)
    return b.build()


_BUILDERS = {"gpt2": _gpt2, "llama": _llama, "bert": _bert}
