// executor/device/emu_device.cpp — the host-emulated device (see device.h): its own memory (one host
// buffer as the arena), three worker threads as in-order queues, and the CPU blocks as its kernels.
// Every queue sleeps a seeded random time before each item, so work that is not ordered by an event
// runs in a random order and a missing dependency shows up as a wrong result. Graphs: a capture keeps
// the compute queue's items and runs them as one item at end_capture; a wait that CUDA forbids during
// a capture (on an event recorded inside it, or by the capturing queue on another) is an error.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/host_buffer.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "core/watchdog.h"
#include "executor/cpu/ops.h"
#include "executor/device/device.h"
#include "executor/device/pinned_ranges.h"
#include "executor/device/vision_kernels.h"
#include "executor/model/cpu_blocks.h"

namespace shardwise {
namespace {

class EmuQueue {
 public:
  EmuQueue(uint64_t seed, int max_delay_us) : rng_(seed), max_delay_us_(max_delay_us) {
    worker_ = std::thread([this] { loop(); });
  }
  ~EmuQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  // Returns the item's sequence number (1-based); while capturing, the item is kept for the graph.
  uint64_t push(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (capturing_) {
      captured_.push_back(std::move(fn));
      return submitted_;
    }
    items_.push_back(std::move(fn));
    cv_.notify_all();
    return ++submitted_;
  }
  void begin_capture() {
    std::lock_guard<std::mutex> lock(mu_);
    SW_CHECK(!capturing_, "emu: a capture is already open on this queue");
    capturing_ = true;
    captured_.clear();
  }
  std::vector<std::function<void()>> end_capture() {
    std::lock_guard<std::mutex> lock(mu_);
    SW_CHECK(capturing_, "emu: end_capture without begin_capture");
    capturing_ = false;
    return std::move(captured_);
  }
  bool capturing() {
    std::lock_guard<std::mutex> lock(mu_);
    return capturing_;
  }
  uint64_t submitted() {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }
  void wait_done(uint64_t seq) {
    const StallGuard guard("a wait for the emulated device's queue", 0,
                           "--wait-timeout raises the limit for very long steps");
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return completed_ >= seq; });
  }
  bool done(uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ >= seq;
  }
  std::exception_ptr take_error() {
    std::lock_guard<std::mutex> lock(mu_);
    std::exception_ptr e = error_;
    error_ = nullptr;
    return e;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !items_.empty(); });
        if (stop_ && items_.empty()) return;
        fn = std::move(items_.front());
        items_.pop_front();
      }
      if (max_delay_us_ > 0) {
        std::uniform_int_distribution<int> d(0, max_delay_us_);
        std::this_thread::sleep_for(std::chrono::microseconds(d(rng_)));
      }
      try {
        fn();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++completed_;
      }
      done_cv_.notify_all();
    }
  }

  std::mt19937_64 rng_;
  int max_delay_us_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> items_;
  uint64_t submitted_ = 0, completed_ = 0;
  bool stop_ = false;
  bool capturing_ = false;
  std::vector<std::function<void()>> captured_;
  std::exception_ptr error_;
  std::thread worker_;
};

LayerWeights host_view(const DevLayer& d, const ModelSpec& spec) {
  auto mat = [](const DevMat& m) {
    TensorView v;
    v.dtype = m.dtype;
    v.shape = {m.rows, m.cols};
    v.data = m.data;
    v.nbytes = m.data ? tensor_bytes(m.dtype, v.shape) : 0;
    return v;
  };
  auto vec = [](const float* p, int64_t n) { return p ? std::vector<float>(p, p + n) : std::vector<float>(); };
  LayerWeights w;
  w.attn_norm = vec(d.attn_norm, spec.hidden_size);
  w.ffn_norm = vec(d.ffn_norm, spec.hidden_size);
  w.q_norm = vec(d.q_norm, spec.head_dim);
  w.k_norm = vec(d.k_norm, spec.head_dim);
  w.q_bias = vec(d.q_bias, spec.q_dim());
  w.k_bias = vec(d.k_bias, spec.kv_dim());
  w.v_bias = vec(d.v_bias, spec.kv_dim());
  w.wq = mat(d.wq);
  w.wk = mat(d.wk);
  w.wv = mat(d.wv);
  w.wo = mat(d.wo);
  w.ffn_gate = mat(d.gate);
  w.ffn_up = mat(d.up);
  w.ffn_down = mat(d.down);
  w.router = mat(d.router);
  if (spec.is_moe()) {
    const int64_t E = spec.num_experts, F = spec.moe_intermediate_size, H = spec.hidden_size;
    w.gate_exps.dtype = d.gate_dtype;
    w.gate_exps.shape = {E, F, H};
    w.up_exps.dtype = d.up_dtype;
    w.up_exps.shape = {E, F, H};
    w.down_exps.dtype = d.down_dtype;
    w.down_exps.shape = {E, H, F};
    w.gate_exp = d.gate_exp;
    w.up_exp = d.up_exp;
    w.down_exp = d.down_exp;
  }
  return w;
}

class EmuDevice;

class EmuKernels : public DeviceKernels {
 public:
  EmuKernels(EmuQueue& q, const ModelSpec& spec, RopeStyle rope)
      : q_(q), spec_(spec), pool_(1), blocks_(spec, rope, pool_) {}
  void set_workspace(uint8_t*, uint64_t) override {}  // the CPU blocks keep their own temporaries
  void prepare_segments(const std::vector<StepSegment>& segments) override {
    q_.push([this, segments] { blocks_.prepare_step(segments); });
  }
  // The CPU blocks keep f32, f16, bf16 or q8_0 caches; the type applies to the blocks queued after this call.
  void set_kv_dtype(DType t) override {
    SW_CHECK(is_kv_dtype(t), "the emulated device keeps the KV cache in ", kKvDtypeNames, ", not ", dtype_name(t));
    check_kv_head_dim(t, spec_.head_dim, "the emulated device's KV cache");
    kv_dtype_ = t;
    q_.push([this, t] { blocks_.set_kv_dtype(t); });
  }
  void kv_layout(const void* src, void* dst, int64_t capacity, int64_t p0, int64_t p1, bool to_positions) override {
    const int64_t heads = spec_.num_key_value_heads;
    // One head's row of one position, in bytes (whole blocks of a q8_0 cache).
    const int64_t row = static_cast<int64_t>(dtype_row_bytes(kv_dtype_, spec_.head_dim));
    SW_CHECK(0 <= p0 && p0 <= p1 && p1 <= capacity, "emu kv_layout: positions [", p0, ", ", p1, ") of ", capacity);
    if (p1 == p0) return;
    q_.push([=] {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      uint8_t* d = static_cast<uint8_t*>(dst);
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t head_at = (h * capacity + p) * row, pos_at = (p * heads + h) * row;
          if (to_positions)
            std::memcpy(d + pos_at, s + head_at, static_cast<size_t>(row));
          else
            std::memcpy(d + head_at, s + pos_at, static_cast<size_t>(row));
        }
    });
  }
  void attention(const DevLayer& w, float* x, int64_t n, void* k, void* v) override {
    q_.push([=] { blocks_.attention(host_view(w, spec_), x, n, k, v); });
  }
  void attention_pre(const DevLayer& w, const float* x, int64_t n, float* qkv) override {
    q_.push([=] { blocks_.attention_pre(host_view(w, spec_), x, n, qkv); });
  }
  void attention_post(const DevLayer& w, float* x, const float* attn, int64_t n) override {
    q_.push([=] { blocks_.attention_post(host_view(w, spec_), x, attn, n); });
  }
  void router(const DevLayer& w, const float* x, int64_t n, float* logits) override {
    q_.push([=] { blocks_.router(host_view(w, spec_), x, n, logits); });
  }
  void ffn(const DevLayer& w, float* x, int64_t n, const MoeRouting* routing) override {
    std::shared_ptr<MoeRouting> r = routing ? std::make_shared<MoeRouting>(*routing) : nullptr;
    q_.push([=] { blocks_.ffn(host_view(w, spec_), x, n, r.get()); });
  }
  void ffn_routed(const DevLayer& w, float* x, int64_t n, const float* logits) override {
    q_.push([=] {
      const MoeRouting r = route_tokens(logits, n, spec_.num_experts, spec_.num_experts_per_tok, spec_.norm_topk_prob);
      blocks_.ffn(host_view(w, spec_), x, n, &r);
    });
  }
  void add(float* x, const float* y, int64_t count) override {
    q_.push([=] { add_inplace(x, y, count); });
  }
  void output_rows(const float* out_norm, const DevMat& head, const float* x, const std::vector<int64_t>& rows,
                   float* logits, int64_t ld) override {
    q_.push([=] {
      const std::vector<float> norm(out_norm, out_norm + spec_.hidden_size);
      TensorView h;
      h.dtype = head.dtype;
      h.shape = {head.rows, head.cols};
      h.data = head.data;
      h.nbytes = tensor_bytes(head.dtype, h.shape);
      // Rows of the head [0, rows) written at logits - r0 + r0: the caller's logits already point at
      // this piece's first column.
      blocks_.output_rows(norm, h, x, rows.data(), static_cast<int64_t>(rows.size()), logits, ld, 0, head.rows);
    });
  }

 private:
  EmuQueue& q_;
  ModelSpec spec_;
  ThreadPool pool_;
  CpuBlocks blocks_;
  DType kv_dtype_ = DType::F32;  // as the calls see it (blocks_ takes it in queue order)
};

// The CPU's vision operations, each enqueued on the compute queue (one thread: the encoder's emulated
// runs test the order of copies and compute, not speed).
class EmuVisionKernels : public VisionKernels {
 public:
  explicit EmuVisionKernels(EmuQueue& q) : q_(q), pool_(1), cpu_(make_cpu_vision_kernels(pool_)) {}
  void set_workspace(uint8_t*, uint64_t) override {}
  void linear(const DevMat& w, const float* bias, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
              bool accumulate) override {
    q_.push([=] { cpu_->linear(w, bias, x, ldx, n, y, ldy, accumulate); });
  }
  void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n, int64_t dim) override {
    q_.push([=] { cpu_->rms_norm(x, w, eps, y, n, dim); });
  }
  void rotary(float* qkv, const float* cos, const float* sin, int64_t n, int64_t n_heads, int64_t head_dim) override {
    q_.push([=] { cpu_->rotary(qkv, cos, sin, n, n_heads, head_dim); });
  }
  void attention(const float* qkv, float* out, const int32_t* cu_seqlens, int64_t n_segments, int64_t max_len,
                 int64_t n_heads, int64_t head_dim) override {
    q_.push([=] { cpu_->attention(qkv, out, cu_seqlens, n_segments, max_len, n_heads, head_dim); });
  }
  void activation(VisionAct act, float* gate, const float* up, int64_t count) override {
    q_.push([=] { cpu_->activation(act, gate, up, count); });
  }
  void permute_rows(const float* src, const int32_t* index, float* dst, int64_t rows, int64_t width,
                    bool scatter) override {
    q_.push([=] { cpu_->permute_rows(src, index, dst, rows, width, scatter); });
  }

 private:
  EmuQueue& q_;
  ThreadPool pool_;
  std::unique_ptr<VisionKernels> cpu_;
};

class EmuDevice : public Device {
 public:
  explicit EmuDevice(const EmuOptions& o) : opt_(o) {
    for (int i = 0; i < kNumQueues; ++i)
      queues_[i] = std::make_unique<EmuQueue>(o.seed * 7919 + static_cast<uint64_t>(i) * 104729,
                                              static_cast<int>(o.max_delay_us * std::max(0.0, o.queue_scale[i])));
  }
  ~EmuDevice() override {
    for (auto& q : queues_) q->wait_done(q->submitted());
  }
  std::string kind() const override { return "emu"; }
  bool supports_kv_dtype(DType t) const override { return t == DType::F32 || (is_kv_dtype(t) && opt_.kv_f16); }
  bool supports_dtype(DType t) const override {
    return opt_.dtypes.empty() || std::find(opt_.dtypes.begin(), opt_.dtypes.end(), t) != opt_.dtypes.end();
  }
  std::string name() const override { return "emulated device (host memory, randomised queue delays)"; }

  uint8_t* allocate_arena(uint64_t bytes) override {
    SW_CHECK(arena_.size() == 0, "emu: an arena is allocated already");
    arena_ = HostBuffer(bytes);
    return arena_.data();
  }
  void release_arena() override {
    synchronize();
    arena_ = HostBuffer();
  }
  // Nothing to pin in host memory; the ranges are only recorded, like CUDA's registrations.
  void pin_host(const void* ptr, uint64_t bytes, HostAccess) override {
    pinned_.add(ptr, bytes, [](uint64_t, uint64_t) { return true; });
  }
  void unpin_host(const void* ptr, uint64_t bytes) override {
    synchronize();
    pinned_.remove(ptr, bytes, [](uint64_t) {});
  }
  uint64_t pinned_host_bytes() const override { return pinned_.bytes(); }
  void set_pcie_cap(double bps) override { cap_ = bps; }

  void copy_h2d(uint8_t* dev, const void* host, uint64_t bytes, Queue q) override {
    check_in_arena(dev, bytes, "copy_h2d");
    SW_CHECK(q == Queue::H2D || q == Queue::H2DAct, "emu: copy_h2d on a queue that does not copy to the device");
    push(q, [=] { throttled_copy(dev, host, bytes); });
  }
  void copy_d2h(void* host, const uint8_t* dev, uint64_t bytes) override {
    check_in_arena(dev, bytes, "copy_d2h");
    push(Queue::D2H, [=] { throttled_copy(host, dev, bytes); });
  }
  void copy_d2d(uint8_t* dst, const uint8_t* src, uint64_t bytes) override {
    check_in_arena(dst, bytes, "copy_d2d");
    check_in_arena(src, bytes, "copy_d2d");
    push(Queue::Compute, [=] { std::memmove(dst, src, bytes); });
  }
  Event record(Queue q) override {
    Event e;
    e.queue = static_cast<int>(q);
    // An event recorded while its queue captures is no point to wait on (as in CUDA): marked, and
    // a wait on it is an error.
    e.seq = queues_[static_cast<int>(q)]->capturing() ? kCapturedEvent : queues_[static_cast<int>(q)]->submitted();
    return e;
  }
  void wait(Queue q, const Event& e) override {
    if (!e.valid() || e.queue == static_cast<int>(q)) return;  // same queue: already ordered
    check_waitable(e);
    // As CUDA: a capturing queue may not wait for another queue's work recorded outside the capture.
    SW_CHECK(!queues_[static_cast<int>(q)]->capturing(), "emu: a queue waits for another queue during a graph capture");
    ++waits_;
    if (opt_.drop_wait > 0 && waits_ == opt_.drop_wait) return;  // test hook: a missing dependency
    EmuQueue* other = queues_[e.queue].get();
    const uint64_t seq = e.seq;
    push(q, [other, seq] { other->wait_done(seq); });
  }
  void host_wait(const Event& e) override {
    if (!e.valid()) return;
    check_waitable(e);
    queues_[e.queue]->wait_done(e.seq);
    rethrow();
  }
  bool event_done(const Event& e) override {
    if (!e.valid()) return true;
    check_waitable(e);
    return queues_[e.queue]->done(e.seq);
  }
  // A graph: the captured items run as one item of the queue.
  bool begin_capture(Queue q) override {
    queues_[static_cast<int>(q)]->begin_capture();
    return true;
  }
  void end_capture(Queue q, uint64_t) override {
    auto items = std::make_shared<std::vector<std::function<void()>>>(queues_[static_cast<int>(q)]->end_capture());
    push(q, [items] {
      for (auto& fn : *items) fn();
    });
    ++graph_launches_;
  }
  uint64_t graph_launches() const override { return graph_launches_; }
  // No profiler to drive: the range is checked (on, then off) and logged, so a run can show which
  // plan runs a real device's profiler would have recorded.
  void profiler_range(bool on) override {
    SW_CHECK(on != profiling_, "emu: profiler range turned ", on ? "on" : "off", " twice");
    profiling_ = on;
    log_info("emulated device: profiler range ", on ? "on" : "off");
  }
  void synchronize() override {
    for (auto& q : queues_) SW_CHECK(!q->capturing(), "emu: synchronize during a graph capture");
    for (auto& q : queues_) q->wait_done(q->submitted());
    rethrow();
  }
  void begin_timeline() override {
    std::lock_guard<std::mutex> lock(stamp_mu_);
    stamps_.clear();
    t0_ = std::chrono::steady_clock::now();
  }
  Event timestamp(Queue q) override {
    size_t i = 0;
    {
      std::lock_guard<std::mutex> lock(stamp_mu_);
      i = stamps_.size();
      stamps_.push_back(-1.0);
    }
    push(q, [this, i] {
      std::lock_guard<std::mutex> lock(stamp_mu_);
      stamps_[i] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    });
    Event e;
    e.queue = static_cast<int>(q);
    e.seq = i;
    return e;
  }
  double timestamp_ms(const Event& e) override {
    std::lock_guard<std::mutex> lock(stamp_mu_);
    SW_CHECK(e.seq < stamps_.size() && stamps_[e.seq] >= 0, "emu: timestamp ", e.seq, " was not reached");
    return stamps_[e.seq];
  }
  DeviceKernels& kernels(const ModelSpec& spec, RopeStyle rope) override {
    if (!kernels_) kernels_ = std::make_unique<EmuKernels>(*queues_[0], spec, rope);
    return *kernels_;
  }
  VisionKernels& vision_kernels(int64_t) override {
    if (!vision_) vision_ = std::make_unique<EmuVisionKernels>(*queues_[0]);
    return *vision_;
  }
  uint64_t context_bytes() const override { return 0; }
  uint64_t device_peak_bytes() override { return arena_.size(); }

 private:
  void push(Queue q, std::function<void()> fn) { queues_[static_cast<int>(q)]->push(std::move(fn)); }
  static constexpr uint64_t kCapturedEvent = ~0ull;
  void check_waitable(const Event& e) {
    SW_CHECK(e.seq != kCapturedEvent,
             "emu: waited for an event recorded during a graph capture (it marks no point yet)");
  }
  void check_in_arena(const void* p, uint64_t bytes, const char* what) const {
    const uint8_t* b = arena_.data();
    const uint8_t* x = static_cast<const uint8_t*>(p);
    SW_CHECK(b != nullptr && x >= b && x + bytes <= b + arena_.size(), "emu ", what, ": ", bytes,
             " bytes at arena offset ", static_cast<long long>(x - b), " fall outside the ", arena_.size(),
             "-byte arena");
  }
  void throttled_copy(void* dst, const void* src, uint64_t bytes) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst, src, bytes);
    if (cap_ > 0) {
      const auto due = t0 + std::chrono::duration<double>(static_cast<double>(bytes) / cap_);
      std::this_thread::sleep_until(due);
    }
  }
  void rethrow() {
    for (auto& q : queues_)
      if (std::exception_ptr e = q->take_error()) std::rethrow_exception(e);
  }

  EmuOptions opt_;
  std::unique_ptr<EmuQueue> queues_[kNumQueues];
  std::unique_ptr<EmuKernels> kernels_;
  std::unique_ptr<EmuVisionKernels> vision_;
  PinnedRanges pinned_{4096};
  HostBuffer arena_;
  double cap_ = 0;
  int waits_ = 0;
  uint64_t graph_launches_ = 0;
  bool profiling_ = false;
  std::mutex stamp_mu_;
  std::deque<double> stamps_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

}  // namespace

std::unique_ptr<Device> make_emu_device(const EmuOptions& options) {
  return std::make_unique<EmuDevice>(options);
}

}  // namespace shardwise
