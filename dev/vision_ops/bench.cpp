// dev/vision_ops/bench.cpp — where does a vision encode's time go on the GPU, op by op, next to the
// cost model's price of each op?
//
// The encode is the product's own (encode_images_on_device, the plan it picks under BUDGET, the tower
// copied from pageable memory as `run --image` does), run on a CUDA device seen through a wrapper that
// puts a timestamp on the compute queue before and after every VisionKernels call and on the H2D queue
// around every weight copy. Nothing else changes: the kernels, plan and copies are the product's.
//
// Check, then time:
//   check  the wrapped encode's tokens equal the plain encode's bit for bit (the stamps change nothing;
//          with a fixed workspace, to f32 rounding)
//   time   ROUNDS wrapped encodes after one warm-up; per op class (linear by shape, attention by
//          segment length, norm, rotary, activation, permute) the kernel time per encode (median
//          round), the calls, and the cost model's price of the same calls under each PROFILE; then the
//          compute queue's idle time inside the encode (waits for copies), the copies' time, the
//          encode's wall time and planner/encoder_cost's whole-encode prediction.
//
//   bench DEVICE TOWER ROUNDS CONFIG... PROFILE.json...
//   CONFIG: BUDGET[@MAX_RESIDENT][+WORKSPACE]/WIDTHxHEIGHT[,WIDTHxHEIGHT...], e.g. 4G/854x480,2560x1440,
//   1G@0/854x480 (every block streamed), 4G+8M/2560x1440 (the kernels' workspace fixed at 8 MiB in place of
//   the plan's).
//   DEVICE: cuda (emu runs the same on the emulated device, to try the bench without a GPU).
//   TOWER: an mmproj GGUF, an HF directory or synthetic:qwen2vl7b?dtype=f16&seed=1 (load_vision_tower).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/size.h"
#include "engine/cost_source.h"
#include "engine/run_setup.h"
#include "engine/vision_planning.h"
#include "executor/device/device.h"
#include "executor/device/vision_kernels.h"
#include "vision/encoder.h"
#include "vision/mmproj.h"
#include "vision/preprocess.h"
#include "vision/vision_runtime.h"

using namespace shardwise;

namespace {

// One recorded call: its class, the cost model's Op for it (priced later), and its two stamps.
struct Call {
  std::string cls;
  Op op;
  bool priced = true;
  Event t0, t1;
  bool copy = false;
};

class Recorder {
 public:
  explicit Recorder(Device& dev) : dev_(dev) {}
  void begin(std::string cls, Op op, bool priced, Queue q) {
    Call c;
    c.cls = std::move(cls);
    c.op = op;
    c.priced = priced;
    c.copy = q != Queue::Compute;
    c.t0 = dev_.timestamp(q);
    calls_.push_back(c);
  }
  void end(Queue q) { calls_.back().t1 = dev_.timestamp(q); }
  std::vector<Call>& calls() { return calls_; }
  void clear() { calls_.clear(); }

 private:
  Device& dev_;
  std::vector<Call> calls_;
};

Op elems_op(OpKind k, int64_t elems) {
  Op op;
  op.kind = k;
  op.elems = elems;
  return op;
}

// The CUDA kernels with a stamp before and after each call. Attention is priced per segment length as
// planner/encoder_cost prices it; the wrapper learns the lengths from the inputs (set_segments).
class StampedKernels : public VisionKernels {
 public:
  StampedKernels(VisionKernels& inner, Recorder& rec) : k_(inner), rec_(rec) {}
  void set_segments(const VisionInputs& in) {
    windows_ = lengths(in.cu_windows);
    frames_ = lengths(in.cu_frames);
    max_window_ = in.max_window;
  }
  // The kernels' workspace as the plan reserves it: theirs, or exactly `bytes` where set (the A/B of the
  // plan's against a fixed one).
  void set_workspace_override(uint64_t bytes) { ws_override_ = bytes; }
  VisionWorkspace workspace(DType t) const override {
    return ws_override_ ? VisionWorkspace{ws_override_, 0} : k_.workspace(t);
  }
  void set_workspace(uint8_t* dev, uint64_t bytes) override { k_.set_workspace(dev, bytes); }
  void linear(const DevMat& w, const float* bias, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
              bool accumulate) override {
    Op op;
    op.kind = OpKind::Matmul;
    op.dtype = w.dtype;
    op.tokens = n;
    op.rows = w.rows;
    op.cols = w.cols;
    std::ostringstream cls;
    cls << "linear " << w.rows << "x" << w.cols << (n >= 4096 ? "" : " (short)");
    rec_.begin(cls.str(), op, true, Queue::Compute);
    k_.linear(w, bias, x, ldx, n, y, ldy, accumulate);
    rec_.end(Queue::Compute);
  }
  void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n, int64_t dim) override {
    rec_.begin("rms_norm", elems_op(OpKind::Norm, n * dim), true, Queue::Compute);
    k_.rms_norm(x, w, eps, y, n, dim);
    rec_.end(Queue::Compute);
  }
  void rotary(float* qkv, const float* cos, const float* sin, int64_t n, int64_t n_heads, int64_t head_dim) override {
    rec_.begin("rotary", elems_op(OpKind::Rope, 2 * n * n_heads * head_dim), true, Queue::Compute);
    k_.rotary(qkv, cos, sin, n, n_heads, head_dim);
    rec_.end(Queue::Compute);
  }
  void attention(const float* qkv, float* out, const int32_t* cu_seqlens, int64_t n_segments, int64_t max_len,
                 int64_t n_heads, int64_t head_dim) override {
    const bool window = max_len == max_window_ && n_segments == static_cast<int64_t>(windows_.size());
    const std::vector<int64_t>& segs = window ? windows_ : frames_;
    std::map<int64_t, int64_t> count;
    for (int64_t l : segs)
      if (l > 0) ++count[l];
    // One call, priced as the sum of its segment lengths' rows: recorded as one entry per length, the
    // first carrying the stamps and the others zero-length (priced, not timed).
    bool first = true;
    for (const auto& [len, c] : count) {
      Op op;
      op.kind = OpKind::VisionAttention;
      op.dtype = DType::F32;
      op.tokens = len * c;
      op.ctx = len;
      op.n_heads = op.n_kv_heads = n_heads;
      op.head_dim = head_dim;
      rec_.begin(window ? "attention (windows)" : "attention (full)", op, true, Queue::Compute);
      if (first) k_.attention(qkv, out, cu_seqlens, n_segments, max_len, n_heads, head_dim);
      rec_.end(Queue::Compute);
      first = false;
    }
  }
  void activation(VisionAct act, float* gate, const float* up, int64_t count) override {
    rec_.begin("activation", elems_op(OpKind::Elementwise, count), true, Queue::Compute);
    k_.activation(act, gate, up, count);
    rec_.end(Queue::Compute);
  }
  void permute_rows(const float* src, const int32_t* index, float* dst, int64_t rows, int64_t width,
                    bool scatter) override {
    rec_.begin("permute_rows", elems_op(OpKind::Elementwise, rows * width), false, Queue::Compute);
    k_.permute_rows(src, index, dst, rows, width, scatter);
    rec_.end(Queue::Compute);
  }

 private:
  static std::vector<int64_t> lengths(const std::vector<int32_t>& cu) {
    std::vector<int64_t> v;
    for (size_t i = 1; i < cu.size(); ++i) v.push_back(cu[i] - cu[i - 1]);
    return v;
  }
  VisionKernels& k_;
  Recorder& rec_;
  std::vector<int64_t> windows_, frames_;
  int64_t max_window_ = -1;
  uint64_t ws_override_ = 0;
};

// The CUDA device as it is, but for its vision kernels (stamped) and its weight copies (stamped on H2D).
class StampedDevice : public Device {
 public:
  explicit StampedDevice(Device& d) : d_(d), rec_(d) {}
  Recorder& recorder() { return rec_; }
  StampedKernels* stamped() { return k_.get(); }
  std::string kind() const override { return d_.kind(); }
  std::string name() const override { return d_.name(); }
  bool supports_dtype(DType t) const override { return d_.supports_dtype(t); }
  bool supports_kv_dtype(DType t) const override { return d_.supports_kv_dtype(t); }
  uint8_t* allocate_arena(uint64_t bytes) override { return d_.allocate_arena(bytes); }
  void release_arena() override { d_.release_arena(); }
  void pin_host(const void* p, uint64_t b, HostAccess a) override { d_.pin_host(p, b, a); }
  void unpin_host(const void* p, uint64_t b) override { d_.unpin_host(p, b); }
  uint64_t pinned_host_bytes() const override { return d_.pinned_host_bytes(); }
  void set_pcie_cap(double b) override { d_.set_pcie_cap(b); }
  void copy_h2d(uint8_t* dev, const void* host, uint64_t bytes, Queue q) override {
    rec_.begin("weight copies", Op{}, false, q);
    d_.copy_h2d(dev, host, bytes, q);
    rec_.end(q);
  }
  void copy_h2d_batch(const HostCopy* c, size_t n, Queue q) override {
    rec_.begin("weight copies", Op{}, false, q);
    d_.copy_h2d_batch(c, n, q);
    rec_.end(q);
  }
  void copy_d2h(void* host, const uint8_t* dev, uint64_t bytes) override { d_.copy_d2h(host, dev, bytes); }
  void copy_d2d(uint8_t* dst, const uint8_t* src, uint64_t bytes) override { d_.copy_d2d(dst, src, bytes); }
  Event record(Queue q) override { return d_.record(q); }
  void wait(Queue q, const Event& e) override { d_.wait(q, e); }
  void host_wait(const Event& e) override { d_.host_wait(e); }
  bool event_done(const Event& e) override { return d_.event_done(e); }
  void synchronize() override { d_.synchronize(); }
  void begin_timeline() override { d_.begin_timeline(); }
  Event timestamp(Queue q) override { return d_.timestamp(q); }
  double timestamp_ms(const Event& e) override { return d_.timestamp_ms(e); }
  DeviceKernels& kernels(const ModelSpec& s, RopeStyle r) override { return d_.kernels(s, r); }
  VisionKernels& vision_kernels(int64_t head_dim) override {
    VisionKernels& inner = d_.vision_kernels(head_dim);
    if (!k_) k_ = std::make_unique<StampedKernels>(inner, rec_);
    return *k_;
  }
  uint64_t context_bytes() const override { return d_.context_bytes(); }
  uint64_t device_peak_bytes() override { return d_.device_peak_bytes(); }

 private:
  Device& d_;
  Recorder rec_;
  std::unique_ptr<StampedKernels> k_;
};

std::vector<float> seeded_patches(int64_t patches, int64_t patch_dim) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(patches * patch_dim));
  for (float& x : v) x = d(rng);
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One encode's numbers, from its stamps.
struct Round {
  std::map<std::string, double> class_ms;  // kernel time per class
  std::map<std::string, int> class_calls;
  double kernels_ms = 0, copies_ms = 0, span_ms = 0, wall_ms = 0;
};

Round read_round(Device& dev, std::vector<Call>& calls, double wall_ms) {
  Round r;
  r.wall_ms = wall_ms;
  double first = 1e300, last = 0;
  for (const Call& c : calls) {
    const double a = dev.timestamp_ms(c.t0), b = dev.timestamp_ms(c.t1), ms = b - a;
    if (c.copy) {
      r.copies_ms += ms;
      r.class_ms["weight copies"] += ms;
      ++r.class_calls["weight copies"];
      continue;
    }
    first = std::min(first, a);
    last = std::max(last, b);
    r.kernels_ms += ms;
    r.class_ms[c.cls] += ms;
    if (ms > 0 || c.cls.rfind("attention", 0) != 0) ++r.class_calls[c.cls];
  }
  r.span_ms = last > first ? last - first : 0;
  return r;
}

// The cost model's price of one encode's compute calls, per class.
std::map<std::string, double> priced(const std::vector<Call>& calls, const CostModel& cost) {
  std::map<std::string, double> ms;
  for (const Call& c : calls)
    if (!c.copy && c.priced) ms[c.cls] += cost.op_ms(c.op, ExecEnv{Backend::Gpu});
  return ms;
}

void run_size(Device& cuda, const VisionTower& t, int64_t width, int64_t height, uint64_t budget, int64_t max_resident,
              uint64_t workspace, int rounds, const std::vector<std::string>& profiles) {
  const VisionModel& m = t.model;
  const std::array<int64_t, 3> g = image_grid(width, height, t.processor);
  const std::vector<GridThw> grids = {{g[0], g[1], g[2]}};
  const VisionInputs in = vision_inputs(m.spec, grids);
  const std::vector<float> px = seeded_patches(in.n_patches, m.spec.patch_dim());
  auto plain = [&] {
    return encode_images_on_device(cuda, m.spec, m.weights, px.data(), grids, budget, nullptr, max_resident);
  };
  StampedDevice dev(cuda);
  dev.vision_kernels(m.spec.head_dim());
  dev.stamped()->set_segments(in);
  VisionRunStats st;
  auto stamped = [&] {
    dev.recorder().clear();
    dev.begin_timeline();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> out =
        encode_images_on_device(dev, m.spec, m.weights, px.data(), grids, budget, &st, max_resident);
    const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return std::make_pair(out, wall);
  };
  // Check: with the plan's own workspace the stamps change nothing (the plain encode's bits). A fixed
  // workspace cuts the linear layers into other pieces, whose 16-bit splits of the activations are scaled
  // per piece: the same values up to f32 rounding.
  const std::vector<float> want = plain();
  if (stamped().first != want) fail(width, "x", height, ": the stamped encode differs from the plain one");
  if (workspace != 0) {
    dev.stamped()->set_workspace_override(workspace);
    const std::vector<float> got = stamped().first;
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    }
    if (got.size() != want.size() || diff > 1e-4 * scale)
      fail(width, "x", height, ": with the workspace fixed the encode differs by ", diff, " (largest value ", scale,
           ")");
  }
  // Time.
  std::vector<Round> rs;
  std::vector<Call> last;
  for (int i = 0; i < rounds; ++i) {
    const double wall = stamped().second;
    rs.push_back(read_round(cuda, dev.recorder().calls(), wall));
    last = dev.recorder().calls();
  }
  std::printf("\n%lldx%lld: %lld patches (grid %lldx%lld), kernel workspace %s, %s\n", static_cast<long long>(width),
              static_cast<long long>(height), static_cast<long long>(in.n_patches), static_cast<long long>(g[1]),
              static_cast<long long>(g[2]), format_bytes(st.plan.workspace_bytes).c_str(), st.plan.describe().c_str());
  std::vector<std::unique_ptr<CostSource>> sources;
  std::vector<std::map<std::string, double>> prices;
  for (const std::string& p : profiles) {
    sources.push_back(std::make_unique<CostSource>(MachineChoice{"", {}, p}));
    prices.push_back(priced(last, sources.back()->at_cap(0)));
  }
  std::printf("  %-30s %6s %10s", "class", "calls", "measured");
  for (size_t i = 0; i < profiles.size(); ++i) std::printf("  priced[%zu]", i);
  std::printf("   (ms per encode, median of %d)\n", rounds);
  for (const auto& [cls, calls] : rs.back().class_calls) {
    std::vector<double> v;
    for (const Round& r : rs) v.push_back(r.class_ms.count(cls) ? r.class_ms.at(cls) : 0);
    std::printf("  %-30s %6d %10.2f", cls.c_str(), calls, median(v));
    for (const auto& p : prices) std::printf("  %9.2f", p.count(cls) ? p.at(cls) : 0.0);
    std::printf("\n");
  }
  auto med = [&](double Round::*f) {
    std::vector<double> v;
    for (const Round& r : rs) v.push_back(r.*f);
    return median(v);
  };
  std::printf(
      "  kernels %.1f ms; compute queue from first to last kernel %.1f ms (idle %.1f); weight copies %.1f ms;"
      " encode wall %.1f ms (stats %.1f); device peak %s (arena %s, budget %s)\n",
      med(&Round::kernels_ms), med(&Round::span_ms), med(&Round::span_ms) - med(&Round::kernels_ms),
      med(&Round::copies_ms), med(&Round::wall_ms), st.encode_ms, format_bytes(st.device_peak_bytes).c_str(),
      format_bytes(st.plan.arena_bytes).c_str(), format_bytes(budget).c_str());
  for (size_t i = 0; i < profiles.size(); ++i) {
    const CostModel& cost = sources[i]->at_cap(0);
    const VisionPart part =
        plan_vision_inputs(m.spec, in, budget, m.weights.matrix_dtype,
                           dev.vision_kernels(m.spec.head_dim()).workspace(m.weights.matrix_dtype), cost, max_resident);
    double sum = 0;
    for (const auto& [cls, ms] : prices[i]) sum += ms;
    std::printf("  priced[%zu] %s: calls %.1f ms; encode predicted %.1f ms (block %.2f, full block %.2f, copy %.2f)\n",
                i, profiles[i].c_str(), sum, part.cost.predicted_ms, part.cost.block_compute_ms,
                part.cost.full_block_compute_ms, part.cost.copy_ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(
        stderr,
        "usage: %s DEVICE TOWER ROUNDS BUDGET[@MAX_RESIDENT][+WORKSPACE]/WIDTHxHEIGHT[,...]... PROFILE.json...\n",
        argv[0]);
    return 2;
  }
  try {
    const VisionTower t = load_vision_tower(argv[2]);
    const int rounds = std::max(1, std::atoi(argv[3]));
    std::vector<std::string> configs, profiles;
    for (int i = 4; i < argc; ++i) {
      const std::string a = argv[i];
      (a.size() > 5 && a.compare(a.size() - 5, 5, ".json") == 0 ? profiles : configs).push_back(a);
    }
    std::unique_ptr<Device> cuda = make_run_device(argv[1]);
    std::printf("%s; tower %s\n", cuda->name().c_str(), argv[2]);
    for (const std::string& c : configs) {
      // BUDGET[@R][+WS]/SIZES: at most R blocks resident (the oracle's partial and streamed plans); a
      // kernel workspace of WS instead of the device's (the linear layers split their activations in it).
      const size_t slash = c.find('/');
      if (slash == std::string::npos) fail(c, ": not BUDGET[@R][+WS]/WIDTHxHEIGHT[,...]");
      std::string b = c.substr(0, slash);
      uint64_t workspace = 0;
      if (const size_t plus = b.find('+'); plus != std::string::npos) {
        workspace = parse_vram_budget(b.substr(plus + 1), "WS");
        b = b.substr(0, plus);
      }
      const size_t at = b.find('@');
      const uint64_t budget = parse_vram_budget(b.substr(0, at), "BUDGET");
      const int64_t max_resident = at == std::string::npos ? INT64_MAX : std::atoll(b.c_str() + at + 1);
      std::printf("\n== %s\n", c.c_str());
      std::stringstream sizes(c.substr(slash + 1));
      for (std::string s; std::getline(sizes, s, ',');) {
        const std::array<int64_t, 2> wh = parse_image_size(s, "size");
        run_size(*cuda, t, wh[0], wh[1], budget, max_resident, workspace, rounds, profiles);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
