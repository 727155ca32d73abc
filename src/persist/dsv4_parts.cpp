// A Dsv4Cache sequence's parts and lengths chunk (dsv4_parts.hpp).
#include "persist/dsv4_parts.hpp"

#include "kvcore/error.hpp"
#include "persist/bytes.hpp"

namespace kvcore::persist {

std::vector<Dsv4Part> dsv4_layer_parts(const Dsv4Cache& c, SeqId seq, int32_t layer, int64_t length) {
  std::vector<Dsv4Part> parts;
  const TensorRef ring = c.raw_ring(seq, layer);
  parts.push_back({ring, static_cast<size_t>(ring.span_bytes())});
  const Dsv4LayerKind k = c.kind(layer);
  if (k == Dsv4LayerKind::Window) return parts;
  const int32_t r = c.config().ratio(k);
  for (bool indexer : {false, true}) {
    if (indexer && k != Dsv4LayerKind::CSA) break;
    const TensorRef kv = c.state(seq, layer, indexer ? Dsv4State::IndexerKv : Dsv4State::CompressorKv);
    const TensorRef score = c.state(seq, layer, indexer ? Dsv4State::IndexerScore : Dsv4State::CompressorScore);
    parts.push_back({kv, static_cast<size_t>(kv.span_bytes())});
    parts.push_back({score, static_cast<size_t>(score.span_bytes())});
    const TensorRef rows = indexer ? c.indexer_store(seq, layer) : c.compressed_store(seq, layer);
    const int64_t n = length / (indexer ? c.config().csa_ratio : r);
    const size_t row_bytes = static_cast<size_t>(rows.span_bytes() / rows.size(0));
    parts.push_back({rows, static_cast<size_t>(n) * row_bytes});
  }
  return parts;
}

std::vector<uint8_t> dsv4_encode_lengths(const Dsv4Cache& c, SeqId seq) {
  ByteWriter lens;
  lens.put(static_cast<uint32_t>(c.n_layers()));
  for (int32_t l = 0; l < c.n_layers(); ++l) lens.put(static_cast<int64_t>(c.length(seq, l)));
  return std::move(lens.out);
}

std::vector<int64_t> dsv4_parse_lengths(const Dsv4Cache& c, std::span<const uint8_t> chunk) {
  ByteReader r(chunk, "lengths chunk");
  const uint32_t n = r.get<uint32_t>("n_layers");
  require(n == static_cast<uint32_t>(c.n_layers()), ErrorCode::Corrupt, "snapshot: ", n, " layers, the layout has ",
          c.n_layers());
  std::vector<int64_t> lengths = r.array<int64_t>(n, "lengths");
  r.expect_end();
  for (int32_t l = 0; l < c.n_layers(); ++l)
    require(lengths[l] >= 0 && lengths[l] <= c.config().max_context, ErrorCode::Corrupt, "snapshot: layer ", l, " length ",
            lengths[l], " outside [0, ", c.config().max_context, "]");
  return lengths;
}

}  // namespace kvcore::persist
