// Dsv4Cache sequence snapshots (format: kvcore/persist/dsv4_snapshot.hpp).
#include "kvcore/persist/dsv4_snapshot.hpp"

#include <sstream>

#include "cache/dsv4_export.hpp"
#include "kvcore/error.hpp"
#include "kvcore/runtime.hpp"
#include "persist/bytes.hpp"
#include "persist/checksum.hpp"
#include "persist/dsv4_parts.hpp"
#include "persist/file_io.hpp"
#include "persist/fingerprint.hpp"
#include "persist/snapshot_format.hpp"

namespace kvcore {

namespace {

using Part = persist::Dsv4Part;
std::vector<Part> layer_parts(const Dsv4Cache& c, SeqId seq, int32_t layer, int64_t length) {
  return persist::dsv4_layer_parts(c, seq, layer, length);
}

void check_seq(const Dsv4Cache& c, const char* what, SeqId seq) {
  require_arg(c.contains(seq), what, ": seq ", seq, " is not a sequence of this cache");
}

}  // namespace

std::string dsv4_layout_fingerprint(const Dsv4Cache& c) {
  const Dsv4CacheConfig& g = c.config();
  std::ostringstream os;
  os << "layout kvcore-dsv4-1\n";
  os << "layers";
  for (Dsv4LayerKind k : g.layers) os << ' ' << dsv4_layer_kind_name(k);
  os << "\n";
  os << "head_dim " << g.head_dim << "\nn_rot " << g.n_rot << "\nwindow " << g.window << "\ncsa_ratio " << g.csa_ratio
     << "\nhca_ratio " << g.hca_ratio << "\nindex_heads " << g.index_heads << "\nindex_dim " << g.index_dim
     << "\nquant " << (g.quant == Dsv4Quant::On ? "on" : "off") << "\ncompressed_packed " << c.compressed_packed()
     << "\nindexer_packed " << c.indexer_packed() << "\neps " << persist::hex_double(g.eps) << "\n";
  os << "compressed_rope " << persist::rope_spec_line(g.compressed_rope) << "\n";
  if (g.maybe_compressed_rope_table) {
    const math::RopeTable& t = *g.maybe_compressed_rope_table;
    os << "compressed_rope_table n_pairs=" << t.layout.n_pairs() << " attention_factor=" << persist::hex_double(t.attention_factor)
       << " freq_xxh3=" << persist::xxh3_64(t.freq, sizeof(float) * static_cast<size_t>(t.layout.n_pairs())) << "\n";
  }
  return os.str();
}

std::vector<uint8_t> snapshot_encode(Dsv4Cache& c, SeqId seq, std::string_view model_id) {
  check_seq(c, "snapshot_encode(Dsv4Cache)", seq);
  std::vector<uint8_t> payload;
  for (int32_t l = 0; l < c.n_layers(); ++l) {
    const int64_t len = c.length(seq, l);
    for (const Part& p : layer_parts(c, seq, l, len)) {
      const size_t at = payload.size();
      payload.resize(at + p.bytes);
      if (p.bytes) copy_bytes(payload.data() + at, Device::cpu(), p.view.data(), c.device(), p.bytes);
    }
  }
  std::vector<std::pair<uint32_t, std::vector<uint8_t>>> singles;
  singles.emplace_back(persist::kDsv4Lengths, persist::dsv4_encode_lengths(c, seq));
  return persist::encode_container(persist::kKindDsv4Sequence, dsv4_layout_fingerprint(c), model_id, std::move(singles),
                                   payload)
      .concat();
}

void snapshot_decode(Dsv4Cache& c, SeqId seq, std::span<const uint8_t> bytes, std::string_view model_id) {
  check_seq(c, "snapshot_decode(Dsv4Cache)", seq);
  for (int32_t l = 0; l < c.n_layers(); ++l)
    require_arg(c.length(seq, l) == 0, "snapshot_decode(Dsv4Cache): sequence ", seq, " layer ", l, " holds ", c.length(seq, l),
                " tokens; load into an empty sequence (truncate(seq, 0) it first)");
  const persist::Container k = persist::parse_container(bytes);
  require_arg(k.summary.kind == persist::kKindDsv4Sequence, "snapshot: kind ", k.summary.kind,
              " is not a Dsv4Cache snapshot (", persist::kKindDsv4Sequence, ")");
  const std::string mine = dsv4_layout_fingerprint(c);
  require_arg(k.summary.fingerprint == mine, "snapshot: another DeepSeek-V4 layout: the file's is\n", k.summary.fingerprint,
              "the cache's\n", mine);
  require_arg(k.summary.model_id == model_id, "snapshot: model id '", k.summary.model_id, "' of the file differs from '",
              model_id, "'");
  const std::vector<int64_t> lengths = persist::dsv4_parse_lengths(c, k.single(persist::kDsv4Lengths));
  uint64_t want = 0;
  std::vector<std::vector<Part>> parts;
  for (int32_t l = 0; l < c.n_layers(); ++l) {
    parts.push_back(layer_parts(c, seq, l, lengths[l]));
    for (const Part& p : parts.back()) want += p.bytes;
  }
  require(k.payload_bytes == want, ErrorCode::Corrupt, "snapshot: payload holds ", k.payload_bytes, " bytes, these lengths need ",
          want);
  // Everything checked: write the slot (it is empty, so a failure midway leaves an empty slot).
  std::vector<uint8_t> payload;
  payload.reserve(k.payload_bytes);
  for (auto p : k.payload) payload.insert(payload.end(), p.begin(), p.end());
  size_t at = 0;
  for (const auto& layer : parts)
    for (const Part& p : layer) {
      if (p.bytes) copy_bytes(p.view.data(), c.device(), payload.data() + at, Device::cpu(), p.bytes);
      at += p.bytes;
    }
  dsv4_set_lengths(c, seq, lengths);
}

void snapshot_save(Dsv4Cache& c, SeqId seq, const std::string& path, std::string_view model_id) {
  require_arg(!path.empty(), "snapshot_save: path is empty");
  const std::vector<uint8_t> bytes = snapshot_encode(c, seq, model_id);
  const std::span<const uint8_t> pieces[1] = {bytes};
  persist::write_file_atomic(path, pieces);
}

void snapshot_load(Dsv4Cache& c, SeqId seq, const std::string& path, std::string_view model_id) {
  const std::vector<uint8_t> bytes = persist::read_file(path);
  snapshot_decode(c, seq, bytes, model_id);
}

}  // namespace kvcore
