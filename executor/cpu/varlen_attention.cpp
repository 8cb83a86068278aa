// executor/cpu/varlen_attention.cpp — variable-length attention through the executor's attention tile kernel:
// each work item is one head of up to kVisionAttentionQueryTile queries of a segment, run over the
// segment's keys with every query's key limit at the segment's end (no mask).
#include "executor/cpu/varlen_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/kernels.h"

namespace shardwise {
namespace {

constexpr int64_t kQT = kVisionAttentionQueryTile;
constexpr int64_t kKT = kVisionAttentionKeyTile;
static_assert(kQT <= kAttnMaxRows && kKT == kAttnKeyTile, "the vision tiles must fit the tile kernel");

// One query tile of one segment and one head: rows [q0, q0 + nq) over keys [s0, s1).
struct AttentionItem {
  int64_t s0, s1, q0, nq, head;
};

struct AttentionScratch {
  std::vector<float> scores, acc, m, l;
  std::vector<const float*> q;
  std::vector<int64_t> limit;
  explicit AttentionScratch(int64_t head_dim)
      : scores(static_cast<size_t>(kQT * kKT)),
        acc(static_cast<size_t>(kQT * head_dim)),
        m(kQT),
        l(kQT),
        q(kQT),
        limit(kQT) {}
};

void attend_item(const float* q, const float* k, const float* v, float* out, const VarlenAttentionShape& sh,
                 const AttentionItem& it, AttentionScratch& s) {
  const int64_t hd = sh.head_dim, off = it.head * hd;
  const int nr = static_cast<int>(it.nq);
  for (int r = 0; r < nr; ++r) {
    s.q[r] = q + (it.q0 + r) * sh.q_stride + off;
    s.limit[r] = it.s1;
  }
  std::fill(s.m.begin(), s.m.begin() + nr, -std::numeric_limits<float>::infinity());
  std::fill(s.l.begin(), s.l.begin() + nr, 0.0f);
  std::fill(s.acc.begin(), s.acc.begin() + nr * hd, 0.0f);
  AttnArgs a;
  a.q = s.q.data();
  a.limit = s.limit.data();
  a.nr = nr;
  a.k = k + off;
  a.v = v + off;
  a.ld = sh.kv_stride;
  a.j_begin = it.s0;
  a.j_end = it.s1;
  a.hd = hd;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  a.m = s.m.data();
  a.l = s.l.data();
  a.acc = s.acc.data();
  a.scratch = s.scores.data();
  cpu_kernels().attn(a);
  for (int r = 0; r < nr; ++r) {
    const float inv = 1.0f / s.l[r];
    const float* acc = s.acc.data() + r * hd;
    float* o = out + (it.q0 + r) * sh.out_stride + off;
    for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] * inv;
  }
}

}  // namespace

uint64_t varlen_attention_scratch_bytes(int64_t head_dim, int n_threads) {
  const uint64_t floats = static_cast<uint64_t>(kQT * kKT + kQT * head_dim + 2 * kQT);
  const uint64_t per_query = sizeof(const float*) + sizeof(int64_t);
  return static_cast<uint64_t>(n_threads) * (sizeof(float) * floats + per_query * kQT);
}

void varlen_attention(const float* q, const float* k, const float* v, float* out, const std::vector<int64_t>& cu,
                      const VarlenAttentionShape& shape, ThreadPool& pool) {
  VarlenAttentionShape sh = shape;
  SW_CHECK(sh.n_heads >= 1 && sh.head_dim >= 1, "varlen_attention: n_heads and head_dim must be positive");
  const int64_t width = sh.n_heads * sh.head_dim;
  for (int64_t* stride : {&sh.q_stride, &sh.kv_stride, &sh.out_stride}) {
    if (*stride == 0) *stride = width;
    SW_CHECK(*stride >= width, "varlen_attention: a row stride of ", *stride, " is below n_heads * head_dim = ", width);
  }
  SW_CHECK(!cu.empty() && cu[0] == 0, "varlen_attention: cu_seqlens must start at 0");
  std::vector<AttentionItem> items;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    SW_CHECK(cu[s + 1] >= cu[s], "varlen_attention: cu_seqlens decreases at segment ", s);
    for (int64_t q0 = cu[s]; q0 < cu[s + 1]; q0 += kQT)
      for (int64_t h = 0; h < sh.n_heads; ++h)
        items.push_back({cu[s], cu[s + 1], q0, std::min(kQT, cu[s + 1] - q0), h});
  }
  std::vector<AttentionScratch> scratch(static_cast<size_t>(pool.size()), AttentionScratch(sh.head_dim));
  pool.parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t a, int64_t b, int thread) {
    for (int64_t i = a; i < b; ++i)
      attend_item(q, k, v, out, sh, items[static_cast<size_t>(i)], scratch[static_cast<size_t>(thread)]);
  });
}

}  // namespace shardwise
