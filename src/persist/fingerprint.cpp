// The layout fingerprint of a PagedCache: canonical text, one "key value" line per property.
// Doubles are written as hex floats, so equal text means bit-equal specs.
#include <cstdio>
#include <sstream>

#include "kvcore/persist/snapshot.hpp"
#include "persist/checksum.hpp"
#include "persist/fingerprint.hpp"

namespace kvcore {

namespace persist {

std::string hex_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

std::string rope_spec_line(const RopeSpec& r) {
  static const char* slices[] = {"head", "tail"};
  static const char* pairings[] = {"neox", "interleaved"};
  static const char* scalings[] = {"none", "linear", "llama3", "yarn"};
  std::ostringstream os;
  os << "n_rot=" << r.n_rot << " slice=" << slices[static_cast<int>(r.slice) & 1]
     << " pairing=" << pairings[static_cast<int>(r.pairing) & 1] << " theta=" << hex_double(r.theta)
     << " scaling=" << scalings[static_cast<int>(r.scaling) & 3] << " factor=" << hex_double(r.factor)
     << " low_freq_factor=" << hex_double(r.low_freq_factor) << " high_freq_factor=" << hex_double(r.high_freq_factor)
     << " original_max_position=" << r.original_max_position << " beta_fast=" << hex_double(r.beta_fast)
     << " beta_slow=" << hex_double(r.beta_slow) << " yarn_truncate=" << (r.yarn_truncate ? 1 : 0)
     << " attention_factor=" << hex_double(r.attention_factor) << " freq_factors=";
  for (size_t i = 0; i < r.freq_factors.size(); ++i) os << (i ? "," : "") << hex_double(r.freq_factors[i]);
  if (r.freq_factors.empty()) os << "-";
  return os.str();
}

}  // namespace persist

std::string layout_fingerprint(const PagedCacheConfig& c) {
  std::ostringstream os;
  os << "layout kvcore-paged-1\n";
  os << "n_layers " << c.n_layers << "\n";
  os << "n_kv_heads " << c.n_kv_heads << "\n";
  os << "head_dim " << c.head_dim << "\n";
  os << "v_head_dim " << c.v_head_dim << "\n";
  os << "block_size " << c.block_size << "\n";
  os << "k_format " << kv_format_name(c.k_format) << "\n";
  if (c.v_from_k_latent) {
    // A layout without V pools whose V is K's latent: its own line, so it never matches (and never
    // loads into) the separate-V layout of the same dims; separate-V fingerprints stay as they were.
    os << "v_format k_latent\n";
  } else {
    os << "v_format " << (c.v_head_dim > 0 ? kv_format_name(c.v_format) : std::string_view("none")) << "\n";
  }
  os << "rope_mode " << (c.rope_mode == RopeMode::RopeOnRead ? "rope_on_read" : "rope_stored") << "\n";
  // One line for all layers when they agree (one spec or n equal specs are the same layout).
  bool same = true;
  const std::string first = c.rope.empty() ? std::string("-") : persist::rope_spec_line(c.rope_for(0));
  for (int32_t l = 1; l < c.n_layers && same && !c.rope.empty(); ++l) same = persist::rope_spec_line(c.rope_for(l)) == first;
  if (same) {
    os << "rope all " << first << "\n";
  } else {
    for (int32_t l = 0; l < c.n_layers; ++l) os << "rope " << l << " " << persist::rope_spec_line(c.rope_for(l)) << "\n";
  }
  return os.str();
}

uint64_t layout_fingerprint_hash(const PagedCacheConfig& config) {
  const std::string f = layout_fingerprint(config);
  return persist::xxh3_64(f.data(), f.size());
}

}  // namespace kvcore
