"""Load an ONNX export of a Hugging Face decoder as a `ModelSource`: config.json beside the graph,
weights from the graph's initializers under their Hugging Face names.

Accepted: a .onnx file, or a folder holding one (optimum's layout: model.onnx, optionally
model.onnx_data, config.json and tokenizer files; or the hub's onnx/model.onnx). Only the weights
are taken from the graph; kiln builds the model from config.json as for any other source.

Exporters rename weights, so each one kiln needs is found in this order:
  1. by name: torch.onnx keeps parameter names (a wrapper module's prefix, `m.`, is stripped);
  2. by module scope: a weight folded into a new tensor (`onnx::MatMul_123`, `val_45`: Linear
     weights stored transposed) or merged with an identical one (tied embeddings) is the
     initializer a node of that module uses: node names `/model/layers.0/mlp/up_proj/MatMul`
     (TorchScript exporter) or the `pkg.torch.onnx.name_scopes` metadata (dynamo exporter);
  3. by position: with names and scopes stripped, the MatMul weights in graph order pair with the
     Linear weights in forward order (q, k, v, o, gate, up, down per layer, then lm_head), checked
     against the shapes the config implies; the embedding is the table a Gather reads.
A graph kiln cannot map is refused with one line saying what it found and what to do.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .causal_lm import weight_spec
from .hf import has_weights, read_config, tokenizer_files
from .registry import find_architecture
from .source import ModelLoadError, ModelSource, content_hash

GRAPH_NAMES = ("model.onnx", "decoder_model_merged.onnx", "decoder_model.onnx")   # preferred, in order
QUANTIZED_OPS = {"MatMulNBits", "DequantizeLinear", "MatMulInteger", "QLinearMatMul", "DynamicQuantizeLinear",
                 "GatherBlockQuantized", "QuantizeLinear"}
ENCODER_OUTPUTS = {"last_hidden_state", "pooler_output", "encoder_last_hidden_state"}
NORM_OPS = {"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "SkipLayerNormalization",
            "SkipSimplifiedLayerNormalization"}
PASS_THROUGH = {"Identity", "Cast"}
# kiln's (family-independent) Linear parameters, in the order a layer runs them.
FORWARD = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.up_proj", "mlp.down_proj")
EXPORT_HINT = ("export the float model again without weight quantization or constant folding (torch.onnx.export "
               "with optimize=False, or do_constant_folding=False with dynamo=False)")


def onnx_graphs(d: Path) -> list[Path]:
    return sorted(d.glob("*.onnx")) + sorted((d / "onnx").glob("*.onnx"))


def is_onnx_dir(d: Path) -> bool:
    """A folder holding an ONNX graph and no Hugging Face weight files."""
    return bool(onnx_graphs(d)) and not has_weights(d)


def _pick_graph(d: Path) -> Path:
    graphs = onnx_graphs(d)
    names = ", ".join(g.name for g in graphs)
    if any(g.name.startswith("encoder") for g in graphs):
        raise ModelLoadError(f"{d} holds an encoder-decoder export ({names}); kiln compiles decoder-only "
                             "causal LMs: export one (optimum-cli export onnx --task text-generation)")
    for want in GRAPH_NAMES:
        for g in graphs:
            if g.name == want:
                return g
    if len(graphs) == 1:
        return graphs[0]
    raise ModelLoadError(f"{d} holds several ONNX graphs ({names}); pass the decoder's .onnx file itself")


@dataclass(frozen=True)
class Ref:
    """Where one HF weight lives: an initializer, stored transposed ([in, out]) or not."""
    init: str
    transposed: bool = False


@dataclass(frozen=True)
class Use:
    """An initializer (possibly through Transpose/Identity/Cast) read by a node."""
    ref: Ref                  # for a MatMul/Gemm B input: transposed = the initializer is [in, out]
    role: str                 # "matmul" | "gather" | "scale" | "bias" | "mul" | "add" | "other"
    scope: str | None         # the torch module path the node came from, when the exporter said


def _scope(node) -> str | None:
    """The module path of a node: dynamo's name_scopes metadata, or a TorchScript node name."""
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                return None
            return scopes[-2] if isinstance(scopes, list) and len(scopes) >= 2 else None   # the last names the op
    if node.name.startswith("/"):
        return ".".join(node.name.strip("/").split("/")[:-1]) or None
    return None


def _role(node, index: int) -> tuple[str, bool]:
    """(role, whether the op reads the input transposed) of input `index` of `node`."""
    op = node.op_type
    if op == "MatMul" and index == 1:
        return "matmul", False
    if op == "Gemm" and index in (1, 2):
        trans = any(a.name == "transB" and a.i for a in node.attribute)
        return ("matmul", trans) if index == 1 else ("bias", False)
    if op == "Gather" and index == 0:
        return "gather", False
    if op in NORM_OPS and index >= 1:
        return ("scale" if index == 1 else "bias"), False
    return {"Mul": "mul", "Add": "add"}.get(op, "other"), False


class Graph:
    """An ONNX graph's initializers and every use a node makes of them."""

    def __init__(self, model):
        self.inits: dict = {}
        self.uses: list[Use] = []
        self.inputs = {i.name for i in model.graph.input}
        self.outputs = [o.name for o in model.graph.output]
        self.ops: set[str] = set()
        self._walk(model.graph, {})

    def _walk(self, graph, derived: dict[str, Ref]) -> None:
        self.inits.update({t.name: t for t in graph.initializer})
        for node in graph.node:
            self.ops.add(node.op_type)
            refs = [Ref(x) if x in self.inits else derived.get(x) for x in node.input]
            if node.op_type in PASS_THROUGH | {"Transpose"} and refs and refs[0] is not None:
                flip = node.op_type == "Transpose"
                if flip and (len(self.inits[refs[0].init].dims) != 2 or
                             any(a.name == "perm" and list(a.ints) != [1, 0] for a in node.attribute)):
                    continue
                derived[node.output[0]] = Ref(refs[0].init, refs[0].transposed ^ flip)
                continue
            for index, ref in enumerate(refs):
                if ref is not None:
                    role, trans = _role(node, index)
                    # MatMul reads B as [in, out]: transposed unless a Transpose (or transB) came between
                    stored = Ref(ref.init, not (ref.transposed ^ trans)) if role == "matmul" else ref
                    self.uses.append(Use(stored, role, _scope(node)))
            for attr in node.attribute:       # If/Loop bodies (optimum's merged decoder)
                subgraphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
                for sub in subgraphs:
                    self._walk(sub, dict(derived))

    def size(self, name: str) -> int:
        return int(np.prod(self.inits[name].dims)) if len(self.inits[name].dims) else 1


def _prefix(graph: Graph, wanted: list[str]) -> str:
    """The prefix a wrapper module put before every name (`m.`), or ''."""
    counts: Counter = Counter()
    names = set(graph.inits) | {f"{u.scope}.weight" for u in graph.uses if u.scope}
    for w in wanted:
        for n in names:
            if n.endswith(w) and (len(n) == len(w) or n[-len(w) - 1] == "."):
                counts[n[: len(n) - len(w)]] += 1
    return counts.most_common(1)[0][0] if counts else ""


def _by_scope(uses: list[Use], leaf: str, graph: Graph, params: set[str]) -> Ref | None:
    """The weight or bias of one module among the (non-scalar) initializers its nodes use: a Linear's
    MatMul operand, an embedding's table, a norm's scale (a LayerNormalization input, or the vector
    a Mul applies); a bias is a Gemm/LayerNormalization bias or the vector an Add applies.

    A MatMul operand or a table may be a folded tensor (`onnx::MatMul_N`: a transposed weight);
    anything else must be one of `params` (named as a parameter: a tied or merged one), since a
    folded vector may hold other values (Gemma's norms fold 1 + w)."""
    def only(roles: tuple[str, ...], vector: bool = False) -> set[Ref]:
        return {u.ref for u in uses if u.role in roles and graph.size(u.ref.init) > 1
                and (u.role in ("matmul", "gather") or u.ref.init in params)
                and (not vector or len(graph.inits[u.ref.init].dims) == 1)}

    if leaf == "weight":
        found = only(("matmul",)) or only(("gather",)) or only(("scale",))
        if not found:
            vectors = only(("mul", "add", "other"), vector=True)
            found = vectors if len(vectors) == 1 else only(("mul",), vector=True)
    elif leaf == "bias":
        found = only(("bias",)) or only(("add",), vector=True)
    else:
        return None
    return next(iter(found)) if len(found) == 1 else None


def _layer_key(kiln_param: str) -> tuple[float, int]:
    m = re.match(r"model\.layers\.(\d+)\.(.+)\.weight$", kiln_param)
    if kiln_param == "lm_head.weight":
        return float("inf"), 0
    return (int(m.group(1)), FORWARD.index(m.group(2))) if m and m.group(2) in FORWARD else (-1.0, -1)


def _by_position(graph: Graph, wmap: dict, shapes: dict, refs: dict[str, Ref], path: Path) -> None:
    """Pair the Linear weights not found yet with the unclaimed MatMul initializers, in graph order."""
    embed = [n for n in weight_spec(wmap.get("model.embed_tokens.weight", [])).hf_names if n not in refs]
    table = next((u.ref for u in graph.uses if u.role == "gather" and len(graph.inits[u.ref.init].dims) == 2
                  and u.ref.init not in {r.init for r in refs.values()}), None)
    if embed and table is not None:      # the table a Gather reads is the token embedding
        refs[embed[0]] = table
    claimed = {r.init for r in refs.values()}
    linear = sorted((p for p in wmap if _layer_key(p)[1] >= 0), key=_layer_key)
    missing = [(p, n) for p in linear for n in weight_spec(wmap[p]).hf_names if n not in refs]
    if not missing:
        return
    free = list(dict.fromkeys(u.ref for u in graph.uses if u.role == "matmul" and u.ref.init not in claimed
                              and len(graph.inits[u.ref.init].dims) == 2))
    if len(free) < len(missing):
        return                               # reported as missing weights by the caller
    pairs = dict(zip((n for _, n in missing), free))
    for param in dict.fromkeys(p for p, _ in missing):
        parts = [pairs.get(n) or refs[n] for n in weight_spec(wmap[param]).hf_names]
        got = [list(graph.inits[r.init].dims)[:: -1 if r.transposed else 1] for r in parts]
        rows, cols = shapes[param]
        if any(g[1] != cols for g in got) or sum(g[0] for g in got) != rows:
            raise ModelLoadError(f"{path}: the graph's unnamed MatMul weights do not match {param} "
                                 f"{[rows, cols]} by position (found {got}); {EXPORT_HINT}, keeping node names")
    refs.update(pairs)


class OnnxWeights:
    """HF-named tensors read from ONNX initializers (external data read in place, not all at once)."""

    def __init__(self, graph: Graph, refs: dict[str, Ref], base: Path):
        self._graph, self._refs, self._base = graph, refs, base

    def names(self) -> list[str]:
        return list(self._refs)

    def get(self, name: str) -> np.ndarray:
        ref = self._refs[name]
        a = _read(self._graph.inits[ref.init], self._base)
        return np.ascontiguousarray(a.T) if ref.transposed else a


def _read(tensor, base: Path) -> np.ndarray:
    import onnx
    from onnx import numpy_helper
    bf16 = tensor.data_type == onnx.TensorProto.BFLOAT16
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        f = (base / info["location"]).resolve()
        if not f.is_relative_to(base.resolve()) or not f.is_file():
            raise ModelLoadError(f"{base}: initializer {tensor.name} points at {info['location']}, which is not a "
                                 "file beside the graph; keep the .onnx and its external data files together")
        dtype = np.uint16 if bf16 else onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        a = np.fromfile(f, dtype=dtype, count=int(np.prod(tensor.dims)), offset=int(info.get("offset", 0)))
        a = a.reshape(tuple(tensor.dims))
        if bf16:
            return (a.astype(np.uint32) << 16).view(np.float32)
    else:
        a = numpy_helper.to_array(tensor)
    return a if a.dtype in (np.float32, np.float16) else a.astype(np.float32)


def _external_files(graph: Graph, base: Path) -> list[Path]:
    import onnx
    locations = {e.value for t in graph.inits.values() if t.data_location == onnx.TensorProto.EXTERNAL
                 for e in t.external_data if e.key == "location"}
    return [base / loc for loc in sorted(locations)]


def _check_graph(graph: Graph, path: Path) -> None:
    quantized = sorted(graph.ops & QUANTIZED_OPS)
    if quantized:
        raise ModelLoadError(f"{path} holds quantized weights ({', '.join(quantized)} nodes); kiln reads float "
                             f"ONNX weights and quantizes them itself (--quant): {EXPORT_HINT}")
    if "logits" not in graph.outputs and ENCODER_OUTPUTS & set(graph.outputs):
        raise ModelLoadError(f"{path} is an encoder or a base model without a language-model head (outputs: "
                             f"{', '.join(graph.outputs)}); kiln compiles causal LMs: export the *ForCausalLM "
                             "model (optimum-cli export onnx --task text-generation)")


def load_onnx(path: Path) -> ModelSource:
    """A .onnx file, or a folder holding one, with config.json beside it (or one folder up from onnx/)."""
    try:
        import onnx
    except ImportError:
        raise ModelLoadError("reading ONNX needs the onnx package: pip install 'kiln[onnx]'") from None
    file = _pick_graph(path) if path.is_dir() else path
    try:
        model = onnx.load(str(file), load_external_data=False)
    except Exception as e:  # protobuf raises several types for a bad file
        raise ModelLoadError(f"{file} is not a readable ONNX model ({e}); re-export it") from None
    graph = Graph(model)
    _check_graph(graph, file)
    folders = [file.parent] + ([file.parent.parent] if file.parent.name == "onnx" else [])
    cfg_path = next((f / "config.json" for f in folders if (f / "config.json").exists()), None)
    if cfg_path is None:
        raise ModelLoadError(f"{file}: an ONNX graph ({len(graph.inits)} initializers, inputs "
                             f"{', '.join(sorted(graph.inputs))}) with no config.json beside it; kiln reads the "
                             "architecture from config.json: put the model's config.json (and tokenizer files) "
                             "next to the .onnx, as optimum-cli export onnx does")
    hf_config = read_config(cfg_path)
    try:
        arch = find_architecture(hf_config)
        config = arch.config_cls.from_hf(hf_config)
    except ValueError as e:
        raise ModelLoadError(f"{file}: {e}") from None
    wmap = arch.weight_map(config)
    shapes = {n: tuple(int(d) for d in p.shape) for n, p in arch.model_cls(config).named_parameters()}
    refs, how = _map_weights(graph, wmap, shapes, file, arch.name)
    write_tokenizer, notes = tokenizer_files(cfg_path.parent, hf_config.get("model_type"))
    notes.append(f"weights from the ONNX graph {file.name}: " + ", ".join(f"{n} {k}" for k, n in how.items() if n))
    files = [cfg_path, file, *_external_files(graph, file.parent)]
    return ModelSource(path=path, format="onnx", hf_config=hf_config,
                       weights=OnnxWeights(graph, refs, file.parent), write_tokenizer=write_tokenizer,
                       content_hash=content_hash(files), notes=notes)


def _map_weights(graph: Graph, wmap: dict, shapes: dict, path: Path,
                 arch: str) -> tuple[dict[str, Ref], dict[str, int]]:
    """Every HF name the weight map needs -> its initializer, by name, then module scope, then position."""
    wanted = list(dict.fromkeys(n for entry in wmap.values() for n in weight_spec(entry).hf_names))
    prefix = _prefix(graph, wanted)
    refs = {w: Ref(prefix + w) for w in wanted if prefix + w in graph.inits}
    how = {"by name": len(refs)}
    params = {n for n in graph.inits if n.startswith(prefix) and n.endswith((".weight", ".bias"))}
    scoped: dict[str, list[Use]] = {}
    for u in graph.uses:
        if u.scope and u.scope.startswith(prefix):
            scoped.setdefault(u.scope[len(prefix):], []).append(u)
    for w in wanted:
        module, _, leaf = w.rpartition(".")
        if w not in refs and module in scoped and (ref := _by_scope(scoped[module], leaf, graph, params)):
            refs[w] = ref
    how["by module scope"] = len(refs) - how["by name"]
    _by_position(graph, wmap, shapes, refs, path)
    how["by position"] = len(refs) - how["by name"] - how["by module scope"]
    missing = [w for w in wanted if w not in refs]
    if missing:
        sample = ", ".join(list(graph.inits)[:3])
        raise ModelLoadError(f"{path}: the graph has no initializer for {len(missing)} of the {len(wanted)} weights "
                             f"kiln's {arch} needs (first: {missing[0]}; it holds {len(graph.inits)} "
                             f"initializers: {sample}, ...): check that config.json describes this graph, or "
                             f"{EXPORT_HINT}")
    return {w: refs[w] for w in wanted}, how

