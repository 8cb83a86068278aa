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

constexpr int64_t kKvChunk = 512;         // keys per task when the key range is split
constexpr int64_t kSplitBelowItems = 64;  // split key ranges when there are fewer work items

// Per-thread scratch, grown on first use and reused by later calls.
struct Scratch {
  std::vector<float> s, m, l, acc, kv_tile;
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
  // A q8_0 cache's tiles are dequantised here (K and V rows of one tile).
  float* kv_tile_for(DType kv, int64_t hd) {
    if (kv != DType::Q8_0) return nullptr;
    if (static_cast<int64_t>(kv_tile.size()) < 2 * kAttnKeyTile * hd)
      kv_tile.resize(static_cast<size_t>(2 * kAttnKeyTile * hd));
    return kv_tile.data();
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

// An item: query heads h0 .. h0 + nh - 1 (of KV head g) x tokens t0 .. t0 + nt - 1.
struct Item {
  int64_t g, h0, nh, t0, nt;
};

// The partition of one call: strides, items and key chunks (shapes only, never the thread count).
struct Plan {
  int64_t hd, group, q_stride, kv_stride, head_stride;
  DType kv_dtype;
  int64_t head_bytes;  // bytes from one KV head's rows to the next's (head_stride elements)
  float scale;
  int64_t n_tokens, hb, n_hblocks, tb, n_tblocks, n_items;
  int64_t max_keys, n_chunks, chunk_keys;
  int64_t row_floats;  // partial record: m, l, acc[hd]
  int64_t item_rows;
  float* part = nullptr;  // partial records [item][chunk][row] when n_chunks > 1

  Item item_of(int64_t i) const {
    const int64_t tbi = i % n_tblocks, rest = i / n_tblocks;
    const int64_t hbi = rest % n_hblocks, g = rest / n_hblocks;
    Item it;
    it.g = g;
    it.h0 = g * group + hbi * hb;
    it.nh = std::min(hb, group - hbi * hb);
    it.t0 = tbi * tb;
    it.nt = std::min(tb, n_tokens - it.t0);
    return it;
  }
};

Plan plan_attention(int64_t n_tokens, const int32_t* positions, const AttentionShape& s) {
  Plan pl;
  pl.hd = s.head_dim;
  pl.group = s.n_heads / s.n_kv_heads;
  pl.q_stride = s.n_heads * pl.hd;
  pl.kv_stride = s.kv_row_stride > 0 ? s.kv_row_stride : s.n_kv_heads * pl.hd;
  pl.head_stride = s.kv_head_stride > 0 ? s.kv_head_stride : pl.hd;
  pl.kv_dtype = s.kv_dtype;
  pl.head_bytes = static_cast<int64_t>(dtype_row_bytes(s.kv_dtype, pl.head_stride));
  pl.scale = 1.0f / std::sqrt(static_cast<float>(pl.hd));
  pl.n_tokens = n_tokens;
  // Rows of an item: hb heads (of one group) x tb tokens.
  pl.hb = std::min<int64_t>(pl.group, kAttnMaxRows);
  pl.n_hblocks = (pl.group + pl.hb - 1) / pl.hb;
  pl.tb = std::max<int64_t>(1, kAttnMaxRows / pl.hb);
  pl.n_tblocks = (n_tokens + pl.tb - 1) / pl.tb;
  pl.n_items = s.n_kv_heads * pl.n_hblocks * pl.n_tblocks;
  pl.max_keys = 0;
  for (int64_t t = 0; t < n_tokens; ++t) pl.max_keys = std::max<int64_t>(pl.max_keys, positions[t] + 1);
  pl.n_chunks = pl.n_items < kSplitBelowItems ? std::max<int64_t>(1, (pl.max_keys + kKvChunk - 1) / kKvChunk) : 1;
  pl.chunk_keys = pl.n_chunks == 1 ? pl.max_keys : kKvChunk;
  pl.row_floats = pl.hd + 2;
  pl.item_rows = std::min(pl.tb, n_tokens) * pl.hb;
  return pl;
}

// Floats of a plan's partial records (0 when its key ranges are not split).
size_t partial_floats(const Plan& pl) {
  return pl.n_chunks > 1 ? static_cast<size_t>(pl.n_items * pl.n_chunks * pl.item_rows * pl.row_floats) : 0;
}

// One task: an item's rows over one key chunk through the tile kernel, written normalised to out (one
// chunk) or as partial records.
void run_task(const Plan& pl, int64_t task, const float* q, const int32_t* positions, const void* k, const void* v,
              float* out, Scratch& sc, const CpuKernels& kern) {
  const int64_t hd = pl.hd;
  const int64_t item = task / pl.n_chunks, chunk = task % pl.n_chunks;
  const Item it = pl.item_of(item);
  const int nr = static_cast<int>(it.nt * it.nh);
  for (int64_t tl = 0; tl < it.nt; ++tl)
    for (int64_t hh = 0; hh < it.nh; ++hh) {
      const int64_t r = tl * it.nh + hh, t = it.t0 + tl;
      sc.q[r] = q + t * pl.q_stride + (it.h0 + hh) * hd;
      sc.limit[r] = positions[t] + 1;
    }
  std::fill(sc.m.begin(), sc.m.begin() + nr, -INFINITY);
  std::fill(sc.l.begin(), sc.l.begin() + nr, 0.0f);
  std::fill(sc.acc.begin(), sc.acc.begin() + nr * hd, 0.0f);
  AttnArgs a;
  a.q = sc.q.data();
  a.limit = sc.limit.data();
  a.nr = nr;
  a.k = static_cast<const uint8_t*>(k) + it.g * pl.head_bytes;
  a.v = static_cast<const uint8_t*>(v) + it.g * pl.head_bytes;
  a.ld = pl.kv_stride;
  a.kv_dtype = pl.kv_dtype;
  a.j_begin = chunk * pl.chunk_keys;
  a.j_end = std::min(pl.max_keys, a.j_begin + pl.chunk_keys);
  a.hd = hd;
  a.scale = pl.scale;
  a.m = sc.m.data();
  a.l = sc.l.data();
  a.acc = sc.acc.data();
  a.scratch = sc.s.data();
  a.kv_tile = sc.kv_tile_for(pl.kv_dtype, hd);
  a.dequant_q8_0 = kern.dequant[kernel_slot(DType::Q8_0)];
  kern.attn(a);
  if (pl.n_chunks == 1) {
    for (int r = 0; r < nr; ++r) {
      const int64_t tl = r / it.nh, hh = r % it.nh;
      float* o = out + (it.t0 + tl) * pl.q_stride + (it.h0 + hh) * hd;
      const float* ac = sc.acc.data() + r * hd;
      const float inv = 1.0f / sc.l[r];
      for (int64_t d = 0; d < hd; ++d) o[d] = ac[d] * inv;
    }
  } else {
    float* p = pl.part + task * pl.item_rows * pl.row_floats;
    for (int r = 0; r < nr; ++r) {
      float* pr = p + r * pl.row_floats;
      pr[0] = sc.m[r];
      pr[1] = sc.l[r];
      std::copy(sc.acc.data() + r * hd, sc.acc.data() + (r + 1) * hd, pr + 2);
    }
  }
}

// Combines the chunks of an item: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c.
void combine_item(const Plan& pl, int64_t item, float* out) {
  const int64_t hd = pl.hd, n_chunks = pl.n_chunks, item_rows = pl.item_rows, row_floats = pl.row_floats;
  const Item it = pl.item_of(item);
  const int nr = static_cast<int>(it.nt * it.nh);
  const float* p = pl.part + item * n_chunks * item_rows * row_floats;
  for (int r = 0; r < nr; ++r) {
    const int64_t tl = r / it.nh, hh = r % it.nh;
    float* o = out + (it.t0 + tl) * pl.q_stride + (it.h0 + hh) * hd;
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

}  // namespace

AttentionShape head_major(AttentionShape s, int64_t capacity) {
  s.kv_row_stride = s.head_dim;
  s.kv_head_stride = capacity * s.head_dim;
  return s;
}

void attention(const float* q, int64_t n_tokens, const int32_t* positions, const void* k, const void* v, int64_t kv_len,
               const AttentionShape& s, float* out, ThreadPool& pool) {
  if (n_tokens <= 0) return;
  attention_segments(q, positions, {{0, n_tokens, k, v, kv_len}}, s, out, pool);
}

void attention_segments(const float* q, const int32_t* positions, const std::vector<AttentionSegment>& segs,
                        const AttentionShape& s, float* out, ThreadPool& pool) {
  SW_CHECK(is_kv_dtype(s.kv_dtype), "attention: a KV cache of ", dtype_name(s.kv_dtype), " is not supported (",
           kKvDtypeNames, ")");
  check_kv_head_dim(s.kv_dtype, s.head_dim, "attention");
  SW_CHECK(
      s.kv_row_stride % dtype_block_elems(s.kv_dtype) == 0 && s.kv_head_stride % dtype_block_elems(s.kv_dtype) == 0,
      "attention: a ", dtype_name(s.kv_dtype), " cache's strides must be whole blocks");
  // Each segment is partitioned as it would be alone (so the results are the same bits), and the tasks
  // of all of them share one pass of the pool.
  std::vector<Plan> plans;
  std::vector<int64_t> first_task, first_item;
  size_t floats = 0;
  int64_t tasks = 0, items = 0;
  for (const AttentionSegment& g : segs) {
    for (int64_t t = g.t0; t < g.t0 + g.n; ++t)
      SW_CHECK(positions[t] >= 0 && positions[t] < g.kv_len, "attention: position ", positions[t],
               " outside the cache (", g.kv_len, " rows)");
    plans.push_back(plan_attention(g.n, positions + g.t0, s));
    first_task.push_back(tasks);
    first_item.push_back(items);
    tasks += plans.back().n_items * plans.back().n_chunks;
    items += plans.back().n_chunks > 1 ? plans.back().n_items : 0;
    floats += partial_floats(plans.back());
  }
  std::vector<float>& p = partials();
  if (p.size() < floats) p.resize(floats);
  floats = 0;
  for (Plan& pl : plans) {
    pl.part = p.data() + floats;
    floats += partial_floats(pl);
  }
  first_task.push_back(tasks);
  first_item.push_back(items);
  const auto segment_of = [](const std::vector<int64_t>& firsts, int64_t i) {
    return static_cast<size_t>(std::upper_bound(firsts.begin(), firsts.end(), i) - firsts.begin() - 1);
  };
  const CpuKernels& kern = cpu_kernels();
  const int64_t qs = s.n_heads * s.head_dim;
  pool.parallel_for(tasks, 1, [&](int64_t i0, int64_t i1, int) {
    Scratch& sc = thread_scratch();
    sc.reserve(kAttnMaxRows, s.head_dim);
    for (int64_t task = i0; task < i1; ++task) {
      const size_t k = segment_of(first_task, task);
      const AttentionSegment& g = segs[k];
      run_task(plans[k], task - first_task[k], q + g.t0 * qs, positions + g.t0, g.k, g.v, out + g.t0 * qs, sc, kern);
    }
  });
  if (items == 0) return;
  pool.parallel_for(items, 1, [&](int64_t i0, int64_t i1, int) {
    for (int64_t item = i0; item < i1; ++item) {
      const size_t k = segment_of(first_item, item);
      combine_item(plans[k], item - first_item[k], out + segs[k].t0 * qs);
    }
  });
}

}  // namespace shardwise
