// executor/model/qwen3_moe.cpp — the routed-experts FFN of qwen3_moe on the CPU: for each expert in
// ascending order, its tokens' SwiGLU FFN, added with the routing weight.
#include <algorithm>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/kernels.h"
#include "executor/cpu/matmul.h"
#include "executor/model/cpu_blocks.h"

namespace shardwise {

void CpuBlocks::moe_ffn(const LayerWeights& w, const float* xn, int64_t n, const MoeRouting& routing, float* out) {
  const int64_t H = spec_.hidden_size, E = spec_.num_experts, F = spec_.moe_intermediate_size;
  SW_CHECK(static_cast<int64_t>(routing.tokens_of_expert.size()) == E, "MoE routing has the wrong expert count");
  std::fill(out, out + n * H, 0.0f);
  const uint64_t gate_bytes = tensor_bytes(w.gate_exps.dtype, {F, H});
  const uint64_t up_bytes = tensor_bytes(w.up_exps.dtype, {F, H});
  const uint64_t down_bytes = tensor_bytes(w.down_exps.dtype, {H, F});
  if (n <= kGemvMaxTokens) {
    moe_ffn_decode(w, xn, n, routing, out);
    return;
  }
  for (int64_t e = 0; e < E; ++e) {
    const auto& toks = routing.tokens_of_expert[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    const uint8_t* g = !w.gate_exp.empty()
                           ? w.gate_exp[static_cast<size_t>(e)]
                           : static_cast<const uint8_t*>(w.gate_exps.data) + static_cast<uint64_t>(e) * gate_bytes;
    const uint8_t* u = !w.up_exp.empty()
                           ? w.up_exp[static_cast<size_t>(e)]
                           : static_cast<const uint8_t*>(w.up_exps.data) + static_cast<uint64_t>(e) * up_bytes;
    const uint8_t* d = !w.down_exp.empty()
                           ? w.down_exp[static_cast<size_t>(e)]
                           : static_cast<const uint8_t*>(w.down_exps.data) + static_cast<uint64_t>(e) * down_bytes;
    SW_CHECK(g && u && d, "MoE: expert ", e, " is routed to but its weights are not present");
    const int64_t m = static_cast<int64_t>(toks.size());
    expert_in_.resize(static_cast<size_t>(m * H));
    gate_.resize(static_cast<size_t>(m * F));
    up_.resize(static_cast<size_t>(m * F));
    expert_out_.resize(static_cast<size_t>(m * H));
    for (int64_t i = 0; i < m; ++i) {
      SW_CHECK(toks[i].token >= 0 && toks[i].token < n, "MoE routing names token ", toks[i].token, " of ", n);
      std::copy(xn + toks[i].token * H, xn + (toks[i].token + 1) * H, expert_in_.begin() + i * H);
    }
    matmul_raw(w.gate_exps.dtype, g, F, H, expert_in_.data(), H, m, gate_.data(), F, pool_);
    matmul_raw(w.up_exps.dtype, u, F, H, expert_in_.data(), H, m, up_.data(), F, pool_);
    swiglu(gate_.data(), up_.data(), m * F, pool_);
    matmul_raw(w.down_exps.dtype, d, H, F, gate_.data(), F, m, expert_out_.data(), H, pool_);
    for (int64_t i = 0; i < m; ++i) {
      float* o = out + toks[i].token * H;
      const float* y = expert_out_.data() + i * H;
      const float wgt = toks[i].weight;
      for (int64_t c = 0; c < H; ++c) o[c] += wgt * y[c];
    }
  }
}

// Decode-sized steps: a handful of tokens each touch k experts. One parallel loop computes the gate
// and up rows of every active expert (SwiGLU applied row by row), a second the down rows, instead of
// three threaded matmuls per expert: the thread pool is woken twice per layer, not 3·k times.
void CpuBlocks::moe_ffn_decode(const LayerWeights& w, const float* xn, int64_t n, const MoeRouting& routing,
                               float* out) {
  const int64_t H = spec_.hidden_size, E = spec_.num_experts, F = spec_.moe_intermediate_size;
  const CpuKernels& k = cpu_kernels();
  const GemvFn gate_fn = k.gemv[kernel_slot(w.gate_exps.dtype)];
  const GemvFn up_fn = k.gemv[kernel_slot(w.up_exps.dtype)];
  const GemvFn down_fn = k.gemv[kernel_slot(w.down_exps.dtype)];
  const uint64_t g_row = dtype_row_bytes(w.gate_exps.dtype, H), u_row = dtype_row_bytes(w.up_exps.dtype, H);
  const uint64_t d_row = dtype_row_bytes(w.down_exps.dtype, F);
  struct Active {
    int64_t expert, m, slot;  // slot: index into the gathered buffers
    const uint8_t *g, *u, *d;
  };
  std::vector<Active> act;
  int64_t rows_total = 0;
  for (int64_t e = 0; e < E; ++e) {
    const auto& toks = routing.tokens_of_expert[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    const uint8_t* g = !w.gate_exp.empty()
                           ? w.gate_exp[static_cast<size_t>(e)]
                           : static_cast<const uint8_t*>(w.gate_exps.data) + static_cast<uint64_t>(e) * g_row * F;
    const uint8_t* u = !w.up_exp.empty()
                           ? w.up_exp[static_cast<size_t>(e)]
                           : static_cast<const uint8_t*>(w.up_exps.data) + static_cast<uint64_t>(e) * u_row * F;
    const uint8_t* d = !w.down_exp.empty()
                           ? w.down_exp[static_cast<size_t>(e)]
                           : static_cast<const uint8_t*>(w.down_exps.data) + static_cast<uint64_t>(e) * d_row * H;
    SW_CHECK(g && u && d, "MoE: expert ", e, " is routed to but its weights are not present");
    act.push_back({e, static_cast<int64_t>(toks.size()), rows_total, g, u, d});
    rows_total += static_cast<int64_t>(toks.size());
  }
  // Gathered inputs [rows_total, H], gate/up [rows_total, F], outputs [rows_total, H].
  expert_in_.resize(static_cast<size_t>(rows_total * H));
  gate_.resize(static_cast<size_t>(rows_total * F));
  up_.resize(static_cast<size_t>(rows_total * F));
  expert_out_.resize(static_cast<size_t>(rows_total * H));
  for (const Active& a : act) {
    const auto& toks = routing.tokens_of_expert[static_cast<size_t>(a.expert)];
    for (int64_t i = 0; i < a.m; ++i) {
      SW_CHECK(toks[i].token >= 0 && toks[i].token < n, "MoE routing names token ", toks[i].token, " of ", n);
      std::copy(xn + toks[i].token * H, xn + (toks[i].token + 1) * H, expert_in_.begin() + (a.slot + i) * H);
    }
  }
  constexpr int64_t kRows = 32;
  const int64_t f_chunks = (F + kRows - 1) / kRows, h_chunks = (H + kRows - 1) / kRows;
  const int64_t n_act = static_cast<int64_t>(act.size());
  pool_.parallel_for(n_act * f_chunks, 1, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      const Active& a = act[static_cast<size_t>(i / f_chunks)];
      const int64_t r0 = (i % f_chunks) * kRows, r1 = std::min(F, r0 + kRows);
      const float* x = expert_in_.data() + a.slot * H;
      float* g = gate_.data() + a.slot * F;
      float* u = up_.data() + a.slot * F;
      gate_fn(a.g, g_row, H, r0, r1, x, H, static_cast<int>(a.m), g, F);
      up_fn(a.u, u_row, H, r0, r1, x, H, static_cast<int>(a.m), u, F);
      for (int64_t t = 0; t < a.m; ++t) swiglu(g + t * F + r0, u + t * F + r0, r1 - r0);
    }
  });
  pool_.parallel_for(n_act * h_chunks, 1, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      const Active& a = act[static_cast<size_t>(i / h_chunks)];
      const int64_t r0 = (i % h_chunks) * kRows, r1 = std::min(H, r0 + kRows);
      down_fn(a.d, d_row, F, r0, r1, gate_.data() + a.slot * F, F, static_cast<int>(a.m),
              expert_out_.data() + a.slot * H, H);
    }
  });
  // Weighted sum in ascending expert order (the same order as the general path).
  std::fill(out, out + n * H, 0.0f);
  for (const Active& a : act) {
    const auto& toks = routing.tokens_of_expert[static_cast<size_t>(a.expert)];
    for (int64_t i = 0; i < a.m; ++i) {
      float* o = out + toks[i].token * H;
      const float* y = expert_out_.data() + (a.slot + i) * H;
      const float wgt = toks[i].weight;
      for (int64_t c = 0; c < H; ++c) o[c] += wgt * y[c];
    }
  }
}

}  // namespace shardwise
