// microbench/gpu_bench.cpp — GpuBench over CUDA (see gpu_bench.h). Built only with CUDA.
#include "microbench/gpu_bench.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/host_buffer.h"
#include "core/thread_pool.h"
#include "executor/cuda/cuda_kernels.h"
#include "executor/device/device.h"
#include "executor/device/vision_kernels.h"
#include "executor/model/moe_routing.h"
#include "microbench/bench_data.h"

namespace shardwise {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("profile (GPU): ", what, ": ", cudaGetErrorString(e));
}

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

class CudaBench final : public GpuBench {
 public:
  explicit CudaBench(uint64_t set_bytes) : set_bytes_(set_bytes) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) fail("profile: no CUDA device (use --device cpu)");
    ck(cudaSetDevice(0), "cudaSetDevice");
    cudaDeviceProp p{};
    ck(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
    name_ = p.name;
    vram_ = p.totalGlobalMem;
    ck(cudaDriverGetVersion(&driver_), "cudaDriverGetVersion");
    ck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS) fail("profile: cublasCreate failed");
    ck(cudaEventCreate(&e0_), "cudaEventCreate");
    ck(cudaEventCreate(&e1_), "cudaEventCreate");
    ck(cudaMalloc(&set_, set_bytes_), "cudaMalloc weight set");
    ws_bytes_ = 512ull << 20;
    ck(cudaMalloc(&ws_, ws_bytes_), "cudaMalloc workspace");
  }
  ~CudaBench() override {
    if (traffic_.joinable()) stop_copy_traffic();
    cudaDeviceSynchronize();
    // Whatever uses the stream and the cuBLAS handle goes first: the MoE blocks synchronise their
    // stream when destroyed (a destroyed stream there ended a validation run with SIGSEGV).
    kernels_.reset();
    vision_.reset();
    if (vision_blas_) cublasDestroy(vision_blas_);
    dev_.reset();
    for (cudaStream_t s : tr_s_)
      if (s) cudaStreamDestroy(s);
    for (void* p :
         {static_cast<void*>(set_), static_cast<void*>(ws_), static_cast<void*>(vision_ws_), static_cast<void*>(act_),
          static_cast<void*>(moe_), static_cast<void*>(kv_), static_cast<void*>(tr_dev_)})
      if (p) cudaFree(p);
    if (tr_host_) cudaFreeHost(tr_host_);
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }
  int driver_version() const override { return driver_; }
  uint64_t vram_bytes() const override { return vram_; }

  // A short kernel is timed as a burst of back-to-back launches between two events, as a step's
  // kernels follow each other on its stream (matmuls on rotated weights, attention on rotated caches):
  // one launch between two events also timed the idle stream's start-up, a few µs — the 8-10 small
  // kernels of qwen30b's attention block, timed one by one, predicted 137 µs for a block that ran in
  // 76 µs. The burst size comes from the op's previous sample (the first runs alone); the MoE block
  // (host-routed, uploads its routing) runs alone.
  double time_op(const Op& op) override {
    const std::string key = op_shape_key(op);
    const auto prev = last_ms_.find(key);
    reps_ = 1;
    if (op.kind != OpKind::MoeExperts && prev != last_ms_.end() && prev->second > 0)
      reps_ = static_cast<int>(std::min<double>(kMaxBurst, std::max(1.0, std::ceil(kBurstMs / prev->second))));
    double ms = 0;
    switch (op.kind) {
      case OpKind::Matmul:
        ms = matmul(op);
        break;
      case OpKind::Attention:
        ms = attention(op);
        break;
      case OpKind::VisionAttention:
        ms = vision_attention(op);
        break;
      case OpKind::MoeExperts:
        ms = moe(op);
        break;
      case OpKind::Norm:
        ms = norm(op);
        break;
      case OpKind::Elementwise:
        ms = elementwise(op);
        break;
      default:
        fail("profile: no GPU runner for ", op_kind_name(op.kind));
    }
    last_ms_[key] = ms;
    return ms;
  }

  double sync_ms() override {
    ck(cudaStreamSynchronize(stream_), "sync");
    const auto t0 = Clock::now();
    ck(cudaStreamSynchronize(stream_), "sync");
    return ms_since(t0);
  }

  double launch_ms() override {
    float* x = activations(2 * 4096);
    ck(cudaStreamSynchronize(stream_), "sync");
    const int n = 20;
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) cuda_swiglu(x, x + 4096, 1, 32, stream_);
    ck(cudaStreamSynchronize(stream_), "sync");
    return ms_since(t0) / n;
  }

  double time_copy(Direction dir, bool pinned, uint64_t bytes, double cap) override {
    ensure_copy_device(bytes);
    dev_->set_pcie_cap(cap);
    void* host = pinned ? pinned_.data() : pageable_.data();
    const auto t0 = Clock::now();
    if (dir == Direction::HostToDevice)
      dev_->copy_h2d(arena_, host, bytes);
    else
      dev_->copy_d2h(host, arena_, bytes);
    dev_->synchronize();
    return ms_since(t0);
  }

  double time_copy_burst(Direction dir, uint64_t bytes, int count) override {
    ensure_copy_device(bytes * static_cast<uint64_t>(count));
    dev_->set_pcie_cap(0);
    uint8_t* host = static_cast<uint8_t*>(pinned_.data());
    uint8_t* dev = static_cast<uint8_t*>(arena_);
    const auto t0 = Clock::now();
    for (int i = 0; i < count; ++i) {
      const uint64_t off = static_cast<uint64_t>(i) * bytes;
      if (dir == Direction::HostToDevice)
        dev_->copy_h2d(dev + off, host + off, bytes);
      else
        dev_->copy_d2h(host + off, dev + off, bytes);
    }
    dev_->synchronize();
    return ms_since(t0) / count;
  }

  double copy_issue_ms(double cap, int count) override {
    const uint64_t bytes = 1ull << 20;
    ensure_copy_device(bytes * static_cast<uint64_t>(count));
    dev_->set_pcie_cap(cap);
    dev_->synchronize();
    uint8_t* host = static_cast<uint8_t*>(pinned_.data());
    uint8_t* dev = static_cast<uint8_t*>(arena_);
    std::vector<Device::HostCopy> copies(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) {
      const uint64_t off = static_cast<uint64_t>(i) * bytes;
      copies[static_cast<size_t>(i)] = {dev + off, host + off, bytes};
    }
    const auto t0 = Clock::now();
    dev_->copy_h2d_batch(copies.data(), copies.size());  // as the runtime issues a layer's experts
    const double ms = ms_since(t0) / count;
    dev_->synchronize();
    dev_->set_pcie_cap(0);
    return ms;
  }

  void start_copy_traffic() override {
    if (traffic_.joinable()) fail("profile: copy traffic already running");
    const uint64_t chunk = 256ull << 20;
    if (!tr_host_) {
      ck(cudaHostAlloc(&tr_host_, 2 * chunk, cudaHostAllocDefault), "cudaHostAlloc (copy traffic)");
      std::memset(tr_host_, 1, 2 * chunk);
      ck(cudaMalloc(&tr_dev_, 2 * chunk), "cudaMalloc (copy traffic)");
      ck(cudaStreamCreateWithFlags(&tr_s_[0], cudaStreamNonBlocking), "cudaStreamCreate");
      ck(cudaStreamCreateWithFlags(&tr_s_[1], cudaStreamNonBlocking), "cudaStreamCreate");
    }
    stop_.store(false);
    moved_ = 0;
    // The thread driving the copies sleeps while they run (blocking-sync events): a thread spinning
    // in cudaStreamSynchronize took one of the cores the measured pool needs, so a 16-thread op had a
    // time-shared straggler (16-thread rows under traffic up to 2.8x their alone time, 0.4 ms even for
    // 1 MB of weights), where the executor's own host thread computes while its copies run.
    traffic_ = std::thread([this, chunk] {
      ck(cudaSetDevice(0), "cudaSetDevice");
      cudaEvent_t done[2];
      for (auto& e : done)
        ck(cudaEventCreateWithFlags(&e, cudaEventBlockingSync | cudaEventDisableTiming), "cudaEventCreate");
      const auto t0 = Clock::now();
      uint64_t moved = 0;
      // Host to device only, two streams back to back: what the executor's weight streaming does. (A D2H
      // copy writes host DRAM where the streaming reads it: traffic both ways let the CPU read 98 GB/s beside
      // 87 GB/s of copies, a DRAM total the one-way streaming never reaches, and CPU FFNs planned from such a
      // profile ran 1.25x their prediction.)
      while (!stop_.load()) {
        cudaMemcpyAsync(tr_dev_, tr_host_, chunk, cudaMemcpyHostToDevice, tr_s_[0]);
        cudaMemcpyAsync(static_cast<uint8_t*>(tr_dev_) + chunk, static_cast<uint8_t*>(tr_host_) + chunk, chunk,
                        cudaMemcpyHostToDevice, tr_s_[1]);
        cudaEventRecord(done[0], tr_s_[0]);
        cudaEventRecord(done[1], tr_s_[1]);
        cudaEventSynchronize(done[0]);
        cudaEventSynchronize(done[1]);
        moved += 2 * chunk;
      }
      traffic_ms_ = ms_since(t0);
      moved_ = moved;
      for (auto& e : done) cudaEventDestroy(e);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the engines are busy before timing starts
  }

  double stop_copy_traffic() override {
    if (!traffic_.joinable()) return 0;
    stop_.store(true);
    traffic_.join();
    return traffic_ms_ > 0 ? static_cast<double>(moved_) / (traffic_ms_ * 1e6) : 0;
  }

 private:
  static constexpr double kBurstMs = 0.25;  // a short kernel's burst lasts about this long
  static constexpr int kMaxBurst = 32;

  // Milliseconds per launch of a burst of reps_ launches of f between two events.
  template <class F>
  double timed(F&& f) {
    ck(cudaEventRecord(e0_, stream_), "cudaEventRecord");
    for (int r = 0; r < reps_; ++r) f();
    ck(cudaEventRecord(e1_, stream_), "cudaEventRecord");
    ck(cudaEventSynchronize(e1_), "cudaEventSynchronize");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, e0_, e1_), "cudaEventElapsedTime");
    return ms / reps_;
  }

  void use(DType dt) {
    if (filled_ == static_cast<int>(dt)) return;
    const std::vector<uint8_t> pat = random_pattern(dt, 2000 + static_cast<uint64_t>(dt));
    // Pattern once, then doubling device-to-device copies.
    const uint64_t pb = std::min<uint64_t>(pat.size(), set_bytes_);
    ck(cudaMemcpy(set_, pat.data(), pb, cudaMemcpyHostToDevice), "fill weight set");
    uint64_t have = pb;
    while (have < set_bytes_) {
      const uint64_t n = std::min(have, set_bytes_ - have) / pb * pb;
      if (n == 0) break;
      ck(cudaMemcpy(set_ + have, set_, n, cudaMemcpyDeviceToDevice), "fill weight set");
      have += n;
    }
    filled_ = static_cast<int>(dt);
  }

  const uint8_t* next(uint64_t bytes) {
    const uint64_t copies = std::max<uint64_t>(1, set_bytes_ / bytes);
    return set_ + (turn_++ % copies) * bytes;
  }

  float* activations(uint64_t floats) {
    if (floats > act_floats_) {
      if (act_) cudaFree(act_);
      ck(cudaMalloc(&act_, floats * sizeof(float)), "cudaMalloc activations");
      std::vector<float> h(floats);
      for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
      ck(cudaMemcpy(act_, h.data(), floats * sizeof(float), cudaMemcpyHostToDevice), "activations");
      act_floats_ = floats;
    }
    return act_;
  }

  double matmul(const Op& op) {
    use(op.dtype);
    const uint64_t wb = static_cast<uint64_t>(op.rows) * dtype_row_bytes(op.dtype, op.cols);
    SW_CHECK(wb <= set_bytes_, "profile: matrix larger than the GPU weight set");
    float* x = activations(static_cast<uint64_t>(op.tokens) * static_cast<uint64_t>(op.cols + op.rows));
    float* y = x + op.tokens * op.cols;
    return timed([&] {
      const DevMat w{op.dtype, op.rows, op.cols, next(wb)};  // rotated: a burst reads its weights from HBM
      cuda_matmul(w, x, op.cols, op.tokens, y, op.rows, false, ws_, ws_bytes_, stream_, blas_);
    });
  }

  double attention(const Op& op) {
    const uint64_t kvd = static_cast<uint64_t>(op.n_kv_heads * op.head_dim),
                   qd = static_cast<uint64_t>(op.n_heads * op.head_dim);
    const uint64_t rows = static_cast<uint64_t>(op.ctx + op.tokens);
    // A step's layers each read their own cache, with weights between: rotate over K/V pairs that
    // together exceed the L2 several times (one pair reused stayed in the L2 up to a few K positions).
    // K and V of op.dtype (f32, f16 or q8_0); the buffer counts floats, a pair of f16 caches takes half as many.
    const uint64_t cache_bytes = dtype_row_bytes(op.dtype, static_cast<int64_t>(rows * kvd));
    const uint64_t pair = (2 * cache_bytes + 3) / 4;
    const uint64_t pairs =
        std::min<uint64_t>(64, std::max<uint64_t>(1, ((256ull << 20) / sizeof(float) + pair - 1) / pair));
    if (pairs * pair > kv_floats_) {
      if (kv_) cudaFree(kv_);
      kv_floats_ = pairs * pair;
      ck(cudaMalloc(&kv_, kv_floats_ * sizeof(float)), "cudaMalloc KV");
      // 0x3c bytes: 0.0115 as f32, 1.06 as f16, q8_0 blocks of 60 x 1.06: finite and non-zero every way
      ck(cudaMemset(kv_, 0x3c, kv_floats_ * sizeof(float)), "KV fill");
    }
    float* q = activations(2 * static_cast<uint64_t>(op.tokens) * qd);
    float* out = q + op.tokens * qd;
    return timed([&] {
      const uint8_t* k = reinterpret_cast<const uint8_t*>(kv_ + (kv_turn_++ % pairs) * pair);
      cuda_attention(q, k, k + cache_bytes, out, op.tokens, op.ctx, op.n_heads, op.n_kv_heads, op.head_dim, ws_,
                     ws_bytes_, stream_, op.dtype);
    });
  }

  // The vision encoder's attention kernel over `tokens` fused q/k/v rows in segments of `ctx` rows (the
  // last one shorter where ctx does not divide tokens), as an encode runs it: the rows were just
  // written by the qkv projection, so nothing rotates them out of the L2.
  double vision_attention(const Op& op) {
    SW_CHECK(op.tokens > 0 && op.ctx > 0 && op.n_heads > 0, "profile: vision attention of ", op.tokens,
             " rows in segments of ", op.ctx);
    if (!vision_) {
      // A cuBLAS handle and workspace of their own: set_workspace points its handle's workspace into the
      // region, which would overlap the matmul runner's use of ws_ on the shared handle.
      if (cublasCreate(&vision_blas_) != CUBLAS_STATUS_SUCCESS) fail("profile: cublasCreate failed");
      ck(cudaMalloc(&vision_ws_, kVisionWorkspaceBytes), "cudaMalloc vision workspace");
      vision_ = make_cuda_vision_kernels(stream_, vision_blas_);
      vision_->set_workspace(vision_ws_, kVisionWorkspaceBytes);
    }
    std::vector<int32_t> cu = {0};
    while (cu.back() < op.tokens) cu.push_back(static_cast<int32_t>(std::min<int64_t>(cu.back() + op.ctx, op.tokens)));
    const uint64_t width = static_cast<uint64_t>(op.n_heads * op.head_dim);
    const uint64_t rows = static_cast<uint64_t>(op.tokens);
    float* qkv = activations(4 * rows * width + cu.size());
    float* out = qkv + 3 * rows * width;
    int32_t* dev_cu = reinterpret_cast<int32_t*>(out + rows * width);
    ck(cudaMemcpy(dev_cu, cu.data(), cu.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "cu_seqlens");
    const int64_t n_segments = static_cast<int64_t>(cu.size()) - 1, max_len = std::min(op.ctx, op.tokens);
    return timed([&] { vision_->attention(qkv, out, dev_cu, n_segments, max_len, op.n_heads, op.head_dim); });
  }

  // The MoE FFN block (norm, routed experts, combine) of a qwen3_moe layer, tokens routed at random.
  double moe(const Op& op) {
    const uint64_t one = static_cast<uint64_t>(op.rows) * dtype_row_bytes(op.dtype, op.cols);
    const uint64_t down = static_cast<uint64_t>(op.cols) * dtype_row_bytes(op.dtype, op.rows);
    const uint64_t total = static_cast<uint64_t>(op.n_experts) * (2 * one + down);
    const std::string key = std::to_string(static_cast<int>(op.dtype)) + "/" + std::to_string(op.n_experts) + "/" +
                            std::to_string(op.rows) + "/" + std::to_string(op.cols) + "/" + std::to_string(op.top_k);
    if (key != moe_key_) {
      if (moe_) cudaFree(moe_);
      ck(cudaMalloc(&moe_, total + static_cast<uint64_t>(op.cols) * 4), "cudaMalloc experts");
      const std::vector<uint8_t> pat = random_pattern(op.dtype, 3000);
      for (uint64_t off = 0; off < total; off += pat.size())
        ck(cudaMemcpy(moe_ + off, pat.data(), std::min<uint64_t>(pat.size(), total - off), cudaMemcpyHostToDevice),
           "experts");
      std::vector<float> ones(static_cast<size_t>(op.cols), 1.0f);
      ck(cudaMemcpy(moe_ + total, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice), "ffn norm");
      const ModelSpec spec = moe_block_spec(op);
      moe_spec_ = spec;
      kernels_ = make_cuda_kernels(spec, RopeStyle::Neox, stream_, blas_);
      layer_ = DevLayer();
      layer_.ffn_norm = reinterpret_cast<const float*>(moe_ + total);
      layer_.gate_dtype = layer_.up_dtype = layer_.down_dtype = op.dtype;
      for (int64_t e = 0; e < op.n_experts; ++e) {
        layer_.gate_exp.push_back(moe_ + static_cast<uint64_t>(e) * one);
        layer_.up_exp.push_back(moe_ + static_cast<uint64_t>(op.n_experts) * one + static_cast<uint64_t>(e) * one);
        layer_.down_exp.push_back(moe_ + 2 * static_cast<uint64_t>(op.n_experts) * one +
                                  static_cast<uint64_t>(e) * down);
      }
      moe_key_ = key;
    }
    std::vector<float> logits(static_cast<size_t>(op.tokens * op.n_experts));
    uint64_t s = 0x9e3779b97f4a7c15ull * (++moe_turn_);
    for (auto& l : logits) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      l = static_cast<float>(s % 10007) / 5003.5f - 1.0f;
    }
    const MoeRouting routing = route_tokens(logits.data(), op.tokens, op.n_experts, op.top_k, true);
    const uint64_t need = cuda_kernels_workspace_bytes(moe_spec_, op.tokens);
    const uint64_t ws = std::min(need, ws_bytes_);
    float* x = activations(static_cast<uint64_t>(op.tokens * op.cols));
    kernels_->set_workspace(ws_, ws);
    kernels_->prepare_step(0, op.tokens);
    return timed([&] { kernels_->ffn(layer_, x, op.tokens, &routing); });
  }

  double norm(const Op& op) {
    const int64_t dim = 4096, rows = std::max<int64_t>(1, op.elems / dim);
    float* x = activations(static_cast<uint64_t>(2 * rows * dim + dim));
    return timed([&] { cuda_rms_norm(x, x + 2 * rows * dim, 1e-6f, x + rows * dim, rows, dim, stream_); });
  }

  double elementwise(const Op& op) {
    float* x = activations(static_cast<uint64_t>(2 * op.elems));
    return timed([&] { cuda_swiglu(x, x + op.elems, 1, op.elems, stream_); });
  }

  void ensure_copy_device(uint64_t bytes) {
    if (dev_ && bytes <= copy_bytes_) return;
    SW_CHECK(!dev_, "profile: copies larger than the first size's buffers");
    copy_bytes_ = std::max<uint64_t>(bytes, 1ull << 30);
    dev_ = make_cuda_device(0);
    arena_ = dev_->allocate_arena(copy_bytes_);
    pinned_ = HostBuffer(copy_bytes_);
    pageable_ = HostBuffer(copy_bytes_);
    std::memset(pinned_.data(), 7, copy_bytes_);
    std::memset(pageable_.data(), 9, copy_bytes_);
    dev_->pin_host(pinned_.data(), copy_bytes_);
  }

  uint64_t set_bytes_;
  std::string name_;
  uint64_t vram_ = 0;
  int driver_ = 0;
  cudaStream_t stream_{};
  cublasHandle_t blas_{};
  cudaEvent_t e0_{}, e1_{};
  uint8_t* set_ = nullptr;
  uint8_t* ws_ = nullptr;
  uint64_t ws_bytes_ = 0;
  float* act_ = nullptr;
  uint64_t act_floats_ = 0;
  float* kv_ = nullptr;
  uint64_t kv_floats_ = 0;
  uint64_t kv_turn_ = 0;
  uint8_t* moe_ = nullptr;
  std::string moe_key_;
  ModelSpec moe_spec_;
  std::unique_ptr<DeviceKernels> kernels_;
  std::unique_ptr<VisionKernels> vision_;  // the vision encoder's kernels, made on first use
  static constexpr uint64_t kVisionWorkspaceBytes = 8ull << 20;
  cublasHandle_t vision_blas_ = nullptr;
  uint8_t* vision_ws_ = nullptr;
  DevLayer layer_;
  uint64_t moe_turn_ = 0;
  int filled_ = -1;
  uint64_t turn_ = 0;
  int reps_ = 1;                           // launches in the current burst
  std::map<std::string, double> last_ms_;  // the previous sample per op
  // copies through the executor's device
  std::unique_ptr<Device> dev_;
  uint8_t* arena_ = nullptr;
  uint64_t copy_bytes_ = 0;
  HostBuffer pinned_, pageable_;
  // background traffic
  void* tr_host_ = nullptr;
  uint8_t* tr_dev_ = nullptr;
  cudaStream_t tr_s_[2]{};
  std::thread traffic_;
  std::atomic<bool> stop_{false};
  uint64_t moved_ = 0;
  double traffic_ms_ = 0;
};

}  // namespace

std::unique_ptr<GpuBench> GpuBench::open(uint64_t weight_set_bytes) {
  return std::make_unique<CudaBench>(weight_set_bytes);
}

}  // namespace shardwise
