// executor/cuda/cuda_runtime_device.cu — the CUDA Device (see executor/device/device.h): the arena is
// one cudaMalloc of exactly the budget; the four queues are non-blocking streams; events come from a
// pool recycled at each synchronize(); host weights are registered (pinned) so copies run at PCIe
// speed; a PCIe cap paces copies in chunks of 4 MiB or more with waiting kernels on the copy's stream
// (the two host-to-device streams share one pacer: the cap is the link's; copies under 64 KiB are
// charged, not held). Activation uploads (Queue::H2DAct) of up to 1 MiB from pinned memory are read by
// a kernel over the mapped host memory instead of the copy engine, which runs host-to-device copies one
// after another whatever their streams: behind a weight copy, the upload waited for all of it (pull
// below). The blocks' kernels live in cuda_kernels.h and are warmed up (loaded, cuBLAS set up) when
// created, before the arena; cuBLAS gets its workspace from the plan's scratch, never its own allocation.
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/watchdog.h"
#include "executor/cuda/cuda_common.cuh"
#include "executor/cuda/cuda_device.h"
#include "executor/cuda/cuda_kernels.h"
#include "executor/device/device.h"
#include "executor/device/pinned_ranges.h"
#include "executor/device/vision_kernels.h"

namespace shardwise {

namespace {

constexpr const char* kStallHint = "--wait-timeout raises the limit for very long steps";

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA: ", what, ": ", cudaGetErrorString(e));
}

// Paces copies to a byte rate on the device itself, as a link of that rate would carry them: before each
// chunk a one-thread kernel on the copy's stream reserves the link for the chunk's time at the cap, from
// when the link is free (the end of the last reservation, on either host-to-device stream: they share the
// link) or now if it is idle, and holds the stream until the reservation starts; the copy then runs at
// the real link's speed, and whatever lets others see it arrive (an event, a timeline stamp, a
// synchronisation) is held by a second kernel until the reservation's end. An idle link banks no credit:
// a copy issued after the link was idle takes its full time at the cap from its start. (Pacing from a
// point in the past would let copies issued after a gap — qwen30b's routed experts, each layer's issued
// once its router's result is back — arrive as if the link had carried them during the gap: 62.4 ms per
// decode step where the link alone needs 62.4 ms and the step's GPU work between the copies another
// 6.3. Host callbacks sleeping between chunks wake late when the cores are busy.)
struct Pacer {
  std::atomic<double> cap{0};            // bytes per second, 0 = none
  std::atomic<uint64_t> owed{0};         // bytes of unpaced small copies, charged to the next paced chunk
  unsigned long long* credit = nullptr;  // device: global-timer ns at which the link is free again
};

// Copies below this size are not held: on any link they take about the link's latency (an
// activation row, router logits), and holding each would add a launch of its own that no real
// slower link has. Their bytes count against the next paced chunk, so the average rate stays at
// the cap. The profiler's smallest copy (64 KiB) is paced: its capped rows time what a paced copy
// costs, and the cost model times smaller copies by the uncapped rows.
constexpr uint64_t kPacedMinBytes = 64ull << 10;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Reserves [start, start + ns) of the link, start = max(the link's free time, now), records the end in
// `tail` (the stream's) and waits until start, so the chunk copied next on the stream starts no earlier
// than the capped link would start it.
__global__ void pace_reserve_kernel(unsigned long long* credit, unsigned long long* tail, unsigned long long ns) {
  const unsigned long long now = global_ns();
  unsigned long long old = *reinterpret_cast<volatile unsigned long long*>(credit), assumed, start;
  do {
    assumed = old;
    start = assumed > now ? assumed : now;
    old = atomicCAS(credit, assumed, start + ns);
  } while (old != assumed);
  *tail = start + ns;
  while (global_ns() < start) __nanosleep(1000);
}

// Holds the stream until its last reserved chunk would have arrived over the capped link.
__global__ void pace_tail_kernel(const unsigned long long* tail) {
  const unsigned long long until = *reinterpret_cast<const volatile unsigned long long*>(tail);
  while (global_ns() < until) __nanosleep(1000);
}

// An activation upload read by the SMs from mapped pinned host memory (CudaDevice::copy, pull):
// `ld.cv` fetches every line again, never a cached copy of what the host rewrote since.
template <typename T>
__global__ void pull_kernel(T* dst, const T* src, uint64_t n) {
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    dst[i] = __ldcv(src + i);
}

// Forwards the blocks, giving cuBLAS the first part of the workspace.
class WorkspaceSplitKernels : public DeviceKernels {
 public:
  WorkspaceSplitKernels(std::unique_ptr<DeviceKernels> inner, cublasHandle_t blas)
      : inner_(std::move(inner)), blas_(blas) {}
  void set_workspace(uint8_t* dev, uint64_t bytes) override {
    const uint64_t w = cuda_blas_workspace_bytes(bytes);
    if (cublasSetWorkspace(blas_, w ? dev : nullptr, w) != CUBLAS_STATUS_SUCCESS)
      fail("cuBLAS: cublasSetWorkspace failed");
    inner_->set_workspace(dev + w, bytes - w);
  }
  void prepare_segments(const std::vector<StepSegment>& segments) override { inner_->prepare_segments(segments); }
  void set_kv_dtype(DType t) override { inner_->set_kv_dtype(t); }
  void attention(const DevLayer& w, float* x, int64_t n, void* k, void* v) override {
    inner_->attention(w, x, n, k, v);
  }
  void kv_layout(const void* src, void* dst, int64_t capacity, int64_t p0, int64_t p1, bool to_positions) override {
    inner_->kv_layout(src, dst, capacity, p0, p1, to_positions);
  }
  void attention_pre(const DevLayer& w, const float* x, int64_t n, float* qkv) override {
    inner_->attention_pre(w, x, n, qkv);
  }
  void attention_post(const DevLayer& w, float* x, const float* attn, int64_t n) override {
    inner_->attention_post(w, x, attn, n);
  }
  void router(const DevLayer& w, const float* x, int64_t n, float* logits) override { inner_->router(w, x, n, logits); }
  void ffn(const DevLayer& w, float* x, int64_t n, const MoeRouting* r) override { inner_->ffn(w, x, n, r); }
  void ffn_routed(const DevLayer& w, float* x, int64_t n, const float* l) override { inner_->ffn_routed(w, x, n, l); }
  void add(float* x, const float* y, int64_t count) override { inner_->add(x, y, count); }
  void output_rows(const float* norm, const DevMat& head, const float* x, const std::vector<int64_t>& rows,
                   float* logits, int64_t ld) override {
    inner_->output_rows(norm, head, x, rows, logits, ld);
  }

 private:
  std::unique_ptr<DeviceKernels> inner_;
  cublasHandle_t blas_;
};

// Activation uploads (Queue::H2DAct) of at most kPullMaxBytes from pinned host memory run as a kernel that
// reads the mapped host memory (pull_kernel), on the SMs. The copy engine runs host-to-device copies in the
// order they reach it, whatever their streams, so an upload issued behind a weight copy waited for all of it
// (nemo8b 4G/4K Dynamic: a CPU FFN's output 0.5-5.1 ms behind a 283 MB streamed FFN, three to five times a
// step). Under a PCIe cap a pull is charged to the pacer, as copies under 64 KiB are.
constexpr uint64_t kPullMaxBytes = 1ull << 20;

class CudaDevice : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    const int n = cuda_device_count();
    if (n == 0) fail("--device cuda: no CUDA device is visible on this machine");
    if (ordinal < 0 || ordinal >= n) fail("CUDA device ", ordinal, " does not exist (", n, " visible)");
    check(cudaSetDevice(ordinal), "cudaSetDevice");
    cudaDeviceProp p;
    check(cudaGetDeviceProperties(&p, ordinal), "cudaGetDeviceProperties");
    name_ = p.name;
    if (p.memPitch > 0) max_pitch_ = static_cast<uint64_t>(p.memPitch);
    int host_ptr = 0;  // registered host memory readable by kernels at its host address (pull)
    if (cudaDeviceGetAttribute(&host_ptr, cudaDevAttrCanUseHostPointerForRegisteredMem, ordinal) != cudaSuccess) {
      cudaGetLastError();
      host_ptr = 0;
    }
    host_ptr_reads_ = host_ptr != 0 && p.unifiedAddressing != 0;
    // The copy queues get the higher priority: a pacing kernel on them must find an SM between the
    // compute queue's blocks, not after them.
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    for (int q = 0; q < kNumQueues; ++q)
      check(cudaStreamCreateWithPriority(&streams_[q], cudaStreamNonBlocking, q == 0 ? least : greatest),
            "cudaStreamCreate");
    void* credits = nullptr;  // the two pacers' link clocks, then one reservation end per queue
    check(cudaMalloc(&credits, (2 + kNumQueues) * sizeof(unsigned long long)), "cudaMalloc (pacer)");
    check(cudaMemset(credits, 0, (2 + kNumQueues) * sizeof(unsigned long long)), "cudaMemset (pacer)");
    pacers_[0].credit = static_cast<unsigned long long*>(credits);
    pacers_[1].credit = pacers_[0].credit + 1;
    tails_ = pacers_[0].credit + 2;
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: cublasCreate failed");
    if (cublasSetStream(blas_, streams_[0]) != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: cublasSetStream failed");
    // No TF32 or other reduced-precision modes: results must match the f32 reference.
    cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    total_ = total_b;
    context_ = total_b - free_b;  // context, modules and cuBLAS handle (assuming the GPU is ours)
    free_after_setup_ = free_b;
    min_free_ = free_b;
  }
  ~CudaDevice() override {
    cudaDeviceSynchronize();
    kernels_.reset();
    vision_.reset();
    for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (cudaEvent_t e : stamps_) cudaEventDestroy(e);
    if (origin_) cudaEventDestroy(origin_);
    for (const auto& r : pinned_.ranges()) cudaHostUnregister(reinterpret_cast<void*>(r.first));
    if (arena_) cudaFree(arena_);
    if (pacers_[0].credit) cudaFree(pacers_[0].credit);
    if (blas_) cublasDestroy(blas_);
    for (auto& s : streams_) cudaStreamDestroy(s);
  }

  std::string kind() const override { return "cuda"; }
  bool supports_dtype(DType t) const override { return cuda_computes_dtype(t); }
  bool supports_kv_dtype(DType t) const override { return is_kv_dtype(t); }
  std::string name() const override { return name_; }

  uint8_t* allocate_arena(uint64_t bytes) override {
    SW_CHECK(arena_ == nullptr, "cuda: an arena is allocated already");
    // The set-up ends here: the context, modules, the cuBLAS handle and the driver's page tables for
    // the pinned host weights (about 2 MiB of device memory per GiB pinned) are context_bytes; from
    // now on only the arena may take device memory.
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    context_ = total_b - free_b;
    free_after_setup_ = free_b;
    min_free_ = free_b;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail("--vram-budget ", format_bytes(bytes), ": the GPU cannot provide it (", cudaGetErrorString(e), "; ",
           format_bytes(free_after_setup_), " free after the CUDA context)");
    }
    arena_ = static_cast<uint8_t*>(p);
    arena_bytes_ = bytes;
    sample_free();
    return arena_;
  }

  // Waits for this device's queues only: another device on the same GPU (a server's image encoder) may be
  // capturing a CUDA graph, which a whole-device synchronisation would break.
  void release_arena() override {
    if (!arena_) return;
    synchronize();
    for (auto& g : graphs_) cudaGraphExecDestroy(g.second);  // they name the arena's addresses
    graphs_.clear();
    check(cudaFree(arena_), "cudaFree(arena)");
    arena_ = nullptr;
    arena_bytes_ = 0;
  }

  void pin_host(const void* ptr, uint64_t bytes, HostAccess access) override {
    pinned_.add(ptr, bytes, [&](uint64_t begin, uint64_t end) { return register_range(begin, end, access); });
  }

  void unpin_host(const void* ptr, uint64_t bytes) override {
    if (!ptr || bytes == 0) return;
    synchronize();  // this device's copies from the range are done (release_arena says why not the whole GPU)
    pinned_.remove(ptr, bytes, [](uint64_t begin) {
      cudaHostUnregister(reinterpret_cast<void*>(begin));
      cudaGetLastError();
    });
  }

  uint64_t pinned_host_bytes() const override { return pinned_.bytes(); }

  void set_pcie_cap(double bps) override {
    for (auto& p : pacers_) p.cap.store(bps);
  }

  void copy_h2d(uint8_t* dev, const void* host, uint64_t bytes, Queue q) override {
    SW_CHECK(q == Queue::H2D || q == Queue::H2DAct, "CUDA: copy_h2d on a queue that does not copy to the device");
    copy(static_cast<int>(q), dev, host, bytes, cudaMemcpyHostToDevice);
  }
  // One call per copy, as copy_h2d: the first starts as soon as it is enqueued. (One cudaMemcpyBatchAsync
  // per layer's experts decoded slower: 1K/4G Dynamic at 16 GB/s 18.9 / 19.3 ms a step against 16.6 / 18.3.)
  void copy_h2d_batch(const HostCopy* copies, size_t count, Queue q) override {
    SW_CHECK(q == Queue::H2D || q == Queue::H2DAct, "CUDA: copy_h2d_batch on a queue that does not copy to the device");
    const int qi = static_cast<int>(q);
    for (size_t i = 0; i < count; ++i) check_rows(copies[i]);
    for (size_t i = 0; i < count; ++i) {
      const HostCopy& c = copies[i];
      if (c.rows == 1)
        copy(qi, c.dev, c.host, c.bytes, cudaMemcpyHostToDevice);
      else
        copy_rows(qi, c);
    }
  }
  // A strided copy: one cudaMemcpy2DAsync where its rows' whole host range is one pinned run, no cap paces
  // the link (the pacer reserves the link per contiguous chunk) and its pitches are within the device's
  // largest (a layer's expert tensor over 2 GiB apart); else row by row.
  void copy_rows(int q, const HostCopy& c) {
    const uint64_t host = reinterpret_cast<uint64_t>(c.host);
    const uint64_t extent = (c.rows - 1) * c.host_pitch + c.bytes;
    auto row_by_row = [&] {
      for (uint64_t r = 0; r < c.rows; ++r)
        copy(q, c.dev + r * c.dev_pitch, static_cast<const uint8_t*>(c.host) + r * c.host_pitch, c.bytes,
             cudaMemcpyHostToDevice);
    };
    if (pacers_[0].cap.load() > 0 || !pinned_.pinned(host) || pinned_.run_from(host, extent) < extent ||
        c.host_pitch > max_pitch_ || c.dev_pitch > max_pitch_ || c.bytes > max_pitch_) {
      row_by_row();
      return;
    }
    const cudaError_t e = cudaMemcpy2DAsync(c.dev, c.dev_pitch, c.host, c.host_pitch, c.bytes, c.rows,
                                            cudaMemcpyHostToDevice, streams_[q]);
    if (e == cudaErrorInvalidPitchValue) {  // a pitch this device does not take after all: row by row
      cudaGetLastError();
      row_by_row();
      return;
    }
    if (e != cudaSuccess) copy_failed(e, c.dev, c.host, extent, cudaMemcpyHostToDevice);
  }
  void copy_d2h(void* host, const uint8_t* dev, uint64_t bytes) override {
    copy(2, host, dev, bytes, cudaMemcpyDeviceToHost);
  }
  void copy_d2d(uint8_t* dst, const uint8_t* src, uint64_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, streams_[0]), "cudaMemcpyAsync D2D");
  }

  Event record(Queue q) override {
    if (next_event_ == events_.size()) {
      cudaEvent_t e;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      events_.push_back(e);
    }
    const size_t i = next_event_++;
    hold_tail(static_cast<int>(q));
    check(cudaEventRecord(events_[i], streams_[static_cast<int>(q)]), "cudaEventRecord");
    Event ev;
    ev.queue = static_cast<int>(q);
    ev.seq = i;
    return ev;
  }
  void wait(Queue q, const Event& e) override {
    if (!e.valid() || e.queue == static_cast<int>(q)) return;
    check(cudaStreamWaitEvent(streams_[static_cast<int>(q)], events_.at(e.seq), 0), "cudaStreamWaitEvent");
  }
  void host_wait(const Event& e) override {
    if (!e.valid()) return;
    const StallGuard guard("a wait for the GPU (an event of its queues)", 0, kStallHint);
    check(cudaEventSynchronize(events_.at(e.seq)), "cudaEventSynchronize");
  }
  bool event_done(const Event& e) override {
    if (!e.valid()) return true;
    const cudaError_t r = cudaEventQuery(events_.at(e.seq));
    if (r == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    check(r, "cudaEventQuery");
    return true;
  }
  void begin_timeline() override {
    if (!origin_) check(cudaEventCreate(&origin_), "cudaEventCreate(timeline)");
    check(cudaEventRecord(origin_, streams_[0]), "cudaEventRecord(timeline)");
    check(cudaEventSynchronize(origin_), "cudaEventSynchronize(timeline)");
    next_stamp_ = 0;
  }
  Event timestamp(Queue q) override {
    if (next_stamp_ == stamps_.size()) {
      cudaEvent_t e;
      check(cudaEventCreate(&e), "cudaEventCreate(timeline)");
      stamps_.push_back(e);
    }
    const size_t i = next_stamp_++;
    hold_tail(static_cast<int>(q));
    check(cudaEventRecord(stamps_[i], streams_[static_cast<int>(q)]), "cudaEventRecord(timeline)");
    Event ev;
    ev.queue = static_cast<int>(q);
    ev.seq = i;
    return ev;
  }
  double timestamp_ms(const Event& e) override {
    SW_CHECK(origin_ && e.seq < next_stamp_, "CUDA: timestamp ", e.seq, " was not recorded since begin_timeline()");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, origin_, stamps_[e.seq]), "cudaEventElapsedTime");
    return ms;
  }
  bool begin_capture(Queue q) override {
    // Relaxed: calls that are not stream work (a cudaGetLastError after a launch) stay legal.
    check(cudaStreamBeginCapture(streams_[static_cast<int>(q)], cudaStreamCaptureModeRelaxed),
          "cudaStreamBeginCapture");
    return true;
  }
  void end_capture(Queue q, uint64_t key) override {
    cudaStream_t s = streams_[static_cast<int>(q)];
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(s, &g);
    if (e != cudaSuccess || g == nullptr) {
      cudaGetLastError();
      fail("CUDA: capturing a decode step as a graph failed (", cudaGetErrorString(e),
           "): a block did something a graph cannot hold; run without --cuda-graphs");
    }
    auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      // Same kernels, new parameters (positions, split counts): update in place; a changed shape
      // (another kernel, a node more) needs a new executable.
      cudaGraphExecUpdateResultInfo info;
      if (cudaGraphExecUpdate(it->second, g, &info) != cudaSuccess) {
        cudaGetLastError();
        cudaGraphExecDestroy(it->second);
        graphs_.erase(it);
        it = graphs_.end();
      }
    }
    if (it == graphs_.end()) {
      cudaGraphExec_t x = nullptr;
      const cudaError_t ie = cudaGraphInstantiate(&x, g, 0);
      if (ie != cudaSuccess) {
        cudaGraphDestroy(g);
        check(ie, "cudaGraphInstantiate");
      }
      it = graphs_.emplace(key, x).first;
    }
    cudaGraphDestroy(g);
    check(cudaGraphLaunch(it->second, s), "cudaGraphLaunch");
    ++graph_launches_;
  }
  uint64_t graph_launches() const override { return graph_launches_; }
  void profiler_range(bool on) override {
    check(on ? cudaProfilerStart() : cudaProfilerStop(), "cudaProfilerStart/Stop");
  }

  void synchronize() override {
    for (int q = 0; q < kNumQueues; ++q) hold_tail(q);
    const StallGuard guard("a wait for the GPU's queues to finish", 0, kStallHint);
    for (auto& s : streams_) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    check(cudaGetLastError(), "a kernel launch");
    next_event_ = 0;  // every recorded event is complete: recycle the pool
    sample_free();
  }

  // The set-up of the blocks includes their warm-up: every kernel they can launch is loaded (and
  // cuBLAS's configurations set up) now, in temporary memory freed again, so that the measured set-up
  // that ends at allocate_arena holds the driver's growth for them, and no first launch after the
  // arena takes device memory (CUDA loads modules lazily by default).
  DeviceKernels& kernels(const ModelSpec& spec, RopeStyle rope) override {
    if (!kernels_) {
      std::unique_ptr<DeviceKernels> k = make_cuda_kernels(spec, rope, streams_[0], blas_);
      if (arena_) {
        log_warn(
            "cuda: the model's kernels are set up after the arena: their first launches may take device memory "
            "beyond the budget");
      } else {
        const CudaWarmUpStats st = cuda_kernels_warm_up(*k);
        if (!st.error.empty())
          log_warn("cuda: the kernel warm-up failed (", st.error,
                   "): kernels not loaded yet may take device memory "
                   "after the arena");
        else
          log_debug("cuda: kernel warm-up: ", st.steps, " block steps, ", st.matmuls, " matmuls, ", st.launches,
                    " launcher calls on ", st.exact_shapes ? "the model's" : "shrunk", " shapes in ",
                    format_bytes(st.temp_bytes), " of temporary memory, ", st.ms, " ms");
      }
      kernels_ = std::make_unique<WorkspaceSplitKernels>(std::move(k), blas_);
    }
    return *kernels_;
  }

  // Warmed up for each head_dim asked (the attention kernel is a template over it) while no arena exists.
  VisionKernels& vision_kernels(int64_t head_dim) override {
    if (!vision_) vision_ = make_cuda_vision_kernels(streams_[0], blas_);
    if (std::find(vision_warm_.begin(), vision_warm_.end(), head_dim) == vision_warm_.end()) {
      vision_warm_.push_back(head_dim);
      if (arena_) {
        log_warn(
            "cuda: the vision kernels are set up after the arena: their first launches may take device memory "
            "beyond the budget");
      } else {
        const std::string error = cuda_vision_warm_up(*vision_, head_dim);
        if (!error.empty())
          log_warn("cuda: the vision kernels' warm-up failed (", error,
                   "): kernels not loaded yet may take device memory after the arena");
      }
    }
    return *vision_;
  }

  uint64_t context_bytes() const override { return context_; }
  uint64_t device_peak_bytes() override {
    sample_free();
    return free_after_setup_ > min_free_ ? free_after_setup_ - min_free_ : 0;
  }

 private:
  bool register_range(uint64_t begin, uint64_t end, HostAccess access) {
    void* p = reinterpret_cast<void*>(begin);
    // Read-only mappings (weights mapped from a file) need the read-only flag; a GPU without it may
    // still register read-only memory that happens to be writable (the synthetic source's).
    cudaError_t e = cudaHostRegister(
        p, end - begin, access == HostAccess::ReadOnly ? cudaHostRegisterReadOnly : cudaHostRegisterDefault);
    if (e != cudaSuccess && access == HostAccess::ReadOnly) {
      cudaGetLastError();
      e = cudaHostRegister(p, end - begin, cudaHostRegisterDefault);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (!warned_pin_) {
        log_warn("could not pin ", format_bytes(end - begin), " of host weights (", cudaGetErrorString(e),
                 "): copies from them run at pageable speed");
        warned_pin_ = true;
      }
      return false;
    }
    return true;
  }

  // Names what was copied when a copy fails (which side is outside the arena, pinned or not).
  [[noreturn]] void copy_failed(cudaError_t e, const void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
    cudaGetLastError();
    const void* dev = kind == cudaMemcpyHostToDevice ? dst : src;
    const void* host = kind == cudaMemcpyHostToDevice ? src : dst;
    const uint8_t* d = static_cast<const uint8_t*>(dev);
    const bool in_arena = arena_ && d >= arena_ && d + bytes <= arena_ + arena_bytes_;
    const uint64_t h = reinterpret_cast<uint64_t>(host);
    const bool pinned = pinned_.pinned(h);
    fail("CUDA: cudaMemcpyAsync ", kind == cudaMemcpyHostToDevice ? "H2D" : "D2H", " of ", bytes,
         " bytes: ", cudaGetErrorString(e), " (device side ", in_arena ? "inside" : "OUTSIDE", " the arena at offset ",
         static_cast<long long>(d - arena_), ", host side ", pinned ? "pinned" : "pageable", " at ", host, ")");
  }

  // A pinned host range must lie inside one registration: split a copy where the host side crosses
  // from one registered range (or unregistered memory) into another.
  void copy(int q, void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
    const uint64_t host = reinterpret_cast<uint64_t>(kind == cudaMemcpyHostToDevice ? src : dst);
    if (q == static_cast<int>(Queue::H2DAct) && kind == cudaMemcpyHostToDevice && bytes > 0 && bytes <= kPullMaxBytes &&
        host_ptr_reads_ && pinned_.pinned(host) && pinned_.run_from(host, bytes) >= bytes) {
      pull(q, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes);
      return;
    }
    uint64_t done = 0;
    while (done < bytes) {
      const uint64_t at = host + done;
      const uint64_t piece = pinned_.run_from(at, bytes - done);
      copy_piece(q, static_cast<uint8_t*>(dst) + done, static_cast<const uint8_t*>(src) + done, piece, kind);
      done += piece;
    }
  }

  void copy_piece(int q, void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
    // Both host-to-device queues share one pacer: the cap is the link's.
    Pacer& pacer = pacers_[q == static_cast<int>(Queue::D2H) ? 1 : 0];
    if (pacer.cap.load() <= 0) {
      const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, streams_[q]);
      if (e != cudaSuccess) copy_failed(e, dst, src, bytes, kind);
      return;
    }
    // Chunks of 4 MiB (a quarter millisecond at 16 GB/s), at most 32 per copy: a 270 MiB shard
    // is paced in 8.4 MiB steps, and its copy adds 64 entries to the stream's queue, not 136.
    const uint64_t chunk = std::max<uint64_t>(4ull << 20, (bytes + 31) / 32);
    for (uint64_t off = 0; off < bytes; off += chunk) {
      const uint64_t c = std::min(chunk, bytes - off);
      if (bytes >= kPacedMinBytes) {
        const double ns = static_cast<double>(c + pacer.owed.exchange(0)) / pacer.cap.load() * 1e9;
        pace_reserve_kernel<<<1, 1, 0, streams_[q]>>>(pacer.credit, tails_ + q, static_cast<unsigned long long>(ns));
        check(cudaGetLastError(), "the pacing kernel launch");
      }
      const cudaError_t e = cudaMemcpyAsync(static_cast<uint8_t*>(dst) + off, static_cast<const uint8_t*>(src) + off, c,
                                            kind, streams_[q]);
      if (e != cudaSuccess)
        copy_failed(e, static_cast<uint8_t*>(dst) + off, static_cast<const uint8_t*>(src) + off, c, kind);
      if (bytes < kPacedMinBytes) {
        pacer.owed.fetch_add(c);
        continue;
      }
      tail_pending_[q] = true;
    }
  }

  // An activation upload as a kernel on queue q reading the pinned host range (kPullMaxBytes above): 16-byte
  // loads where both sides and the size allow, else 4-byte, else bytes. Charged to the pacer under a cap.
  void pull(int q, uint8_t* dst, const uint8_t* src, uint64_t bytes) {
    const uintptr_t a =
        reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | static_cast<uintptr_t>(bytes);
    const int width = (a & 15u) == 0 ? 16 : (a & 3u) == 0 ? 4 : 1;
    const uint64_t n = bytes / static_cast<uint64_t>(width);
    const unsigned threads = 256, blocks = static_cast<unsigned>(std::min<uint64_t>((n + threads - 1) / threads, 256));
    cudaStream_t s = streams_[q];
    if (width == 16)
      pull_kernel<<<blocks, threads, 0, s>>>(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), n);
    else if (width == 4)
      pull_kernel<<<blocks, threads, 0, s>>>(reinterpret_cast<unsigned int*>(dst),
                                             reinterpret_cast<const unsigned int*>(src), n);
    else
      pull_kernel<<<blocks, threads, 0, s>>>(reinterpret_cast<unsigned char*>(dst),
                                             reinterpret_cast<const unsigned char*>(src), n);
    check(cudaGetLastError(), "the activation upload kernel launch");
    if (pacers_[0].cap.load() > 0) pacers_[0].owed.fetch_add(bytes);
  }

  // Whatever is enqueued on queue q next (an event, a timeline stamp) waits until q's paced copies would
  // have arrived over the capped link.
  void hold_tail(int q) {
    if (!tail_pending_[q].exchange(false)) return;
    pace_tail_kernel<<<1, 1, 0, streams_[q]>>>(tails_ + q);
    check(cudaGetLastError(), "the pacing kernel launch");
  }

  void sample_free() {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) == cudaSuccess) min_free_ = std::min<uint64_t>(min_free_, f);
  }

  int ordinal_;
  std::string name_;
  cudaStream_t streams_[kNumQueues] = {};
  unsigned long long* tails_ = nullptr;              // device: per queue, the end of its last link reservation
  std::atomic<bool> tail_pending_[kNumQueues] = {};  // a paced copy since the queue's last tail kernel
  cublasHandle_t blas_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::vector<cudaEvent_t> stamps_;  // timing events of the step timeline
  size_t next_stamp_ = 0;
  cudaEvent_t origin_ = nullptr;
  size_t next_event_ = 0;
  std::unique_ptr<DeviceKernels> kernels_;
  std::unique_ptr<VisionKernels> vision_;
  std::vector<int64_t> vision_warm_;  // head_dims the vision kernels were warmed up for
  uint8_t* arena_ = nullptr;
  uint64_t arena_bytes_ = 0, total_ = 0, context_ = 0, free_after_setup_ = 0, min_free_ = 0;
  PinnedRanges pinned_{static_cast<uint64_t>(sysconf(_SC_PAGESIZE))};  // registered with the driver
  bool warned_pin_ = false;
  Pacer pacers_[2];
  std::map<uint64_t, cudaGraphExec_t> graphs_;  // end_capture's executables by the runtime's key
  uint64_t graph_launches_ = 0;
  uint64_t max_pitch_ = (1ull << 31) - 1;  // cudaDevAttrMaxPitch, read at set-up
  bool host_ptr_reads_ = false;            // kernels may read registered host memory at its host address (pull)
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(int ordinal) {
  return std::make_unique<CudaDevice>(ordinal);
}

}  // namespace shardwise
