// Attention ops over pages the caller owns (an engine's own pools and tables): attention_decode,
// attention_prefill, attention_dsv4_decode and the workspace helpers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <string>
#include <vector>

#include "bindings.hpp"
#include "kvcore/ops/attention.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/attention_dsv4.hpp"
#include "tensors.hpp"

namespace kvcore::py {

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// The tensors and tables of one call over caller-owned pages, held for the call.
struct PagesArgs {
  Tensor k, v, k_scale, v_scale, positions, valid, indptr, indices, last_page_len, pos_offset, sinks, q_positions,
      qo_indptr, workspace;
  std::optional<math::RopeTable> rope;
  PagedKV kv;
  AttentionStep step;
  AttentionSchedule schedule;
  AttentionLayer layer;
};

void fill(PagesArgs& a, nb::handle k, nb::handle v, nb::handle indptr, nb::handle indices, nb::handle last_page_len,
          nb::handle k_scale, nb::handle v_scale, nb::handle positions, nb::handle valid, nb::handle pos_offset,
          float softmax_scale, nb::handle sinks, int32_t window, nb::handle q_positions,
          const std::optional<RopeSpec>& rope_on_read, int32_t num_splits, int64_t max_seq_cells,
          nb::handle workspace, bool check_tables) {
  a.k = to_tensor(k, "k", k_scale.is_none() ? DType::U8 : DType::E4M3);
  a.v = to_tensor(v, "v", v_scale.is_none() ? DType::U8 : DType::E4M3);
  a.k_scale = to_optional_tensor(k_scale, "k_scale", DType::UE8M0);
  a.v_scale = to_optional_tensor(v_scale, "v_scale", DType::UE8M0);
  a.positions = to_optional_tensor(positions, "positions");
  a.valid = to_optional_tensor(valid, "valid");
  a.indptr = to_tensor(indptr, "indptr");
  a.indices = to_tensor(indices, "indices");
  a.last_page_len = to_tensor(last_page_len, "last_page_len");
  a.pos_offset = to_optional_tensor(pos_offset, "pos_offset");
  a.sinks = to_optional_tensor(sinks, "sinks");
  a.q_positions = to_optional_tensor(q_positions, "q_positions");
  a.workspace = to_optional_tensor(workspace, "workspace");
  a.kv = PagedKV{a.k.ref, a.v.ref, a.k_scale.ref, a.v_scale.ref, a.positions.ref, a.valid.ref};
  if (rope_on_read) {
    const int32_t head_dim = a.k.ref.ndim() == 4 ? static_cast<int32_t>(a.k.ref.size(3)) : 0;
    rope_on_read->validate(head_dim);
    a.rope = make_rope_table(*rope_on_read, head_dim);
    a.kv.rope_mode = RopeMode::RopeOnRead;
    a.kv.maybe_rope = &*a.rope;
  }
  a.step.table = BlockTable{a.indptr.ref, a.indices.ref, a.last_page_len.ref, a.pos_offset.ref};
  a.step.q_positions = a.q_positions.ref;
  a.schedule.num_splits = num_splits;
  a.schedule.max_seq_cells = max_seq_cells;
  a.schedule.check_tables = check_tables;
  a.schedule.maybe_workspace = a.workspace.ref;
  a.layer.softmax_scale = softmax_scale;
  a.layer.window = window;
  a.layer.maybe_sinks = a.sinks.ref;
}

const char* kPagesDoc =
    "k, v: pages [num_blocks, block_size, n_kv_heads, head_dim] (f32/f16/bf16, or uint8 e4m3 codes with\n"
    "k_scale / v_scale: UE8M0 [.., head_dim / 64] or f32 [num_blocks, block_size, n_kv_heads]);\n"
    "indptr [batch + 1], indices, last_page_len [batch] int32: block tables in CSR form; positions int32\n"
    "[num_blocks, block_size] (window, causal, rope_on_read); valid uint8 (None: every cell live);\n"
    "pos_offset int32 [batch]; softmax_scale (0: head_dim**-0.5); sinks f32 [n_q_heads]; window: keys with\n"
    "q_pos - k_pos < window (0: all); q_positions int32 [n_rows]; rope_on_read: the RopeSpec of keys\n"
    "stored unrotated (attention then rotates keys and the unrotated q); workspace: scratch bytes\n"
    "(attention_workspace_bytes). One call plans and runs; a PagedCache's plan() serves every layer.";

std::vector<int64_t> shape_of_q(const Tensor& q) {
  return std::vector<int64_t>(q.ref.shape_data(), q.ref.shape_data() + q.ref.ndim());
}

int32_t q_heads(const Tensor& q, const char* op) {
  require_arg(q.ref.ndim() == 3, op, ": q must be [n_rows, n_q_heads, head_dim], got ", described(q.ref));
  return static_cast<int32_t>(q.ref.size(1));
}

// Plans one step over the caller's pages and runs it once: the tail both one-shot entry points share.
nb::object plan_and_run(PagesArgs& a, const Tensor& tq, nb::handle q, nb::handle out, nb::handle stream, bool prefill,
                        const char* op) {
  const int32_t hq = q_heads(tq, op);
  Output o = output(out, "out", q, shape_of_q(tq), tq.ref.dtype());
  const Stream s = resolve_stream(stream, tq.ref.device());
  a.schedule.stream = s;
  {
    nb::gil_scoped_release g;
    const AttentionPlan plan = prefill ? AttentionPlan::prefill(a.kv, hq, a.step, a.schedule)
                                       : AttentionPlan::decode(a.kv, hq, a.step, a.schedule);
    plan.run(tq.ref, a.kv, o.t.ref, a.layer, s);
  }
  return o.obj;
}

}  // namespace

void bind_attention_ops(nb::module_& m) {
  m.def(
      "attention_decode",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle indptr, nb::handle indices, nb::handle last_page_len,
         nb::handle out, nb::handle k_scale, nb::handle v_scale, nb::handle positions, nb::handle valid,
         nb::handle pos_offset, float softmax_scale, nb::handle sinks, int32_t window, nb::handle q_positions,
         std::optional<RopeSpec> rope_on_read, int32_t num_splits, int64_t max_seq_cells, nb::handle workspace,
         bool check_tables, nb::handle stream) -> nb::object {
        Tensor tq = to_tensor(q, "q");
        PagesArgs a;
        fill(a, k, v, indptr, indices, last_page_len, k_scale, v_scale, positions, valid, pos_offset, softmax_scale,
             sinks, window, q_positions, rope_on_read, num_splits, max_seq_cells, workspace, check_tables);
        return plan_and_run(a, tq, q, out, stream, false, "attention_decode");
      },
      "q"_a.none(), "k"_a.none(), "v"_a.none(), "indptr"_a.none(), "indices"_a.none(), "last_page_len"_a.none(),
      nb::kw_only(), "out"_a = nb::none(), "k_scale"_a = nb::none(), "v_scale"_a = nb::none(),
      "positions"_a = nb::none(), "valid"_a = nb::none(), "pos_offset"_a = nb::none(), "softmax_scale"_a = 0.0f,
      "sinks"_a = nb::none(), "window"_a = 0, "q_positions"_a = nb::none(), "rope_on_read"_a = nb::none(),
      "num_splits"_a = 0, "max_seq_cells"_a = 0, "workspace"_a = nb::none(), "check_tables"_a = true,
      "stream"_a = nb::none(),
      (std::string("Decode attention (one query row per sequence) over pages you own:\n"
                   "q [batch, n_q_heads, head_dim] -> out (same shape).\n") +
       kPagesDoc)
          .c_str());
  m.def(
      "attention_prefill",
      [](nb::handle q, nb::handle qo_indptr, nb::handle k, nb::handle v, nb::handle indptr, nb::handle indices,
         nb::handle last_page_len, nb::handle out, nb::handle k_scale, nb::handle v_scale, nb::handle positions,
         nb::handle valid, nb::handle pos_offset, float softmax_scale, nb::handle sinks, int32_t window,
         nb::handle q_positions, std::optional<RopeSpec> rope_on_read, int32_t num_splits, int64_t max_seq_cells,
         nb::handle workspace, bool check_tables, nb::handle stream) -> nb::object {
        Tensor tq = to_tensor(q, "q");
        PagesArgs a;
        fill(a, k, v, indptr, indices, last_page_len, k_scale, v_scale, positions, valid, pos_offset, softmax_scale,
             sinks, window, q_positions, rope_on_read, num_splits, max_seq_cells, workspace, check_tables);
        a.qo_indptr = to_tensor(qo_indptr, "qo_indptr");
        a.step.qo_indptr = a.qo_indptr.ref;
        return plan_and_run(a, tq, q, out, stream, true, "attention_prefill");
      },
      "q"_a.none(), "qo_indptr"_a.none(), "k"_a.none(), "v"_a.none(), "indptr"_a.none(), "indices"_a.none(),
      "last_page_len"_a.none(), nb::kw_only(), "out"_a = nb::none(), "k_scale"_a = nb::none(),
      "v_scale"_a = nb::none(), "positions"_a = nb::none(), "valid"_a = nb::none(), "pos_offset"_a = nb::none(),
      "softmax_scale"_a = 0.0f, "sinks"_a = nb::none(), "window"_a = 0, "q_positions"_a = nb::none(),
      "rope_on_read"_a = nb::none(), "num_splits"_a = 0, "max_seq_cells"_a = 0, "workspace"_a = nb::none(),
      "check_tables"_a = true, "stream"_a = nb::none(),
      (std::string("Causal prefill attention over pages you own: q [n_tokens, n_q_heads, head_dim], rows\n"
                   "qo_indptr[b] .. qo_indptr[b+1] (int32 [batch + 1]) of sequence b at q_positions (required);\n"
                   "the chunk's own keys must be in the pages already.\n") +
       kPagesDoc)
          .c_str());
  m.def(
      "attention_dsv4_decode",
      [](nb::handle q, nb::handle window_kv, nb::handle window_len, nb::handle q_positions, const RopeSpec& rope,
         float softmax_scale, nb::handle comp_rows, nb::handle comp_idx, nb::handle window_index, nb::handle sinks,
         int32_t num_splits, nb::handle workspace, bool check_indices, nb::handle out,
         nb::handle stream) -> nb::object {
        Tensor tq = to_tensor(q, "q"), tw = to_tensor(window_kv, "window_kv"), tl = to_tensor(window_len, "window_len");
        Tensor tp = to_tensor(q_positions, "q_positions"), tr = to_optional_tensor(comp_rows, "comp_rows");
        Tensor ti = to_optional_tensor(comp_idx, "comp_idx"), twi = to_optional_tensor(window_index, "window_index");
        Tensor ts = to_optional_tensor(sinks, "sinks"), tws = to_optional_tensor(workspace, "workspace");
        const int32_t hq = q_heads(tq, "attention_dsv4_decode");
        rope.validate(512);
        const math::RopeTable table = make_rope_table(rope, 512);
        Dsv4AttentionStep step;
        step.window_len = tl.ref;
        step.maybe_window_index = twi.ref;
        step.q_positions = tp.ref;
        Dsv4AttentionLayer layer;
        layer.window_kv = tw.ref;
        layer.comp_rows = tr.ref;
        layer.comp_idx = ti.ref;
        layer.maybe_sinks = ts.ref;
        layer.rope = &table;
        layer.softmax_scale = softmax_scale;
        layer.check_indices = check_indices;
        AttentionSchedule schedule;
        schedule.num_splits = num_splits;
        schedule.maybe_workspace = tws.ref;
        const Stream s = resolve_stream(stream, tq.ref.device());
        schedule.stream = s;
        Output o = output(out, "out", q, shape_of_q(tq), tq.ref.dtype());
        {
          nb::gil_scoped_release g;
          Dsv4AttentionPlan::decode(layer, hq, step, schedule).run(tq.ref, layer, o.t.ref, s);
        }
        return o.obj;
      },
      "q"_a.none(), "window_kv"_a.none(), "window_len"_a.none(), "q_positions"_a.none(), "rope"_a, nb::kw_only(),
      "softmax_scale"_a = 0.0f, "comp_rows"_a = nb::none(), "comp_idx"_a = nb::none(), "window_index"_a = nb::none(),
      "sinks"_a = nb::none(), "num_splits"_a = 0, "workspace"_a = nb::none(), "check_indices"_a = true,
      "out"_a = nb::none(), "stream"_a = nb::none(),
      "DeepSeek-V4 sparse decode attention: q [n_rows, n_heads, 512] over the window rows window_kv\n"
      "[n_rows (or n_rings with window_index), n_window <= 128, 512] (window_len int32 [n_rows] live) and the\n"
      "packed compressed rows comp_rows uint8 [n_comp, 584] picked by comp_idx int32 [n_rows, k] (-1: none);\n"
      "the output's rope dims are rotated back by q_positions. softmax_scale 0: 512**-0.5.");
  m.def("attention_workspace_bytes", &attention_workspace_bytes, "n_rows"_a, "n_q_heads"_a, "head_dim"_a,
        "num_splits"_a, "Bytes of workspace an attention call with these sizes and split count needs.");
}

}  // namespace kvcore::py
