// PagedTxn's bulk records (add_refs, release_blocks) roll back exactly: refcounts, the free
// list (order included), the shared-block count and pending flags.
#include <gtest/gtest.h>

#include <vector>

#include "cache/paged_meta.hpp"

using namespace kvcore;

namespace {

struct State {
  std::vector<int32_t> free_list, refcount;
  std::vector<uint8_t> flags;
  int32_t shared;
  bool operator==(const State&) const = default;
};
State state_of(const PagedMeta& m) { return {m.free_list, m.refcount, m.pending_flag, m.shared_blocks}; }

TEST(PagedJournal, BulkReleasesAndReferenceChangesRollBack) {
  PagedMeta m;
  m.init(4, 12);
  std::vector<int32_t> held;
  {
    PagedTxn t(m);
    for (int i = 0; i < 8; ++i) {
      const int32_t b = t.pop_free();
      t.set_refcount(b, 1);
      held.push_back(b);
    }
    t.add_refs({held[1], held[3], held[5]}, 1);  // shared by a second holder
    t.set_pending_flag(held[2], 1);
    t.commit();
  }
  EXPECT_EQ(m.shared_blocks, 3);
  const State before = state_of(m);
  {
    PagedTxn t(m);
    t.release_blocks({held[0], held[1], held[2], held[3]});  // 0, 2 freed; 1, 3 lose a reference
    EXPECT_EQ(m.refcount[held[0]], 0);
    EXPECT_EQ(m.refcount[held[1]], 1);
    EXPECT_EQ(m.pending_flag[held[2]], 0);
    EXPECT_EQ(m.shared_blocks, 1);
    const int32_t again = t.pop_free();  // the last freed block comes back first
    EXPECT_EQ(again, held[2]);
    t.set_refcount(again, 1);
    t.release_blocks({held[6], again});
    t.add_refs({held[7]}, 2);
    // no commit: the destructor rolls everything back
  }
  const State after = state_of(m);
  EXPECT_EQ(after.free_list, before.free_list);
  EXPECT_EQ(after.refcount, before.refcount);
  EXPECT_EQ(after.flags, before.flags);
  EXPECT_EQ(after.shared, before.shared);
  {
    PagedTxn t(m);
    t.release_blocks({held[0], held[1]});
    t.commit();
  }
  EXPECT_EQ(m.refcount[held[0]], 0);
  EXPECT_EQ(m.free_list.back(), held[0]);
  EXPECT_EQ(m.shared_blocks, 2);
}

}  // namespace
