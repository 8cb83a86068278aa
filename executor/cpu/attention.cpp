// executor/cpu/attention.cpp — tiled online-softmax attention (see attention.h).
//
// Work items: (KV head, block of query heads of its GQA group, block of query tokens). The rows of an
// item (tokens x heads, <= kAttnMaxRows) share the KV head, so the tile kernel (CpuKernels::attn,
// kernels_attention.h) reads each K and V row once for all of them. When there are few items (decode,
// short prefill chunks) the key range of each item is also split into chunks of kKvChunk keys, run as
// separate tasks whose partial (max, sum, unnormalised output) are combined at the end, so that all
// threads help a single query. The partition depends only on the shapes, never on the thread count,
// so results do not change with the number of threads.
#include "executor/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/kernels.h"

namespace shardwise {
namespace {

constexpr int64_t kKvChunk = 512;     // keys per task when the key range is split
constexpr int64_t kSplitBelowItems = 64;  // split key ranges when there are fewer work items

// Per-thread scratch, grown on first use and reused by later calls.
struct Scratch {
  std::vector<float> s, m, l, acc;
  std::vector<const float*> q;
  std::vector<int64_t> limit;
  void reserve(int64_t rows, int64_t hd) {
    if (static_cast<int64_t>(m.size()) >= rows && static_cast<int64_t>(acc.size()) >= rows * hd) return;
    s.resize(static_cast<size_t>(rows * kAttnKeyTile));
    m.resize(static_cast<size_t>(rows));
    l.resize(static_cast<size_t>(rows));
    acc.resize(static_cast<size_t>(rows * hd));
    q.resize(static_cast<size_t>(rows));
    limit.resize(static_cast<size_t>(rows));
  }
};

Scratch& thread_scratch() {
  static thread_local Scratch s;
  return s;
}

// Partial results of split tasks: per task and row, m, l and hd accumulators.
std::vector<float>& partials() {
  static thread_local std::vector<float> p;
  return p;
}

}  // namespace

AttentionShape head_major(AttentionShape s, int64_t capacity) {
  s.kv_row_stride = s.head_dim;
  s.kv_head_stride = capacity * s.head_dim;
  return s;
}

void attention(const float* q, int64_t n_tokens, const int32_t* positions, const float* k, const float* v,
               int64_t kv_len, const AttentionShape& s, float* out, ThreadPool& pool) {
  const int64_t hd = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const int64_t q_stride = s.n_heads * hd;
  const int64_t kv_stride = s.kv_row_stride > 0 ? s.kv_row_stride : s.n_kv_heads * hd;
  const int64_t head_stride = s.kv_head_stride > 0 ? s.kv_head_stride : hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t t = 0; t < n_tokens; ++t)
    SW_CHECK(positions[t] >= 0 && positions[t] < kv_len, "attention: position ", positions[t],
             " outside the cache (", kv_len, " rows)");
  if (n_tokens <= 0) return;
  const CpuKernels& kern = cpu_kernels();

  // Rows of an item: hb heads (of one group) x tb tokens.
  const int64_t hb = std::min<int64_t>(group, kAttnMaxRows);
  const int64_t n_hblocks = (group + hb - 1) / hb;
  const int64_t tb = std::max<int64_t>(1, kAttnMaxRows / hb);
  const int64_t n_tblocks = (n_tokens + tb - 1) / tb;
  const int64_t n_items = s.n_kv_heads * n_hblocks * n_tblocks;
  int64_t max_keys = 0;
  for (int64_t t = 0; t < n_tokens; ++t) max_keys = std::max<int64_t>(max_keys, positions[t] + 1);
  const int64_t n_chunks =
      n_items < kSplitBelowItems ? std::max<int64_t>(1, (max_keys + kKvChunk - 1) / kKvChunk) : 1;
  const int64_t chunk_keys = n_chunks == 1 ? max_keys : kKvChunk;
  const int64_t row_floats = hd + 2;  // partial record: m, l, acc[hd]
  const int64_t item_rows = std::min(tb, n_tokens) * hb;
  float* part = nullptr;
  if (n_chunks > 1) {
    std::vector<float>& p = partials();
    const size_t need = static_cast<size_t>(n_items * n_chunks * item_rows * row_floats);
    if (p.size() < need) p.resize(need);
    part = p.data();
  }

  struct Item {
    int64_t g, h0, nh, t0, nt;
  };
  auto item_of = [&](int64_t i) {
    const int64_t tbi = i % n_tblocks, rest = i / n_tblocks;
    const int64_t hbi = rest % n_hblocks, g = rest / n_hblocks;
    Item it;
    it.g = g;
    it.h0 = g * group + hbi * hb;
    it.nh = std::min(hb, group - hbi * hb);
    it.t0 = tbi * tb;
    it.nt = std::min(tb, n_tokens - it.t0);
    return it;
  };

  pool.parallel_for(n_items * n_chunks, 1, [&](int64_t i0, int64_t i1, int) {
    Scratch& sc = thread_scratch();
    sc.reserve(kAttnMaxRows, hd);
    for (int64_t task = i0; task < i1; ++task) {
      const int64_t item = task / n_chunks, chunk = task % n_chunks;
      const Item it = item_of(item);
      const int nr = static_cast<int>(it.nt * it.nh);
      for (int64_t tl = 0; tl < it.nt; ++tl)
        for (int64_t hh = 0; hh < it.nh; ++hh) {
          const int64_t r = tl * it.nh + hh, t = it.t0 + tl;
          sc.q[r] = q + t * q_stride + (it.h0 + hh) * hd;
          sc.limit[r] = positions[t] + 1;
        }
      std::fill(sc.m.begin(), sc.m.begin() + nr, -INFINITY);
      std::fill(sc.l.begin(), sc.l.begin() + nr, 0.0f);
      std::fill(sc.acc.begin(), sc.acc.begin() + nr * hd, 0.0f);
      AttnArgs a;
      a.q = sc.q.data();
      a.limit = sc.limit.data();
      a.nr = nr;
      a.k = k + it.g * head_stride;
      a.v = v + it.g * head_stride;
      a.ld = kv_stride;
      a.j_begin = chunk * chunk_keys;
      a.j_end = std::min(max_keys, a.j_begin + chunk_keys);
      a.hd = hd;
      a.scale = scale;
      a.m = sc.m.data();
      a.l = sc.l.data();
      a.acc = sc.acc.data();
      a.scratch = sc.s.data();
      kern.attn(a);
      if (n_chunks == 1) {
        for (int r = 0; r < nr; ++r) {
          const int64_t tl = r / it.nh, hh = r % it.nh;
          float* o = out + (it.t0 + tl) * q_stride + (it.h0 + hh) * hd;
          const float* ac = sc.acc.data() + r * hd;
          const float inv = 1.0f / sc.l[r];
          for (int64_t d = 0; d < hd; ++d) o[d] = ac[d] * inv;
        }
      } else {
        float* p = part + task * item_rows * row_floats;
        for (int r = 0; r < nr; ++r) {
          float* pr = p + r * row_floats;
          pr[0] = sc.m[r];
          pr[1] = sc.l[r];
          std::copy(sc.acc.data() + r * hd, sc.acc.data() + (r + 1) * hd, pr + 2);
        }
      }
    }
  });
  if (n_chunks == 1) return;

  // Combine the chunks of each item: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c.
  pool.parallel_for(n_items, 1, [&](int64_t i0, int64_t i1, int) {
    for (int64_t item = i0; item < i1; ++item) {
      const Item it = item_of(item);
      const int nr = static_cast<int>(it.nt * it.nh);
      const float* p = part + item * n_chunks * item_rows * row_floats;
      for (int r = 0; r < nr; ++r) {
        const int64_t tl = r / it.nh, hh = r % it.nh;
        float* o = out + (it.t0 + tl) * q_stride + (it.h0 + hh) * hd;
        float mx = -INFINITY;
        for (int64_t c = 0; c < n_chunks; ++c) mx = std::max(mx, p[(c * item_rows + r) * row_floats]);
        float l = 0.0f;
        std::fill(o, o + hd, 0.0f);
        for (int64_t c = 0; c < n_chunks; ++c) {
          const float* pr = p + (c * item_rows + r) * row_floats;
          if (pr[0] == -INFINITY) continue;  // no key of this chunk is visible to the row
          const float w = std::exp(pr[0] - mx);
          l += w * pr[1];
          for (int64_t d = 0; d < hd; ++d) o[d] += w * pr[2 + d];
        }
        const float inv = 1.0f / l;
        for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
      }
    }
  });
}

}  // namespace shardwise
