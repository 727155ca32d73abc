// Persistence from Python: snapshots as PagedCache / Dsv4Cache methods (save, load, snapshot,
// restore), kvcore.snapshot_inspect / snapshot_describe, and kvcore.PrefixCache.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "host_ints.hpp"
#include "kvcore/error.hpp"
#include "kvcore/persist/dsv4_snapshot.hpp"
#include "kvcore/persist/prefix_cache.hpp"
#include "kvcore/persist/snapshot.hpp"
#include "paged.hpp"
#include "persist_args.hpp"

namespace kvcore::py {

namespace nb = nanobind;
using namespace nb::literals;

// (persist_args.hpp)
std::string path_arg(nb::handle p, const char* name) {
  nb::object s = nb::module_::import_("os").attr("fspath")(p);
  require_arg(nb::isinstance<nb::str>(s), "argument '", name, "' must be a str or os.PathLike path, got ",
              nb::type_name(s.type()).c_str());
  return nb::cast<std::string>(s);
}

// Bytes of a str (UTF-8) or a bytes-like object.
std::string bytes_arg(nb::handle b, const char* name) {
  if (nb::isinstance<nb::str>(b)) return nb::cast<std::string>(b);
  if (nb::isinstance<nb::bytes>(b)) {
    nb::bytes by = nb::borrow<nb::bytes>(b);
    return std::string(by.c_str(), by.size());
  }
  if (nb::hasattr(b, "tobytes") || nb::isinstance<nb::bytearray>(b) || nb::hasattr(b, "__buffer__")) {
    nb::bytes by = nb::bytes(nb::object(nb::module_::import_("builtins").attr("bytes")(b)));
    return std::string(by.c_str(), by.size());
  }
  throw Error(ErrorCode::InvalidArgument, detail::concat("argument '", name, "' must be str or bytes, got ",
                                                         nb::type_name(b.type()).c_str()));
}

namespace {

// A Python PrefixCache: the C++ one plus a reference to its cache, declared first so the cache
// outlives the prefix cache (whose destructor erases its holder sequences).
struct PyPrefixCache {
  nb::object cache_obj;
  PyPagedCache* cache = nullptr;
  std::optional<PrefixCache> prefix;
};

nb::dict loaded_dict(const SnapshotLoaded& l) {
  nb::dict d;
  for (size_t i = 0; i < l.ids.size(); ++i) d[nb::int_(l.saved_ids[i])] = nb::int_(l.ids[i]);
  return d;
}

nb::dict summary_dict(const SnapshotSummary& s) {
  nb::dict d;
  d["major"] = s.major;
  d["minor"] = s.minor;
  d["kind"] = s.kind == 1 ? "paged" : s.kind == 2 ? "dsv4" : "unknown";
  d["file_bytes"] = s.file_bytes;
  d["n_chunks"] = s.n_chunks;
  d["fingerprint"] = s.fingerprint;
  d["model_id"] = nb::bytes(s.model_id.data(), s.model_id.size());
  d["producer"] = s.producer;
  d["block_size"] = s.block_size;
  d["n_blocks"] = s.n_blocks;
  d["bytes_per_block"] = s.bytes_per_block;
  nb::list seqs;
  for (const SnapshotSummary::Seq& q : s.seqs) {
    nb::dict e;
    e["saved_id"] = q.saved_id;
    e["n_cells"] = q.n_cells;
    e["n_live"] = q.n_live;
    e["n_blocks"] = q.n_blocks;
    e["first_position"] = q.first_position;
    e["last_position"] = q.last_position;
    seqs.append(e);
  }
  d["seqs"] = seqs;
  d["dsv4_lengths"] = s.dsv4_lengths;
  return d;
}

// A file path (str / PathLike) or the snapshot's bytes.
std::vector<uint8_t> snapshot_bytes(nb::handle src) {
  if (nb::isinstance<nb::bytes>(src) || nb::isinstance<nb::bytearray>(src) || nb::isinstance<nb::memoryview>(src)) {
    const std::string b = bytes_arg(src, "source");
    return std::vector<uint8_t>(b.begin(), b.end());
  }
  const std::string path = path_arg(src, "source");
  nb::gil_scoped_release g;
  return read_file_bytes(path);
}

void add_paged_methods(nb::handle cls) {
  using Self = PyPagedCache&;
  // save() and snapshot() apply pending rotations first (as read() does): plans go stale then.
  auto bump_if_prepared = [](Self c, bool pending) {
    if (pending && !c.cache.needs_prepare()) ++c.epoch;
  };
  nb::cpp_function_def(
      [bump_if_prepared](Self c, nb::handle path, nb::handle model_id, nb::handle seqs) {
        const std::string p = path_arg(path, "path"), id = bytes_arg(model_id, "model_id");
        const std::vector<int64_t> s = seqs.is_none() ? std::vector<int64_t>{} : host_i64(seqs, "seqs");
        const bool pending = c.cache.needs_prepare();
        {
          nb::gil_scoped_release g;
          snapshot_save(c.cache, p, id, s);
        }
        bump_if_prepared(c, pending);
      },
      nb::scope(cls), nb::name("save"), nb::is_method(), "path"_a, "model_id"_a, "seqs"_a = nb::none(),
      "Save seqs (default: every sequence) to path, atomically (a temporary file, fsync, rename).\n"
      "model_id (str or bytes) names what made the K/V (model, revision, dtype); load() must give the same.");
  nb::cpp_function_def(
      [](Self c, nb::handle path, nb::handle model_id, int32_t position_delta) {
        SnapshotLoadOptions o;
        const std::string p = path_arg(path, "path");
        o.model_id = bytes_arg(model_id, "model_id");
        o.position_delta = position_delta;
        SnapshotLoaded l;
        {
          nb::gil_scoped_release g;
          l = snapshot_load(c.cache, p, o);
        }
        ++c.epoch;
        return loaded_dict(l);
      },
      nb::scope(cls), nb::name("load"), nb::is_method(), "path"_a, "model_id"_a, nb::kw_only(), "position_delta"_a = 0,
      "Load a snapshot's sequences as new sequences; returns {saved id: new id}. Checks everything\n"
      "before the cache is touched: CorruptError (truncated or altered file), InvalidArgumentError\n"
      "(another layout or model_id), OutOfMemoryError (too few free blocks); the cache is then\n"
      "unchanged. position_delta (rope_mode='on_read' only) moves every loaded position.");
  nb::cpp_function_def(
      [bump_if_prepared](Self c, nb::handle model_id, nb::handle seqs) {
        const std::string id = bytes_arg(model_id, "model_id");
        const std::vector<int64_t> s = seqs.is_none() ? std::vector<int64_t>{} : host_i64(seqs, "seqs");
        const bool pending = c.cache.needs_prepare();
        std::vector<uint8_t> b;
        {
          nb::gil_scoped_release g;
          b = snapshot_encode(c.cache, s, id);
        }
        bump_if_prepared(c, pending);
        return nb::bytes(b.data(), b.size());
      },
      nb::scope(cls), nb::name("snapshot"), nb::is_method(), "model_id"_a, "seqs"_a = nb::none(),
      "The snapshot of seqs (default: every sequence) as bytes (the file format of save()).");
  nb::cpp_function_def(
      [](Self c, nb::handle data, nb::handle model_id, int32_t position_delta) {
        const std::string b = bytes_arg(data, "data");
        SnapshotLoadOptions o;
        o.model_id = bytes_arg(model_id, "model_id");
        o.position_delta = position_delta;
        SnapshotLoaded l;
        {
          nb::gil_scoped_release g;
          l = snapshot_decode(c.cache, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b.data()), b.size()), o);
        }
        ++c.epoch;
        return loaded_dict(l);
      },
      nb::scope(cls), nb::name("restore"), nb::is_method(), "data"_a, "model_id"_a, nb::kw_only(),
      "position_delta"_a = 0, "load() from bytes made by snapshot(); the same checks and result.");
  nb::setattr(cls, "layout_fingerprint",
              nb::module_::import_("builtins").attr("property")(nb::cpp_function(
                  [](const PyPagedCache& c) { return layout_fingerprint(c.cache.config()); }, nb::is_method(),
                  "What makes this cache's bytes meaningful (formats, dims, block size, RoPE): a snapshot\n"
                  "loads only into a cache with the same text.")));
  nb::setattr(cls, "layout_hash",
              nb::module_::import_("builtins").attr("property")(nb::cpp_function(
                  [](const PyPagedCache& c) { return layout_fingerprint_hash(c.cache.config()); }, nb::is_method(),
                  "The 64-bit hash of layout_fingerprint: the layout part of every StoreKey of this cache.")));
}

void add_dsv4_methods(nb::handle cls) {
  nb::cpp_function_def(
      [](Dsv4Cache& c, SeqId seq, nb::handle path, nb::handle model_id) {
        const std::string p = path_arg(path, "path"), id = bytes_arg(model_id, "model_id");
        nb::gil_scoped_release g;
        snapshot_save(c, seq, p, id);
      },
      nb::scope(cls), nb::name("save"), nb::is_method(), "seq"_a, "path"_a, "model_id"_a,
      "Save one sequence (every layer's window ring, compressor and indexer states and rows) to path.");
  nb::cpp_function_def(
      [](Dsv4Cache& c, SeqId seq, nb::handle path, nb::handle model_id) {
        const std::string p = path_arg(path, "path"), id = bytes_arg(model_id, "model_id");
        nb::gil_scoped_release g;
        snapshot_load(c, seq, p, id);
      },
      nb::scope(cls), nb::name("load"), nb::is_method(), "seq"_a, "path"_a, "model_id"_a,
      "Load a saved sequence into seq, which must be empty (truncate(seq, 0) first). Checked before\n"
      "anything is written; on a refusal the cache is unchanged.");
  nb::cpp_function_def(
      [](Dsv4Cache& c, SeqId seq, nb::handle model_id) {
        const std::string id = bytes_arg(model_id, "model_id");
        std::vector<uint8_t> b;
        {
          nb::gil_scoped_release g;
          b = snapshot_encode(c, seq, id);
        }
        return nb::bytes(b.data(), b.size());
      },
      nb::scope(cls), nb::name("snapshot"), nb::is_method(), "seq"_a, "model_id"_a, "save() as bytes.");
  nb::cpp_function_def(
      [](Dsv4Cache& c, SeqId seq, nb::handle data, nb::handle model_id) {
        const std::string b = bytes_arg(data, "data"), id = bytes_arg(model_id, "model_id");
        nb::gil_scoped_release g;
        snapshot_decode(c, seq, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b.data()), b.size()), id);
      },
      nb::scope(cls), nb::name("restore"), nb::is_method(), "seq"_a, "data"_a, "model_id"_a,
      "load() from bytes made by snapshot().");
}

// Every PrefixCache call edits its PagedCache's sequences: plans made before go stale.
PrefixCache& prefix_of(PyPrefixCache& p) {
  ++p.cache->epoch;
  return *p.prefix;
}

}  // namespace

void bind_persist(nb::module_& m) {
  add_paged_methods(nb::type<PyPagedCache>());
  add_dsv4_methods(nb::type<Dsv4Cache>());

  m.def("snapshot_inspect", [](nb::handle source) { return summary_dict(snapshot_inspect(snapshot_bytes(source))); },
        "source"_a,
        "Check a snapshot (a path or its bytes) as a load would, without a cache, and describe it: a dict\n"
        "with the format version, kind ('paged' or 'dsv4'), fingerprint, model_id, block counts and per\n"
        "sequence saved id, length and positions. Raises CorruptError / InvalidArgumentError.");
  m.def(
      "snapshot_describe",
      [](nb::handle source) { return snapshot_describe(snapshot_inspect(snapshot_bytes(source))); }, "source"_a,
      "snapshot_inspect() as readable text (what `kvcore snapshot inspect FILE` prints).");

  nb::class_<PrefixStats>(m, "PrefixStats", "Counts of a PrefixCache.")
      .def_ro("queries", &PrefixStats::queries)
      .def_ro("hit_queries", &PrefixStats::hit_queries)
      .def_ro("blocks_hit", &PrefixStats::blocks_hit)
      .def_ro("blocks_missed", &PrefixStats::blocks_missed)
      .def_ro("blocks_published", &PrefixStats::blocks_published)
      .def_ro("holders", &PrefixStats::holders)
      .def_ro("evictions", &PrefixStats::evictions)
      .def("__repr__", [](const PrefixStats& s) {
        return detail::concat("PrefixStats(queries=", s.queries, ", hit_queries=", s.hit_queries,
                              ", blocks_hit=", s.blocks_hit, ", blocks_published=", s.blocks_published,
                              ", holders=", s.holders, ")");
      });

  nb::class_<PyPrefixCache>(
      m, "PrefixCache",
      "Reuse of full blocks whose K/V came from the same tokens (automatic prefix caching) on one\n"
      "PagedCache. A block's key chains the hashes of every earlier block's tokens, under a salt that\n"
      "names what else changes K/V or who may see it (model, adapter, tenant): equal salts share,\n"
      "others never do.\n\n"
      "    prefix = kvcore.PrefixCache(cache)\n"
      "    seq, reused = prefix.create(prompt, salt='tenant-a')   # reused tokens: full blocks\n"
      "    cache.append(seq, range(reused, len(prompt)), k, v)     # the rest of the prompt\n"
      "    prefix.publish(seq, prompt, salt='tenant-a')           # later prompts can reuse it\n\n"
      "Edit its sequences through shift/truncate here (or report them with note_edit): only the\n"
      "unedited prefix is published. Published blocks stay cached until evict(). Keeps its cache alive.")
      .def(
          "__init__",
          [](PyPrefixCache* self, nb::pointer_and_handle<PyPagedCache> cache, uint64_t seed) {
            PyPagedCache* c = cache.p;
            new (self) PyPrefixCache{nb::borrow(cache.h), c, std::nullopt};
            self->prefix.emplace(c->cache, seed);
          },
          "cache"_a, "seed"_a = 0, "seed 0: a random hash seed (nobody outside can precompute collisions).")
      .def(
          "create",
          [](PyPrefixCache& p, nb::handle prompt, nb::handle salt) {
            const std::vector<int32_t> t = host_i32(prompt, "prompt");
            const std::string s = bytes_arg(salt, "salt");
            int32_t reused = 0;
            const SeqId seq = prefix_of(p).create(t, s, &reused);
            return nb::make_tuple(seq, reused);
          },
          "prompt"_a, "salt"_a = "",
          "A new sequence holding the longest cached prefix of prompt (token ids) in full blocks;\n"
          "returns (seq, reused_tokens). Append the rest of the prompt from token reused_tokens.")
      .def(
          "publish",
          [](PyPrefixCache& p, SeqId seq, nb::handle tokens, nb::handle salt) {
            const std::vector<int32_t> t = host_i32(tokens, "tokens");
            return prefix_of(p).publish(seq, t, bytes_arg(salt, "salt"));
          },
          "seq"_a, "tokens"_a, "salt"_a = "",
          "Publish the full blocks of seq's unedited prefix (tokens[i]: the id of its token i); returns the\n"
          "tokens now published.")
      .def(
          "shift", [](PyPrefixCache& p, SeqId seq, int32_t n_keep, int32_t n_discard) { prefix_of(p).shift(seq, n_keep, n_discard); },
          "seq"_a, "n_keep"_a, "n_discard"_a, "PagedCache.shift, keeping [0, n_keep) publishable.")
      .def(
          "truncate", [](PyPrefixCache& p, SeqId seq, int32_t n) { prefix_of(p).truncate(seq, n); }, "seq"_a, "n"_a,
          "PagedCache.truncate, keeping [0, n) publishable.")
      .def(
          "note_edit", [](PyPrefixCache& p, SeqId seq, int32_t first_token) { prefix_of(p).note_edit(seq, first_token); },
          "seq"_a, "first_token"_a, "Report an edit made elsewhere from token first_token on.")
      .def(
          "erase", [](PyPrefixCache& p, SeqId seq) { prefix_of(p).erase(seq); }, "seq"_a,
          "Erase a sequence (its published blocks stay cached).")
      .def(
          "evict", [](PyPrefixCache& p, int32_t free_blocks) { return prefix_of(p).evict(free_blocks); },
          "free_blocks"_a,
          "Drop least recently used cached prefixes until the cache has free_blocks free; True when it has.")
      .def("clear", [](PyPrefixCache& p) { prefix_of(p).clear(); }, "Drop every cached prefix.")
      .def("stats", [](const PyPrefixCache& p) { return p.prefix->stats(); }, "Query, hit and publish counts.")
      .def("holds", [](const PyPrefixCache& p, SeqId seq) { return p.prefix->holds(seq); }, "seq"_a,
           "Whether seq is one of the sequences that keep published prefixes cached.")
      .def_prop_ro("cache", [](const PyPrefixCache& p) { return p.cache_obj; }, "The PagedCache.");
}

}  // namespace kvcore::py
