// GPU suite, kernel part: every case of the op table (executor/ops/op_table.h) that has a CUDA kernel
// (matmul through GEMV and exact cuBLAS GEMMs, the GEMV k-split forced both ways, attention with each
// decode kernel, RMSNorm, SwiGLU) against the f64 references (executor/reference/op_reference.h)
// within the case's tolerance, and against the CPU kernels where the test did so before; then every
// CUDA block (cuda_kernels.h) against the CPU blocks on the same inputs over a table of odd model
// shapes, every dtype, both RoPE styles, q/k norm on and off, dense and MoE, decode and prefill token
// counts, fresh pos0 = 0 and a filled cache (pos0 = 300). Inputs are fresh random numbers per check;
// outputs are poisoned with NaN first; cache rows the step must not read are NaN too. Then a
// micro-benchmark printout (GEMV GB/s, GEMM TFLOP/s, attention) of the timed models' shapes, each
// checked before it is timed. Last, the vision encoder's operations ([vision], vision_kernels.h)
// against f64 loops, their warm-up, and a printout of vision attention's throughput. Built only with
// CUDA (it uses the CUDA headers); runs on the GPU machine (see test_gpu.cpp).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "executor/cpu/attention.h"
#include "executor/cpu/ops.h"
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/kernels.cuh"
#include "executor/device/vision_kernels.h"
#include "executor/model/cpu_blocks.h"
#include "executor/model/model_weights.h"
#include "executor/model/moe_routing.h"
#include "executor/ops/op_table.h"
#include "executor/reference/op_reference.h"
#include "test_util.h"
#include "vision/encoder_reference.h"

using namespace shardwise;

namespace {

constexpr double kBlockTol = 1e-5;  // max|gpu - cpu| / max|cpu| per row (f32 accumulation both sides)

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) FAIL(what << ": " << cudaGetErrorString(e));
}

struct Gpu {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  Gpu() {
    ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) FAIL("cublasCreate failed");
    cublasSetStream(blas, stream);
  }
  ~Gpu() {
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
  }
  void sync() { ck(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }
};
Gpu& gpu() {
  static Gpu g;
  return g;
}

// cudaMemcpy from pageable memory and cudaMemset run on the legacy default stream and may return
// before the bytes land, and the kernels under test run on a non-blocking stream that does not wait for
// that stream: without this, a kernel may read inputs still being copied (or outputs still being
// poisoned).
void settle() {
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// Device allocations of one test, freed at its end.
class DevMem {
 public:
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() {
    for (void* p : ptrs_) cudaFree(p);
  }
  uint8_t* alloc(uint64_t bytes) {
    void* p = nullptr;
    ck(cudaMalloc(&p, std::max<uint64_t>(bytes, 256)), "cudaMalloc");
    ptrs_.push_back(p);
    return static_cast<uint8_t*>(p);
  }
  float* floats(size_t n) { return reinterpret_cast<float*>(alloc(n * sizeof(float))); }
  template <typename T>
  T* upload(const T* host, size_t n) {
    T* d = reinterpret_cast<T*>(alloc(n * sizeof(T)));
    ck(cudaMemcpy(d, host, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    settle();
    return d;
  }
  float* upload(const std::vector<float>& v) { return upload(v.data(), v.size()); }

 private:
  std::vector<void*> ptrs_;
};

void poison(float* d, size_t n) {  // all-ones = NaN
  ck(cudaMemset(d, 0xFF, n * sizeof(float)), "cudaMemset");
  settle();
}
void put(float* d, const std::vector<float>& h) {
  ck(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  settle();
}
std::vector<float> get(const float* d, size_t n) {
  std::vector<float> h(n);
  gpu().sync();
  ck(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return h;
}

uint32_t g_seed = 12345;
std::vector<float> fresh(size_t n, float lo = -1.0f, float hi = 1.0f) {
  return test::random_floats(n, ++g_seed, lo, hi);
}

// ---- model table ----------------------------------------------------------------------------------
struct ModelCase {
  const char* name;
  const char* yaml;  // without dtype
};

// Odd shapes: hidden 96/100/200/256, q_dim != hidden, kv ratio 4, 3, 2 and 1, head_dim 32/64/128 and
// the padded ones 24/80/10 (10: heads not 16-byte aligned, element-wise loads), q/k norm on (qwen3*) and
// off (llama), experts with odd FFN widths (3 quantised blocks per row).
const ModelCase kModels[] = {
    {"llama h96 hd32 kv4:1",
     "name: t1\nfamily: llama\nhidden_size: 96\nnum_hidden_layers: 1\nnum_attention_heads: 4\n"
     "num_key_value_heads: 1\nhead_dim: 32\nintermediate_size: 160\nvocab_size: 300\nrope_theta: 10000.0\n"
     "rms_norm_eps: 1.0e-05\nmax_position_embeddings: 1024\n"},
    {"qwen3 h200 hd64 kv1:1",
     "name: t2\nfamily: qwen3\nhidden_size: 200\nnum_hidden_layers: 1\nnum_attention_heads: 4\n"
     "num_key_value_heads: 4\nhead_dim: 64\nintermediate_size: 256\nvocab_size: 333\nrope_theta: 1000000.0\n"
     "rms_norm_eps: 1.0e-06\nmax_position_embeddings: 1024\n"},
    {"llama h100 hd64 kv2:1 (unaligned f16 rows)",
     "name: t3\nfamily: llama\nhidden_size: 100\nnum_hidden_layers: 1\nnum_attention_heads: 2\n"
     "num_key_value_heads: 1\nhead_dim: 64\nintermediate_size: 96\nvocab_size: 129\nrope_theta: 500000.0\n"
     "rms_norm_eps: 1.0e-05\nmax_position_embeddings: 1024\n"},
    {"qwen3_moe h256 hd128 kv4:1 8 experts top-3",
     "name: t4\nfamily: qwen3_moe\nhidden_size: 256\nnum_hidden_layers: 1\nnum_attention_heads: 8\n"
     "num_key_value_heads: 2\nhead_dim: 128\nnum_experts: 8\nnum_experts_per_tok: 3\nmoe_intermediate_size: 96\n"
     "norm_topk_prob: true\nvocab_size: 250\nrope_theta: 1000000.0\nrms_norm_eps: 1.0e-06\nmax_position_embeddings: "
     "1024\n"},
    {"qwen3_moe h96 hd32 kv1:1 6 experts top-2 (no renorm)",
     "name: t5\nfamily: qwen3_moe\nhidden_size: 96\nnum_hidden_layers: 1\nnum_attention_heads: 3\n"
     "num_key_value_heads: 3\nhead_dim: 32\nnum_experts: 6\nnum_experts_per_tok: 2\nmoe_intermediate_size: 64\n"
     "norm_topk_prob: false\nvocab_size: 100\nrope_theta: 10000.0\nrms_norm_eps: 1.0e-05\nmax_position_embeddings: "
     "1024\n"},
    {"qwen3 h96 hd24 kv2:1",
     "name: t6\nfamily: qwen3\nhidden_size: 96\nnum_hidden_layers: 1\nnum_attention_heads: 4\n"
     "num_key_value_heads: 2\nhead_dim: 24\nintermediate_size: 128\nvocab_size: 130\nrope_theta: 1000000.0\n"
     "rms_norm_eps: 1.0e-06\nmax_position_embeddings: 1024\n"},
    {"llama h160 hd80 kv1:1",
     "name: t7\nfamily: llama\nhidden_size: 160\nnum_hidden_layers: 1\nnum_attention_heads: 2\n"
     "num_key_value_heads: 2\nhead_dim: 80\nintermediate_size: 96\nvocab_size: 101\nrope_theta: 10000.0\n"
     "rms_norm_eps: 1.0e-05\nmax_position_embeddings: 1024\n"},
    {"llama h64 hd10 kv3:1 (unaligned heads)",
     "name: t8\nfamily: llama\nhidden_size: 64\nnum_hidden_layers: 1\nnum_attention_heads: 6\n"
     "num_key_value_heads: 2\nhead_dim: 10\nintermediate_size: 64\nvocab_size: 77\nrope_theta: 10000.0\n"
     "rms_norm_eps: 1.0e-05\nmax_position_embeddings: 1024\n"},
};

ModelSpec spec_of(const ModelCase& mc, DType dt) {
  std::string yaml = mc.yaml;
  yaml += std::string("dtype: ") + dtype_name(dt) + "\n";
  return parse_spec_yaml_text(yaml, mc.name);
}

// One layer's weights on the host (CPU blocks) and on the device (CUDA blocks).
struct LayerPair {
  std::unique_ptr<WeightSource> source;
  ModelWeights host;
  DevLayer dev;
  DevMat head;
  float* out_norm = nullptr;
};

DevMat dev_mat(DevMem& mem, const TensorView& t) {
  DevMat m;
  if (!t.data) return m;
  m.dtype = t.dtype;
  m.rows = t.shape.at(0);
  m.cols = t.shape.at(1);
  m.data = mem.upload(static_cast<const uint8_t*>(t.data), t.nbytes);
  return m;
}

std::unique_ptr<LayerPair> make_layer(DevMem& mem, const ModelSpec& spec, ThreadPool& pool) {
  auto lp = std::make_unique<LayerPair>();
  lp->source = make_synthetic_weights(spec, 7, &pool);
  lp->host = ModelWeights::from_source(*lp->source);
  const LayerWeights& w = lp->host.layers.at(0);
  DevLayer& d = lp->dev;
  d.attn_norm = mem.upload(w.attn_norm);
  d.ffn_norm = mem.upload(w.ffn_norm);
  if (!w.q_norm.empty()) {
    d.q_norm = mem.upload(w.q_norm);
    d.k_norm = mem.upload(w.k_norm);
  }
  d.wq = dev_mat(mem, w.wq);
  d.wk = dev_mat(mem, w.wk);
  d.wv = dev_mat(mem, w.wv);
  d.wo = dev_mat(mem, w.wo);
  if (spec.is_moe()) {
    d.router = dev_mat(mem, w.router);
    const int64_t E = spec.num_experts;
    d.gate_dtype = w.gate_exps.dtype;
    d.up_dtype = w.up_exps.dtype;
    d.down_dtype = w.down_exps.dtype;
    const uint8_t* g = mem.upload(static_cast<const uint8_t*>(w.gate_exps.data), w.gate_exps.nbytes);
    const uint8_t* u = mem.upload(static_cast<const uint8_t*>(w.up_exps.data), w.up_exps.nbytes);
    const uint8_t* dn = mem.upload(static_cast<const uint8_t*>(w.down_exps.data), w.down_exps.nbytes);
    for (int64_t e = 0; e < E; ++e) {
      d.gate_exp.push_back(g + e * (w.gate_exps.nbytes / E));
      d.up_exp.push_back(u + e * (w.up_exps.nbytes / E));
      d.down_exp.push_back(dn + e * (w.down_exps.nbytes / E));
    }
  } else {
    d.gate = dev_mat(mem, w.ffn_gate);
    d.up = dev_mat(mem, w.ffn_up);
    d.down = dev_mat(mem, w.ffn_down);
  }
  lp->head = dev_mat(mem, lp->host.output);
  lp->out_norm = mem.upload(lp->host.output_norm);
  return lp;
}

struct StepCase {
  int64_t n, pos0;
};
const StepCase kSteps[] = {{1, 0}, {1, 300}, {3, 0}, {3, 300}, {8, 300}, {9, 0}, {9, 300}, {77, 0}, {77, 300}};
constexpr int64_t kCapacity = 400;

std::string where(const ModelCase& mc, DType dt, RopeStyle rope, const StepCase& s) {
  return std::string(mc.name) + " " + dtype_name(dt) + (rope == RopeStyle::Neox ? " neox" : " normal") +
         " n=" + std::to_string(s.n) + " pos0=" + std::to_string(s.pos0);
}

// Runs every block once on the CPU and the GPU for one (model, dtype, rope, step) and compares.
void check_blocks(const ModelSpec& spec, LayerPair& lp, RopeStyle rope, const StepCase& s, uint8_t* ws,
                  uint64_t ws_bytes, ThreadPool& pool, const std::string& label) {
  Gpu& g = gpu();
  DevMem mem;
  const int64_t n = s.n, H = spec.hidden_size, QD = spec.q_dim(), KVD = spec.kv_dim(), W = QD + 2 * KVD;
  const LayerWeights& hw = lp.host.layers.at(0);
  CpuBlocks cpu(spec, rope, pool);
  cpu.prepare_step(s.pos0, n);
  std::unique_ptr<DeviceKernels> k = make_cuda_kernels(spec, rope, g.stream, g.blas);
  k->set_workspace(ws, ws_bytes);
  k->prepare_step(s.pos0, n);
  INFO(label);

  {  // attention: whole block with the cache; rows the step must not read are NaN
    std::vector<float> x = fresh(static_cast<size_t>(n * H));
    std::vector<float> kc = fresh(static_cast<size_t>(kCapacity * KVD)),
                       vc = fresh(static_cast<size_t>(kCapacity * KVD));
    for (size_t i = static_cast<size_t>(s.pos0 * KVD); i < kc.size(); ++i) kc[i] = vc[i] = std::nanf("");
    float* dx = mem.upload(x);
    float* dk = mem.upload(kc);
    float* dv = mem.upload(vc);
    cpu.attention(hw, x.data(), n, kc.data(), vc.data());
    k->attention(lp.dev, dx, n, dk, dv);
    CHECK(test::max_rel_error(get(dx, x.size()), x, H) <= kBlockTol);
    const size_t r0 = static_cast<size_t>(s.pos0 * KVD), rn = static_cast<size_t>(n * KVD);
    const std::vector<float> gk = get(dk + r0, rn), gv = get(dv + r0, rn);
    CHECK(test::max_rel_error(gk, std::vector<float>(kc.begin() + r0, kc.begin() + r0 + rn), KVD) <= kBlockTol);
    CHECK(test::max_rel_error(gv, std::vector<float>(vc.begin() + r0, vc.begin() + r0 + rn), KVD) <= kBlockTol);
  }
  {  // attention_pre: normed, roped q, k and v
    std::vector<float> x = fresh(static_cast<size_t>(n * H)), qkv(static_cast<size_t>(n * W));
    float* dx = mem.upload(x);
    float* dq = mem.floats(qkv.size());
    poison(dq, qkv.size());
    cpu.attention_pre(hw, x.data(), n, qkv.data());
    k->attention_pre(lp.dev, dx, n, dq);
    CHECK(test::max_rel_error(get(dq, qkv.size()), qkv, W) <= kBlockTol);
  }
  {  // attention_post
    std::vector<float> x = fresh(static_cast<size_t>(n * H)), attn = fresh(static_cast<size_t>(n * QD));
    float* dx = mem.upload(x);
    float* da = mem.upload(attn);
    cpu.attention_post(hw, x.data(), attn.data(), n);
    k->attention_post(lp.dev, dx, da, n);
    CHECK(test::max_rel_error(get(dx, x.size()), x, H) <= kBlockTol);
  }
  if (spec.is_moe()) {  // router, then the experts with a routing from random logits
    const int64_t E = spec.num_experts;
    std::vector<float> x = fresh(static_cast<size_t>(n * H)), logits(static_cast<size_t>(n * E));
    float* dx = mem.upload(x);
    float* dl = mem.floats(logits.size());
    poison(dl, logits.size());
    cpu.router(hw, x.data(), n, logits.data());
    k->router(lp.dev, dx, n, dl);
    CHECK(test::max_rel_error(get(dl, logits.size()), logits, E) <= kBlockTol);

    const std::vector<float> rl = fresh(static_cast<size_t>(n * E), -3.0f, 3.0f);
    const MoeRouting routing = route_tokens(rl.data(), n, E, spec.num_experts_per_tok, spec.norm_topk_prob);
    // Experts nobody is routed to need not be on the device.
    DevLayer dl_sparse = lp.dev;
    for (int64_t e = 0; e < E; ++e)
      if (routing.tokens_of_expert[static_cast<size_t>(e)].empty())
        dl_sparse.gate_exp[static_cast<size_t>(e)] = dl_sparse.up_exp[static_cast<size_t>(e)] =
            dl_sparse.down_exp[static_cast<size_t>(e)] = nullptr;
    std::vector<float> y = fresh(static_cast<size_t>(n * H));
    float* dy = mem.upload(y);
    float* dy2 = mem.upload(y);
    cpu.ffn(hw, y.data(), n, &routing);
    k->ffn(dl_sparse, dy, n, &routing);
    k->ffn(lp.dev, dy2, n, &routing);
    const std::vector<float> gy = get(dy, y.size()), gy2 = get(dy2, y.size());
    CHECK(test::max_rel_error(gy, y, H) <= kBlockTol);
    CHECK(std::memcmp(gy.data(), gy2.data(), gy.size() * sizeof(float)) == 0);  // deterministic
    if (n <= 8) {  // routed on the device from the same logits: as the host routing, both layouts
      std::vector<float> z = fresh(static_cast<size_t>(n * H));
      const std::vector<float> z0 = z;
      float* dz = mem.upload(z0);
      float* drl = mem.upload(rl);
      cpu.ffn(hw, z.data(), n, &routing);
      k->ffn_routed(lp.dev, dz, n, drl);  // the layer's experts lie evenly: base + id * stride
      CHECK(test::max_rel_error(get(dz, z.size()), z, H) <= kBlockTol);
      if (E > 1) {  // experts in another order: found through pointer tables
        DevLayer swapped = lp.dev;
        std::swap(swapped.gate_exp[0], swapped.gate_exp[1]);
        std::swap(swapped.up_exp[0], swapped.up_exp[1]);
        std::swap(swapped.down_exp[0], swapped.down_exp[1]);
        // Expert ids 0 and 1 now name each other's matrices: swapping their logits gives the same
        // computation as the reference above.
        std::vector<float> rl_sw = rl;
        for (int64_t t = 0; t < n; ++t)
          std::swap(rl_sw[static_cast<size_t>(t * E)], rl_sw[static_cast<size_t>(t * E + 1)]);
        float* drl_sw = mem.upload(rl_sw);
        float* dz2 = mem.upload(z0);
        k->ffn_routed(swapped, dz2, n, drl_sw);
        CHECK(test::max_rel_error(get(dz2, z.size()), z, H) <= kBlockTol);
      }
    }
  } else {
    std::vector<float> x = fresh(static_cast<size_t>(n * H));
    float* dx = mem.upload(x);
    cpu.ffn(hw, x.data(), n, nullptr);
    k->ffn(lp.dev, dx, n, nullptr);
    CHECK(test::max_rel_error(get(dx, x.size()), x, H) <= kBlockTol);
  }
  if (n <= 3) {  // output: the whole LM head and a piece of it
    const int64_t V = spec.vocab_size;
    std::vector<float> xr = fresh(static_cast<size_t>(H)), logits(static_cast<size_t>(V));
    float* dx = mem.upload(xr);
    float* dl = mem.floats(logits.size());
    poison(dl, logits.size());
    cpu.output(lp.host.output_norm, lp.host.output, xr.data(), logits.data(), 0, V);
    k->output(lp.out_norm, lp.head, dx, dl);
    CHECK(test::max_rel_error(get(dl, logits.size()), logits, V) <= kBlockTol);
    const int64_t r0 = V / 3, r1 = V - 5;
    DevMat piece = lp.head;
    piece.rows = r1 - r0;
    piece.data += r0 * static_cast<int64_t>(dtype_row_bytes(piece.dtype, piece.cols));
    poison(dl, logits.size());
    std::fill(logits.begin(), logits.end(), 0.0f);
    cpu.output(lp.host.output_norm, lp.host.output, xr.data(), logits.data(), r0, r1);
    k->output(lp.out_norm, piece, dx, dl);
    CHECK(test::max_rel_error(get(dl, static_cast<size_t>(r1 - r0)),
                              std::vector<float>(logits.begin() + r0, logits.begin() + r1), r1 - r0) <= kBlockTol);
  }
  g.sync();
}

// ---- matmul reference ----------------------------------------------------------------------------
std::vector<uint8_t> random_weights(DType dt, int64_t rows, int64_t cols, float scale) {
  std::vector<uint8_t> w(dtype_row_bytes(dt, cols) * static_cast<size_t>(rows));
  const std::vector<float> f = fresh(static_cast<size_t>(rows * cols), -scale, scale);
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(dt, f.data() + r * cols, w.data() + r * dtype_row_bytes(dt, cols), cols);
  return w;
}

// The f64 reference of y[t, r] = sum_c deq(W[r])[c] * x[t * ldx + c] (+ y0 when accumulating: the sum of
// the terms' magnitudes, which the tolerance scales, grows by |y0| too).
OpReference ref_matmul(DType dt, const std::vector<uint8_t>& w, int64_t rows, int64_t cols, const std::vector<float>& x,
                       int64_t ldx, int64_t n, const std::vector<float>* y0) {
  OpReference ref = reference_matmul(dt, w.data(), dtype_row_bytes(dt, cols), rows, cols, x.data(), ldx, n);
  if (y0)
    for (size_t i = 0; i < ref.y.size(); ++i) {
      ref.y[i] += (*y0)[i];
      ref.mag[i] += std::fabs(static_cast<double>((*y0)[i]));
    }
  return ref;
}

// A matmul result against its reference under the matmul tolerance (a per-output or per-row relative
// error is ill-conditioned when the terms cancel, e.g. a 1-row matrix, or y0 + Wx near 0 when
// accumulating; the terms' magnitudes are not). Empty when it passes, else what failed.
std::string matmul_mismatch(const std::vector<float>& got, const OpReference& ref, const Tolerance& tol) {
  if (got.size() != ref.y.size()) return "wrong size";
  const RefCheck rc = compare_to_reference(got.data(), ref, tol);
  return rc.ok() ? std::string() : describe(rc, got.data(), ref, tol);
}

// A context for the internal kernel launchers (kernels.cuh).
struct KernelCtx {
  cuda::Workspace ws;
  cuda::Ctx ctx;
  KernelCtx(uint8_t* base, uint64_t bytes) {
    ws.reset(base, bytes);
    ctx.stream = gpu().stream;
    ctx.blas = gpu().blas;
    ctx.ws = &ws;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&ctx.sm_count, cudaDevAttrMultiProcessorCount, dev);
  }
};

const char* kernel_name(cuda::DecodeAttn kernel) {
  return kernel == cuda::DecodeAttn::Warps ? "warps" : kernel == cuda::DecodeAttn::Block ? "block" : "auto";
}

// The decode kernels (prefill steps ignore the choice).
constexpr cuda::DecodeAttn kDecodeKernels[] = {cuda::DecodeAttn::Warps, cuda::DecodeAttn::Block};

cuda::AttnArgs attn_args(const float* q, const void* kc, const void* vc, float* out, int64_t n, int64_t pos0, int heads,
                         int kv_heads, int hd) {
  cuda::AttnArgs a;
  a.q = q;
  a.q_stride = static_cast<int64_t>(heads) * hd;
  a.k = kc;
  a.v = vc;
  a.kv_stride = static_cast<int64_t>(kv_heads) * hd;
  a.out = out;
  a.out_stride = static_cast<int64_t>(heads) * hd;
  a.n = static_cast<int32_t>(n);
  a.pos_first = static_cast<int32_t>(pos0);
  a.n_heads = heads;
  a.n_kv_heads = kv_heads;
  a.head_dim = hd;
  return a;
}

double time_ms(const std::function<void()>& fn, int iters) {
  Gpu& g = gpu();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  fn();  // warm-up
  cudaEventRecord(a, g.stream);
  for (int i = 0; i < iters; ++i) fn();
  cudaEventRecord(b, g.stream);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

struct MatShape {  // a matrix of the GEMV task cases
  int64_t rows, cols;
};

// One matmul against the f64 reference: n tokens of x (row stride ldx; `wide`: rows 0 and 1 scaled by
// 1e5 and 1e-4, a dynamic range that exercises the f16 splits' scaling), stored or accumulated.
void check_matmul(Gpu& g, DevMem& mem, const DevMat& dm, const std::vector<uint8_t>& w, int64_t ldx, int64_t n,
                  bool accumulate, bool wide, uint8_t* ws, uint64_t ws_bytes, const std::string& label) {
  std::vector<float> x = fresh(static_cast<size_t>(n * ldx), -2.0f, 2.0f);
  if (wide) {
    for (int64_t c = 0; c < dm.cols; ++c) x[c] *= 1.0e5f;
    for (int64_t c = 0; c < dm.cols; ++c) x[ldx + c] *= 1.0e-4f;
  }
  const std::vector<float> y0 = fresh(static_cast<size_t>(n * dm.rows));
  const OpReference ref = ref_matmul(dm.dtype, w, dm.rows, dm.cols, x, ldx, n, accumulate ? &y0 : nullptr);
  float* dx = mem.upload(x);
  float* dy = mem.floats(ref.y.size());
  if (accumulate)
    put(dy, y0);
  else
    poison(dy, ref.y.size());
  cuda_matmul(dm, dx, ldx, n, dy, dm.rows, accumulate, ws, ws_bytes, g.stream, g.blas);
  const std::string bad = matmul_mismatch(get(dy, ref.y.size()), ref, tolerance(OpId::Matmul));
  INFO(label << " ldx=" << ldx << (accumulate ? " accumulate" : " store") << (wide ? " wide" : "") << ": " << bad);
  REQUIRE(bad.empty());
}

// One GEMV launch of n <= 8 tokens through the internal launcher, its k-split as given (cuda_matmul
// launches the same task with GemvSplit::Auto).
void gemv_launch(const DevMat& dm, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy, bool accumulate,
                 cuda::GemvSplit split) {
  KernelCtx kc(nullptr, 0);  // a GEMV takes no workspace
  cuda::GemvTask t;
  t.w0 = dm.data;
  t.x = x;
  t.ldx = ldx;
  t.y = y;
  t.ldy = ldy;
  t.rows = static_cast<int32_t>(dm.rows);
  t.cols = static_cast<int32_t>(dm.cols);
  t.nt = static_cast<int32_t>(n);
  cuda::gemv(kc.ctx, dm.dtype, accumulate ? cuda::GemvMode::Accumulate : cuda::GemvMode::Store, &t, 1, split);
}

// check_matmul's case through gemv_launch with the k-split forced.
void check_gemv(DevMem& mem, const DevMat& dm, const std::vector<uint8_t>& w, int64_t ldx, int64_t n, bool accumulate,
                cuda::GemvSplit split, const std::string& label) {
  const std::vector<float> x = fresh(static_cast<size_t>(n * ldx), -2.0f, 2.0f);
  const std::vector<float> y0 = fresh(static_cast<size_t>(n * dm.rows));
  const OpReference ref = ref_matmul(dm.dtype, w, dm.rows, dm.cols, x, ldx, n, accumulate ? &y0 : nullptr);
  float* dx = mem.upload(x);
  float* dy = mem.floats(ref.y.size());
  if (accumulate)
    put(dy, y0);
  else
    poison(dy, ref.y.size());
  gemv_launch(dm, dx, ldx, n, dy, dm.rows, accumulate, split);
  const std::string bad = matmul_mismatch(get(dy, ref.y.size()), ref, tolerance(OpId::Matmul));
  INFO(label << " ldx=" << ldx << (accumulate ? " accumulate" : " store") << ": " << bad);
  REQUIRE(bad.empty());
}

// silu(g) * u of two references (the fused gate/up pass), with the scale of its rounding error: the
// terms' magnitudes of g and u carried through the product (silu' stays below 1.1).
OpReference ref_swiglu(const OpReference& g, const OpReference& u) {
  OpReference r;
  r.y.resize(g.y.size());
  r.mag.resize(g.y.size());
  for (size_t i = 0; i < g.y.size(); ++i) {
    const double gi = g.y[i], ui = u.y[i], s = gi / (1.0 + std::exp(-gi));
    r.y[i] = s * ui;
    r.mag[i] = 1.1 * std::fabs(ui) * g.mag[i] + std::fabs(s) * u.mag[i];
  }
  return r;
}

// The GEMV tasks the MoE blocks launch, with the k-split as given: one SwiGLU launch of a task with its
// own gate and up matrices and a task whose matrices a device selector picks from pointer tables, then a
// store whose matrix a selector picks from matrices laid out evenly (sel_stride).
void check_gemv_tasks(DevMem& mem, DType dt, const MatShape& sh, int64_t n, cuda::GemvSplit split,
                      const std::string& label) {
  const uint64_t mat_bytes = dtype_row_bytes(dt, sh.cols) * static_cast<uint64_t>(sh.rows);
  uint8_t* dw = mem.alloc(3 * mat_bytes);  // matrices 0, 1, 2 back to back
  std::vector<uint8_t> w[3];
  for (int i = 0; i < 3; ++i) {
    w[i] = random_weights(dt, sh.rows, sh.cols, 0.5f);
    ck(cudaMemcpy(dw + i * mat_bytes, w[i].data(), mat_bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  const std::vector<float> x = fresh(static_cast<size_t>(n * sh.cols), -2.0f, 2.0f);
  const float* dx = mem.upload(x);
  std::vector<OpReference> r;
  for (int i = 0; i < 3; ++i) r.push_back(ref_matmul(dt, w[i], sh.rows, sh.cols, x, sh.cols, n, nullptr));
  const uint8_t* gates[2] = {dw + 2 * mat_bytes, dw};            // entry 1: matrix 0
  const uint8_t* ups[2] = {dw + mat_bytes, dw + 2 * mat_bytes};  // entry 1: matrix 2
  const int32_t picks[3] = {0, 1, 2};
  const uint8_t* const* d_gates = mem.upload(gates, 2);
  const uint8_t* const* d_ups = mem.upload(ups, 2);
  const int32_t* d_picks = mem.upload(picks, 3);
  const size_t out = static_cast<size_t>(n * sh.rows);
  float* y[3] = {mem.floats(out), mem.floats(out), mem.floats(out)};
  cuda::GemvTask t[3];
  for (int i = 0; i < 3; ++i) {
    poison(y[i], out);
    t[i].x = dx;
    t[i].ldx = sh.cols;
    t[i].y = y[i];
    t[i].ldy = sh.rows;
    t[i].rows = static_cast<int32_t>(sh.rows);
    t[i].cols = static_cast<int32_t>(sh.cols);
    t[i].nt = static_cast<int32_t>(n);
  }
  t[0].w0 = dw;  // gate: matrix 0, up: matrix 1
  t[0].w1 = dw + mat_bytes;
  t[1].w0 = reinterpret_cast<const uint8_t*>(d_gates);  // entry 1 of the tables
  t[1].w1 = reinterpret_cast<const uint8_t*>(d_ups);
  t[1].sel = d_picks + 1;
  t[1].sel_fast = true;
  t[2].w0 = dw;  // matrix 2 at 2 * mat_bytes
  t[2].sel = d_picks + 2;
  t[2].sel_stride = static_cast<int64_t>(mat_bytes);
  t[2].sel_fast = true;
  KernelCtx kc(nullptr, 0);
  cuda::gemv(kc.ctx, dt, cuda::GemvMode::SwiGLU, t, 2, split);
  cuda::gemv(kc.ctx, dt, cuda::GemvMode::Store, t + 2, 1, split);
  INFO(label << " n=" << n);
  const Tolerance tol = tolerance(OpId::Matmul);
  CHECK(matmul_mismatch(get(y[0], out), ref_swiglu(r[0], r[1]), tol) == "");
  CHECK(matmul_mismatch(get(y[1], out), ref_swiglu(r[0], r[2]), tol) == "");
  CHECK(matmul_mismatch(get(y[2], out), r[2], tol) == "");
}

}  // namespace

TEST_CASE("op table: matmul cases through cuda_matmul (GEMV and exact GEMM) match the f64 reference",
          "[gpu][kernels]") {
  Gpu& g = gpu();
  DevMem mem;
  const uint64_t ws_bytes = 256ull << 20;
  uint8_t* ws = mem.alloc(ws_bytes);
  std::unique_ptr<DevMem> wmem;  // the current shape's weights (cases come grouped by dtype and shape)
  std::vector<uint8_t> w;
  DevMat dm;
  for (const OpCase& c : check_cases(OpId::Matmul)) {
    if (!wmem || dm.dtype != c.dtype || dm.rows != c.rows || dm.cols != c.cols) {
      wmem = std::make_unique<DevMem>();
      w = random_weights(c.dtype, c.rows, c.cols, 0.5f);
      dm = DevMat{c.dtype, c.rows, c.cols, wmem->upload(w.data(), w.size())};
    }
    DevMem act;  // this case's activations
    for (bool accumulate : {false, true})
      for (int64_t pad : {int64_t(0), int64_t(4)})
        check_matmul(g, act, dm, w, c.cols + pad, c.tokens, accumulate, c.tokens > cuda::kGemvMaxTokens && pad == 0, ws,
                     ws_bytes, c.label());
  }
  // A workspace too small for the split falls back to GEMV passes: same numbers.
  const int64_t rows = 300, cols = 256, n = 40;
  for (DType dt : weight_dtypes()) {
    const std::vector<uint8_t> wt = random_weights(dt, rows, cols, 0.5f);
    DevMat small{dt, rows, cols, mem.upload(wt.data(), wt.size())};
    const std::vector<float> x = fresh(static_cast<size_t>(n * cols));
    const OpReference ref = ref_matmul(dt, wt, rows, cols, x, cols, n, nullptr);
    float* dx = mem.upload(x);
    float* dy = mem.floats(ref.y.size());
    poison(dy, ref.y.size());
    cuda_matmul(small, dx, cols, n, dy, rows, false, ws, 4096, g.stream, g.blas);
    const std::string bad = matmul_mismatch(get(dy, ref.y.size()), ref, tolerance(OpId::Matmul));
    INFO(dtype_name(dt) << " with a 4 KiB workspace: " << bad);
    REQUIRE(bad.empty());
  }
}

TEST_CASE("CUDA blocks match the CPU blocks (every dtype, RoPE style, step shape)", "[gpu][kernels]") {
  DevMem mem;
  const uint64_t ws_bytes = 128ull << 20;
  uint8_t* ws = mem.alloc(ws_bytes);
  ThreadPool pool(2);
  for (const ModelCase& mc : kModels) {
    for (DType dt : weight_dtypes()) {
      const ModelSpec spec = spec_of(mc, dt);
      DevMem wmem;
      std::unique_ptr<LayerPair> lp = make_layer(wmem, spec, pool);
      for (RopeStyle rope : {RopeStyle::Neox, RopeStyle::Normal})
        for (const StepCase& s : kSteps) check_blocks(spec, *lp, rope, s, ws, ws_bytes, pool, where(mc, dt, rope, s));
    }
  }
}

TEST_CASE(
    "op table: matmul cases of up to 8 tokens through the GEMVs with rows split among a block's warps (k-split) and "
    "without",
    "[gpu][kernels]") {
  // Forced both ways, every dtype and shape of the table (rows shorter than a warp's step: warps with
  // nothing to add), the GEMV's token counts; then the tasks of the MoE blocks (fused gate/up, matrices
  // picked by a device selector).
  for (cuda::GemvSplit split : {cuda::GemvSplit::Always, cuda::GemvSplit::Never}) {
    const std::string way = split == cuda::GemvSplit::Always ? "k-split " : "no k-split ";
    std::unique_ptr<DevMem> wmem;
    std::vector<uint8_t> w;
    DevMat dm;
    for (const OpCase& c : check_cases(OpId::Matmul)) {
      if (c.tokens > cuda::kGemvMaxTokens) continue;
      if (!wmem || dm.dtype != c.dtype || dm.rows != c.rows || dm.cols != c.cols) {
        wmem = std::make_unique<DevMem>();
        w = random_weights(c.dtype, c.rows, c.cols, 0.5f);
        dm = DevMat{c.dtype, c.rows, c.cols, wmem->upload(w.data(), w.size())};
      }
      DevMem act;
      for (bool accumulate : {false, true})
        check_gemv(act, dm, w, c.cols + (c.tokens == 3 ? 4 : 0), c.tokens, accumulate, split, way + c.label());
    }
    DevMem mem;
    for (DType dt : weight_dtypes())
      for (const MatShape& sh : {MatShape{37, 96}, MatShape{129, 4096}, MatShape{3, 11520}}) {
        if (sh.cols % dtype_block_elems(dt) != 0) continue;
        for (int64_t n : {1, 3, 8})
          check_gemv_tasks(
              mem, dt, sh, n, split,
              way + "tasks " + dtype_name(dt) + " " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols));
      }
  }
}

TEST_CASE("quantised GEMM: more tasks than one launch takes, odd shapes, rows of any scale, stored and accumulated",
          "[gpu][kernels]") {
  // Every type the kernel computes: 70 matrices (two launches of at most 64 tasks), 96 columns (a stage with
  // one quantised block; the K-quants: three super-blocks, 12 stages), rows 1 to 130 and 1 to 75 activation
  // rows per matrix (partial tiles both ways, two token tiles), activation rows scaled from 1e-4 to 1e4 (each
  // row is split with its own scale).
  constexpr int kTasks = 70;
  DevMem mem;
  uint8_t* ws = mem.alloc(64ull << 20);
  int types = 0;
  for (DType dt : weight_dtypes()) {
    if (!cuda::quant_gemm_computes(dt)) continue;
    ++types;
    const int64_t cols = dtype_block_elems(dt) == 256 ? 768 : 96;
    for (bool accumulate : {false, true}) {
      std::vector<int64_t> rows(kTasks), m(kTasks), first(kTasks);
      int64_t slots = 0;
      for (int i = 0; i < kTasks; ++i) {
        rows[i] = 1 + (i * 37) % 130;
        m[i] = 1 + (i * 13) % 75;
        first[i] = slots;
        slots += m[i];
      }
      std::vector<float> x = fresh(static_cast<size_t>(slots * cols));
      for (int64_t t = 0; t < slots; ++t)
        for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(t * cols + c)] *= std::pow(10.0f, float(t % 9) - 4.0f);
      const float* dx = mem.upload(x);
      KernelCtx kc(ws, 64ull << 20);
      const cuda::SplitRows xs = cuda::split_rows(kc.ctx, dx, cols, slots, cols);
      std::vector<cuda::QuantGemmTask> tasks(kTasks);
      std::vector<std::vector<uint8_t>> w(kTasks);
      std::vector<std::vector<float>> y0(kTasks);
      std::vector<float*> dy(kTasks);
      for (int i = 0; i < kTasks; ++i) {
        w[i] = random_weights(dt, rows[i], cols, 0.5f);
        y0[i] = fresh(static_cast<size_t>(m[i] * rows[i]));
        dy[i] = mem.floats(y0[i].size());
        if (accumulate)
          put(dy[i], y0[i]);
        else
          poison(dy[i], y0[i].size());
        tasks[i].w = mem.upload(w[i].data(), w[i].size());
        tasks[i].x_row = first[i];
        tasks[i].y = dy[i];
        tasks[i].ldy = rows[i];
        tasks[i].rows = static_cast<int32_t>(rows[i]);
        tasks[i].m = static_cast<int32_t>(m[i]);
      }
      cuda::quant_gemm(kc.ctx, dt, xs, cols, tasks.data(), kTasks, accumulate);
      for (int i = 0; i < kTasks; ++i) {
        const std::vector<float> xi(x.begin() + first[i] * cols, x.begin() + (first[i] + m[i]) * cols);
        const OpReference ref = ref_matmul(dt, w[i], rows[i], cols, xi, cols, m[i], accumulate ? &y0[i] : nullptr);
        const std::string bad = matmul_mismatch(get(dy[i], ref.y.size()), ref, tolerance(OpId::Matmul));
        INFO(dtype_name(dt) << (accumulate ? " accumulated" : " stored") << " task " << i << " (" << rows[i]
                            << " rows, " << m[i] << " activation rows): " << bad);
        REQUIRE(bad.empty());
      }
    }
  }
  CHECK(types == 7);  // q8_0, q4_0 and the five K-quants
}

TEST_CASE("CUDA blocks go through long steps in chunks when the workspace is small", "[gpu][kernels]") {
  DevMem mem;
  ThreadPool pool(2);
  for (const ModelCase& mc : {kModels[0], kModels[3]}) {
    for (DType dt : {DType::F16, DType::Q4_0}) {
      const ModelSpec spec = spec_of(mc, dt);
      DevMem wmem;
      std::unique_ptr<LayerPair> lp = make_layer(wmem, spec, pool);
      const uint64_t ws_bytes = cuda_kernels_workspace_bytes(spec, 1);  // 77 tokens must go in chunks
      uint8_t* ws = mem.alloc(ws_bytes);
      check_blocks(spec, *lp, RopeStyle::Neox, {77, 300}, ws, ws_bytes, pool,
                   where(mc, dt, RopeStyle::Neox, {77, 300}) + " small workspace");
    }
  }
}

TEST_CASE("op table: attention cases match the f64 reference and the CPU with each decode kernel", "[gpu][kernels]") {
  // Every case with the warp and the block decode kernel (prefill steps ignore the choice), at the
  // default keys per split and at 32 (more splits); cache rows past the step's last query are NaN. The
  // q8_0 cases' caches hold quantised rows: the reference attends over their dequantised values, the
  // CPU and the GPU over the blocks.
  DevMem mem;
  ThreadPool pool(0);
  const uint64_t ws_bytes = 256ull << 20;
  KernelCtx kc(mem.alloc(ws_bytes), ws_bytes);
  for (const OpCase& c : check_cases(OpId::Attention)) {
    const int64_t QD = c.heads * c.head_dim, KVD = c.kv_heads * c.head_dim, last = c.pos0 + c.tokens;
    const std::vector<float> q = fresh(static_cast<size_t>(c.tokens * QD), -2.0f, 2.0f);
    std::vector<float> k = fresh(static_cast<size_t>(c.kv_len * KVD), -2.0f, 2.0f);
    std::vector<float> v = fresh(static_cast<size_t>(c.kv_len * KVD));
    const std::vector<uint8_t> k_bits = test::kv_cache_of(c.dtype, k, KVD, last),
                               v_bits = test::kv_cache_of(c.dtype, v, KVD, last);
    std::vector<int32_t> pos(static_cast<size_t>(c.tokens));
    for (int64_t t = 0; t < c.tokens; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(c.pos0 + t);
    AttentionShape shape{c.heads, c.kv_heads, c.head_dim};
    const OpReference ref = reference_attention(q.data(), c.tokens, pos.data(), k.data(), v.data(), shape);
    shape.kv_dtype = c.dtype;
    std::vector<float> cpu(static_cast<size_t>(c.tokens * QD));
    shardwise::attention(q.data(), c.tokens, pos.data(), k_bits.data(), v_bits.data(), c.kv_len, shape, cpu.data(),
                         pool);
    DevMem act;
    float* dq = act.upload(q);
    const uint8_t* dk = act.upload(k_bits.data(), k_bits.size());
    const uint8_t* dv = act.upload(v_bits.data(), v_bits.size());
    float* dout = act.floats(cpu.size());
    for (cuda::DecodeAttn kernel : kDecodeKernels)
      for (int keys : {0, 32}) {
        poison(dout, cpu.size());
        cuda::AttnArgs a = attn_args(dq, dk, dv, dout, c.tokens, c.pos0, static_cast<int>(c.heads),
                                     static_cast<int>(c.kv_heads), static_cast<int>(c.head_dim));
        a.kv_dtype = c.dtype;
        a.decode_kernel = kernel;
        a.decode_min_keys = keys;
        cuda::attention(kc.ctx, a);
        const std::vector<float> got = get(dout, cpu.size());
        const RefCheck rc = compare_to_reference(got.data(), ref, c.tol);
        INFO(c.label() << " decode kernel " << kernel_name(kernel) << " min keys " << keys << ": "
                       << describe(rc, got.data(), ref, c.tol));
        CHECK(rc.ok());
        // Per head; heads of 1 or 2 elements per token row, where one output can be near 0 by
        // cancellation, per row.
        CHECK(test::max_rel_error(got, cpu, c.head_dim >= 8 ? c.head_dim : QD) <= kBlockTol);
      }
  }
}

TEST_CASE("CUDA attention with more key splits than one combine takes, and with room for few splits",
          "[gpu][kernels]") {
  DevMem mem;
  ThreadPool pool(0);
  const uint64_t ws_bytes = 256ull << 20;
  KernelCtx kc(mem.alloc(ws_bytes), ws_bytes);
  // More splits than the combine kernel takes at a time (128): one kv head, 16 keys per warp over 20K
  // keys (about 1000 splits), a partial last chunk; head_dim 256 (two output elements per combine thread) and 80.
  for (int hd : {256, 80}) {
    const int heads = 3, kv_heads = 1;
    const int64_t n = 2, pos0 = 20000, kv_len = pos0 + n, QD = heads * hd, KVD = kv_heads * hd;
    const std::vector<float> q = fresh(static_cast<size_t>(n * QD), -2.0f, 2.0f);
    const std::vector<float> k = fresh(static_cast<size_t>(kv_len * KVD), -2.0f, 2.0f);
    const std::vector<float> v = fresh(static_cast<size_t>(kv_len * KVD));
    const std::vector<int32_t> pos = {static_cast<int32_t>(pos0), static_cast<int32_t>(pos0 + 1)};
    std::vector<float> ref(static_cast<size_t>(n * QD));
    shardwise::attention(q.data(), n, pos.data(), k.data(), v.data(), kv_len, {heads, kv_heads, hd}, ref.data(), pool);
    float* dout = mem.floats(ref.size());
    float* dq = mem.upload(q);
    float* dk = mem.upload(k);
    float* dv = mem.upload(v);
    for (cuda::DecodeAttn kernel : kDecodeKernels) {
      poison(dout, ref.size());
      cuda::AttnArgs a = attn_args(dq, dk, dv, dout, n, pos0, heads, kv_heads, hd);
      a.decode_kernel = kernel;
      a.decode_min_keys = 16;
      cuda::attention(kc.ctx, a);
      INFO("many splits: hd " << hd << " decode kernel " << kernel_name(kernel));
      CHECK(test::max_rel_error(get(dout, ref.size()), ref, hd) <= kBlockTol);
    }
    // A workspace with room for the partials of ~10 splits only: the kernels take fewer, longer splits.
    const uint64_t small_bytes = 10 * (static_cast<uint64_t>(n * heads) * (hd + 2) * 4 + 512);
    KernelCtx small(mem.alloc(small_bytes), small_bytes);
    for (cuda::DecodeAttn kernel : kDecodeKernels) {
      poison(dout, ref.size());
      cuda::AttnArgs a = attn_args(dq, dk, dv, dout, n, pos0, heads, kv_heads, hd);
      a.decode_kernel = kernel;
      cuda::attention(small.ctx, a);
      INFO("small workspace: hd " << hd << " decode kernel " << kernel_name(kernel));
      CHECK(test::max_rel_error(get(dout, ref.size()), ref, hd) <= kBlockTol);
    }
  }
}

TEST_CASE("CUDA attention over offset and padded rows matches the CPU and leaves the padding untouched",
          "[gpu][kernels]") {
  // The op table's attention cases run on dense rows; here the rows' layout varies.
  DevMem mem;
  ThreadPool pool(0);
  const uint64_t ws_bytes = 64ull << 20;
  KernelCtx kc(mem.alloc(ws_bytes), ws_bytes);
  // Device layout of a case: q, caches and out start `off` floats into their allocations, rows are
  // the dense width plus `pad` floats (the padding and everything beyond a head's head_dim elements
  // must stay untouched: they are poisoned and checked bit for bit).
  struct Case {
    int heads, kv_heads, hd;
    int64_t n, pos0;
    int off = 0, pad = 0;
  };
  std::vector<Case> cases;
  // Unaligned or padded rows at the vectorised sizes and at hd % 4 == 0 fall back to guarded loads.
  for (int hd : {32, 64, 128, 256, 48}) {
    cases.push_back({4, 2, hd, 1, 500, 1, 0});
    cases.push_back({4, 2, hd, 9, 70, 0, 2});
    cases.push_back({4, 1, hd, 40, 10, 3, 5});
  }
  cases.push_back({8, 2, 64, 3, 200, 0, 4});  // padded rows that stay 16-byte aligned: vector loads
  for (const Case& c : cases) {
    const int64_t kv_len = c.pos0 + c.n, QD = static_cast<int64_t>(c.heads) * c.hd,
                  KVD = static_cast<int64_t>(c.kv_heads) * c.hd;
    const int64_t qs = QD + c.pad, kvs = KVD + c.pad;
    const std::vector<float> q = fresh(static_cast<size_t>(c.n * QD), -2.0f, 2.0f);
    const std::vector<float> k = fresh(static_cast<size_t>(kv_len * KVD), -2.0f, 2.0f);
    const std::vector<float> v = fresh(static_cast<size_t>(kv_len * KVD));
    std::vector<int32_t> pos(static_cast<size_t>(c.n));
    for (int64_t t = 0; t < c.n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(c.pos0 + t);
    std::vector<float> ref(static_cast<size_t>(c.n * QD));
    shardwise::attention(q.data(), c.n, pos.data(), k.data(), v.data(), kv_len, {c.heads, c.kv_heads, c.hd}, ref.data(),
                         pool);
    // Strided device copies (padding NaN).
    auto strided = [&](const std::vector<float>& src, int64_t rows, int64_t width, int64_t stride) {
      std::vector<float> dst(static_cast<size_t>(c.off + rows * stride), std::nanf(""));
      for (int64_t r = 0; r < rows; ++r)
        std::copy(src.begin() + r * width, src.begin() + (r + 1) * width, dst.begin() + c.off + r * stride);
      return dst;
    };
    const std::vector<float> hq = strided(q, c.n, QD, qs), hk = strided(k, kv_len, KVD, kvs),
                             hv = strided(v, kv_len, KVD, kvs);
    float* dq = mem.upload(hq);
    float* dk = mem.upload(hk);
    float* dv = mem.upload(hv);
    const size_t out_floats = static_cast<size_t>(c.off + c.n * qs);
    float* dout = mem.floats(out_floats);
    for (cuda::DecodeAttn kernel : kDecodeKernels) {
      poison(dout, out_floats);
      cuda::AttnArgs a =
          attn_args(dq + c.off, dk + c.off, dv + c.off, dout + c.off, c.n, c.pos0, c.heads, c.kv_heads, c.hd);
      a.q_stride = qs;
      a.kv_stride = kvs;
      a.out_stride = qs;
      a.decode_kernel = kernel;
      cuda::attention(kc.ctx, a);
      const std::vector<float> raw = get(dout, out_floats);
      std::vector<float> got(ref.size());
      bool untouched = true;
      for (size_t i = 0; i < raw.size(); ++i) {
        const int64_t j = static_cast<int64_t>(i) - c.off;
        if (j >= 0 && j % qs < QD) {
          got[static_cast<size_t>(j / qs * QD + j % qs)] = raw[i];
        } else {
          uint32_t bits;
          std::memcpy(&bits, &raw[i], 4);
          untouched &= bits == 0xFFFFFFFFu;
        }
      }
      INFO("heads " << c.heads << "/" << c.kv_heads << " hd " << c.hd << " n=" << c.n << " pos0=" << c.pos0
                    << " offset " << c.off << " pad " << c.pad << " decode kernel " << kernel_name(kernel));
      // Per head (as the op table's cases); heads of 1 or 2 elements per token row, where one output
      // can be near 0 by cancellation.
      CHECK(test::max_rel_error(got, ref, c.hd >= 8 ? c.hd : QD) <= kBlockTol);
      CHECK(untouched);
    }
  }
}

TEST_CASE(
    "CUDA exported attention for profilers: cuda_attention over f32, f16, bf16 and q8_0 caches, with and without "
    "room for split-K partials",
    "[gpu][kernels]") {
  Gpu& g = gpu();
  DevMem mem;
  ThreadPool pool(0);
  struct Case {
    int64_t heads, kv_heads, hd, n, pos0;
    uint64_t ws_bytes;
  };
  // Decode (split keys, and none), prefill, padded head_dims (80: 4-element pieces; 50: element by element;
  // 96: q8_0's padded one).
  const Case cases[] = {
      {8, 2, 128, 1, 3000, 16u << 20}, {8, 2, 128, 1, 3000, 0},         {4, 4, 80, 5, 700, 16u << 20},
      {6, 2, 48, 64, 400, 16u << 20},  {6, 2, 48, 64, 400, 0},          {4, 1, 64, 300, 0, 16u << 20},
      {2, 1, 50, 3, 200, 16u << 20},   {4, 2, 256, 20, 100, 16u << 20}, {6, 2, 96, 3, 500, 16u << 20}};
  uint8_t* ws = mem.alloc(16u << 20);
  for (DType kv : {DType::F32, DType::F16, DType::BF16, DType::Q8_0})
    for (const Case& c : cases) {
      if (c.hd % dtype_block_elems(kv) != 0) continue;  // q8_0: head_dims of whole blocks
      const int64_t kv_len = c.pos0 + c.n, QD = c.heads * c.hd, KVD = c.kv_heads * c.hd;
      const std::vector<float> q = fresh(static_cast<size_t>(c.n * QD), -2.0f, 2.0f);
      // The caches as the device holds them, and in k and v the values they hold (what the CPU attends
      // over for the reference).
      std::vector<float> k = fresh(static_cast<size_t>(kv_len * KVD), -2.0f, 2.0f);
      std::vector<float> v = fresh(static_cast<size_t>(kv_len * KVD));
      const std::vector<uint8_t> k_bits = test::kv_cache_of(kv, k, KVD, kv_len),
                                 v_bits = test::kv_cache_of(kv, v, KVD, kv_len);
      std::vector<int32_t> pos(static_cast<size_t>(c.n));
      for (int64_t t = 0; t < c.n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(c.pos0 + t);
      std::vector<float> ref(static_cast<size_t>(c.n * QD));
      shardwise::attention(q.data(), c.n, pos.data(), k.data(), v.data(), kv_len, {c.heads, c.kv_heads, c.hd},
                           ref.data(), pool);
      float* dq = mem.upload(q);
      const uint8_t* dk = mem.upload(k_bits.data(), k_bits.size());
      const uint8_t* dv = mem.upload(v_bits.data(), v_bits.size());
      float* dout = mem.floats(ref.size());
      poison(dout, ref.size());
      cuda_attention(dq, dk, dv, dout, c.n, c.pos0, c.heads, c.kv_heads, c.hd, c.ws_bytes ? ws : nullptr, c.ws_bytes,
                     g.stream, kv);
      INFO("cuda_attention " << dtype_name(kv) << " cache, heads " << c.heads << "/" << c.kv_heads << " hd " << c.hd
                             << " n=" << c.n << " pos0=" << c.pos0 << " workspace " << c.ws_bytes);
      CHECK(test::max_rel_error(get(dout, ref.size()), ref, c.hd) <= kBlockTol);
    }
  g.sync();
}

// The RoPE kernel stores the step's K and V rows in the cache's type as the host's quantize_row stores the
// same values (q8_0: a warp per block of 32, ggml's rounding): turned by 0 (cos 1, sin 0) with no norms or
// biases, the rows reach the cache unchanged, so the cache's bytes must be quantize_row's to the bit, and
// rows before the step untouched. head_dim 32 to 256 (one to eight blocks per head), a head of zeros
// (scale 0) and values at q8_0's rounding ties (a block whose largest is 127: scale 1, 2.5 -> 3).
TEST_CASE("CUDA RoPE stores K and V cache rows of f16, bf16 and q8_0 as the host's quantize_row does",
          "[gpu][kernels]") {
  Gpu& g = gpu();
  cuda::Ctx ctx;
  ctx.stream = g.stream;
  for (DType kv : {DType::F16, DType::BF16, DType::Q8_0})
    for (int hd : {32, 64, 128, 256}) {
      DevMem mem;
      const int heads = 4, kv_heads = 2, n = 5, pos0 = 3;
      const int64_t QD = heads * hd, KVD = kv_heads * hd, W = QD + 2 * KVD;
      std::vector<float> qkv = fresh(static_cast<size_t>(n * W), -3.0f, 3.0f);
      for (int64_t e = 0; e < hd; ++e) qkv[static_cast<size_t>(QD + e)] = 0.0f;  // token 0's first k head
      float* tie = &qkv[static_cast<size_t>(W + QD + KVD)];                      // token 1's first v block
      tie[0] = 127.0f;
      tie[1] = 2.5f;
      tie[2] = -2.5f;
      tie[3] = 0.5f;
      const std::vector<float> cos(static_cast<size_t>(n * hd / 2), 1.0f), sin(cos.size(), 0.0f);
      const uint64_t row = dtype_row_bytes(kv, KVD), bytes = static_cast<uint64_t>(pos0 + n) * row;
      const std::vector<uint8_t> before(bytes, 0x5a);
      uint8_t* kc = mem.upload(before.data(), before.size());
      uint8_t* vc = mem.upload(before.data(), before.size());
      cuda::QkRopeArgs r;
      r.qkv = mem.upload(qkv);
      r.stride = W;
      r.n = n;
      r.n_heads = heads;
      r.n_kv_heads = kv_heads;
      r.head_dim = hd;
      r.cos = mem.upload(cos);
      r.sin = mem.upload(sin);
      r.k_cache = kc;
      r.v_cache = vc;
      r.kv_dtype = kv;
      r.pos_first = pos0;
      cuda::qk_norm_rope(ctx, r);
      g.sync();
      std::vector<uint8_t> want = before, got_k(bytes), got_v(bytes);
      ck(cudaMemcpy(got_k.data(), kc, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
      ck(cudaMemcpy(got_v.data(), vc, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
      INFO(dtype_name(kv) << " head_dim " << hd);
      for (int t = 0; t < n; ++t)
        quantize_row(kv, &qkv[static_cast<size_t>(t * W + QD)], want.data() + (pos0 + t) * row, KVD);
      CHECK(got_k == want);
      for (int t = 0; t < n; ++t)
        quantize_row(kv, &qkv[static_cast<size_t>(t * W + QD + KVD)], want.data() + (pos0 + t) * row, KVD);
      CHECK(got_v == want);
    }
}

TEST_CASE("op table: rms_norm and swiglu cases on cuda_rms_norm and cuda_swiglu match the f64 reference and the CPU",
          "[gpu][kernels]") {
  Gpu& g = gpu();
  for (const OpCase& c : check_cases(OpId::RmsNorm)) {  // out of place and in place
    DevMem mem;
    const std::vector<float> x = fresh(static_cast<size_t>(c.rows * c.cols), -3.0f, 3.0f),
                             w = fresh(static_cast<size_t>(c.cols));
    const OpReference ref = reference_rms_norm(x.data(), w.data(), 1e-5f, c.rows, c.cols);
    std::vector<float> cpu(x.size());
    rms_norm(x.data(), w.data(), 1e-5f, cpu.data(), c.rows, c.cols);
    float* dx = mem.upload(x);
    float* dw = mem.upload(w);
    float* dy = mem.floats(x.size());
    poison(dy, x.size());
    cuda_rms_norm(dx, dw, 1e-5f, dy, c.rows, c.cols, g.stream);
    cuda_rms_norm(dx, dw, 1e-5f, dx, c.rows, c.cols, g.stream);
    for (const float* d : {dy, dx}) {
      const std::vector<float> got = get(d, x.size());
      const RefCheck rc = compare_to_reference(got.data(), ref, c.tol);
      INFO("cuda_rms_norm " << c.label() << (d == dx ? " in place: " : ": ") << describe(rc, got.data(), ref, c.tol));
      CHECK(rc.ok());
      CHECK(test::max_rel_error(got, cpu, c.cols) <= kBlockTol);
    }
  }
  for (const OpCase& c : check_cases(OpId::Swiglu)) {
    DevMem mem;
    std::vector<float> gate = fresh(static_cast<size_t>(c.rows * c.cols), -6.0f, 6.0f);
    const std::vector<float> up = fresh(static_cast<size_t>(c.rows * c.cols));
    const OpReference ref = reference_swiglu(gate.data(), up.data(), c.rows * c.cols);
    float* dg = mem.upload(gate);
    float* du = mem.upload(up);
    swiglu(gate.data(), up.data(), c.rows * c.cols);
    cuda_swiglu(dg, du, c.rows, c.cols, g.stream);
    const std::vector<float> got = get(dg, gate.size());
    const RefCheck rc = compare_to_reference(got.data(), ref, c.tol);
    INFO("cuda_swiglu " << c.label() << ": " << describe(rc, got.data(), ref, c.tol));
    CHECK(rc.ok());
    CHECK(test::max_rel_error(got, gate, c.cols) <= kBlockTol);
  }
  g.sync();
}

TEST_CASE("CUDA blocks report a workspace that is too small or a missing expert", "[gpu][kernels]") {
  DevMem mem;
  ThreadPool pool(1);
  const ModelSpec spec = spec_of(kModels[3], DType::F16);
  DevMem wmem;
  std::unique_ptr<LayerPair> lp = make_layer(wmem, spec, pool);
  Gpu& g = gpu();
  std::unique_ptr<DeviceKernels> k = make_cuda_kernels(spec, RopeStyle::Neox, g.stream, g.blas);
  uint8_t* ws = mem.alloc(1 << 20);
  float* x = mem.floats(static_cast<size_t>(4 * spec.hidden_size));
  put(x, fresh(static_cast<size_t>(4 * spec.hidden_size)));
  k->set_workspace(ws, 512);
  CHECK_THROWS_AS(k->prepare_step(0, 100), Error);  // the RoPE table alone does not fit
  k->set_workspace(ws, 4096);
  k->prepare_step(0, 4);
  CHECK_THROWS_AS(k->attention_pre(lp->dev, x, 4, x), Error);
  k->set_workspace(ws, 1 << 20);
  CHECK_THROWS_AS(k->attention_pre(lp->dev, x, 4, x), Error);  // set_workspace drops the step's table
  const std::vector<float> rl = fresh(static_cast<size_t>(4 * spec.num_experts), -3.0f, 3.0f);
  const MoeRouting routing = route_tokens(rl.data(), 4, spec.num_experts, spec.num_experts_per_tok, true);
  DevLayer missing = lp->dev;
  for (auto& p : missing.gate_exp) p = nullptr;
  CHECK_THROWS_AS(k->ffn(missing, x, 4, &routing), Error);
  g.sync();
}

TEST_CASE("CUDA kernel micro-benchmarks (printout, not a timed test)", "[gpu][bench]") {
  Gpu& g = gpu();
  DevMem mem;
  const uint64_t ws_bytes = 512ull << 20;
  uint8_t* ws = mem.alloc(ws_bytes);
  const double hbm_gbps = 4300.0;
  std::printf(
      "\n== CUDA kernel micro-benchmarks (roofline: ~%.0f GB/s HBM, cuBLAS f16 ~770 TFLOP/s, f32 FFMA ~60 TFLOP/s)\n",
      hbm_gbps);
  // The dense model the benchmarks time (op_table.h); its attention with one layer and a small vocabulary.
  const ModelSpec dense = perf_dense_model();
  // Decode GEMV: copies rotate so that the 60 MB L2 holds none of the next matrix.
  // Few-row matrices (4096 rows: o and down) also without the k-split ("no ks"), to see what it does.
  for (const char* role : {"gate_up", "down", "o"}) {
    const MatrixShape m = layer_matrix(dense, role);
    for (DType dt : weight_dtypes()) {
      const uint64_t bytes = dtype_row_bytes(dt, m.cols) * static_cast<uint64_t>(m.rows);
      const int copies = static_cast<int>(std::max<uint64_t>(2, (400ull << 20) / bytes));
      const std::vector<uint8_t> w = random_weights(dt, m.rows, m.cols, 0.1f);
      std::vector<DevMat> mats;
      for (int i = 0; i < copies; ++i) mats.push_back(DevMat{dt, m.rows, m.cols, mem.upload(w.data(), w.size())});
      // Check before timing.
      const std::vector<float> x = fresh(static_cast<size_t>(8 * m.cols));
      float* dx = mem.upload(x);
      float* dy = mem.floats(static_cast<size_t>(8 * m.rows));
      const OpReference ref = ref_matmul(dt, w, m.rows, m.cols, x, m.cols, 1, nullptr);
      cuda_matmul(mats[0], dx, m.cols, 1, dy, m.rows, false, ws, ws_bytes, g.stream, g.blas);
      CHECK(matmul_mismatch(get(dy, ref.y.size()), ref, tolerance(OpId::Matmul)) == "");
      for (cuda::GemvSplit split : {cuda::GemvSplit::Auto, cuda::GemvSplit::Never}) {
        const bool ks = split == cuda::GemvSplit::Auto;
        if (!ks && m.rows > 4096) continue;
        for (int64_t n : {1, 4, 8}) {
          int it = 0;
          const double ms = time_ms(
              [&] { gemv_launch(mats[static_cast<size_t>(it++ % copies)], dx, m.cols, n, dy, m.rows, false, split); },
              40);
          const double gbps = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
          std::printf("GEMV %-5s %6lld x %-6lld n=%lld%s: %8.1f us  %7.0f GB/s  (%4.1f%% of HBM)\n", dtype_name(dt),
                      static_cast<long long>(m.rows), static_cast<long long>(m.cols), static_cast<long long>(n),
                      ks ? "" : " no ks", ms * 1e3, gbps, 100.0 * gbps / hbm_gbps);
        }
      }
    }
  }
  // Prefill GEMM (exact paths), checked on every 512th row before it is timed.
  {
    const MatrixShape m = layer_matrix(dense, "gate_up");
    const int64_t rows = m.rows, cols = m.cols, n = kPrefillTokens;
    const std::vector<float> x = fresh(static_cast<size_t>(n * cols));
    float* dx = mem.upload(x);
    float* dy = mem.floats(static_cast<size_t>(n * rows));
    for (DType dt : weight_dtypes()) {
      const std::vector<uint8_t> w = random_weights(dt, rows, cols, 0.1f);
      DevMat dm{dt, rows, cols, mem.upload(w.data(), w.size())};
      cuda_matmul(dm, dx, cols, n, dy, rows, false, ws, ws_bytes, g.stream, g.blas);
      const std::vector<float> y = get(dy, static_cast<size_t>(n * rows));
      const uint64_t rb = dtype_row_bytes(dt, cols);
      for (int64_t r = 0; r < rows; r += 512) {
        const OpReference ref =
            reference_matmul(dt, w.data() + static_cast<uint64_t>(r) * rb, rb, 1, cols, x.data(), cols, n);
        std::vector<float> got(static_cast<size_t>(n));
        for (int64_t t = 0; t < n; ++t) got[static_cast<size_t>(t)] = y[static_cast<size_t>(t * rows + r)];
        const std::string bad = matmul_mismatch(got, ref, tolerance(OpId::Matmul));
        INFO("GEMM " << dtype_name(dt) << " row " << r << ": " << bad);
        CHECK(bad.empty());
      }
      const double ms =
          time_ms([&] { cuda_matmul(dm, dx, cols, n, dy, rows, false, ws, ws_bytes, g.stream, g.blas); }, 10);
      const double tflops = 2.0 * static_cast<double>(n * rows * cols) / (ms * 1e-3) / 1e12;
      std::printf("GEMM %-5s %lld x %lld x %lld tokens: %8.3f ms  %6.1f TFLOP/s\n", dtype_name(dt),
                  static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(n), ms, tflops);
    }
  }
  // Attention of the dense model (nemo8b: 32 heads, 8 kv heads, head_dim 128): decode at 4K context, prefill of 512.
  {
    ModelSpec spec = dense;
    spec.dtype = DType::F16;
    spec.num_hidden_layers = 1;
    spec.vocab_size = 1000;
    spec.max_position_embeddings = 8192;
    ThreadPool pool(16);
    DevMem wmem;
    std::unique_ptr<LayerPair> lp = make_layer(wmem, spec, pool);
    const int64_t H = spec.hidden_size, KVD = spec.kv_dim(), cap = 4608;
    float* kc = mem.floats(static_cast<size_t>(cap * KVD));
    float* vc = mem.floats(static_cast<size_t>(cap * KVD));
    const std::vector<float> hk = fresh(static_cast<size_t>(cap * KVD)), hv = fresh(static_cast<size_t>(cap * KVD));
    put(kc, hk);
    put(vc, hv);
    {
      KernelCtx kctx(ws, ws_bytes);
      const int heads = static_cast<int>(spec.num_attention_heads), kvh = static_cast<int>(spec.num_key_value_heads);
      const int hd = static_cast<int>(spec.head_dim);
      for (int64_t n : {int64_t(1), int64_t(8), int64_t(512), int64_t(4096)}) {
        const int64_t pos0 = 4096 - std::min<int64_t>(n, 4096);
        float* q = mem.floats(static_cast<size_t>(n * spec.q_dim()));
        float* out = mem.floats(static_cast<size_t>(n * spec.q_dim()));
        const std::vector<float> hq = fresh(static_cast<size_t>(n * spec.q_dim()));
        put(q, hq);
        const cuda::AttnArgs a = attn_args(q, kc, vc, out, n, pos0, heads, kvh, hd);
        cuda::attention(kctx.ctx, a);  // checked (the first and the last query) before it is timed
        const std::vector<float> got = get(out, hq.size());
        for (int64_t t : {int64_t(0), n - 1}) {
          const int32_t p = static_cast<int32_t>(pos0 + t);
          const OpReference ref =
              reference_attention(hq.data() + t * spec.q_dim(), 1, &p, hk.data(), hv.data(),
                                  {spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim});
          const RefCheck rc = compare_to_reference(got.data() + t * spec.q_dim(), ref, tolerance(OpId::Attention));
          INFO("attention kernel n=" << n << " query " << t << ": "
                                     << describe(rc, got.data() + t * spec.q_dim(), ref, tolerance(OpId::Attention)));
          CHECK(rc.ok());
        }
        const double ms = time_ms([&] { cuda::attention(kctx.ctx, a); }, 10);
        const double kv_bytes = 2.0 * static_cast<double>(pos0 + n) * static_cast<double>(KVD) * 4;
        double flops = 0;  // scores and weighted sum: 4 * head_dim per (query, visible key, head)
        for (int64_t t = 0; t < n; ++t) flops += 4.0 * hd * heads * static_cast<double>(pos0 + t + 1);
        std::printf("attention kernel n=%-4lld context %lld: %8.3f ms  %6.0f GB/s of KV  %5.1f TFLOP/s\n",
                    static_cast<long long>(n), static_cast<long long>(pos0 + n), ms, kv_bytes / (ms * 1e-3) / 1e9,
                    flops / (ms * 1e-3) / 1e12);
      }
      // Decode at the peer protocol's 1K and at 4K context by each kernel's keys per warp: fewer keys,
      // more warps against a longer combine (the warp kernel at 1K and 64 keys: 16 splits x 8 kv heads = 32
      // blocks of 4 warps on 132 SMs; the block kernel at 1K and 8 keys: 16 splits x 8 kv heads = 128
      // blocks of 8 warps).
      for (cuda::DecodeAttn kernel : kDecodeKernels)
        for (int64_t context : {int64_t(1024), int64_t(4096)})
          for (int32_t keys : {0, 16, 32, 64, 128}) {  // 0: the default (about sqrt(context))
            float* q = mem.floats(static_cast<size_t>(spec.q_dim()));
            float* out = mem.floats(static_cast<size_t>(spec.q_dim()));
            put(q, fresh(static_cast<size_t>(spec.q_dim())));
            cuda::AttnArgs a = attn_args(q, kc, vc, out, 1, context - 1, heads, kvh, hd);
            a.decode_min_keys = keys;
            a.decode_kernel = kernel;
            const double ms = time_ms([&] { cuda::attention(kctx.ctx, a); }, 20);
            std::printf("attention decode (%s) context %5lld, >= %3s keys per warp: %8.4f ms  %6.0f GB/s of KV\n",
                        kernel_name(kernel), static_cast<long long>(context),
                        keys == 0 ? "dft" : std::to_string(keys).c_str(), ms,
                        2.0 * static_cast<double>(context) * static_cast<double>(KVD) * 4 / (ms * 1e-3) / 1e9);
          }
      // 8 tokens (speculative-decoding-sized steps) at 4K context, each kernel.
      for (cuda::DecodeAttn kernel : kDecodeKernels) {
        float* q = mem.floats(static_cast<size_t>(8 * spec.q_dim()));
        float* out = mem.floats(static_cast<size_t>(8 * spec.q_dim()));
        put(q, fresh(static_cast<size_t>(8 * spec.q_dim())));
        cuda::AttnArgs a = attn_args(q, kc, vc, out, 8, 4088, heads, kvh, hd);
        a.decode_kernel = kernel;
        const double ms = time_ms([&] { cuda::attention(kctx.ctx, a); }, 20);
        std::printf("attention decode (%s) n=8 context 4096: %8.4f ms\n", kernel_name(kernel), ms);
      }
    }
    std::unique_ptr<DeviceKernels> k = make_cuda_kernels(spec, RopeStyle::Neox, g.stream, g.blas);
    for (int64_t n : {int64_t(1), int64_t(512)}) {
      const int64_t pos0 = 4096 - n;
      float* x = mem.floats(static_cast<size_t>(n * H));
      put(x, fresh(static_cast<size_t>(n * H), -0.1f, 0.1f));
      k->set_workspace(ws, ws_bytes);
      k->prepare_step(pos0, n);
      const double ms = time_ms([&] { k->attention(lp->dev, x, n, kc, vc); }, 10);
      const double kv_gb = 2.0 * static_cast<double>(4096 * KVD) * 4 / 1e9;
      std::printf(
          "attention block (norm, qkv, rope, attention, o) n=%lld at context 4096: %8.3f ms  (KV read %.0f MB)\n",
          static_cast<long long>(n), ms, kv_gb * 1e3);
      k->prepare_step(pos0, n);
      const double fms = time_ms([&] { k->ffn(lp->dev, x, n, nullptr); }, 10);
      std::printf("FFN block n=%lld: %8.3f ms\n", static_cast<long long>(n), fms);
    }
  }
  std::fflush(stdout);
}

// ---- vision kernels (executor/device/vision_kernels.h, vision.cu) -----------------------------------
// Each operation against a double-precision loop over the same inputs (the CPU vision kernels live
// elsewhere). Bounds are relative to the terms' magnitudes, tight enough that a row, key or segment off by
// one fails.
namespace {

// The vision kernels on the suite's stream with a workspace region of their own.
struct VisionRig {
  DevMem mem;
  std::unique_ptr<VisionKernels> k;
  explicit VisionRig(uint64_t ws_bytes = 64ull << 20) : k(make_cuda_vision_kernels(gpu().stream, gpu().blas)) {
    k->set_workspace(mem.alloc(ws_bytes), ws_bytes);
  }
};

double weight_value(DType dt, const std::vector<uint8_t>& w, size_t i) {
  if (dt == DType::F32) {
    float f;
    std::memcpy(&f, w.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, w.data() + 2 * i, 2);
  return dt == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

// y (n rows ldy apart, as read back) against y0 (+)= W x + bias in f64: "" or the worst element. Each output
// within 1e-5 of the sum of its terms' magnitudes; the padding between rows (r >= rows) unchanged.
std::string linear_mismatch(const std::vector<float>& got, const std::vector<double>& w, int64_t rows, int64_t cols,
                            const std::vector<float>& x, int64_t ldx, int64_t n, const std::vector<float>& y0,
                            int64_t ldy, const float* bias, bool accumulate) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < ldy; ++r) {
      const size_t at = static_cast<size_t>(t * ldy + r);
      if (r >= rows) {
        if (std::memcmp(&got[at], &y0[at], 4) != 0) return "padding of row " + std::to_string(t) + " was written";
        continue;
      }
      double sum = 0, mag = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double term = w[static_cast<size_t>(r * cols + c)] * x[static_cast<size_t>(t * ldx + c)];
        sum += term;
        mag += std::fabs(term);
      }
      if (bias) sum += bias[r], mag += std::fabs(bias[r]);
      if (accumulate) sum += y0[at], mag += std::fabs(y0[at]);
      if (!(std::fabs(got[at] - sum) <= 1e-5 * mag + 1e-30))
        return "y[" + std::to_string(t) + ", " + std::to_string(r) + "] = " + std::to_string(got[at]) + ", expected " +
               std::to_string(sum);
    }
  return "";
}

// The f64 attention of every row of the segments of cu (fused qkv rows of 3 * heads * hd), out [rows, heads * hd].
std::vector<double> vision_attention_ref(const std::vector<float>& qkv, const std::vector<int32_t>& cu, int64_t heads,
                                         int64_t hd) {
  const int64_t ld = 3 * heads * hd, width = heads * hd;
  const std::vector<double> in(qkv.begin(), qkv.end());
  std::vector<double> out(static_cast<size_t>(cu.back() * width), 0.0);
  varlen_attention_reference(in.data(), in.data() + width, in.data() + 2 * width, ld, out.data(), width,
                             std::vector<int64_t>(cu.begin(), cu.end()), heads, hd);
  return out;
}

struct VisionAttnLayout {
  const char* name;
  std::vector<int32_t> cu;
};

std::vector<VisionAttnLayout> vision_attn_layouts() {
  std::vector<VisionAttnLayout> l;
  // Segments of 0, 5, 64, 0, 131 (three query and key tiles, the last of 3 rows), 1, 64 and 129 rows.
  l.push_back({"uneven segments with empty ones", {0, 0, 5, 69, 69, 200, 201, 265, 394}});
  std::vector<int32_t> windows;  // the windowed layers: many 64-row windows
  for (int32_t s = 0; s <= 48 * 64; s += 64) windows.push_back(s);
  l.push_back({"48 windows of 64 rows", windows});
  l.push_back({"one segment of 1100 rows", {0, 1100}});
  l.push_back({"a leading empty segment, then 65 and 63 rows", {0, 0, 65, 128}});
  return l;
}

}  // namespace

TEST_CASE("CUDA vision linear matches f64 (f32/f16/bf16 weights, bias, accumulate, strided rows, GEMV and GEMM)",
          "[gpu][vision]") {
  VisionRig rig;
  const int64_t rows = 72, cols = 136;
  const std::vector<float> bias = fresh(static_cast<size_t>(rows));
  const float* dbias = rig.mem.upload(bias);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const std::vector<uint8_t> w = random_weights(dt, rows, cols, 0.5f);
    const DevMat dm{dt, rows, cols, rig.mem.upload(w.data(), w.size())};
    std::vector<double> wd(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < wd.size(); ++i) wd[i] = weight_value(dt, w, i);
    for (int64_t n : {1, 5, 37, 300})
      for (bool strided : {false, true})
        for (bool with_bias : {false, true})
          for (bool accumulate : {false, true}) {
            const int64_t ldx = strided ? cols + 3 : cols, ldy = strided ? rows + 5 : rows;
            DevMem act;
            const std::vector<float> x = fresh(static_cast<size_t>(n * ldx)), y0 = fresh(static_cast<size_t>(n * ldy));
            const float* dx = act.upload(x);
            float* dy = act.upload(y0);
            rig.k->linear(dm, with_bias ? dbias : nullptr, dx, ldx, n, dy, ldy, accumulate);
            const std::string bad = linear_mismatch(get(dy, y0.size()), wd, rows, cols, x, ldx, n, y0, ldy,
                                                    with_bias ? bias.data() : nullptr, accumulate);
            INFO(dtype_name(dt) << " n=" << n << (strided ? " strided" : "") << (with_bias ? " bias" : "")
                                << (accumulate ? " accumulate" : "") << ": " << bad);
            CHECK(bad.empty());
          }
  }
}

TEST_CASE("CUDA vision rms_norm matches f64, out of place and in place", "[gpu][vision]") {
  VisionRig rig;
  for (int64_t dim : {1280, 36, 3}) {
    const int64_t n = 37;
    const std::vector<float> x = fresh(static_cast<size_t>(n * dim), -3.0f, 3.0f), w = fresh(static_cast<size_t>(dim));
    DevMem mem;
    float* dx = mem.upload(x);
    const float* dw = mem.upload(w);
    float* dy = mem.floats(x.size());
    poison(dy, x.size());
    rig.k->rms_norm(dx, dw, 1e-6f, dy, n, dim);
    rig.k->rms_norm(dx, dw, 1e-6f, dx, n, dim);
    for (const float* d : {static_cast<const float*>(dy), static_cast<const float*>(dx)}) {
      const std::vector<float> got = get(d, x.size());
      double worst = 0;
      for (int64_t t = 0; t < n; ++t) {
        double ss = 0;
        for (int64_t c = 0; c < dim; ++c)
          ss += static_cast<double>(x[static_cast<size_t>(t * dim + c)]) * x[t * dim + c];
        const double scale = 1.0 / std::sqrt(ss / static_cast<double>(dim) + 1e-6);
        for (int64_t c = 0; c < dim; ++c) {
          const size_t i = static_cast<size_t>(t * dim + c);
          const double ref = x[i] * scale * w[static_cast<size_t>(c)];
          worst = std::max(worst, std::fabs(got[i] - ref) / (std::fabs(x[i] * scale) + 1e-30));
          if (std::isnan(got[i])) worst = INFINITY;
        }
      }
      INFO("dim " << dim << (d == dx ? " in place" : ""));
      CHECK(worst <= 1e-5);
    }
  }
}

TEST_CASE("CUDA vision rotary matches f64 on the q and k heads and leaves v alone", "[gpu][vision]") {
  VisionRig rig;
  for (int64_t hd : {16, 80}) {
    const int64_t n = 50, heads = 3, half = hd / 2, ld = 3 * heads * hd;
    const std::vector<float> qkv = fresh(static_cast<size_t>(n * ld), -2.0f, 2.0f);
    const std::vector<float> angle = fresh(static_cast<size_t>(n * half), -40.0f, 40.0f);
    std::vector<float> cs(angle.size()), sn(angle.size());
    for (size_t i = 0; i < angle.size(); ++i) {
      cs[i] = std::cos(angle[i]);
      sn[i] = std::sin(angle[i]);
    }
    DevMem mem;
    float* d = mem.upload(qkv);
    rig.k->rotary(d, mem.upload(cs), mem.upload(sn), n, heads, hd);
    const std::vector<float> got = get(d, qkv.size());
    double worst = 0;
    bool v_kept = true;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t hh = 0; hh < 3 * heads; ++hh)
        for (int64_t p = 0; p < half; ++p) {
          const size_t i0 = static_cast<size_t>(t * ld + hh * hd + p), i1 = i0 + static_cast<size_t>(half);
          if (hh >= 2 * heads) {  // v
            v_kept = v_kept && std::memcmp(&got[i0], &qkv[i0], 4) == 0 && std::memcmp(&got[i1], &qkv[i1], 4) == 0;
            continue;
          }
          const double c = cs[static_cast<size_t>(t * half + p)], s = sn[static_cast<size_t>(t * half + p)];
          const double x0 = qkv[i0], x1 = qkv[i1];
          const double mag = std::fabs(x0) + std::fabs(x1);
          worst = std::max(
              {worst, std::fabs(got[i0] - (x0 * c - x1 * s)) / mag, std::fabs(got[i1] - (x1 * c + x0 * s)) / mag});
          if (std::isnan(got[i0]) || std::isnan(got[i1])) worst = INFINITY;
        }
    INFO("head_dim " << hd);
    CHECK(worst <= 1e-6);
    CHECK(v_kept);
  }
}

TEST_CASE("CUDA vision activations match f64 (each act, with and without up)", "[gpu][vision]") {
  VisionRig rig;
  const int64_t count = 10007;
  for (VisionAct act : {VisionAct::Silu, VisionAct::Gelu, VisionAct::GeluTanh, VisionAct::QuickGelu})
    for (bool with_up : {false, true}) {
      const std::vector<float> gate = fresh(static_cast<size_t>(count), -6.0f, 6.0f),
                               up = fresh(static_cast<size_t>(count), -2.0f, 2.0f);
      DevMem mem;
      float* dg = mem.upload(gate);
      rig.k->activation(act, dg, with_up ? mem.upload(up) : nullptr, count);
      const std::vector<float> got = get(dg, gate.size());
      double worst = 0;
      for (size_t i = 0; i < gate.size(); ++i) {
        const double u = with_up ? up[i] : 1.0;
        const double ref = vision_activation_reference(act, gate[i]) * u;
        worst = std::max(worst, std::fabs(got[i] - ref) / ((1.0 + std::fabs(gate[i])) * std::fabs(u) + 1e-30));
        if (std::isnan(got[i])) worst = INFINITY;
      }
      INFO("act " << static_cast<int>(act) << (with_up ? " with up" : ""));
      CHECK(worst <= 4e-6);
    }
}

TEST_CASE("CUDA vision permute_rows gathers and scatters by an int32 permutation", "[gpu][vision]") {
  VisionRig rig;
  const int64_t rows = 1000;
  std::vector<int32_t> perm(static_cast<size_t>(rows));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i);
  std::mt19937 rng(7);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t width : {300, 37})
    for (bool scatter : {false, true}) {
      const std::vector<float> src = fresh(static_cast<size_t>(rows * width));
      DevMem mem;
      const float* ds = mem.upload(src);
      const int32_t* di = mem.upload(perm.data(), perm.size());
      float* dd = mem.floats(src.size());
      poison(dd, src.size());
      rig.k->permute_rows(ds, di, dd, rows, width, scatter);
      const std::vector<float> got = get(dd, src.size());
      bool same = true;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t j = perm[static_cast<size_t>(i)];
        const int64_t from = scatter ? i : j, to = scatter ? j : i;
        same = same && std::memcmp(&got[static_cast<size_t>(to * width)], &src[static_cast<size_t>(from * width)],
                                   static_cast<size_t>(width) * 4) == 0;
      }
      INFO("width " << width << (scatter ? " scatter" : " gather"));
      CHECK(same);
    }
}

TEST_CASE("CUDA vision attention matches f64 over segment layouts (head_dim 16, 80, 128; empty, windowed, long)",
          "[gpu][vision]") {
  VisionRig rig;
  const int64_t heads = 3, extra_rows = 7;  // rows past the last offset: inputs that must not count, outputs kept
  for (int64_t hd : {16, 80, 128})
    for (const VisionAttnLayout& layout : vision_attn_layouts())
      for (int misalign : {0, 1}) {
        if (misalign && hd != 80) continue;  // qkv off 16-byte alignment: the scalar loads, once
        const std::vector<int32_t>& cu = layout.cu;
        const int64_t n = cu.back() + extra_rows, ld = 3 * heads * hd, width = heads * hd;
        int64_t max_len = 0;
        for (size_t s = 0; s + 1 < cu.size(); ++s) max_len = std::max<int64_t>(max_len, cu[s + 1] - cu[s]);
        const std::vector<float> qkv = fresh(static_cast<size_t>(n * ld), -2.0f, 2.0f);
        DevMem mem;
        float* dqkv = mem.floats(qkv.size() + 1) + misalign;
        put(dqkv, qkv);
        const int32_t* dcu = mem.upload(cu.data(), cu.size());
        float* dout = mem.floats(static_cast<size_t>(n * width));
        poison(dout, static_cast<size_t>(n * width));
        rig.k->attention(dqkv, dout, dcu, static_cast<int64_t>(cu.size()) - 1, max_len, heads, hd);
        const std::vector<float> got = get(dout, static_cast<size_t>(n * width));
        const std::vector<double> ref = vision_attention_ref(qkv, cu, heads, hd);
        double worst = 0, scale = 0;
        for (float v : qkv) scale = std::max(scale, static_cast<double>(std::fabs(v)));  // |out| <= max |v|
        for (size_t i = 0; i < ref.size(); ++i) {
          worst = std::max(worst, std::fabs(got[i] - ref[i]));
          if (std::isnan(got[i])) worst = INFINITY;
        }
        bool past_end_kept = true;
        for (size_t i = ref.size(); i < got.size(); ++i) past_end_kept = past_end_kept && std::isnan(got[i]);
        INFO(layout.name << ", head_dim " << hd << (misalign ? ", qkv not 16-byte aligned" : "") << ": max |error| "
                         << worst << " of scale " << scale);
        CHECK(worst <= 2e-5 * scale);
        CHECK(past_end_kept);
      }
}

TEST_CASE("CUDA vision kernels refuse bad arguments", "[gpu][vision]") {
  VisionRig rig;
  float* buf = rig.mem.floats(4096);
  const int32_t* cu = rig.mem.upload(std::vector<int32_t>{0, 4}.data(), 2);
  CHECK_THROWS_AS(rig.k->attention(buf, buf + 2048, cu, 1, 4, 1, 6), Error);    // not a multiple of 4
  CHECK_THROWS_AS(rig.k->attention(buf, buf + 2048, cu, 1, 4, 1, 132), Error);  // above kVisionMaxHeadDim
  CHECK_THROWS_AS(rig.k->attention(buf, buf + 2048, cu, -1, 4, 1, 16), Error);
  CHECK_THROWS_AS(rig.k->attention(buf, buf + 2048, cu, 1, -4, 1, 16), Error);
  CHECK_THROWS_AS(rig.k->attention(buf, buf + 2048, cu, 1, 4, 0, 16), Error);
  CHECK_THROWS_AS(rig.k->rotary(buf, buf, buf, 4, 1, 7), Error);
  CHECK_THROWS_AS(rig.k->rotary(buf, buf, buf, -1, 1, 8), Error);
  CHECK_THROWS_AS(rig.k->activation(VisionAct::Gelu, buf, nullptr, -1), Error);
  CHECK_THROWS_AS(rig.k->permute_rows(buf, cu, buf, 2, 4, false), Error);  // in place
  CHECK_THROWS_AS(rig.k->permute_rows(buf, cu, buf + 8, -2, 4, false), Error);
  const DevMat q8{DType::Q8_0, 4, 32, reinterpret_cast<const uint8_t*>(buf)};
  CHECK_THROWS_AS(rig.k->linear(q8, nullptr, buf, 32, 1, buf + 1024, 4, false), Error);
  const DevMat f32{DType::F32, 4, 32, reinterpret_cast<const uint8_t*>(buf)};
  CHECK_THROWS_AS(rig.k->linear(f32, nullptr, buf, 16, 1, buf + 1024, 4, false), Error);  // ldx < cols
  std::unique_ptr<VisionKernels> fresh_k = make_cuda_vision_kernels(gpu().stream, gpu().blas);
  CHECK_THROWS_AS(fresh_k->linear(f32, nullptr, buf, 32, 1, buf + 1024, 4, false), Error);  // no workspace yet
  gpu().sync();
}

TEST_CASE("CUDA vision warm-up runs every kernel for head_dims 16, 80 and 128 and reports a bad head_dim",
          "[gpu][vision]") {
  std::unique_ptr<VisionKernels> k = make_cuda_vision_kernels(gpu().stream, gpu().blas);
  for (int64_t hd : {16, 80, 128}) {
    INFO("head_dim " << hd);
    CHECK(cuda_vision_warm_up(*k, hd) == "");
  }
  CHECK(cuda_vision_warm_up(*k, 6) != "");
  // It leaves the kernels without a workspace; with one again they work.
  DevMem mem;
  k->set_workspace(mem.alloc(1 << 20), 1 << 20);
  const std::vector<float> x = fresh(64);
  float* dx = mem.upload(x);
  k->activation(VisionAct::Silu, dx, nullptr, 64);
  const std::vector<float> got = get(dx, 64);
  CHECK(std::fabs(got[5] - vision_activation_reference(VisionAct::Silu, x[5])) <= 1e-6);
}

TEST_CASE("CUDA vision attention throughput at Qwen2.5-VL-7B's shapes (printout, not a timed test)",
          "[gpu][bench][vision]") {
  // 16 heads of 80: a full-attention layer at a 1440p image (one segment of 18,998 rows) and a windowed one
  // (297 windows of 64 rows); inputs are random, outputs unchecked (the tests above check the kernel).
  VisionRig rig;
  const int64_t heads = 16, hd = 80, rows = 297 * 64 - 10;
  DevMem mem;
  float* qkv = mem.floats(static_cast<size_t>(rows * 3 * heads * hd));
  put(qkv, fresh(static_cast<size_t>(rows * 3 * heads * hd)));
  float* out = mem.floats(static_cast<size_t>(rows * heads * hd));
  std::vector<int32_t> windows;
  for (int64_t s = 0; s < rows; s += 64) windows.push_back(static_cast<int32_t>(s));
  windows.push_back(static_cast<int32_t>(rows));
  const std::vector<int32_t> full = {0, static_cast<int32_t>(rows)};
  const int32_t* dfull = mem.upload(full.data(), full.size());
  const int32_t* dwin = mem.upload(windows.data(), windows.size());
  const double full_ms = time_ms([&] { rig.k->attention(qkv, out, dfull, 1, rows, heads, hd); }, 3);
  const double win_ms =
      time_ms([&] { rig.k->attention(qkv, out, dwin, static_cast<int64_t>(windows.size()) - 1, 64, heads, hd); }, 20);
  const double full_flop = 4.0 * static_cast<double>(rows) * static_cast<double>(rows) * heads * hd;
  const double win_flop = 4.0 * static_cast<double>(rows) * 64.0 * heads * hd;
  std::printf("vision attention, 16 heads x 80, one segment of %lld rows: %8.2f ms (%.1f TFLOP/s)\n",
              static_cast<long long>(rows), full_ms, full_flop / full_ms / 1e9);
  std::printf("vision attention, 16 heads x 80, %lld windows of 64 rows: %8.3f ms (%.1f TFLOP/s)\n",
              static_cast<long long>(windows.size() - 1), win_ms, win_flop / win_ms / 1e9);
  std::fflush(stdout);
}
