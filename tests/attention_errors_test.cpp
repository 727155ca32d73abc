// Bad arguments to paged attention: kvcore::Error naming the value, output untouched.
#include <gtest/gtest.h>

#include "attention_test_util.hpp"

using namespace attn_test;

namespace {

struct Fixture {
  HostCase c;
  DeviceCase g;
  Buffer out;
  TensorRef o;
  Fixture() {
    CaseSpec s;
    s.seq_cells = {30, 40};
    s.kv = DType::E4M3;
    c = make_case(s);
    make_device_case(c, Device::cpu(), g);
    out = Buffer(static_cast<size_t>(c.rows) * s.n_q_heads * s.head_dim * 4, Device::cpu());
    std::fill(out.as<float>(), out.as<float>() + out.size() / 4, 42.0f);
    o = TensorRef(out.data(), DType::F32, Device::cpu(), {c.rows, s.n_q_heads, s.head_dim});
  }
  void expect(const PagedKV& kv, const BlockTable& t, const AttentionOptions& opt, const char* needle,
              const TensorRef* q = nullptr) {
    try {
      attention_decode(q ? *q : g.q_ref, kv, t, o, opt);
      ADD_FAILURE() << "no throw, expected " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what() << " / wanted: " << needle;
    }
    for (size_t i = 0; i < out.size() / 4; ++i) ASSERT_EQ(out.as<float>()[i], 42.0f);
  }
};

}  // namespace

TEST(AttentionErrors, TablesOutOfRange) {
  Fixture f;
  f.g.indices.as<int32_t>()[2] = f.c.num_blocks;
  f.expect(f.g.kv, f.g.table, f.g.opt, "table.indices[2]");
  f.g.indices.as<int32_t>()[2] = -1;
  f.expect(f.g.kv, f.g.table, f.g.opt, "= -1");
  f.g.indices.as<int32_t>()[2] = 0;
  f.g.lpl.as<int32_t>()[1] = 17;
  f.expect(f.g.kv, f.g.table, f.g.opt, "last_page_len[1] = 17");
  f.g.lpl.as<int32_t>()[1] = 8;
  f.g.indptr.as<int32_t>()[1] = 99;
  f.expect(f.g.kv, f.g.table, f.g.opt, "indptr");
}

TEST(AttentionErrors, ShapesDtypesAndOptions) {
  Fixture f;
  {  // q rows != sequences; head_dim mismatch (out shaped like q: those checks come first)
    Buffer ob(2 * 16 * 64 * 4, Device::cpu());
    TensorRef q1(f.g.q.data(), DType::F32, Device::cpu(), {1, 8, 64}), o1(ob.data(), DType::F32, Device::cpu(), {1, 8, 64});
    try {
      attention_decode(q1, f.g.kv, f.g.table, o1, f.g.opt);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("q has 1 rows"), std::string::npos) << e.what();
    }
    TensorRef q2(f.g.q.data(), DType::F32, Device::cpu(), {2, 16, 32}), o2(ob.data(), DType::F32, Device::cpu(), {2, 16, 32});
    try {
      attention_decode(q2, f.g.kv, f.g.table, o2, f.g.opt);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("head_dim 32"), std::string::npos) << e.what();
    }
  }
  // n_q_heads not a multiple of n_kv_heads
  TensorRef q3(f.g.q.data(), DType::F32, Device::cpu(), {2, 3, 64});
  {
    Buffer ob(2 * 3 * 64 * 4, Device::cpu());
    TensorRef o3(ob.data(), DType::F32, Device::cpu(), {2, 3, 64});
    EXPECT_THROW(attention_decode(q3, f.g.kv, f.g.table, o3, f.g.opt), Error);
  }
  AttentionOptions o = f.g.opt;
  o.sinks = TensorRef(f.g.q.data(), DType::F32, Device::cpu(), {5});
  f.expect(f.g.kv, f.g.table, o, "sinks");
  o = f.g.opt;
  o.window = -3;
  f.expect(f.g.kv, f.g.table, o, "window must be >= 0, got -3");
  o = f.g.opt;
  o.softmax_scale = 0;
  f.expect(f.g.kv, f.g.table, o, "softmax_scale");
  o = f.g.opt;
  o.rotate_query = true;
  f.expect(f.g.kv, f.g.table, o, "rotate_query needs rope_on_read");
  o = f.g.opt;
  o.window = 4;
  o.q_positions = TensorRef();
  f.expect(f.g.kv, f.g.table, o, "q_positions is required");
  PagedKV kv = f.g.kv;
  kv.k_scale = TensorRef();
  f.expect(kv, f.g.table, f.g.opt, "need kv.k_scale");
  kv = f.g.kv;
  kv.v = TensorRef(f.g.v.data(), DType::F16, Device::cpu(), {f.g.kv.v.size(0), 16, 2, 32});
  f.expect(kv, f.g.table, f.g.opt, "kv.v");
  kv = f.g.kv;
  kv.positions = TensorRef(f.g.pos.data(), DType::F32, Device::cpu(), {f.g.kv.k.size(0), 16});
  f.expect(kv, f.g.table, f.g.opt, "kv.positions");
  o = f.g.opt;
  RopeSpec bad = f.c.rope;
  bad.n_rot = 66;
  o.rope_on_read = bad;
  f.expect(f.g.kv, f.g.table, o, "n_rot");
  BlockTable t = f.g.table;
  t.indptr = TensorRef(f.g.indptr.data(), DType::I32, Device::cpu(), {1});
  f.expect(f.g.kv, t, f.g.opt, "batch + 1 >= 2");  // empty batch
  o = f.g.opt;
  Buffer small(16, Device::cpu());
  o.workspace = TensorRef(small.data(), DType::U8, Device::cpu(), {16});
  o.num_splits = 4;
  f.expect(f.g.kv, f.g.table, o, "workspace holds 16 bytes");
  o = f.g.opt;
  o.kernel_variant = 5;
  f.expect(f.g.kv, f.g.table, o, "kernel_variant must be 0 to 4, got 5");
  o = f.g.opt;
  o.num_splits = -1;
  f.expect(f.g.kv, f.g.table, o, "num_splits must be in [0, 1024], got -1");
}

// The workspace size needs the split count the call resolves (0 is not a count).
TEST(AttentionErrors, WorkspaceBytesNeedsASplitCount) {
  EXPECT_EQ(attention_workspace_bytes(3, 8, 64, 2), size_t{3 * 8 * 2 * (64 + 1)} * 4);
  try {
    (void)attention_workspace_bytes(3, 8, 64, 0);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_splits must be >= 1"), std::string::npos) << e.what();
  }
}
