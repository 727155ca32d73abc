// DeepSeek-V4: kvcore.Dsv4Cache and the dsv4 op family (finalizer, compressor, indexer).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "host_arrays.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/error.hpp"
#include "kvcore/ops/dsv4.hpp"
#include "names.hpp"
#include "tensors.hpp"

namespace kvcore::py {

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Dsv4Ref = nb::pointer_and_handle<Dsv4Cache>;

struct Weights {
  Tensor ape, norm;
  Dsv4CompressorWeights w;
};

Weights weights(nb::handle ape, nb::handle norm_weight, const RopeSpec& rope, const Dsv4Compressor& comp) {
  Weights w;
  w.ape = to_tensor(ape, "ape");
  w.norm = to_tensor(norm_weight, "norm_weight");
  w.w.ape = w.ape.ref;
  w.w.norm_weight = w.norm.ref;
  rope.validate(comp.head_dim);
  w.w.rope = make_rope_table(rope, comp.head_dim);
  return w;
}

nb::object view(Dsv4Ref self, const TensorRef& t, nb::handle framework) {
  const std::string fw =
      framework.is_none() ? (t.device().is_cpu() ? "numpy" : "torch") : nb::cast<std::string>(framework);
  return export_view(t, self.h, fw.c_str());
}

nb::object rows_numpy(std::vector<float>&& v, int64_t cols) {
  const size_t n = cols > 0 ? v.size() / static_cast<size_t>(cols) : 0;
  return numpy_from(std::move(v), {n, static_cast<size_t>(cols)});
}

}  // namespace

void bind_dsv4(nb::module_& m) {
  nb::class_<Dsv4Compressor>(m, "Dsv4Compressor",
                             "Geometry of one DeepSeek-V4 compressor: head_dim, n_rot, ratio, overlap, kind\n"
                             "('attention' or 'indexer'). Presets: csa(), hca(), indexer().")
      .def_static("csa", &Dsv4Compressor::csa, "head_dim"_a = 512, "n_rot"_a = 64, "ratio"_a = 4)
      .def_static("hca", &Dsv4Compressor::hca, "head_dim"_a = 512, "n_rot"_a = 64, "ratio"_a = 128)
      .def_static("indexer", &Dsv4Compressor::indexer, "head_dim"_a = 128, "n_rot"_a = 64, "ratio"_a = 4)
      .def_rw("head_dim", &Dsv4Compressor::head_dim)
      .def_rw("n_rot", &Dsv4Compressor::n_rot)
      .def_rw("ratio", &Dsv4Compressor::ratio)
      .def_rw("overlap", &Dsv4Compressor::overlap)
      .def_rw("eps", &Dsv4Compressor::eps)
      .def_prop_ro("kind", [](const Dsv4Compressor& c) { return c.kind == Dsv4RowKind::Attention ? "attention" : "indexer"; })
      .def_prop_ro("width", &Dsv4Compressor::width)
      .def_prop_ro("state_rows", &Dsv4Compressor::state_rows)
      .def_prop_ro("packed_row_bytes", &Dsv4Compressor::packed_row_bytes);

  m.def(
      "dsv4_kv_finalize",
      [](nb::handle kv, nb::handle raw_ring, int64_t first_raw_row, int32_t n_rot, bool quant, nb::handle stream) {
        Tensor a = to_tensor(kv, "kv"), b = to_tensor(raw_ring, "raw_ring");
        const Stream s = resolve_stream(stream, a.ref.device());
        nb::gil_scoped_release g;
        dsv4_kv_finalize(a.ref, b.ref, first_raw_row, n_rot, parse_quant(quant), s);
      },
      "kv"_a.none(), "raw_ring"_a.none(), "first_raw_row"_a, "n_rot"_a = 64, nb::kw_only(), "quant"_a = true,
      "stream"_a = nb::none(),
      "Decode KV finalizer: kv [n, head_dim] f32 (RoPE applied) FP8-rounded in place on its nope dims\n"
      "(quant), row i stored into raw_ring [R, head_dim] (f32/f16) at (first_raw_row + i) % R.");
  m.def(
      "dsv4_compressor_store_one",
      [](nb::handle c, nb::handle z, nb::handle ape, nb::handle state_kv, nb::handle state_score, int64_t pos,
         const Dsv4Compressor& comp, nb::handle stream) {
        Tensor tc = to_tensor(c, "c"), tz = to_tensor(z, "z"), ta = to_tensor(ape, "ape");
        Tensor tk = to_tensor(state_kv, "state_kv"), ts = to_tensor(state_score, "state_score");
        const Stream s = resolve_stream(stream, tc.ref.device());
        nb::gil_scoped_release g;
        dsv4_compressor_store_one(tc.ref, tz.ref, ta.ref, tk.ref, ts.ref, pos, comp, s);
      },
      "c"_a.none(), "z"_a.none(), "ape"_a.none(), "state_kv"_a.none(), "state_score"_a.none(), "pos"_a, "comp"_a, nb::kw_only(), "stream"_a = nb::none(),
      "Store token pos (c, z: [width] f32) into a compressor state [state_rows, width].");
  // The two state edits that take only the states: one binding each over the op's pointer.
  using StateEdit = void (*)(const TensorRef&, const TensorRef&, const Dsv4Compressor&, Stream);
  const struct {
    const char* name;
    StateEdit op;
    const char* doc;
  } state_edits[] = {
      {"dsv4_compressor_shift", &dsv4_compressor_shift,
       "Overlapping compressors: rows m..2m-1 of the state become rows 0..m-1."},
      {"dsv4_compressor_reset", &dsv4_compressor_reset, "Reset a compressor state: kv 0, scores -inf."},
  };
  for (const auto& e : state_edits)
    m.def(
        e.name,
        [op = e.op](nb::handle state_kv, nb::handle state_score, const Dsv4Compressor& comp, nb::handle stream) {
          Tensor tk = to_tensor(state_kv, "state_kv"), ts = to_tensor(state_score, "state_score");
          const Stream s = resolve_stream(stream, tk.ref.device());
          nb::gil_scoped_release g;
          op(tk.ref, ts.ref, comp, s);
        },
        "state_kv"_a.none(), "state_score"_a.none(), "comp"_a, nb::kw_only(), "stream"_a = nb::none(), e.doc);
  m.def(
      "dsv4_compressor_emit",
      [](nb::handle state_kv, nb::handle state_score, const Dsv4Compressor& comp, nb::handle ape,
         nb::handle norm_weight, const RopeSpec& rope, int64_t window, nb::handle rows, bool quant,
         nb::handle stream) {
        Tensor tk = to_tensor(state_kv, "state_kv"), ts = to_tensor(state_score, "state_score");
        Tensor tr = to_tensor(rows, "rows");
        Weights w = weights(ape, norm_weight, rope, comp);
        const Stream s = resolve_stream(stream, tk.ref.device());
        nb::gil_scoped_release g;
        dsv4_compressor_emit(tk.ref, ts.ref, comp, w.w, window, parse_quant(quant), tr.ref, s);
      },
      "state_kv"_a.none(), "state_score"_a.none(), "comp"_a, "ape"_a.none(), "norm_weight"_a.none(), "rope"_a, "window"_a, "rows"_a.none(),
      nb::kw_only(), "quant"_a = true, "stream"_a = nb::none(),
      "Emit compressed row `window` into rows ([cap, head_dim] f32 or [cap, packed_row_bytes] uint8):\n"
      "softmax pool over the state, RMSNorm (norm_weight), RoPE at window * ratio, FP8 / FP4 when quant.");
  m.def(
      "dsv4_compress_prefill",
      [](nb::handle c, nb::handle z, nb::handle state_kv, nb::handle state_score, int64_t start_pos,
         const Dsv4Compressor& comp, nb::handle ape, nb::handle norm_weight, const RopeSpec& rope, nb::handle rows,
         bool quant, nb::handle stream) {
        Tensor tc = to_tensor(c, "c"), tz = to_tensor(z, "z");
        Tensor tk = to_tensor(state_kv, "state_kv"), ts = to_tensor(state_score, "state_score");
        Tensor tr = to_tensor(rows, "rows");
        Weights w = weights(ape, norm_weight, rope, comp);
        const Stream s = resolve_stream(stream, tc.ref.device());
        nb::gil_scoped_release g;
        dsv4_compress_prefill(tc.ref, tz.ref, tk.ref, ts.ref, start_pos, comp, w.w, parse_quant(quant), tr.ref, s);
      },
      "c"_a.none(), "z"_a.none(), "state_kv"_a.none(), "state_score"_a.none(), "start_pos"_a, "comp"_a, "ape"_a.none(), "norm_weight"_a.none(), "rope"_a,
      "rows"_a.none(), nb::kw_only(), "quant"_a = true, "stream"_a = nb::none(),
      "Compress tokens start_pos .. start_pos + n - 1 (c, z: [n, width] f32): emit every window that\n"
      "completes into rows and leave the state as storing them one by one would.");
  m.def(
      "dsv4_indexer_topk",
      [](nb::handle q, nb::handle weights_, nb::handle index_rows, int64_t n_rows, int64_t first_query_pos,
         int32_t ratio, int32_t k, bool quant, nb::handle scores, nb::handle out, nb::handle stream) -> nb::tuple {
        Tensor tq = to_tensor(q, "q"), tw = to_tensor(weights_, "weights"), ti = to_tensor(index_rows, "index_rows");
        require_arg(tq.ref.ndim() == 3 && ti.ref.ndim() == 2, "dsv4_indexer_topk: q must be [n_q, H, D] and "
                    "index_rows [cap, ...], got ", described(tq.ref), " and ", described(ti.ref));
        const int64_t nq = tq.ref.size(0), cap = ti.ref.size(0);
        Output os = output(scores, "scores", q, {nq, cap}, DType::F32);
        Output oo = output(out, "out", q, {nq, static_cast<int64_t>(k)}, DType::I32);
        const Stream s = resolve_stream(stream, tq.ref.device());
        {
          nb::gil_scoped_release g;
          dsv4_indexer_topk(tq.ref, tw.ref, ti.ref, n_rows, first_query_pos, ratio, parse_quant(quant), os.t.ref,
                            oo.t.ref, s);
        }
        return nb::make_tuple(oo.obj, os.obj);
      },
      "q"_a.none(), "weights"_a.none(), "index_rows"_a.none(), "n_rows"_a, "first_query_pos"_a, "ratio"_a, "k"_a, nb::kw_only(),
      "quant"_a = true, "scores"_a = nb::none(), "out"_a = nb::none(), "stream"_a = nb::none(),
      "Lightning indexer: scores I(t, s) = sum_h w_h relu(q_h . k_s) over visible rows s < (t + 1) / ratio,\n"
      "and the k best rows per query (best first, -1 past the visible ones). Returns (top int32 [n_q, k],\n"
      "scores f32 [n_q, cap]).");

  nb::class_<Dsv4Cache>(m, "Dsv4Cache", nb::is_weak_referenceable(),
                        "The KV cache of DeepSeek-V4 attention, per sequence and layer: the raw window ring,\n"
                        "compressor and indexer states, compressed rows (packed 584-byte FP8) and indexer rows\n"
                        "(packed FP4). The engine computes the projections and hands them to append();\n"
                        "read_window / read_compressed / read_indexer give host copies as float32.\n\n"
                        "    cache = kvcore.Dsv4Cache.v4_flash(max_context=4096)\n"
                        "    cache.set_weights(layer, comp_ape, comp_norm, idx_ape, idx_norm)\n"
                        "    cache.append(seq, layer, pos, kv, comp_c, comp_z, idx_c, idx_z)")
      .def(
          "__init__",
          [](Dsv4Cache* self, std::vector<std::string> layers, int32_t head_dim, int32_t n_rot, int32_t window,
             int32_t csa_ratio, int32_t hca_ratio, int32_t index_heads, int32_t index_dim, int32_t index_topk,
             int64_t max_context, int32_t max_seqs, bool quant, bool packed, nb::handle device, nb::handle stream) {
            Dsv4CacheConfig cfg;
            cfg.layers.clear();
            for (const std::string& l : layers) cfg.layers.push_back(parse_dsv4_layer_kind(l));
            cfg.head_dim = head_dim;
            cfg.n_rot = n_rot;
            cfg.window = window;
            cfg.csa_ratio = csa_ratio;
            cfg.hca_ratio = hca_ratio;
            cfg.index_heads = index_heads;
            cfg.index_dim = index_dim;
            cfg.index_topk = index_topk;
            cfg.max_context = max_context;
            cfg.max_seqs = max_seqs;
            cfg.quant = parse_quant(quant);
            cfg.packed = packed;
            const Device dev = parse_device(device);
            cfg.stream = resolve_stream(stream, dev);
            nb::gil_scoped_release g;
            new (self) Dsv4Cache(std::move(cfg), dev);
          },
          "layers"_a, nb::kw_only(), "head_dim"_a = 512, "n_rot"_a = 64, "window"_a = 128, "csa_ratio"_a = 4,
          "hca_ratio"_a = 128, "index_heads"_a = 64, "index_dim"_a = 128, "index_topk"_a = 512,
          "max_context"_a = 65536, "max_seqs"_a = 1, "quant"_a = true, "packed"_a = true, "device"_a = "cpu",
          "stream"_a = nb::none(),
          "layers: one of 'window', 'csa', 'hca' per layer; quant: FP8/FP4 storage as DeepSeek-V4's engine\n"
          "(False: f32 math, as HF computes); packed: 584-byte / FP4 rows where the geometry has them;\n"
          "stream: the CUDA stream of every cache operation (default: torch's current stream).")
      .def_static(
          "v4_flash",
          [](int64_t max_context, int32_t max_seqs, nb::handle device, nb::handle stream) {
            const Device dev = parse_device(device);
            Dsv4CacheConfig cfg = Dsv4CacheConfig::v4_flash(max_context, max_seqs);
            cfg.stream = resolve_stream(stream, dev);
            return Dsv4Cache(std::move(cfg), dev);
          },
          "max_context"_a, "max_seqs"_a = 1, "device"_a = "cpu", "stream"_a = nb::none(), "DeepSeek-V4-Flash's 43-layer schedule.")
      .def_static(
          "v4_pro",
          [](int64_t max_context, int32_t max_seqs, nb::handle device, nb::handle stream) {
            const Device dev = parse_device(device);
            Dsv4CacheConfig cfg = Dsv4CacheConfig::v4_pro(max_context, max_seqs);
            cfg.stream = resolve_stream(stream, dev);
            return Dsv4Cache(std::move(cfg), dev);
          },
          "max_context"_a, "max_seqs"_a = 1, "device"_a = "cpu", "stream"_a = nb::none(), "DeepSeek-V4-Pro's 61-layer schedule.")
      .def_prop_ro("n_layers", &Dsv4Cache::n_layers)
      .def("kind", [](const Dsv4Cache& c, int32_t layer) { return dsv4_layer_kind_str(c.kind(layer)); }, "layer"_a)
      .def_prop_ro("raw_row_bytes", &Dsv4Cache::raw_row_bytes)
      .def_prop_ro("compressed_row_bytes", &Dsv4Cache::compressed_row_bytes)
      .def_prop_ro("indexer_row_bytes", &Dsv4Cache::indexer_row_bytes)
      .def_prop_ro("device", [](const Dsv4Cache& c) { return c.device().str(); })
      .def("compressor", [](const Dsv4Cache& c, int32_t layer) { return c.config().compressor(c.kind(layer)); },
           "layer"_a, "The attention compressor geometry of a CSA or HCA layer.")
      .def("indexer", [](const Dsv4Cache& c) { return c.config().indexer(); }, "The indexer compressor geometry.")
      .def(
          "set_weights",
          [](Dsv4Cache& c, int32_t layer, nb::handle comp_ape, nb::handle comp_norm, nb::handle idx_ape,
             nb::handle idx_norm) {
            Tensor a = to_optional_tensor(comp_ape, "comp_ape"), b = to_optional_tensor(comp_norm, "comp_norm");
            Tensor d = to_optional_tensor(idx_ape, "idx_ape"), e = to_optional_tensor(idx_norm, "idx_norm");
            nb::gil_scoped_release g;
            c.set_weights(layer, Dsv4LayerWeights{a.ref, b.ref, d.ref, e.ref});
          },
          "layer"_a, "comp_ape"_a = nb::none(), "comp_norm"_a = nb::none(), "idx_ape"_a = nb::none(),
          "idx_norm"_a = nb::none(),
          "Copy one layer's compressor weights: comp_ape [ratio, width], comp_norm [head_dim] (CSA/HCA);\n"
          "idx_ape [4, 2 * index_dim], idx_norm [index_dim] (CSA).")
      .def("create", &Dsv4Cache::create, "A new empty sequence (at most max_seqs live); returns its id.")
      .def("erase", &Dsv4Cache::erase, "seq"_a, "Free a sequence.")
      .def("__contains__", &Dsv4Cache::contains, "seq"_a)
      .def("sequences", &Dsv4Cache::sequences, "Ids of every live sequence.")
      .def(
          "truncate",
          [](Dsv4Cache& c, SeqId seq, int32_t n) {
            nb::gil_scoped_release g;
            c.truncate(seq, n);
          },
          "seq"_a, "n"_a, "Keep the first n tokens in every layer (0 empties the sequence).")
      .def("debug_state", &Dsv4Cache::debug_state, "Canonical text of the cache's host state (tests compare it).")
      .def(
          "append",
          [](Dsv4Cache& c, SeqId seq, int32_t layer, int32_t pos, nb::handle kv, nb::handle comp_c,
             nb::handle comp_z, nb::handle idx_c, nb::handle idx_z) {
            Tensor a = to_tensor(kv, "kv"), b = to_optional_tensor(comp_c, "comp_c"), d = to_optional_tensor(comp_z, "comp_z");
            Tensor e = to_optional_tensor(idx_c, "idx_c"), f = to_optional_tensor(idx_z, "idx_z");
            nb::gil_scoped_release g;
            c.append(seq, layer, pos, Dsv4TokenInputs{a.ref, b.ref, d.ref, e.ref, f.ref});
          },
          "seq"_a, "layer"_a, "pos"_a, "kv"_a.none(), "comp_c"_a = nb::none(), "comp_z"_a = nb::none(),
          "idx_c"_a = nb::none(), "idx_z"_a = nb::none(),
          "Append tokens pos .. pos + n - 1 (pos == length(seq, layer)): kv [n, head_dim] f32 (RoPE applied;\n"
          "FP8-rounded in place when quantized), comp_c / comp_z [n, width] (CSA/HCA), idx_c / idx_z\n"
          "[n, 2 * index_dim] (CSA).")
      .def("length", &Dsv4Cache::length, "seq"_a, "layer"_a)
      .def("compressed_rows", &Dsv4Cache::compressed_rows, "seq"_a, "layer"_a)
      .def("indexer_rows", &Dsv4Cache::indexer_rows, "seq"_a, "layer"_a)
      .def(
          "raw_ring", [](Dsv4Ref s, int32_t seq, int32_t layer, nb::handle fw) { return view(s, s.p->raw_ring(seq, layer), fw); },
          "seq"_a, "layer"_a, nb::kw_only(), "framework"_a = nb::none(),
          "View (keeps the cache alive) of the raw window ring [window, head_dim]; position p at p % window.")
      .def(
          "compressed_store",
          [](Dsv4Ref s, SeqId seq, int32_t layer, nb::handle fw) { return view(s, s.p->compressed_store(seq, layer), fw); },
          "seq"_a, "layer"_a, nb::kw_only(), "framework"_a = nb::none(),
          "View of the compressed row store ([cap, 584] uint8 or [cap, head_dim] f32).")
      .def(
          "indexer_store",
          [](Dsv4Ref s, SeqId seq, int32_t layer, nb::handle fw) { return view(s, s.p->indexer_store(seq, layer), fw); },
          "seq"_a, "layer"_a, nb::kw_only(), "framework"_a = nb::none(), "View of the indexer row store.")
      .def(
          "read_window",
          [](const Dsv4Cache& c, SeqId seq, int32_t layer) {
            return rows_numpy(c.read_window(seq, layer), c.config().head_dim);
          },
          "seq"_a, "layer"_a, "Host copy float32 [min(length, window), head_dim], oldest first.")
      .def(
          "read_compressed",
          [](const Dsv4Cache& c, SeqId seq, int32_t layer) {
            return rows_numpy(c.read_compressed(seq, layer), c.config().head_dim);
          },
          "seq"_a, "layer"_a, "Host copy float32 [compressed_rows, head_dim].")
      .def(
          "read_indexer",
          [](const Dsv4Cache& c, SeqId seq, int32_t layer) {
            return rows_numpy(c.read_indexer(seq, layer), c.config().index_dim);
          },
          "seq"_a, "layer"_a, "Host copy float32 [indexer_rows, index_dim] (Hadamard domain if quantized).")
      .def(
          "indexer_topk",
          [](const Dsv4Cache& c, SeqId seq, int32_t layer, nb::handle q, nb::handle weights_,
             int32_t first_query_pos, nb::handle scores, nb::handle out) {
            Tensor tq = to_tensor(q, "q"), tw = to_tensor(weights_, "weights");
            Tensor ts = to_tensor(scores, "scores"), to = to_tensor(out, "out");
            nb::gil_scoped_release g;
            c.indexer_topk(seq, layer, tq.ref, tw.ref, first_query_pos, ts.ref, to.ref);
          },
          "seq"_a, "layer"_a, "q"_a.none(), "weights"_a.none(), "first_query_pos"_a, "scores"_a.none(), "out"_a.none(),
          "dsv4_indexer_topk over this sequence's indexer rows of a CSA layer.")
      .def("shift", &Dsv4Cache::shift, "seq"_a, "n_keep"_a, "n_discard"_a,
           "Context shift (docs/specs/dsv4-context-shift.md): drops tokens [n_keep, n_keep + n_discard),\n"
           "re-rotates what follows. InvalidArgumentError for a bad range or counts off shift_granule;\n"
           "NotSupportedError when the kept tail is shorter than the window of a longer sequence.")
      .def_prop_ro("allocated_bytes", &Dsv4Cache::allocated_bytes);
}

}  // namespace kvcore::py
