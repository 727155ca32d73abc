// kvcore.PagedCache, kvcore.Ticket and kvcore.AttentionPlan.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "bindings.hpp"
#include "host_arrays.hpp"
#include "host_ints.hpp"
#include "kvcore/error.hpp"
#include "kvcore/runtime.hpp"
#include "names.hpp"
#include "paged.hpp"
#include "tensors.hpp"

namespace kvcore::py {

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using CacheRef = nb::pointer_and_handle<PyPagedCache>;

const char* kCacheDoc = R"(A paged KV cache for many sequences, on the CPU or one CUDA device.

Per layer a K pool and a V pool of fixed-size blocks; sequences own lists of blocks, shared by
fork() and copied on write. Every call checks its arguments first and raises kvcore.Error (a
ValueError, MemoryError, ... subclass) naming the bad one; the cache is then unchanged.

A decode step:
    cache = kvcore.PagedCache(n_layers=32, n_kv_heads=8, head_dim=128, num_blocks=4096,
                              k_format="fp8", rope=kvcore.RopeSpec.llama3_8b(), rope_mode="on_read")
    seq = cache.create()
    ticket = cache.reserve(seq, [pos])            # cells for this step's tokens
    plan = cache.plan(ticket)                     # block tables + options, once per step
    for layer in range(32):
        cache.store(ticket, layer, k, v)          # k, v: [n_tokens, n_kv_heads, head_dim]
        out = plan.run(layer, q)                  # q: [n_tokens, n_q_heads, head_dim]

Edits: fork(seq) shares every block (copy on write), truncate(seq, n) rolls back,
shift(seq, n_keep, n_discard) drops a range and moves later tokens down (metadata only in
rope_mode='on_read'), erase(seq) frees. Tensors are any object with __dlpack__ (numpy, torch)
on the cache's device; they are used in place, never copied. Views of the pools
(k_pool(layer), ...) keep the cache alive.)";

void bump(PyPagedCache& c) { ++c.epoch; }

const char* pool_dtype_name(DType t) {
  switch (t) {
    case DType::E4M3: return "float8_e4m3fn";
    case DType::UE8M0: return "uint8";  // torch's float8_e8m0fnu is recent; bytes serve
    default: return dtype_py_name(t);
  }
}


PagedCacheConfig make_config(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim, int32_t num_blocks,
                             std::optional<int32_t> v_head_dim, int32_t block_size, const std::string& k_format,
                             std::optional<std::string> v_format, nb::handle rope, const std::string& rope_mode,
                             bool strict_positions, bool kvcore_attention, bool v_from_k_latent) {
  PagedCacheConfig cfg;
  cfg.n_layers = n_layers;
  cfg.n_kv_heads = n_kv_heads;
  cfg.head_dim = head_dim;
  cfg.v_head_dim = v_head_dim.value_or(head_dim);
  cfg.block_size = block_size;
  cfg.num_blocks = num_blocks;
  cfg.k_format = parse_kv_format(k_format, "k_format");
  cfg.v_format = v_format ? parse_kv_format(*v_format, "v_format") : cfg.k_format;
  if (cfg.v_format == KvFormat::Dsv4Row) cfg.v_format = KvFormat::F16;  // ignored without V; never Dsv4Row
  if (nb::isinstance<RopeSpec>(rope)) cfg.rope = {nb::cast<RopeSpec>(rope)};
  else cfg.rope = nb::cast<std::vector<RopeSpec>>(rope);
  cfg.rope_mode = parse_rope_mode(rope_mode);
  cfg.strict_positions = strict_positions;
  cfg.kvcore_attention = kvcore_attention;
  cfg.v_from_k_latent = v_from_k_latent;
  return cfg;
}

nb::object pool_view(CacheRef self, int32_t layer, bool is_k, bool scales, nb::handle framework) {
  const KvPool p = is_k ? self.p->cache.k_pool(layer) : self.p->cache.v_pool(layer);
  const TensorRef& t = scales ? p.scales : p.data;
  if (t.empty()) return nb::none();
  std::string fw = framework.is_none() ? (t.device().is_cpu() ? "numpy" : "torch") : nb::cast<std::string>(framework);
  return export_view(t, self.h, fw.c_str());
}

std::vector<int32_t> copy_i32(const TensorRef& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) copy_bytes(v.data(), Device::cpu(), t.data(), t.device(), v.size() * 4);
  return v;
}

PyAttentionPlan make_plan(CacheRef self, const capi::Ticket* ticket, const std::vector<SeqId>& seqs,
                          const std::vector<int32_t>& q_positions, std::optional<float> softmax_scale, int32_t window,
                          nb::handle sinks, int32_t num_splits, bool check_tables) {
  PyAttentionPlan plan;
  plan.cache_obj = nb::borrow(self.h);
  plan.cache = self.p;
  plan.sinks = to_optional_tensor(sinks, "sinks");
  capi::PagedPlanOptions o;
  o.softmax_scale = softmax_scale.value_or(0.0f);
  require_arg(!softmax_scale || *softmax_scale > 0.0f, "plan: softmax_scale must be > 0, got ", o.softmax_scale);
  o.window = window;
  o.sinks = plan.sinks.ref;
  o.num_splits = num_splits;
  o.check_tables = check_tables;
  PagedCache& cache = self.p->cache;
  nb::gil_scoped_release g;
  if (ticket && q_positions.empty()) {
    plan.plan.emplace(capi::PagedPlan::of_ticket(cache, *ticket, o));
  } else if (ticket) {
    plan.plan.emplace(cache, ticket->seqs, ticket->counts, q_positions, o);
  } else {
    const std::vector<int32_t> ones(seqs.size(), 1);
    plan.plan.emplace(cache, seqs, ones, q_positions, o);
  }
  plan.epoch = self.p->epoch;
  return plan;
}

nb::object plan_run(PyAttentionPlan& plan, int32_t layer, nb::handle q, nb::handle out, nb::handle stream) {
  require_arg(plan.epoch == plan.cache->epoch,
              "AttentionPlan.run: the plan is stale (the cache changed after plan(); make a new plan each step)");
  Tensor tq = to_tensor(q, "q");
  // The output's rows are V's width (MLA: 512 for 576-dim queries).
  Output o = output(out, "out", q, shape_with_last(tq.ref, plan.cache->cache.config().v_head_dim), tq.ref.dtype());
  const Stream s = resolve_stream(stream, plan.cache->cache.device());
  {
    nb::gil_scoped_release g;
    plan.plan->run(layer, tq.ref, o.t.ref, s);
  }
  return o.obj;
}

}  // namespace

// The stream of this call: `stream`, else torch's current stream (CUDA caches; CPU ignores it).
void use_stream(PyPagedCache& c, nb::handle stream) {
  const Device dev = c.cache.device();
  if (dev.is_cuda()) c.cache.set_stream(resolve_stream(stream, dev));
}

void bind_paged_cache(nb::module_& m) {
  nb::class_<SeqInfo>(m, "SeqInfo", "One sequence: live tokens, cells spanned, blocks, last position (-1: empty).")
      .def_ro("n_live", &SeqInfo::n_live)
      .def_ro("n_cells", &SeqInfo::n_cells)
      .def_ro("n_blocks", &SeqInfo::n_blocks)
      .def_ro("last_position", &SeqInfo::last_position)
      .def("__repr__", [](const SeqInfo& s) {
        return detail::concat("SeqInfo(n_live=", s.n_live, ", n_cells=", s.n_cells, ", n_blocks=", s.n_blocks,
                              ", last_position=", s.last_position, ")");
      });
  nb::class_<PagedStats>(m, "PagedStats", "Pool and sequence counts of a PagedCache.")
      .def_ro("sequences", &PagedStats::sequences)
      .def_ro("blocks_total", &PagedStats::blocks_total)
      .def_ro("blocks_used", &PagedStats::blocks_used)
      .def_ro("blocks_free", &PagedStats::blocks_free)
      .def_ro("blocks_shared", &PagedStats::blocks_shared)
      .def_ro("bytes_per_block", &PagedStats::bytes_per_block)
      .def_ro("bytes_total", &PagedStats::bytes_total)
      .def_ro("bytes_used", &PagedStats::bytes_used)
      .def_ro("tokens_live", &PagedStats::tokens_live)
      .def_ro("tokens_dead", &PagedStats::tokens_dead)
      .def_ro("cells_pending", &PagedStats::cells_pending)
      .def("__repr__", [](const PagedStats& s) {
        return detail::concat("PagedStats(sequences=", s.sequences, ", blocks_used=", s.blocks_used, "/",
                              s.blocks_total, ", tokens_live=", s.tokens_live, ", tokens_dead=", s.tokens_dead, ")");
      });

  nb::class_<PagedPoolSpec>(m, "PoolSpec",
                            "One pool array a PagedCache needs (PagedCache.pool_specs): its layer, part ('k',\n"
                            "'k_scales', 'v', 'v_scales'), shape [num_blocks + 1, block_size, n_kv_heads, width],\n"
                            "dtype (as torch names it; uint8 also serves for float8_e4m3fn) and size in bytes.")
      .def_ro("layer", &PagedPoolSpec::layer)
      .def_prop_ro("part", [](const PagedPoolSpec& s) { return pool_part_name(s.part); })
      .def_prop_ro("shape", [](const PagedPoolSpec& s) { return nb::make_tuple(s.shape[0], s.shape[1], s.shape[2], s.shape[3]); })
      .def_prop_ro("dtype", [](const PagedPoolSpec& s) { return pool_dtype_name(s.dtype); })
      .def_ro("bytes", &PagedPoolSpec::bytes)
      .def("__repr__", [](const PagedPoolSpec& s) {
        return detail::concat("PoolSpec(layer=", s.layer, ", part='", pool_part_name(s.part), "', shape=(", s.shape[0],
                              ", ", s.shape[1], ", ", s.shape[2], ", ", s.shape[3], "), dtype='", pool_dtype_name(s.dtype),
                              "')");
      });

  nb::class_<capi::Ticket>(m, "Ticket",
                           "Cells reserved for one step's new tokens (PagedCache.reserve). Store each layer with\n"
                           "PagedCache.store(ticket, layer, k, v); stale once one of its sequences changes again.\n"
                           "Pass it back as reserve(..., reuse=ticket) so a decode loop allocates nothing per step.")
      .def(nb::init<>(), "An empty ticket, to be filled by reserve(..., reuse=ticket).")
      .def_ro("seqs", &capi::Ticket::seqs)
      .def_ro("counts", &capi::Ticket::counts)
      .def_ro("positions", &capi::Ticket::positions, "The tokens' positions, as given to reserve().")
      .def_prop_ro("n_tokens", [](const capi::Ticket& t) { return t.positions.size(); })
      .def_prop_ro(
          "slots", [](const capi::Ticket& t) { return t.positions.empty() ? std::vector<int32_t>{} : copy_i32(t.t.slot_mapping()); },
          "Cell ids (block * block_size + slot), one per token (a host copy).");

  nb::class_<PyAttentionPlan>(m, "AttentionPlan",
                              "Attention over one step's batch, made by PagedCache.plan(): block tables, query\n"
                              "positions and options computed once; run(layer, q) once per layer. Stale (run raises)\n"
                              "once the cache's sequences change; holds a reference to its cache.")
      .def("run", &plan_run, "layer"_a, "q"_a.none(), nb::kw_only(), "out"_a = nb::none(), "stream"_a = nb::none(),
           "Attention of q [n_rows, n_q_heads, head_dim] (f32/f16/bf16; rows in the plan's order, rotated\n"
           "already unless the cache is rope_mode='on_read', where kvcore rotates q at its position) over\n"
           "layer's pages. Writes out ([n_rows, n_q_heads, v_head_dim]; any of f32/f16/bf16) or returns a\n"
           "new tensor like q of that shape.")
      .def_prop_ro("batch", [](const PyAttentionPlan& p) { return p.plan->batch(); })
      .def_prop_ro("n_rows", [](const PyAttentionPlan& p) { return p.plan->n_rows(); })
      .def_prop_ro("prefill", [](const PyAttentionPlan& p) { return p.plan->prefill(); })
      .def_prop_ro("softmax_scale", [](const PyAttentionPlan& p) { return p.plan->softmax_scale(); })
      .def_prop_ro("is_stale", [](const PyAttentionPlan& p) { return p.epoch != p.cache->epoch; });

  nb::class_<PyPagedCache>(m, "PagedCache", kCacheDoc, nb::is_weak_referenceable())
      .def(
          "__init__",
          [](PyPagedCache* self, int32_t n_layers, int32_t n_kv_heads, int32_t head_dim, int32_t num_blocks,
             nb::handle rope, std::optional<int32_t> v_head_dim, int32_t block_size, const std::string& k_format,
             std::optional<std::string> v_format, const std::string& rope_mode, bool strict_positions,
             bool kvcore_attention, bool v_from_k_latent, nb::handle device, nb::handle stream, nb::handle pools) {
            PagedCacheConfig cfg = make_config(n_layers, n_kv_heads, head_dim, num_blocks, v_head_dim, block_size,
                                               k_format, v_format, rope, rope_mode, strict_positions,
                                               kvcore_attention, v_from_k_latent);
            const Device dev = parse_device(device);
            cfg.stream = resolve_stream(stream, dev);
            std::optional<PagedCache> built;
            if (pools.is_none()) {
              {
                nb::gil_scoped_release g;
                built.emplace(std::move(cfg), dev);
              }
              new (self) PyPagedCache{{}, nb::none(), std::move(*built), 0};
              return;
            }
            require_arg(nb::isinstance<nb::list>(pools) || nb::isinstance<nb::tuple>(pools),
                        "argument 'pools' must be a list of tensors (PagedCache.pool_specs), got ",
                        nb::type_name(pools.type()).c_str());
            std::vector<Tensor> held;
            std::vector<TensorRef> refs;
            const nb::tuple given = nb::tuple(pools);
            for (size_t i = 0; i < given.size(); ++i) {
              const std::string name = detail::concat("pools[", i, "]");
              held.push_back(to_tensor(given[i], name.c_str()));
              refs.push_back(held.back().ref);
            }
            std::vector<nb::ndarray<>> arrays;
            for (Tensor& t : held) arrays.push_back(std::move(t.held));
            {
              nb::gil_scoped_release g;
              built.emplace(std::move(cfg), dev, refs);
            }
            new (self) PyPagedCache{std::move(arrays), given, std::move(*built), 0};
          },
          "n_layers"_a, "n_kv_heads"_a, "head_dim"_a, "num_blocks"_a, nb::kw_only(), "rope"_a,
          "v_head_dim"_a = nb::none(), "block_size"_a = 16, "k_format"_a = "f16", "v_format"_a = nb::none(),
          "rope_mode"_a = "stored", "strict_positions"_a = true, "kvcore_attention"_a = true,
          "v_from_k_latent"_a = false, "device"_a = "cpu", "stream"_a = nb::none(), "pools"_a = nb::none(),
          "Allocate the pools: num_blocks blocks of block_size cells per layer.\n"
          "rope: a RopeSpec (or one per layer); k_format/v_format: 'f32', 'f16', 'bf16', 'fp8' (e4m3 + one\n"
          "UE8M0 scale per 64 dims); v_head_dim 0: no V pools; rope_mode 'stored' (K rotated when written)\n"
          "or 'on_read' (K stored unrotated, rotated by attention; shift() moves no byte);\n"
          "strict_positions: positions must increase along a sequence; kvcore_attention: refuse at once\n"
          "formats kvcore's attention cannot read (False: pages for an engine's own attention);\n"
          "v_from_k_latent: MLA's shared layout -- no V pools, V is the first v_head_dim dims of each K\n"
          "row (K's format and scales); append/store then take K only (v=None);\n"
          "device 'cpu' or 'cuda:N';\n"
          "stream: the CUDA stream of the construction (default: torch's current stream); every later\n"
          "call runs on its own stream= or, without one, on torch's current stream at the call;\n"
          "pools: pool memory the caller allocated (so its allocator accounts for it): one tensor per\n"
          "array of PagedCache.pool_specs(...) with the same arguments, in that order, each of exactly\n"
          "that shape and dtype (uint8 also for float8_e4m3fn), contiguous, 16-byte aligned, on the\n"
          "cache's device. The cache zeroes them, writes only through them and keeps them alive.")
      .def_static(
          "pool_specs",
          [](int32_t n_layers, int32_t n_kv_heads, int32_t head_dim, int32_t num_blocks, nb::handle rope,
             std::optional<int32_t> v_head_dim, int32_t block_size, const std::string& k_format,
             std::optional<std::string> v_format, const std::string& rope_mode, bool strict_positions,
             bool kvcore_attention, bool v_from_k_latent) {
            return paged_pool_specs(make_config(n_layers, n_kv_heads, head_dim, num_blocks, v_head_dim, block_size, k_format,
                                          v_format, rope, rope_mode, strict_positions, kvcore_attention,
                                          v_from_k_latent));
          },
          "n_layers"_a, "n_kv_heads"_a, "head_dim"_a, "num_blocks"_a, nb::kw_only(), "rope"_a,
          "v_head_dim"_a = nb::none(), "block_size"_a = 16, "k_format"_a = "f16", "v_format"_a = nb::none(),
          "rope_mode"_a = "stored", "strict_positions"_a = true, "kvcore_attention"_a = true,
          "v_from_k_latent"_a = false,
          "The pool arrays a cache of this configuration needs (PoolSpec list, in the order\n"
          "PagedCache(..., pools=) takes them): per layer k, k_scales (fp8 K), v (v_head_dim > 0 and\n"
          "not v_from_k_latent),\n"
          "v_scales (fp8 V). An engine allocates them itself, e.g.\n"
          "    pools = [torch.empty(s.shape, dtype=getattr(torch, s.dtype), device='cuda') for s in specs]\n"
          "Each has num_blocks + 1 blocks: the last is the cache's zero block (never write it).")
      .def_prop_ro(
          "pools", [](const PyPagedCache& c) -> nb::object { return c.pools; },
          "The caller's pool tensors given to the constructor (a tuple), or None when the cache allocated them.")
      // ---- sequences ----
      .def(
          "create", [](PyPagedCache& c) { bump(c); return c.cache.create(); }, "A new empty sequence; returns its id.")
      .def(
          "fork",
          [](PyPagedCache& c, SeqId seq, nb::handle stream) {
            use_stream(c, stream);
            SeqId r;
            {
              nb::gil_scoped_release g;
              r = c.cache.fork(seq);
            }
            bump(c);
            return r;
          },
          "seq"_a, nb::kw_only(), "stream"_a = nb::none(), "A new sequence sharing every block of seq (copied on first write); returns its id.")
      .def(
          "erase",
          [](PyPagedCache& c, SeqId seq, nb::handle stream) {
            use_stream(c, stream);
            {
              nb::gil_scoped_release g;
              c.cache.erase(seq);
            }
            bump(c);
          },
          "seq"_a, nb::kw_only(), "stream"_a = nb::none(), "Free a sequence (blocks shared with others stay).")
      .def(
          "append",
          [](PyPagedCache& c, SeqId seq, nb::handle positions, nb::handle k, nb::handle v, nb::handle stream) {
            use_stream(c, stream);
            const std::vector<int32_t> pos = host_i32(positions, "positions");
            Tensor tk = to_tensor(k, "k"), tv = to_optional_tensor(v, "v");
            {
              nb::gil_scoped_release g;
              c.cache.append(seq, pos, tk.ref, tv.ref);
            }
            bump(c);
          },
          "seq"_a, "positions"_a.none(), "k"_a.none(), "v"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
          "Append n tokens to every layer at once: positions (n ints), k [n_layers, n, n_kv_heads, head_dim],\n"
          "v [n_layers, n, n_kv_heads, v_head_dim] (None without V), f32/f16/bf16 on the cache's device.")
      .def(
          "reserve",
          [](PyPagedCache& c, nb::handle seqs, nb::handle positions, nb::handle counts,
             capi::Ticket* reuse, nb::handle stream) -> nb::object {
            use_stream(c, stream);
            const std::vector<int64_t> s = host_i64(seqs, "seqs");
            const std::vector<int32_t> pos = host_i32(positions, "positions");
            std::vector<int32_t> cnt;
            if (counts.is_none()) {
              require_arg(s.size() == 1, "reserve: counts is required for ", s.size(), " sequences");
              cnt = {static_cast<int32_t>(pos.size())};
            } else {
              cnt = host_i32(counts, "counts");
            }
            if (reuse) {
              {
                nb::gil_scoped_release g;
                reuse->reserve(c.cache, s, cnt, pos);
              }
              bump(c);
              return nb::cast(reuse, nb::rv_policy::reference);
            }
            capi::Ticket t;
            {
              nb::gil_scoped_release g;
              t.reserve(c.cache, s, cnt, pos);
            }
            bump(c);
            return nb::cast(std::move(t));
          },
          "seqs"_a, "positions"_a.none(), "counts"_a = nb::none(), nb::kw_only(), "reuse"_a = nb::none(), "stream"_a = nb::none(),
          "Reserve cells for new tokens: counts[i] tokens of seqs[i] (distinct ids; seqs may be one int,\n"
          "then counts defaults to len(positions)); positions concatenated in that order. The tokens are\n"
          "live at once; store() writes them layer by layer. reuse: refill this Ticket (no allocation).")
      .def(
          "store",
          [](PyPagedCache& c, const capi::Ticket& ticket, int32_t layer, nb::handle k, nb::handle v,
             nb::handle stream) {
            use_stream(c, stream);
            Tensor tk = to_tensor(k, "k"), tv = to_optional_tensor(v, "v");
            nb::gil_scoped_release g;
            c.cache.store(ticket.t, layer, tk.ref, tv.ref);
          },
          "ticket"_a, "layer"_a, "k"_a.none(), "v"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
          "Write one layer of the ticket's tokens: k [n_tokens, n_kv_heads, head_dim], v [n_tokens,\n"
          "n_kv_heads, v_head_dim] (f32/f16/bf16; rotated at their positions in rope_mode='stored').")
      .def(
          "store_layers",
          [](PyPagedCache& c, const capi::Ticket& ticket, nb::handle k, nb::handle v, nb::handle stream) {
            use_stream(c, stream);
            Tensor tk = to_tensor(k, "k"), tv = to_optional_tensor(v, "v");
            nb::gil_scoped_release g;
            c.cache.store_layers(ticket.t, tk.ref, tv.ref);
          },
          "ticket"_a, "k"_a.none(), "v"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
          "Write every layer of the ticket's tokens at once (one launch on CUDA; the same bytes as store()\n"
          "per layer): k [n_layers, n_tokens, n_kv_heads, head_dim], v [n_layers, n_tokens, n_kv_heads,\n"
          "v_head_dim] (f32/f16/bf16; K rotated at its positions in rope_mode='stored').")
      .def(
          "shift",
          [](PyPagedCache& c, SeqId seq, int32_t n_keep, int32_t n_discard, nb::handle stream) {
            use_stream(c, stream);
            {
              nb::gil_scoped_release g;
              c.cache.shift(seq, n_keep, n_discard);
            }
            bump(c);
          },
          "seq"_a, "n_keep"_a, "n_discard"_a, nb::kw_only(), "stream"_a = nb::none(),
          "Context shift: keep tokens [0, n_keep), drop [n_keep, n_keep + n_discard); later tokens move down\n"
          "by n_discard positions (metadata only in rope_mode='on_read'; rotations deferred to prepare()\n"
          "in 'stored').")
      .def(
          "blocks_needed",
          [](const PyPagedCache& c, nb::handle seqs, nb::handle counts) {
            return c.cache.blocks_needed(host_i64(seqs, "seqs"), host_i32(counts, "counts"));
          },
          "seqs"_a, "counts"_a,
          "Free blocks reserve(seqs, ..., counts) would take (new blocks plus copies of shared tails).")
      .def(
          "can_fit",
          [](const PyPagedCache& c, nb::handle seqs, nb::handle counts) {
            return c.cache.can_fit(host_i64(seqs, "seqs"), host_i32(counts, "counts"));
          },
          "seqs"_a, "counts"_a, "Whether the pool has the blocks reserve(seqs, ..., counts) would take.")
      .def(
          "remove_positions",
          [](PyPagedCache& c, SeqId seq, int32_t p0, std::optional<int32_t> p1, nb::handle stream) {
            use_stream(c, stream);
            {
              nb::gil_scoped_release g;
              c.cache.remove_positions(seq, p0, p1.value_or(PagedCache::kPosEnd));
            }
            bump(c);
          },
          "seq"_a, "p0"_a, "p1"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
          "Drop every token of seq whose position p has p0 <= p < p1 (None: to the end); llama.cpp's seq_rm.")
      .def(
          "add_positions",
          [](PyPagedCache& c, SeqId seq, int32_t p0, std::optional<int32_t> p1, int32_t delta, nb::handle stream) {
            use_stream(c, stream);
            {
              nb::gil_scoped_release g;
              c.cache.add_positions(seq, p0, p1.value_or(PagedCache::kPosEnd), delta);
            }
            bump(c);
          },
          "seq"_a, "p0"_a, "p1"_a, "delta"_a, nb::kw_only(), "stream"_a = nb::none(),
          "Add delta to the positions of seq's tokens with p0 <= p < p1 (None: to the end); llama.cpp's\n"
          "seq_add. Rope-stored keys are re-rotated at the next prepare(); rope-on-read: metadata only.")
      .def(
          "truncate",
          [](PyPagedCache& c, SeqId seq, int32_t n, nb::handle stream) {
            use_stream(c, stream);
            {
              nb::gil_scoped_release g;
              c.cache.truncate(seq, n);
            }
            bump(c);
          },
          "seq"_a, "n"_a, nb::kw_only(), "stream"_a = nb::none(), "Keep the first n tokens (speculative-decoding rollback).")
      .def(
          "prepare",
          [](PyPagedCache& c, nb::handle stream) {
            use_stream(c, stream);
            const bool pending = c.cache.needs_prepare();
            {
              nb::gil_scoped_release g;
              c.cache.prepare();
            }
            if (pending) bump(c);
          },
          nb::kw_only(), "stream"_a = nb::none(),
          "Apply what shifts left pending (rotations, position offsets). plan() and read() need no call.")
      .def_prop_ro("needs_prepare", [](const PyPagedCache& c) { return c.cache.needs_prepare(); })
      // ---- attention ----
      .def(
          "plan",
          [](CacheRef self, nb::handle what, nb::handle q_positions, std::optional<float> softmax_scale,
             int32_t window, nb::handle sinks, int32_t num_splits, bool check_tables, nb::handle stream) {
            use_stream(*self.p, stream);
            const bool is_ticket = nb::isinstance<capi::Ticket>(what);
            const capi::Ticket* ticket = is_ticket ? &nb::cast<const capi::Ticket&>(what) : nullptr;
            std::vector<SeqId> seqs;
            std::vector<int32_t> qpos;
            if (!is_ticket) {
              seqs = host_i64(what, "seqs");
              if (q_positions.is_none())
                for (SeqId s : seqs) qpos.push_back(self.p->cache.info(s).last_position);
            }
            if (!q_positions.is_none()) qpos = host_i32(q_positions, "q_positions");
            PyAttentionPlan plan = make_plan(self, ticket, seqs, qpos, softmax_scale, window, sinks, num_splits,
                                             check_tables);
            return plan;
          },
          "ticket_or_seqs"_a, "q_positions"_a = nb::none(), nb::kw_only(), "softmax_scale"_a = nb::none(),
          "window"_a = 0, "sinks"_a = nb::none(), "num_splits"_a = 0, "check_tables"_a = true, "stream"_a = nb::none(),
          "Plan this step's attention. With a Ticket: its sequences, one query row per reserved token\n"
          "(decode when every count is 1, else causal prefill), at the tokens' positions. With seq ids:\n"
          "one query row each, at q_positions (default: each sequence's last position).\n"
          "softmax_scale: default head_dim**-0.5; window: sliding window (0: none); sinks: f32 [n_q_heads].")
      // ---- reading ----
      .def(
          "read",
          [](PyPagedCache& c, SeqId seq, int32_t layer, nb::handle stream) {
            use_stream(c, stream);
            PagedReadBack r;
            const bool pending = c.cache.needs_prepare();
            {
              nb::gil_scoped_release g;
              r = c.cache.read(seq, layer);
            }
            if (pending) bump(c);  // read() ran prepare(), which moved positions
            const PagedCacheConfig& cfg = c.cache.config();
            const size_t n = r.positions.size(), H = static_cast<size_t>(cfg.n_kv_heads);
            nb::object pos = numpy_from(std::move(r.positions), {n});
            nb::object k = numpy_from(std::move(r.k), {n, H, static_cast<size_t>(cfg.head_dim)});
            nb::object v = r.v.empty() && cfg.v_head_dim == 0
                               ? nb::none()
                               : numpy_from(std::move(r.v), {n, H, static_cast<size_t>(cfg.v_head_dim)});
            return nb::make_tuple(pos, k, v);
          },
          "seq"_a, "layer"_a, nb::kw_only(), "stream"_a = nb::none(),
          "Host copy of one layer of a sequence as numpy: (positions int32 [n], k float32 [n, heads, head_dim]\n"
          "rotated at current positions, v float32 [n, heads, v_head_dim] or None).")
      .def(
          "block_tables",
          [](PyPagedCache& c, nb::handle seqs, bool offsets, nb::handle stream) {
            use_stream(c, stream);
            const std::vector<SeqId> s = host_i64(seqs, "seqs");
            BlockTable csr;
            const bool pending = c.cache.needs_prepare();
            {
              nb::gil_scoped_release g;
              csr = c.cache.block_tables(s, offsets ? PagedPositions::Offsets : PagedPositions::Materialized);
            }
            if (!offsets && pending) bump(c);
            nb::dict d;
            for (auto [name, t] : {std::pair<const char*, const TensorRef*>{"indptr", &csr.indptr},
                                   {"indices", &csr.indices},
                                   {"last_page_len", &csr.last_page_len},
                                   {"pos_offset", &csr.pos_offset}}) {
              std::vector<int32_t> v = copy_i32(*t);
              const size_t n = v.size();
              d[name] = numpy_from(std::move(v), {n});
            }
            return d;
          },
          "seqs"_a, "offsets"_a = false, nb::kw_only(), "stream"_a = nb::none(),
          "Host copies (numpy int32) of the CSR block tables of seqs: a dict with indptr, indices,\n"
          "last_page_len, pos_offset (key position = positions[cell] - pos_offset[b]; 0 unless offsets=True).")
      .def(
          "positions",
          [](CacheRef self, nb::handle framework) {
            const TensorRef t = self.p->cache.positions();
            return export_view(t, self.h,
                               framework.is_none() ? (t.device().is_cpu() ? "numpy" : "torch")
                                                   : nb::cast<std::string>(framework).c_str());
          },
          nb::kw_only(), "framework"_a = nb::none(),
          "View (no copy) of the stored positions, int32 [num_blocks, block_size]; token positions after\n"
          "prepare(). framework: 'numpy' (CPU), 'torch' or 'dlpack'; default numpy on CPU, torch on CUDA.")
      .def(
          "valid",
          [](CacheRef self, nb::handle framework) {
            const TensorRef t = self.p->cache.valid();
            return export_view(t, self.h,
                               framework.is_none() ? (t.device().is_cpu() ? "numpy" : "torch")
                                                   : nb::cast<std::string>(framework).c_str());
          },
          nb::kw_only(), "framework"_a = nb::none(), "View of the cell validity bytes, uint8 [num_blocks, block_size].")
      .def(
          "k_pool", [](CacheRef self, int32_t layer, nb::handle fw) { return pool_view(self, layer, true, false, fw); },
          "layer"_a, nb::kw_only(), "framework"_a = nb::none(),
          "View (no copy; keeps the cache alive) of layer's K pool [num_blocks, block_size, n_kv_heads,\n"
          "head_dim]; FP8 pools are uint8 codes (torch: float8_e4m3fn).")
      .def(
          "v_pool", [](CacheRef self, int32_t layer, nb::handle fw) { return pool_view(self, layer, false, false, fw); },
          "layer"_a, nb::kw_only(), "framework"_a = nb::none(), "View of layer's V pool (None without V).")
      .def(
          "k_scales", [](CacheRef self, int32_t layer, nb::handle fw) { return pool_view(self, layer, true, true, fw); },
          "layer"_a, nb::kw_only(), "framework"_a = nb::none(),
          "View of layer's K scale bytes (UE8M0 [num_blocks, block_size, n_kv_heads, head_dim / 64]) of an\n"
          "FP8 pool, else None.")
      .def(
          "v_scales", [](CacheRef self, int32_t layer, nb::handle fw) { return pool_view(self, layer, false, true, fw); },
          "layer"_a, nb::kw_only(), "framework"_a = nb::none(), "View of layer's V scale bytes, or None.")
      // ---- inspection ----
      .def("stats", [](const PyPagedCache& c) { return c.cache.stats(); }, "Pool and sequence counts.")
      .def("info", [](const PyPagedCache& c, SeqId s) { return c.cache.info(s); }, "seq"_a, "One sequence's counts.")
      .def("__contains__", [](const PyPagedCache& c, SeqId s) { return c.cache.contains(s); }, "seq"_a)
      .def("sequences", [](const PyPagedCache& c) { return c.cache.sequences(); }, "Ids of every live sequence.")
      .def("debug_state", [](const PyPagedCache& c) { return c.cache.debug_state(); },
           "Canonical text of all host metadata (tests compare it).")
      .def_prop_ro("n_layers", [](const PyPagedCache& c) { return c.cache.config().n_layers; })
      .def_prop_ro("n_kv_heads", [](const PyPagedCache& c) { return c.cache.config().n_kv_heads; })
      .def_prop_ro("head_dim", [](const PyPagedCache& c) { return c.cache.config().head_dim; })
      .def_prop_ro("v_head_dim", [](const PyPagedCache& c) { return c.cache.config().v_head_dim; })
      .def_prop_ro("v_from_k_latent", [](const PyPagedCache& c) { return c.cache.config().v_from_k_latent; },
                   "True: no V pools; V is the first v_head_dim dims of each K row (MLA's shared layout).")
      .def_prop_ro("block_size", [](const PyPagedCache& c) { return c.cache.config().block_size; })
      .def_prop_ro("num_blocks", [](const PyPagedCache& c) { return c.cache.config().num_blocks; })
      .def_prop_ro("k_format", [](const PyPagedCache& c) { return kv_format_str(c.cache.config().k_format); })
      .def_prop_ro("v_format", [](const PyPagedCache& c) { return kv_format_str(c.cache.config().v_format); })
      .def_prop_ro("rope_mode", [](const PyPagedCache& c) { return rope_mode_str(c.cache.config().rope_mode); })
      .def_prop_ro("rope", [](const PyPagedCache& c) { return c.cache.config().rope; })
      .def_prop_ro("device", [](const PyPagedCache& c) { return c.cache.device().str(); })
      .def("__repr__", [](const PyPagedCache& c) {
        const PagedCacheConfig& cfg = c.cache.config();
        return detail::concat("PagedCache(n_layers=", cfg.n_layers, ", n_kv_heads=", cfg.n_kv_heads,
                              ", head_dim=", cfg.head_dim, ", num_blocks=", cfg.num_blocks, ", k_format='",
                              kv_format_str(cfg.k_format), "', rope_mode='", rope_mode_str(cfg.rope_mode),
                              "', device='", c.cache.device().str(), "')");
      });
}

}  // namespace kvcore::py
