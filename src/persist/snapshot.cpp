// Snapshots of PagedCache sequences: the public entry points (format: persist/snapshot_format).
#include "kvcore/persist/snapshot.hpp"

#include <sstream>

#include "cache/paged_export.hpp"
#include "kvcore/error.hpp"
#include "persist/file_io.hpp"
#include "persist/snapshot_format.hpp"

namespace kvcore {

namespace {

PagedExport export_seqs(PagedCache& cache, std::span<const SeqId> seqs) {
  if (!seqs.empty()) return paged_export(cache, seqs);
  const std::vector<SeqId> all = cache.sequences();
  return paged_export(cache, all);
}

// InvalidArgument naming the first line where the file's layout and the cache's differ.
void check_fingerprint(const std::string& file, const std::string& cache) {
  if (file == cache) return;
  std::istringstream a(file), b(cache);
  std::string la, lb;
  while (true) {
    const bool ga = static_cast<bool>(std::getline(a, la)), gb = static_cast<bool>(std::getline(b, lb));
    if (!ga && !gb) break;
    if (!ga) la = "(nothing)";
    if (!gb) lb = "(nothing)";
    require_arg(la == lb, "snapshot: another layout: the file has '", la, "', the cache '", lb, "'");
  }
}

SnapshotLoaded load_parsed(PagedCache& cache, persist::ParsedSnapshot& p, const SnapshotLoadOptions& o) {
  check_fingerprint(p.summary.fingerprint, layout_fingerprint(cache.config()));
  require_arg(p.summary.model_id == o.model_id, "snapshot: model id '", p.summary.model_id, "' of the file differs from '",
              o.model_id, "'");
  SnapshotLoaded out;
  out.ids = paged_import(cache, p.ex, o.position_delta);
  for (const PagedExport::Seq& s : p.ex.seqs) out.saved_ids.push_back(s.id);
  return out;
}

}  // namespace

std::vector<uint8_t> snapshot_encode(PagedCache& cache, std::span<const SeqId> seqs, std::string_view model_id) {
  const PagedExport ex = export_seqs(cache, seqs);
  return persist::encode_snapshot(ex, layout_fingerprint(cache.config()), model_id).concat();
}

SnapshotLoaded snapshot_decode(PagedCache& cache, std::span<const uint8_t> bytes, const SnapshotLoadOptions& options) {
  persist::ParsedSnapshot p = persist::parse_snapshot(bytes);
  return load_parsed(cache, p, options);
}

void snapshot_save(PagedCache& cache, const std::string& path, std::string_view model_id, std::span<const SeqId> seqs) {
  require_arg(!path.empty(), "snapshot_save: path is empty");
  const PagedExport ex = export_seqs(cache, seqs);
  const persist::EncodedSnapshot e = persist::encode_snapshot(ex, layout_fingerprint(cache.config()), model_id);
  persist::write_file_atomic(path, e.pieces);
}

SnapshotLoaded snapshot_load(PagedCache& cache, const std::string& path, const SnapshotLoadOptions& options) {
  const std::vector<uint8_t> bytes = persist::read_file(path);
  return snapshot_decode(cache, bytes, options);
}

SnapshotSummary snapshot_inspect(std::span<const uint8_t> bytes) { return persist::parse_snapshot(bytes).summary; }

std::vector<uint8_t> read_file_bytes(const std::string& path) { return persist::read_file(path); }

std::string snapshot_describe(const SnapshotSummary& s) {
  std::ostringstream os;
  os << "kvcore snapshot, format " << s.major << "." << s.minor << " (PagedCache sequences), " << s.file_bytes
     << " bytes, " << s.n_chunks << " chunks, every checksum verified\n";
  os << "written by kvcore " << (s.producer.empty() ? "(unknown)" : s.producer) << "\n";
  os << "model id: '" << s.model_id << "'\n";
  os << "blocks: " << s.n_blocks << " of " << s.block_size << " cells, " << s.bytes_per_block << " bytes each\n";
  os << "sequences: " << s.seqs.size() << "\n";
  for (const SnapshotSummary::Seq& q : s.seqs)
    os << "  saved id " << q.saved_id << ": " << q.n_live << " tokens in " << q.n_cells << " cells, " << q.n_blocks
       << " blocks, positions " << q.first_position << " .. " << q.last_position << "\n";
  for (uint32_t t : s.skipped_chunk_types) os << "skipped optional chunk type " << t << " (newer minor version)\n";
  os << "layout fingerprint:\n";
  std::istringstream f(s.fingerprint);
  for (std::string line; std::getline(f, line);) os << "  " << line << "\n";
  return os.str();
}

}  // namespace kvcore
