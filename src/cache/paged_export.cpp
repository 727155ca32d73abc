// PagedCache's persistence hooks: export sequences to host memory, import them on fresh blocks.
#include "cache/paged_export.hpp"

#include <algorithm>
#include <cstring>

#include "cache/paged_impl.hpp"
#include "kvcore/error.hpp"
#include "kvcore/runtime.hpp"

namespace kvcore {

struct PagedCacheAccess {
  static PagedCache::Impl& impl(PagedCache& c) { return *c.impl_; }
  static const PagedCache::Impl& impl(const PagedCache& c) { return *c.impl_; }
};

int64_t PagedExport::bytes_per_block() const {
  int64_t n = 0;
  for (int64_t b : array_block_bytes) n += b;
  return n;
}

std::vector<int64_t> paged_array_block_bytes(const PagedCache& cache) {
  std::vector<int64_t> v;
  for (const PagedPoolArray& a : PagedCacheAccess::impl(cache).arrays) v.push_back(a.block_bytes);
  return v;
}

std::vector<PagedPoolArray> paged_pool_arrays(const PagedCache& cache) { return PagedCacheAccess::impl(cache).arrays; }

PagedExportPlan paged_export_plan(PagedCache& cache, std::span<const SeqId> seqs) {
  PagedCache::Impl& m = PagedCacheAccess::impl(cache);
  m.check_usable();
  for (size_t i = 0; i < seqs.size(); ++i) {
    m.meta.seq(seqs[i]);
    for (size_t j = 0; j < i; ++j) require_arg(seqs[i] != seqs[j], "paged_export: sequence id ", seqs[i], " listed twice");
  }
  m.rotate_pending();  // K must be rotated to its stored position before its bytes leave (RopeStored)
  const int32_t bs = m.cfg.block_size;
  PagedExportPlan plan;
  PagedExport& ex = plan.manifest;
  ex.block_size = bs;
  ex.array_block_bytes = paged_array_block_bytes(cache);
  std::vector<int32_t>& cache_block = plan.cache_blocks;  // export index -> cache block
  std::vector<int32_t> index_of(m.cfg.num_blocks, -1);   // cache block -> export index
  std::vector<int32_t>& span = plan.spans;               // export index -> cells spanned by its widest holder
  std::vector<int32_t> offset;                           // export index -> its holders' position offset
  for (SeqId id : seqs) {
    const PagedSeq& s = m.meta.seq(id);
    PagedExport::Seq es{id, s.n_cells, s.n_live, {}};
    for (size_t bi = 0; bi < s.blocks.size(); ++bi) {
      const int32_t b = s.blocks[bi];
      if (index_of[b] < 0) {
        index_of[b] = static_cast<int32_t>(cache_block.size());
        cache_block.push_back(b);
        span.push_back(0);
        offset.push_back(s.pos_offset);
      }
      const int32_t e = index_of[b];
      span[e] = std::max(span[e], m.meta.cells_in_block(s, bi));
      es.blocks.push_back(e);
    }
    ex.seqs.push_back(std::move(es));
  }
  ex.n_blocks = static_cast<int32_t>(cache_block.size());
  ex.positions.assign(static_cast<size_t>(ex.n_blocks) * bs, 0);
  ex.valid.assign(static_cast<size_t>(ex.n_blocks) * bs, 0);
  for (int32_t e = 0; e < ex.n_blocks; ++e)
    for (int32_t j = 0; j < span[e]; ++j) {
      const int64_t c = m.meta.cell(cache_block[e], j);
      const size_t k = static_cast<size_t>(e) * bs + j;
      ex.valid[k] = m.meta.valid[c];
      ex.positions[k] = m.meta.valid[c] ? m.meta.pos(c) - offset[e] : 0;
    }
  return plan;
}

PagedExport paged_export(PagedCache& cache, std::span<const SeqId> seqs) {
  PagedExportPlan plan = paged_export_plan(cache, seqs);
  PagedCache::Impl& m = PagedCacheAccess::impl(cache);
  PagedExport& ex = plan.manifest;
  const std::vector<int32_t>& cache_block = plan.cache_blocks;
  const std::vector<int32_t>& span = plan.spans;
  const int32_t bs = ex.block_size;
  ex.payload.assign(static_cast<size_t>(ex.payload_bytes()), 0);
  uint8_t* out = ex.payload.data();
  for (const PagedPoolArray& a : m.arrays) {
    const int64_t cell_bytes = a.block_bytes / bs;
    // Runs of consecutive cache blocks in export order: one copy each.
    for (int32_t e = 0; e < ex.n_blocks;) {
      int32_t n = 1;
      while (e + n < ex.n_blocks && cache_block[e + n] == cache_block[e] + n) ++n;
      copy_bytes(out + e * a.block_bytes, Device::cpu(), a.base + cache_block[e] * a.block_bytes, m.dev,
                 static_cast<size_t>(n * a.block_bytes), m.cfg.stream);
      e += n;
    }
    for (int32_t e = 0; e < ex.n_blocks; ++e)  // no stale bytes past the span
      std::memset(out + e * a.block_bytes + span[e] * cell_bytes, 0, static_cast<size_t>((bs - span[e]) * cell_bytes));
    out += ex.n_blocks * a.block_bytes;
  }
  return std::move(plan.manifest);
}

void paged_export_check(const PagedExport& ex, bool with_payload) {
  const int32_t bs = ex.block_size;
  require(bs > 0 && bs <= 4096, ErrorCode::Corrupt, "snapshot: block_size ", bs, " outside [1, 4096]");
  require(ex.n_blocks >= 0, ErrorCode::Corrupt, "snapshot: block count ", ex.n_blocks, " is negative");
  const size_t cells = static_cast<size_t>(ex.n_blocks) * bs;
  require(ex.positions.size() == cells && ex.valid.size() == cells, ErrorCode::Corrupt, "snapshot: cell arrays hold ",
          ex.positions.size(), " / ", ex.valid.size(), " entries, expected ", cells);
  for (int64_t b : ex.array_block_bytes)
    require(b > 0 && b % bs == 0, ErrorCode::Corrupt, "snapshot: array block bytes ", b, " not a positive multiple of ", bs);
  require(!with_payload || static_cast<int64_t>(ex.payload.size()) == ex.payload_bytes(), ErrorCode::Corrupt,
          "snapshot: payload holds ", ex.payload.size(), " bytes, expected ", ex.payload_bytes());
  std::vector<uint8_t> held(static_cast<size_t>(ex.n_blocks), 0);
  for (const PagedExport::Seq& s : ex.seqs) {
    require(s.n_cells >= 0 && s.n_live >= 0 && s.n_live <= s.n_cells, ErrorCode::Corrupt, "snapshot: sequence ", s.id,
            " has ", s.n_live, " live of ", s.n_cells, " cells");
    const size_t want_blocks = static_cast<size_t>((static_cast<int64_t>(s.n_cells) + bs - 1) / bs);
    require(s.blocks.size() == want_blocks, ErrorCode::Corrupt, "snapshot: sequence ", s.id, " spans ", s.n_cells,
            " cells in ", s.blocks.size(), " blocks, expected ", want_blocks);
    int32_t live = 0;
    for (size_t bi = 0; bi < s.blocks.size(); ++bi) {
      const int32_t e = s.blocks[bi];
      require(e >= 0 && e < ex.n_blocks, ErrorCode::Corrupt, "snapshot: sequence ", s.id, " names block ", e, " of ",
              ex.n_blocks);
      for (size_t bj = 0; bj < bi; ++bj)
        require(s.blocks[bj] != e, ErrorCode::Corrupt, "snapshot: sequence ", s.id, " holds block ", e, " twice");
      held[e] = 1;
      const int32_t used = bi + 1 < s.blocks.size() ? bs : s.n_cells - static_cast<int32_t>(bi) * bs;
      int32_t block_live = 0;
      for (int32_t j = 0; j < used; ++j) block_live += ex.valid[static_cast<size_t>(e) * bs + j] ? 1 : 0;
      require(block_live > 0, ErrorCode::Corrupt, "snapshot: sequence ", s.id, " block ", bi, " holds no live cell");
      live += block_live;
    }
    require(live == s.n_live, ErrorCode::Corrupt, "snapshot: sequence ", s.id, " counts ", s.n_live, " live tokens, its cells ",
            live);
    if (s.n_cells > 0) {
      const int32_t c = s.n_cells - 1;
      require(ex.valid[static_cast<size_t>(s.blocks[c / bs]) * bs + c % bs] != 0, ErrorCode::Corrupt, "snapshot: sequence ",
              s.id, " ends in a dead cell");
    }
  }
  for (int32_t e = 0; e < ex.n_blocks; ++e)
    require(held[e], ErrorCode::Corrupt, "snapshot: block ", e, " belongs to no sequence");
}

std::vector<SeqId> paged_import(PagedCache& cache, const PagedExport& ex, int32_t position_delta) {
  PagedCache::Impl& m = PagedCacheAccess::impl(cache);
  m.check_usable();
  paged_export_check(ex);
  return paged_import_with(cache, ex, position_delta, [&](std::span<const int32_t> block) {
    const uint8_t* in = ex.payload.data();
    for (const PagedPoolArray& a : m.arrays) {
      for (int32_t e = 0; e < ex.n_blocks;) {
        int32_t n = 1;
        while (e + n < ex.n_blocks && block[e + n] == block[e] + n) ++n;
        copy_bytes(a.base + block[e] * a.block_bytes, m.dev, in + e * a.block_bytes, Device::cpu(),
                   static_cast<size_t>(n * a.block_bytes), m.cfg.stream);
        e += n;
      }
      in += ex.n_blocks * a.block_bytes;
    }
  });
}

std::vector<SeqId> paged_import_with(PagedCache& cache, const PagedExport& ex, int32_t position_delta,
                                     const PagedPayloadWriter& write_payload) {
  PagedCache::Impl& m = PagedCacheAccess::impl(cache);
  m.check_usable();
  paged_export_check(ex, /*with_payload=*/false);
  const int32_t bs = m.cfg.block_size;
  require_arg(ex.block_size == bs, "paged_import: block_size ", ex.block_size, " differs from the cache's ", bs);
  require_arg(ex.array_block_bytes == paged_array_block_bytes(cache),
              "paged_import: the pool arrays' block sizes differ from the cache's (another layout)");
  require_arg(position_delta == 0 || m.cfg.rope_mode == RopeMode::RopeOnRead, "paged_import: position_delta ",
              position_delta, " needs a rope-on-read cache (stored K is rotated at its positions)");
  for (const PagedExport::Seq& s : ex.seqs) {
    int64_t prev = -1;
    for (int32_t c = 0; c < s.n_cells; ++c) {
      const size_t k = static_cast<size_t>(s.blocks[c / bs]) * bs + c % bs;
      if (!ex.valid[k]) continue;
      const int64_t p = static_cast<int64_t>(ex.positions[k]) + position_delta;
      require_arg(p >= 0 && p <= INT32_MAX, "paged_import: sequence ", s.id, " position ", ex.positions[k], " + delta ",
                  position_delta, " leaves [0, 2^31)");
      require_arg(!m.cfg.strict_positions || p > prev, "paged_import: sequence ", s.id, " positions do not increase at cell ",
                  c, " (", prev, " then ", p, ") and the cache requires strictly increasing positions");
      prev = p;
    }
  }
  require(static_cast<int64_t>(m.meta.free_list.size()) >= ex.n_blocks, ErrorCode::OutOfMemory, "paged_import: needs ",
          ex.n_blocks, " free blocks, the cache has ", m.meta.free_list.size());

  std::vector<int32_t> holders(static_cast<size_t>(ex.n_blocks), 0);
  for (const PagedExport::Seq& s : ex.seqs)
    for (int32_t e : s.blocks) ++holders[e];
  PagedTxn txn(m.meta);
  std::vector<int32_t> block(static_cast<size_t>(ex.n_blocks));
  for (int32_t e = 0; e < ex.n_blocks; ++e) {
    const int32_t b = txn.pop_free();
    block[e] = b;
    txn.set_refcount(b, holders[e]);
    for (int32_t j = 0; j < bs; ++j) {
      const size_t k = static_cast<size_t>(e) * bs + j;
      txn.set_cell(b, j, ex.valid[k] ? ex.positions[k] + position_delta : 0, ex.valid[k], 0);
    }
  }
  std::vector<SeqId> ids;
  for (const PagedExport::Seq& s : ex.seqs) {
    PagedSeq ps;
    ps.n_cells = s.n_cells;
    ps.n_live = s.n_live;
    for (int32_t e : s.blocks) ps.blocks.push_back(block[e]);
    ids.push_back(txn.add_seq(std::move(ps)));
  }
  // The blocks are free until the commit: writing their bytes first keeps the strong guarantee.
  m.finish(txn, {}, [&] { write_payload(block); });
  return ids;
}

}  // namespace kvcore

namespace kvcore {

int32_t paged_prefix_in_place(const PagedCache& cache, SeqId seq, int32_t n) {
  const PagedCache::Impl& m = PagedCacheAccess::impl(cache);
  const PagedSeq& s = m.meta.seq(seq);
  n = std::min(std::max(n, 0), s.n_cells);
  const int32_t bs = m.cfg.block_size;
  for (int32_t c = 0; c < n; ++c) {
    const int64_t cell = m.meta.cell(s.blocks[c / bs], c % bs);
    if (!m.meta.valid[cell] || m.meta.pos(cell) - s.pos_offset != c) return c;
  }
  return n;
}

}  // namespace kvcore
