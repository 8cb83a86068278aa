// executor/runtime/runtime.cpp — plan execution (see runtime.h).
#include "executor/runtime/runtime.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/host_buffer.h"
#include "core/log.h"
#include "core/size.h"
#include "core/thread_pool.h"
#include "core/watchdog.h"
#include "executor/cpu/ops.h"
#include "executor/session/kv_cache.h"
#include "planner/verify.h"

namespace shardwise {

TensorDtypes tensor_dtypes_of(const WeightSource& source) {
  TensorDtypes d;
  for (const auto& kv : source.tensors()) d[kv.first] = kv.second.dtype;
  return d;
}

// Host staging and per-step state. The activations that cross PCIe (x, q/k/v, attention output,
// router logits, logits) live in one page-aligned block sized for the largest tier and pinned:
// copies from pageable memory go through the driver's staging buffer (a 16 KiB decode hop took
// ~12 us, a 1 MiB prefill hop ~200 us on the H200 host, against ~5 and ~20 pinned).
struct Runtime::Buffers {
  HostBuffer staging;
  int64_t max_tokens = 0;
  int64_t max_rows = 1;  // logits rows (sequences of one step)
  float *x = nullptr, *qkv = nullptr, *attn = nullptr, *logits = nullptr;
  float* partial = nullptr;       // an MoE layer's CPU share [max_tokens, hidden] (plan.h moe_cpu_share)
  float* out_norm_f32 = nullptr;  // the output norm's weights, uploaded for a device LM head
  std::vector<float*> router;     // per layer [max_tokens, experts] (MoE only)
  std::vector<float*>
      guess;  // per layer [max_tokens, experts]: its guessed router logits (router_guess), if any plan has them
  Device* pinned_by = nullptr;  // unpins the staging before it is unmapped (also when set-up throws)
  // The host KV cache, pinned when a plan stages it on the device (attn_staged); unpinned here, before
  // the cache is unmapped (buf_ is the runtime's last member: destroyed before host_kv_).
  const void* kv_pinned = nullptr;
  uint64_t kv_pinned_bytes = 0;
  ~Buffers() {
    if (!pinned_by) return;
    try {
      if (kv_pinned) pinned_by->unpin_host(kv_pinned, kv_pinned_bytes);
      pinned_by->unpin_host(staging.data(), staging.size());
    } catch (...) {
    }
  }
  std::vector<std::unique_ptr<MoeRouting>> routing;      // per layer, filled when the routing is known
  std::vector<std::unique_ptr<MoeSplit>> split;          // per layer: its routing split CPU / GPU (moe shares)
  std::vector<std::vector<const uint8_t*>> expert_ptrs;  // per layer: streamed experts' device blocks
  std::vector<Device::HostCopy> expert_copies;           // a layer's batch of expert copies (reused)
  std::vector<char> taken;                               // a stream slot's expert places in use (reused)
  std::vector<float> inverted;                           // RuntimeOptions::guess_test (reused)
  RuntimeGuesses guesses;                                // speculative expert prefetch so far
};

namespace {

constexpr uint64_t kAlign = 256;
uint64_t align_up(uint64_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

const ArenaRegion* region(const Plan& p, const char* name) {
  for (const auto& r : p.arena)
    if (r.name == name) return &r;
  return nullptr;
}

Queue queue_of(Resource r) {
  switch (r) {
    case Resource::GpuCompute:
      return Queue::Compute;
    case Resource::H2D:
      return Queue::H2D;
    case Resource::D2H:
      return Queue::D2H;
    case Resource::H2DAct:
      return Queue::H2DAct;
    case Resource::Cpu:
      break;
  }
  return Queue::Compute;
}

}  // namespace

void push_expert_copies(std::vector<Device::HostCopy>& out, uint8_t* blk, const ShardLayout& L, const TensorView& g,
                        const TensorView& u, const TensorView& d) {
  struct Part {
    uint8_t* dev;
    const void* host;
    uint64_t bytes;
  };
  Part p[3] = {{blk, g.data, g.nbytes},
               {blk + L.expert_up_offset, u.data, u.nbytes},
               {blk + L.expert_down_offset, d.data, d.nbytes}};
  auto single = [&](int i) { out.push_back({p[i].dev, p[i].host, p[i].bytes}); };
  std::sort(p, p + 3, [](const Part& a, const Part& b) { return a.dev < b.dev; });
  auto at = [](const void* q) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(q)); };
  // Parts i..j (consecutive in the place) as one strided copy: one size, one host and one place distance,
  // each at least the size (rows that do not overlap).
  auto joins = [&](int i, int j) {
    const int64_t w = static_cast<int64_t>(p[i].bytes);
    const int64_t hp = at(p[i + 1].host) - at(p[i].host), dp = p[i + 1].dev - p[i].dev;
    if (hp < w || dp < w) return false;
    for (int k = i + 1; k <= j; ++k)
      if (static_cast<int64_t>(p[k].bytes) != w || at(p[k].host) - at(p[k - 1].host) != hp ||
          p[k].dev - p[k - 1].dev != dp)
        return false;
    return true;
  };
  auto rows = [&](int i, int j) {
    out.push_back({p[i].dev, p[i].host, p[i].bytes, static_cast<uint64_t>(j - i + 1),
                   static_cast<uint64_t>(at(p[i + 1].host) - at(p[i].host)),
                   static_cast<uint64_t>(p[i + 1].dev - p[i].dev)});
  };
  if (joins(0, 2)) {
    rows(0, 2);
  } else if (joins(0, 1)) {
    rows(0, 1);
    single(2);
  } else if (joins(1, 2)) {
    single(0);
    rows(1, 2);
  } else {
    for (int i = 0; i < 3; ++i) single(i);
  }
}

namespace {
// push_expert_copies of layer 0's expert 0, whose merged gate, up and down tensors are g, u and d (their
// data only located, never read), into the planner's layout of that layer's FFN.
int count_expert_copies(const ModelSpec& spec, const TensorDtypes* dtypes, const TensorView& g, const TensorView& u,
                        const TensorView& d) {
  const ShardSet shards = make_shards(spec, 1, DType::F32, dtypes);
  const std::vector<ShardLayout> layouts = shard_layouts(spec, shards, dtypes);
  if (shards.ffn.empty()) return 3;
  std::vector<Device::HostCopy> copies;
  uint8_t* place = reinterpret_cast<uint8_t*>(uintptr_t{1} << 40);  // a place, never written
  push_expert_copies(copies, place, layouts.at(static_cast<size_t>(shards.ffn[0])), g.slice(0), u.slice(0), d.slice(0));
  return static_cast<int>(copies.size());
}
}  // namespace

int expert_copies_of(const WeightSource& source) {
  const ModelSpec& spec = source.spec();
  if (!spec.is_moe()) return 3;
  const TensorDtypes dtypes = tensor_dtypes_of(source);
  return count_expert_copies(spec, &dtypes, source.tensor("blk.0.ffn_gate_exps.weight"),
                             source.tensor("blk.0.ffn_up_exps.weight"), source.tensor("blk.0.ffn_down_exps.weight"));
}

int synthetic_expert_copies(const ModelSpec& spec) {
  if (!spec.is_moe()) return 3;
  const std::map<std::string, uint64_t> at = synthetic_tensor_offsets(spec);
  TensorView v[3];
  const char* names[3] = {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"};
  for (const TensorDesc& t : spec.tensors())
    for (int i = 0; i < 3; ++i)
      if (t.name == names[i]) {
        v[i].dtype = t.dtype;
        v[i].shape = t.shape;
        v[i].nbytes = t.bytes;
        v[i].data = reinterpret_cast<const void*>((uintptr_t{1} << 44) + at.at(t.name));  // located, never read
      }
  for (const TensorView& t : v)
    SW_CHECK(t.data != nullptr, "synthetic_expert_copies: ", spec.name, " has no layer-0 experts");
  return count_expert_copies(spec, nullptr, v[0], v[1], v[2]);
}

namespace {

// Host weights stay where the source keeps them (a file mapping, the synthetic source's memory); they
// are pinned in place so copies run at full PCIe speed. Tensors are merged into maximal contiguous page
// ranges (one registration per run of tensors, not per tensor), registered in pieces of at most 1 GiB:
// each piece is one bounded wait (a driver call that never returns ends the run with an error naming
// it) and one step of the progress shown on a terminal.
void pin_host_weights(const WeightSource& source, Device& device) {
  constexpr uint64_t kPage = 4096, kPiece = 1ull << 30;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& kv : source.tensors()) {
    const uint64_t b = reinterpret_cast<uint64_t>(kv.second.data);
    ranges.push_back({b / kPage * kPage, (b + kv.second.nbytes + kPage - 1) / kPage * kPage});
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  uint64_t total = 0;
  for (const auto& r : merged) total += r.second - r.first;
  Phase phase(str_cat("pinning ", format_bytes(total), " of host weights"));
  uint64_t done = 0;
  for (const auto& r : merged)
    for (uint64_t at = r.first; at < r.second; at += kPiece) {
      const uint64_t bytes = std::min(kPiece, r.second - at);
      const StallGuard guard(
          str_cat("pinning ", format_bytes(bytes), " of host weights of ", source.origin()), 120,
          "if pinning hangs on this system, give --no-pin-weights: copies then run from pageable memory");
      device.pin_host(reinterpret_cast<const void*>(at), bytes, HostAccess::ReadOnly);
      done += bytes;
      phase.note(str_cat(format_bytes(done), " of ", format_bytes(total)));
    }
}

}  // namespace

// The activations' host staging (Buffers), sized for the largest tier and pinned, and the host KV cache,
// pinned too where a plan copies its rows.
void Runtime::set_up_host_staging() {
  Buffers& b = *buf_;
  for (const auto& t : table_.tiers) b.max_tokens = std::max(b.max_tokens, t.tokens);
  b.max_tokens = std::max<int64_t>(1, b.max_tokens);
  const int64_t n = b.max_tokens, L = spec_.num_hidden_layers, E = spec_.is_moe() ? spec_.num_experts : 0;
  b.max_rows = std::min<int64_t>(n, slots_);  // logits rows: one per sequence of a step
  const uint64_t sizes[6] = {static_cast<uint64_t>(n * spec_.hidden_size),
                             static_cast<uint64_t>(n * (spec_.q_dim() + 2 * spec_.kv_dim())),
                             static_cast<uint64_t>(n * spec_.q_dim()),
                             static_cast<uint64_t>(b.max_rows * spec_.vocab_size),
                             static_cast<uint64_t>(weights_.output_norm.size()),
                             static_cast<uint64_t>(E > 0 ? n * spec_.hidden_size : 0)};
  auto floats = [](uint64_t count) { return (count + 63) / 64 * 64; };  // 256-byte aligned parts
  bool guesses = false;  // a plan prefetches experts on a guess (plan.h router_next)
  for (const auto& t : table_.tiers)
    for (const auto& p : t.candidates)
      if (p.feasible)
        for (const Action& a : p.actions) guesses = guesses || a.payload == Payload::RouterGuess;
  uint64_t total = 0;
  for (uint64_t c : sizes) total += floats(c);
  total += static_cast<uint64_t>(guesses ? 2 * L : L) * floats(static_cast<uint64_t>(n * E));
  b.staging = HostBuffer(total * sizeof(float));
  float* p = reinterpret_cast<float*>(b.staging.data());
  float** parts[6] = {&b.x, &b.qkv, &b.attn, &b.logits, &b.out_norm_f32, &b.partial};
  for (int i = 0; i < 6; ++i) {
    *parts[i] = p;
    p += floats(sizes[i]);
  }
  b.router.assign(static_cast<size_t>(L), nullptr);
  b.guess.assign(static_cast<size_t>(L), nullptr);
  for (int64_t l = 0; E > 0 && l < L; ++l) {
    b.router[static_cast<size_t>(l)] = p;
    p += floats(static_cast<uint64_t>(n * E));
    if (guesses) {
      b.guess[static_cast<size_t>(l)] = p;
      p += floats(static_cast<uint64_t>(n * E));
    }
  }
  std::copy(weights_.output_norm.begin(), weights_.output_norm.end(), b.out_norm_f32);
  device_.pin_host(b.staging.data(), b.staging.size());
  b.pinned_by = &device_;
  // The host KV cache: pinned too where a plan copies its rows (a staged attention).
  host_kv_ = std::make_unique<KvCache>(spec_, table_.ctx, kv_dtype_);
  bool stages = false;
  for (const auto& t : table_.tiers)
    for (const auto& p : t.candidates)
      if (p.feasible)
        for (const Action& a : p.actions)
          stages = stages || a.payload == Payload::KvPast || a.payload == Payload::KvNew;
  if (stages && host_kv_->bytes() > 0) {
    device_.pin_host(host_kv_->k(0), host_kv_->bytes());
    b.kv_pinned = host_kv_->k(0);
    b.kv_pinned_bytes = host_kv_->bytes();
  }
}

Runtime::Runtime(const WeightSource& source, const ModelWeights& weights, Device& device, ThreadPool& pool,
                 PlanTable table, const RuntimeOptions& options)
    : source_(source),
      weights_(weights),
      device_(device),
      pool_(pool),
      table_(std::move(table)),
      options_(options),
      spec_(source.spec()),
      cpu_(source.spec(), source.rope_style(), pool),
      buf_(std::make_unique<Buffers>()) {
  SW_CHECK(table_.version == kPlanFormatVersion, "plan table version ", table_.version, " is not supported");
  SW_CHECK(!table_.tiers.empty(), "the plan table has no tiers");
  slots_ = options_.slots;
  slot_capacity_ = slots_ >= 1 ? table_.ctx / slots_ : 0;
  SW_CHECK(slots_ >= 1 && slot_capacity_ >= 1, "a context of ", table_.ctx, " tokens cannot be shared by ", slots_,
           " slots");
  n_past_.assign(static_cast<size_t>(slots_), 0);
  dtypes_ = tensor_dtypes_of(source);
  for (const auto& kv : dtypes_)
    if (!device_.supports_dtype(kv.second))
      fail(source.origin(), ": tensor ", kv.first, " is ", dtype_name(kv.second), ", which the ", device_.kind(),
           " device cannot compute with yet (use --device cpu, or a file of f16, q8_0 or q4_0 weights)");
  kv_dtype_ = parse_dtype(table_.kv_dtype);
  if (!device_.supports_kv_dtype(kv_dtype_))
    fail("the ", device_.kind(), " device keeps the KV cache in f32 only, and the plan table's is ", table_.kv_dtype,
         " (plan with --kv-dtype f32, or run on --device cpu)");
  shards_ = make_shards(spec_, table_.ctx, kv_dtype_, &dtypes_);
  layouts_ = shard_layouts(spec_, shards_, &dtypes_);
  // The table must describe this model's shards and keep the planner's rules (a file may not), then
  // what this executor needs of each plan.
  verify_plan_table(table_, spec_, shards_, plan_origin());
  for (const auto& tier : table_.tiers)
    for (const Plan& p : tier.candidates)
      if (p.feasible) validate_plan(p);
  if (options_.schedule) require_feasible(*options_.schedule);
  if (options_.pin_host_weights) pin_host_weights(source, device_);
  // The activations' host staging, pinned like the weights (before the arena: pinning costs the
  // driver device memory for page tables).
  set_up_host_staging();
  device_.set_pcie_cap(options_.pcie_cap_bytes_per_s);
  // The kernels' host staging is part of the set-up (pinned host memory costs the driver device
  // page tables); after the arena nothing else may take device memory.
  {
    const Phase phase("setting up the device's kernels");
    const StallGuard guard("setting up the device's kernels (module loads, cuBLAS)", 300);
    kernels_ = &device_.kernels(spec_, source.rope_style());
    kernels_->set_kv_dtype(kv_dtype_);
  }
  {
    const Phase phase(str_cat("allocating the ", format_bytes(table_.budget_bytes), " arena"));
    const StallGuard guard(str_cat("allocating the ", format_bytes(table_.budget_bytes), " arena on the device"), 120);
    arena_ = device_.allocate_arena(table_.budget_bytes);
  }
  cpu_.set_kv_capacity(host_kv_->capacity());  // the CPU blocks here only see host caches
  cpu_.set_kv_dtype(kv_dtype_);
  buf_->routing.resize(static_cast<size_t>(spec_.num_hidden_layers));
  buf_->split.resize(static_cast<size_t>(spec_.num_hidden_layers));
  buf_->expert_ptrs.resize(static_cast<size_t>(spec_.num_hidden_layers));
  trace_ = std::getenv("SHARDWISE_TRACE_ACTIONS") != nullptr;
  // Load time, not the first step: upload what the decode plan pins (other tiers' plans pin a prefix
  // of the same canonical order, or are baselines with their own layout).
  int64_t chunk = 0;
  const Plan& first = plan_for(1, &chunk);
  if (first.feasible) {
    ensure_resident(first);
    device_.synchronize();
  }
}

Runtime::~Runtime() {
  try {
    device_.synchronize();
  } catch (...) {
  }
}

RuntimeGuesses Runtime::guesses() const {
  return buf_->guesses;
}

// RuntimeOptions::guess_test: logits [n, experts] whose top_k per token are the lowest of `g` (Lowest), or
// the first half of g's top_k and the rest of its lowest (Mixed), written into `out`.
const float* Runtime::test_guess(const float* g, int64_t n, std::vector<float>& out) const {
  const int64_t E = spec_.num_experts, k = spec_.num_experts_per_tok;
  out.assign(static_cast<size_t>(n * E), -1e30f);
  std::vector<float> neg(static_cast<size_t>(n * E));
  for (int64_t i = 0; i < n * E; ++i) neg[static_cast<size_t>(i)] = -g[i];
  const MoeRouting top = route_tokens(g, n, E, k, false), low = route_tokens(neg.data(), n, E, k, false);
  const int64_t from_top = options_.guess_test == RuntimeOptions::GuessTest::Mixed ? (k + 1) / 2 : 0;
  for (int64_t t = 0; t < n; ++t) {
    float* row = out.data() + t * E;
    int64_t placed = 0;
    for (int64_t j = 0; j < from_top; ++j)
      row[top.expert_ids[static_cast<size_t>(t * k + j)]] = 1e3f - static_cast<float>(placed++);
    for (int64_t j = 0; placed < k && j < k; ++j) {
      float& v = row[low.expert_ids[static_cast<size_t>(t * k + j)]];
      if (v < 0) v = 1e3f - static_cast<float>(placed++);
    }
  }
  return out.data();
}

void Runtime::record_timeline(int runs) {
  SW_CHECK(runs >= 0, "runtime: record_timeline of ", runs, " runs");
  timeline_.clear();
  options_.timeline_first = plan_runs_;
  options_.timeline_runs = runs;
}

void Runtime::set_n_past(int64_t n) {
  SW_CHECK(n >= 0 && n <= slot_capacity_, "position ", n, " outside the context of ", slot_capacity_);
  n_past_[0] = n;
}

void Runtime::fill_host_cache(int64_t n, uint64_t seed) {
  SW_CHECK(n >= 0 && n <= table_.ctx, "fill_host_cache: ", n, " positions outside the context of ", table_.ctx);
  const std::vector<bool>& on_gpu = kv_fixed_ ? kv_on_gpu_ : kv_placement(options_.schedule);
  // A seeded 256 KiB pattern copied over every host-resident cache (gigabytes at a 16K context: copies
  // of a pattern run at memory speed, where generating every value would cost seconds per runtime).
  std::vector<float> pattern(65536);
  uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull;
  for (float& v : pattern) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<float>(static_cast<int64_t>(x >> 40) - (int64_t(1) << 23)) / static_cast<float>(int64_t(1) << 23);
  }
  // The pattern in the cache's element type, copied in units of its blocks (elements of a float type;
  // a q8_0 cache's rows are whole blocks): eb bytes each.
  const int64_t be = dtype_block_elems(kv_dtype_), eb = dtype_block_bytes(kv_dtype_);
  std::vector<uint8_t> stored(static_cast<size_t>(dtype_row_bytes(kv_dtype_, static_cast<int64_t>(pattern.size()))));
  quantize_row(kv_dtype_, pattern.data(), stored.data(), static_cast<int64_t>(pattern.size()));
  const int64_t L = spec_.num_hidden_layers, units = n * spec_.kv_dim() / be;
  const int64_t P = static_cast<int64_t>(pattern.size()) / be, pieces = (units + P - 1) / P;
  pool_.parallel_for(2 * L * pieces, 1, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t half = i / pieces, piece = i % pieces, layer = half / 2;
      if (static_cast<size_t>(layer) < on_gpu.size() && on_gpu[static_cast<size_t>(layer)]) continue;
      uint8_t* p = static_cast<uint8_t*>(half % 2 ? host_kv_->v(layer) : host_kv_->k(layer)) + piece * P * eb;
      // Shifted by the layer and side, so that K and V of different layers differ.
      const int64_t shift = (half * 4099) % P, len = std::min(P, units - piece * P);
      for (int64_t j = 0; j < len;) {
        const int64_t from = (shift + j) % P, run = std::min(len - j, P - from);
        std::memcpy(p + j * eb, stored.data() + from * eb, static_cast<size_t>(run * eb));
        j += run;
      }
    }
  });
}

RuntimeMemory Runtime::memory() {
  RuntimeMemory m;
  m.budget_bytes = table_.budget_bytes;
  m.arena_peak_bytes = arena_peak_;
  m.device_peak_bytes = device_.device_peak_bytes();
  m.context_bytes = device_.context_bytes();
  m.uploaded_bytes = uploaded_;
  return m;
}

void Runtime::require_feasible(Schedule s) const {
  bool any = false;
  for (const auto& tier : table_.tiers) {
    const Plan* p = tier.find(s);
    any = any || (p && p->feasible);
  }
  SW_CHECK(any, "--schedule ", schedule_name(s), " has no feasible plan at any tier for this budget");
}

const std::vector<bool>& Runtime::kv_placement(std::optional<Schedule> schedule) const {
  for (const auto& tier : table_.tiers) {
    const Plan* p = schedule ? tier.find(*schedule) : (tier.feasible ? &tier.chosen_plan() : nullptr);
    if (p && p->feasible) return p->kv_on_gpu;
  }
  return table_.kv_on_gpu;
}

bool Runtime::keeps_kv_as(std::optional<Schedule> schedule) const {
  return kv_placement(schedule) == (kv_fixed_ ? kv_on_gpu_ : kv_placement(options_.schedule));
}

void Runtime::set_schedule(std::optional<Schedule> schedule) {
  if (schedule) require_feasible(*schedule);
  SW_CHECK(keeps_kv_as(schedule), "runtime: the ", schedule ? schedule_name(*schedule) : "table's",
           " plans keep the KV "
           "cache elsewhere than this runtime does; set up another runtime for them");
  options_.schedule = schedule;
  arena_peak_ = 0;
  uploaded_ = 0;
}

const Plan& Runtime::plan_for(int64_t n, int64_t* chunk) const {
  if (!options_.schedule) {
    const TierEntry& e = table_.lookup(n);
    *chunk = e.tokens;
    return e.chosen_plan();
  }
  // A forced schedule: the smallest tier >= n where it is feasible, else its largest feasible tier.
  const Plan* best = nullptr;
  const Plan* largest = nullptr;
  for (const auto& t : table_.tiers) {
    const Plan* p = t.find(*options_.schedule);
    if (!p || !p->feasible) continue;
    if (t.tokens >= n && !best) best = p;
    largest = p;
  }
  const Plan* p = best ? best : largest;
  SW_CHECK(p != nullptr, "schedule ", schedule_name(*options_.schedule), " has no feasible plan");
  *chunk = p->tier;
  return *p;
}

void Runtime::step_batch(const std::vector<SeqStep>& seqs) {
  const std::vector<StepSegment> segs = step_segments(seqs, slots_, slot_capacity_, n_past_, spec_.vocab_size);
  std::vector<int32_t> tokens;
  for (const SeqStep& q : seqs) tokens.insert(tokens.end(), q.tokens, q.tokens + q.n);
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<float> rows;  // the step's input rows, when a sequence brings its own
  if (step_has_embeddings(seqs)) rows = step_input_rows(seqs, weights_.token_embd, spec_.hidden_size);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<Phase> first;  // the first step uploads the pinned shards: a phase of the set-up
  if (steps_.empty()) first.emplace(str_cat("the first step (", n, " tokens)"));
  int64_t chunk = 0;
  const Plan& plan = plan_for(n, &chunk);
  int64_t chunks = 0;
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t m = std::min(chunk, n - i);
    // The sequences' parts in tokens [i, i + m); a sequence whose last token is here gets its logits.
    std::vector<StepSegment> part;
    std::vector<float*> logits;
    for (size_t k = 0; k < segs.size(); ++k) {
      const StepSegment& g = segs[k];
      const int64_t a = std::max(g.t0, i), b = std::min(g.t0 + g.n, i + m);
      if (a >= b) continue;
      part.push_back({a - i, b - a, g.pos0 + (a - g.t0), g.row0, g.rope_pos3 ? g.rope_pos3 + 3 * (a - g.t0) : nullptr});
      logits.push_back(b == g.t0 + g.n ? seqs[k].logits : nullptr);
    }
    run_plan(plan, tokens.data() + i, part, logits, rows.empty() ? nullptr : rows.data() + i * spec_.hidden_size);
    ++chunks;
  }
  for (const SeqStep& q : seqs) n_past_[static_cast<size_t>(q.slot)] += q.n;
  RuntimeStep st;
  st.tokens = n;
  st.tier = plan.tier;
  st.chunks = chunks;
  st.schedule = plan.schedule;
  st.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  steps_.push_back(st);
}

int64_t Runtime::n_past_of(int slot) const {
  SW_CHECK(slot >= 0 && slot < slots_, "slot ", slot, " is outside the runtime's ", slots_, " slots");
  return n_past_[static_cast<size_t>(slot)];
}

// The caches (host and device) are indexed by position: dropping a suffix is moving n_past back.
void Runtime::truncate_slot(int slot, int64_t n_past) {
  SW_CHECK(n_past >= 0 && n_past <= n_past_of(slot), "truncate: position ", n_past, " outside the ", n_past_of(slot),
           " cached positions");
  n_past_[static_cast<size_t>(slot)] = n_past;
}

namespace {

// The stream slots and the host caches' staging region of a plan, where it has them.
struct PlanRegions {
  const ArenaRegion* slot[2] = {nullptr, nullptr};
  const ArenaRegion* staging = nullptr;
};

// Every arena region and every placement in VRAM lies inside the budget; a streamed shard names a slot.
PlanRegions check_placements(const Plan& p, const std::string& where, uint64_t budget, int64_t n_shards) {
  auto inside = [budget](uint64_t off, uint64_t bytes) { return off <= budget && bytes <= budget - off; };
  PlanRegions regions;
  for (const ArenaRegion& r : p.arena) {
    SW_CHECK(inside(r.offset, r.bytes), where, ": arena region '", r.name, "' at ", r.offset, " (", r.bytes,
             " bytes) lies outside the budget of ", budget, " bytes");
    if (r.name == "slot0") regions.slot[0] = &r;
    if (r.name == "slot1") regions.slot[1] = &r;
    if (r.name == "kv staging") regions.staging = &r;
  }
  for (size_t i = 0; i < p.placements.size(); ++i) {
    const ShardPlacement& sp = p.placements[i];
    SW_CHECK(sp.shard == static_cast<int>(i), where, ": placement ", i, " is of shard ", sp.shard,
             " (placements are listed by shard id, this model has ", n_shards, ")");
    if (sp.arena_offset < 0) continue;
    if (sp.home == WeightHome::Pinned) {  // pinned weights, or a layer's KV cache in VRAM
      SW_CHECK(inside(static_cast<uint64_t>(sp.arena_offset), sp.bytes), where, ": shard ", sp.name,
               " at arena offset ", sp.arena_offset, " (", sp.bytes, " bytes) lies outside the budget of ", budget,
               " bytes");
    } else if (sp.streamed) {
      // Copied into a stream slot: its offset is the slot's. Its bytes may exceed the slot (the LM head
      // goes in row pieces, a routed MoE FFN copies only the experts it touches); each copy is checked.
      const ArenaRegion* slot = nullptr;
      for (const ArenaRegion* r : regions.slot)
        if (r && static_cast<uint64_t>(sp.arena_offset) == r->offset) slot = r;
      SW_CHECK(slot != nullptr, where, ": streamed shard ", sp.name, " names arena offset ", sp.arena_offset,
               ", which is no stream slot's");
    }
  }
  return regions;
}

// A speculative copy (the guessed experts of a layer; of a split layer, the GPU's share of them) follows
// its layer's guess, and the layer's own copy follows it.
void check_speculative(const Plan& p, const Action& a, const std::string& act, const ModelSpec& spec,
                       const ShardSet& shards) {
  SW_CHECK(
      a.kind == ActionKind::CopyWeights && spec.is_moe() && a.shard >= 0 && shards.at(a.shard).kind == ShardKind::Ffn,
      act, ": only an MoE FFN's experts are copied on a guess");
  bool guessed = false;
  for (int d : a.deps) {
    const Action& g = p.actions[static_cast<size_t>(d)];
    guessed = guessed || (g.payload == Payload::RouterGuess && g.layer == a.layer);
  }
  SW_CHECK(guessed, act, ": a speculative copy depends on its layer's guessed router logits (router_guess)");
  // The layer's own copy follows into the same slot and waits for this one (it fills in the misses).
  int own = 0;
  for (const Action& b : p.actions)
    if (b.id > a.id && b.kind == ActionKind::CopyWeights && !b.speculative && b.shard == a.shard &&
        std::find(b.deps.begin(), b.deps.end(), a.id) != b.deps.end())
      own += b.slot == a.slot ? 1 : 1000;
  SW_CHECK(own == 1, act,
           ": a speculative copy is followed by exactly one copy of the same shard into the same slot "
           "that depends on it (the routed experts it missed)");
}

// An MoE layer split between CPU and GPU: one CPU share, one GPU share, one partial copied up and added,
// all of the same c, as its experts' copy (else experts would be computed twice or not at all).
void check_splits(const Plan& p, const std::string& where, const ShardSet& shards, int64_t L) {
  struct Split {
    int cpu = 0, gpu = 0, partial = 0, add = 0, c = -1;  // c: the cpu_experts its shares and expert copy name
    bool same_c = true;
  };
  std::vector<Split> splits(static_cast<size_t>(L));
  for (const Action& a : p.actions) {
    if (a.layer < 0 || a.layer >= L) continue;
    Split& sp = splits[static_cast<size_t>(a.layer)];
    sp.cpu += a.part == ComputePart::MoeCpuShare;
    sp.gpu += a.part == ComputePart::MoeGpuShare;
    sp.partial += a.payload == Payload::MoePartial;
    sp.add += a.part == ComputePart::MoeShareAdd;
    const bool names_c =
        a.part == ComputePart::MoeCpuShare || a.part == ComputePart::MoeGpuShare ||
        a.part == ComputePart::MoeShareAdd ||
        (a.kind == ActionKind::CopyWeights && a.shard >= 0 && shards.at(a.shard).kind == ShardKind::Ffn);
    if (!names_c) continue;
    if (sp.c < 0) sp.c = a.cpu_experts;
    sp.same_c = sp.same_c && a.cpu_experts == sp.c;
  }
  for (int64_t l = 0; l < L; ++l) {
    const Split& sp = splits[static_cast<size_t>(l)];
    if (sp.cpu + sp.gpu + sp.partial + sp.add == 0) continue;
    SW_CHECK(
        sp.cpu == 1 && sp.gpu == 1 && sp.partial == 1 && sp.add == 1, where, ": layer ", l, " splits its experts with ",
        sp.cpu, " CPU share(s), ", sp.gpu, " GPU share(s), ", sp.partial, " partial copy(ies) and ", sp.add,
        " add(s): a split layer has one of each (a plan saved before the GPU share ran beside the CPU's: plan again)");
    SW_CHECK(sp.same_c, where, ": layer ", l,
             "'s shares and expert copy name different cpu_experts: they must split the same way");
  }
}

}  // namespace

// Everything a plan indexes or sizes is checked against this model and budget before any step runs
// (a plan file is input: a row range, offset or slot out of range must be an error, not a read
// outside the arena). The JSON reader has checked ids, dependency order and field types.
void Runtime::validate_plan(const Plan& p) const {
  const std::string where = str_cat(plan_origin(), ": the ", schedule_name(p.schedule), " plan of tier ", p.tier);
  const int64_t n_shards = static_cast<int64_t>(shards_.shards.size()), L = spec_.num_hidden_layers;
  const PlanRegions regions = check_placements(p, where, table_.budget_bytes, n_shards);
  SW_CHECK(static_cast<int64_t>(p.kv_on_gpu.size()) == L, where, ": kv_on_gpu names ", p.kv_on_gpu.size(),
           " layers, this model has ", L);
  const TensorView& head = source_.tensor(spec_.tie_word_embeddings ? "token_embd.weight" : "output.weight");
  for (const Action& a : p.actions) validate_action(p, a, where, regions.slot, regions.staging, head);
  check_splits(p, where, shards_, L);
  if (slots_ > 1 && schedule_is_candidate(p.schedule)) {  // a logits row per sequence ending in a step
    const ArenaRegion* scratch = region(p, "scratch");
    const uint64_t need = executor_traits(spec_, 3, slots_).scratch_bytes(p.tier);
    SW_CHECK(scratch && scratch->bytes >= need, where, ": its scratch (", scratch ? scratch->bytes : 0,
             " bytes) has no room for the logits of ", slots_, " sequences (", need,
             " bytes): plan it for as many (serve --parallel)");
  }
}

void Runtime::validate_action(const Plan& p, const Action& a, const std::string& where,
                              const ArenaRegion* const slot_region[2], const ArenaRegion* staging,
                              const TensorView& head) const {
  const int64_t n_shards = static_cast<int64_t>(shards_.shards.size()), L = spec_.num_hidden_layers;
  const std::string act = str_cat(where, ": action ", a.id, " (", a.label, ")");
  SW_CHECK(a.shard >= -1 && a.shard < n_shards, act, " names shard ", a.shard, " of ", n_shards);
  SW_CHECK(a.layer >= -1 && a.layer < L, act, " names layer ", a.layer, " of ", L);
  SW_CHECK(a.slot >= -1 && a.slot <= 1, act, " names stream slot ", a.slot, " (0 or 1)");
  const bool stages = a.part == ComputePart::AttnStaged || a.payload == Payload::KvPast || a.payload == Payload::KvNew;
  if (stages) {  // a host cache staged on the device: its layer's KV on the host, the region for K and V twice
    SW_CHECK(a.layer >= 0 && !p.kv_on_gpu[static_cast<size_t>(a.layer)], act, " stages the host cache of layer ",
             a.layer, ", which the plan keeps in VRAM");
    const uint64_t need = 4 * static_cast<uint64_t>(table_.ctx) * dtype_row_bytes(kv_dtype_, spec_.kv_dim());
    SW_CHECK(staging && staging->bytes >= need, act, " stages a host cache, but the plan's 'kv staging' region has ",
             staging ? staging->bytes : 0, " of the ", need, " bytes it needs");
  }
  const bool share =
      a.part == ComputePart::MoeCpuShare || a.part == ComputePart::MoeGpuShare || a.part == ComputePart::MoeShareAdd;
  if (share || a.cpu_experts > 0) {  // an MoE layer split between CPU and GPU
    SW_CHECK(spec_.is_moe() && a.shard >= 0 && shards_.at(a.shard).kind == ShardKind::Ffn, act,
             " splits experts of a shard that is no MoE FFN");
    SW_CHECK(a.cpu_experts >= 1 && a.cpu_experts < spec_.num_experts_per_tok, act, ": cpu_experts ", a.cpu_experts,
             " must be 1 .. ", spec_.num_experts_per_tok - 1, " (of the model's ", spec_.num_experts_per_tok,
             " per token)");
    SW_CHECK(a.part != ComputePart::MoeCpuShare || a.resource == Resource::Cpu, act, ": a CPU share runs on the CPU");
    SW_CHECK(a.part != ComputePart::MoeGpuShare || a.resource == Resource::GpuCompute, act,
             ": a GPU share runs on the GPU");
    SW_CHECK(a.part != ComputePart::MoeShareAdd || a.resource == Resource::GpuCompute, act,
             ": a CPU share is added on the GPU");
  }
  SW_CHECK(a.payload != Payload::MoePartial ||
               (spec_.is_moe() && (a.resource == Resource::H2DAct || a.resource == Resource::H2D)),
           act, ": an MoE share goes up to the GPU, in a model with experts");
  if (a.part == ComputePart::RouterNext)
    SW_CHECK(spec_.is_moe() && a.kind == ActionKind::Compute && a.resource == Resource::GpuCompute && a.shard >= 0 &&
                 shards_.at(a.shard).kind == ShardKind::Attention && a.layer == shards_.at(a.shard).layer,
             act,
             ": a guess at a layer's routing runs on the GPU with that layer's attention shard (its router), in a "
             "model with experts");
  if (a.payload == Payload::RouterGuess)
    SW_CHECK(spec_.is_moe() && a.resource == Resource::D2H && a.layer >= 0, act,
             ": guessed router logits go to the host");
  if (a.speculative) check_speculative(p, a, act, spec_, shards_);
  if (a.row_end > a.row_begin) {  // a piece of the LM head, in a stream slot
    SW_CHECK(a.shard >= 0 && shards_.at(a.shard).kind == ShardKind::Output && a.row_end <= spec_.vocab_size, act,
             " streams rows [", a.row_begin, ", ", a.row_end, ") of the LM head's ", spec_.vocab_size);
    const uint64_t piece = static_cast<uint64_t>(a.row_end - a.row_begin) * head.row_bytes();
    SW_CHECK(a.slot >= 0 && slot_region[a.slot] && piece <= slot_region[a.slot]->bytes, act, ": its ", piece,
             " bytes of LM head rows do not fit a stream slot of the plan");
  }
}

void Runtime::check_region(const uint8_t* p, uint64_t bytes, const char* what) const {
  SW_CHECK(p >= arena_ && p + bytes <= arena_ + table_.budget_bytes, "runtime: ", what, " (", bytes,
           " bytes) falls outside the arena: the plan does not fit its budget");
}

const uint8_t* Runtime::host_tensor(const std::string& name, uint64_t* bytes) const {
  const TensorView& v = source_.tensor(name);
  *bytes = v.nbytes;
  return static_cast<const uint8_t*>(v.data);
}

// Copies a shard's tensors (or rows [row0, row1) of the LM head) into device memory at dst, laid out
// as shard_layout says. Vectors go as f32 (from the arranged weights).
void Runtime::copy_shard(const Shard& s, uint8_t* dst, int64_t row0, int64_t row1) {
  try {
    copy_shard_tensors(s, dst, row0, row1);
  } catch (const Error& e) {
    fail("uploading shard ", s.name(), " to arena offset ", static_cast<long long>(dst - arena_), ": ", e.what());
  }
}

void Runtime::copy_shard_tensors(const Shard& s, uint8_t* dst, int64_t row0, int64_t row1) {
  const ShardLayout& L = layouts_[static_cast<size_t>(s.id)];
  for (const ShardTensorPlace& t : L.tensors) {
    const TensorView& src = source_.tensor(t.name);
    if (t.shape.size() <= 1) {
      if (row1 > row0) continue;  // a piece of the LM head carries only rows (its norm goes to scratch)
      // Norm vectors: the f32 copies arranged at load time.
      const float* f = nullptr;
      const std::string& n = t.name;
      if (n == "output_norm.weight")
        f = weights_.output_norm.data();
      else {
        const int layer = s.layer;
        const LayerWeights& lw = weights_.layers.at(static_cast<size_t>(layer));
        if (n.find("attn_q.bias") != std::string::npos)
          f = lw.q_bias.data();
        else if (n.find("attn_k.bias") != std::string::npos)
          f = lw.k_bias.data();
        else if (n.find("attn_v.bias") != std::string::npos)
          f = lw.v_bias.data();
        else if (n.find("attn_norm") != std::string::npos)
          f = lw.attn_norm.data();
        else if (n.find("attn_q_norm") != std::string::npos)
          f = lw.q_norm.data();
        else if (n.find("attn_k_norm") != std::string::npos)
          f = lw.k_norm.data();
        else if (n.find("ffn_norm") != std::string::npos)
          f = lw.ffn_norm.data();
      }
      SW_CHECK(f != nullptr, "runtime: no f32 copy of ", n);
      device_.copy_h2d(dst + t.offset, f, t.bytes);
      continue;
    }
    if (row1 > row0) {  // a piece of the LM head: only its rows, at the start of the slot
      if (t.name == "output.weight" || (spec_.tie_word_embeddings && t.name == "token_embd.weight")) {
        const uint64_t rb = src.row_bytes();
        device_.copy_h2d(dst, src.row(row0), static_cast<uint64_t>(row1 - row0) * rb);
      }
      continue;
    }
    SW_CHECK(src.nbytes == t.bytes, "runtime: tensor ", t.name, " has ", src.nbytes, " bytes, the layout expects ",
             t.bytes);
    device_.copy_h2d(dst + t.offset, src.data, t.bytes);
  }
  if (L.n_experts > 0 && row1 <= row0) {  // all experts (pinned MoE FFN): expert by expert
    const std::string p = "blk." + std::to_string(s.layer) + ".";
    const TensorView& g = source_.tensor(p + "ffn_gate_exps.weight");
    const TensorView& u = source_.tensor(p + "ffn_up_exps.weight");
    const TensorView& d = source_.tensor(p + "ffn_down_exps.weight");
    for (int64_t e = 0; e < L.n_experts; ++e) {
      const TensorView ge = g.slice(e), ue = u.slice(e), de = d.slice(e);
      uint8_t* base = dst + L.expert_base + static_cast<uint64_t>(e) * L.expert_stride;
      device_.copy_h2d(base, ge.data, ge.nbytes);
      device_.copy_h2d(base + L.expert_up_offset, ue.data, ue.nbytes);
      device_.copy_h2d(base + L.expert_down_offset, de.data, de.nbytes);
    }
  }
}

void Runtime::ensure_resident(const Plan& plan) {
  // Whatever this plan uses as slots or scratch no longer holds pinned weights afterwards.
  for (const auto& r : plan.arena) {
    if (r.name == "pinned" || r.name == "kv") continue;
    for (auto it = resident_.begin(); it != resident_.end();) {
      const uint64_t off = static_cast<uint64_t>(it->second), end = off + shards_.at(it->first).bytes;
      if (off < r.offset + r.bytes && r.offset < end)
        it = resident_.erase(it);
      else
        ++it;
    }
  }
  bool uploaded = false;
  for (const auto& sp : plan.placements) {
    const Shard& s = shards_.at(sp.shard);
    if (s.kind == ShardKind::Kv || s.kind == ShardKind::Embedding || sp.home != WeightHome::Pinned) continue;
    auto it = resident_.find(sp.shard);
    if (it != resident_.end() && it->second == sp.arena_offset) continue;
    SW_CHECK(sp.arena_offset >= 0, "plan: pinned shard ", sp.name, " has no arena offset");
    uint8_t* dst = arena_ + sp.arena_offset;
    check_region(dst, s.bytes, "a pinned shard");
    copy_shard(s, dst, 0, 0);
    resident_[sp.shard] = sp.arena_offset;
    uploaded_ += s.bytes;
    uploaded = true;
  }
  if (uploaded) device_.wait(Queue::Compute, device_.record(Queue::H2D));
}

// Only the tensors of the shard being run: a stream slot is protected by the plan's dependencies for
// the actions of the shard copied into it and no others (the next copy into the slot waits for that
// shard's compute only). So an MoE FFN takes the FFN norm from its own shard, never from the attention
// shard's copy: with the attention shard streamed, the next shard's copy into that slot may already
// be overwriting it while the experts run (found as a rare wrong result of gpu-only on the emulated
// device; on a GPU it is the same race between the H2D copy and the FFN kernel).
DevLayer Runtime::device_layer(int layer, ShardKind kind, const Plan& plan, const std::vector<uint8_t*>& base) const {
  SW_CHECK(kind == ShardKind::Attention || kind == ShardKind::Ffn, "runtime: device_layer of a non-layer shard");
  DevLayer w;
  auto mat = [&](const ShardLayout& L, const uint8_t* b, const std::string& name) {
    DevMat m;
    const ShardTensorPlace* t = L.find(name);
    if (!t || !b) return m;
    m.dtype = t->dtype;
    m.rows = t->shape.size() >= 2 ? t->shape[0] : 1;
    m.cols = t->shape.back();
    m.data = b + t->offset;
    return m;
  };
  auto vec = [&](const ShardLayout& L, const uint8_t* b, const std::string& name) -> const float* {
    const ShardTensorPlace* t = L.find(name);
    return (t && b) ? reinterpret_cast<const float*>(b + t->offset) : nullptr;
  };
  const std::string p = "blk." + std::to_string(layer) + ".";
  if (kind == ShardKind::Attention) {
    const int a = shards_.attention[static_cast<size_t>(layer)];
    const ShardLayout& la = layouts_[static_cast<size_t>(a)];
    const uint8_t* ba = base[static_cast<size_t>(a)];
    w.attn_norm = vec(la, ba, p + "attn_norm.weight");
    w.q_norm = vec(la, ba, p + "attn_q_norm.weight");
    w.k_norm = vec(la, ba, p + "attn_k_norm.weight");
    w.q_bias = vec(la, ba, p + "attn_q.bias");
    w.k_bias = vec(la, ba, p + "attn_k.bias");
    w.v_bias = vec(la, ba, p + "attn_v.bias");
    w.wq = mat(la, ba, p + "attn_q.weight");
    w.wk = mat(la, ba, p + "attn_k.weight");
    w.wv = mat(la, ba, p + "attn_v.weight");
    w.wo = mat(la, ba, p + "attn_output.weight");
    if (spec_.is_moe()) {  // the router and its copy of the FFN norm belong to the attention shard
      w.ffn_norm = vec(la, ba, p + "ffn_norm.weight");
      w.router = mat(la, ba, p + "ffn_gate_inp.weight");
    }
    return w;
  }
  const int f = shards_.ffn[static_cast<size_t>(layer)];
  const ShardLayout& lf = layouts_[static_cast<size_t>(f)];
  const uint8_t* bf = base[static_cast<size_t>(f)];
  w.ffn_norm = vec(lf, bf, p + "ffn_norm.weight");
  if (spec_.is_moe()) {
    w.gate_dtype = lf.gate_dtype;
    w.up_dtype = lf.up_dtype;
    w.down_dtype = lf.down_dtype;
    const auto& streamed = buf_->expert_ptrs[static_cast<size_t>(layer)];
    const int64_t E = spec_.num_experts;
    w.gate_exp.assign(static_cast<size_t>(E), nullptr);
    w.up_exp.assign(static_cast<size_t>(E), nullptr);
    w.down_exp.assign(static_cast<size_t>(E), nullptr);
    const bool pinned = plan.placements[static_cast<size_t>(f)].home == WeightHome::Pinned;
    for (int64_t e = 0; e < E; ++e) {
      const uint8_t* blk = pinned ? (bf ? bf + lf.expert_base + static_cast<uint64_t>(e) * lf.expert_stride : nullptr)
                                  : (streamed.empty() ? nullptr : streamed[static_cast<size_t>(e)]);
      if (!blk) continue;
      w.gate_exp[static_cast<size_t>(e)] = blk;
      w.up_exp[static_cast<size_t>(e)] = blk + lf.expert_up_offset;
      w.down_exp[static_cast<size_t>(e)] = blk + lf.expert_down_offset;
    }
  } else {
    w.gate = mat(lf, bf, p + "ffn_gate.weight");
    w.up = mat(lf, bf, p + "ffn_up.weight");
    w.down = mat(lf, bf, p + "ffn_down.weight");
  }
  return w;
}

// One run of a plan (a step, or one chunk of a longer one): the step's device buffers carved from the
// plan's scratch, where each shard's weights are for this run, the events of its actions and their
// issue order. Each action kind is issued by a member of its own; run() orders them. Set-up, issue and
// wait keep the order of device calls, events and waits of a single pass over the plan.
class Runtime::StepRun {
 public:
  // The run's tokens, its sequences' parts (step_engine.h) and where each part's last logits go (null:
  // the sequence goes on in the next run); rows: the run's input rows [n, hidden] instead of the
  // tokens' embeddings (null: the tokens').
  StepRun(Runtime& rt, const Plan& plan, const int32_t* tokens, const std::vector<StepSegment>& segments,
          const std::vector<float*>& logits, const float* rows);
  // Issues every action (device work enqueued, CPU work done), then waits for the device.
  void run();
  // The measured timeline of this run, when it is recorded (RuntimeOptions::timeline_runs).
  void record_timeline();

 private:
  // Set-up.
  void carve_scratch();
  void locate_weights();
  void start_timeline();
  bool graphs_fit() const;
  // The device's copy of layer's KV cache in VRAM (v: its V half), elements of the KV dtype.
  uint8_t* kv_dev(int layer, bool v);
  // A host cache staged for a layer's attention on the GPU (attn_staged): K then V, position-major as
  // the device attends to them, then K then V head-major as they cross PCIe (kv_cache.h's layout).
  uint8_t* staged(int part);  // 0, 1: K, V position-major; 2, 3: K, V head-major
  // Rows [p0, p1) of every head between a host cache and the head-major half of the staging.
  void copy_heads(int layer, bool up, int64_t p0, int64_t p1, Queue q);
  // Rows of every sequence of the run between a host cache and the staging: its cached rows (past), or
  // this run's new ones.
  void copy_seq_heads(int layer, bool up, bool past, Queue q);
  // The staged caches' layout change for every sequence's past rows (to_positions) or new rows (back).
  void stage_layout(bool past);
  const MoeRouting& route(int layer);
  const MoeSplit& split(int layer, int cpu_experts);
  double host_ms() const;
  // CUDA graphs (options_.cuda_graphs): consecutive GPU compute actions are captured as one graph,
  // launched when anything else comes next; their events are then the one recorded after the graph.
  void end_capture();

  // One action, as its kind says.
  void execute(const Action& a);
  void copy_activations(const Action& a, int layer);
  void copy_weights(const Action& a, const Shard& sh, int layer);
  void copy_routed_experts(const Action& a, const Shard& sh, int layer, uint8_t* dst, uint64_t cap);
  std::unique_ptr<MoeRouting> guessed_routing(const Action& a, int layer);
  void compute_gpu(const Action& a, const Shard& sh, int layer);
  void gpu_attention(const Action& a, const Shard& sh, int layer);
  void gpu_ffn(const Action& a, const Shard& sh, int layer);
  void gpu_output(const Action& a, const Shard& sh);
  void compute_cpu(const Action& a, const Shard& sh, int layer);

  // Issue order.
  bool needs_routing(const Action& a) const;
  bool routing_arrived(const Action& a);
  const Action* next_share() const;
  void issue_ready(bool hold);
  void wait_routing(const Action& a);
  bool start_share();
  void settle(const Action& a);

  Runtime& rt_;
  Device& device_;
  DeviceKernels* const kernels_;
  ThreadPool& pool_;
  CpuBlocks& cpu_;
  const ModelSpec& spec_;
  const ShardSet& shards_;
  const std::vector<ShardLayout>& layouts_;
  const ModelWeights& weights_;
  const WeightSource& source_;
  const RuntimeOptions& options_;
  KvCache* const host_kv_;
  uint8_t* const arena_;
  const std::vector<bool>& kv_on_gpu_;
  Buffers& b_;
  const Plan& plan_;
  const int32_t* const tokens_;
  const float* const rows_;
  const std::vector<StepSegment>& segs_;
  const int64_t n_, ctx_;
  std::vector<int64_t> out_rows_;  // the tokens whose logits the run computes (one per ending sequence)
  const int64_t H_, QD_, KVD_, W_, V_, E_;

  // The step's device buffers at the start of the plan's scratch region (the rest is the kernels'
  // workspace); partial_d_ and guess_d_ only where the plan splits a layer or guesses its routing.
  float *x_d_ = nullptr, *qkv_d_ = nullptr, *attn_d_ = nullptr, *router_d_ = nullptr, *logits_d_ = nullptr,
        *out_norm_d_ = nullptr, *partial_d_ = nullptr, *guess_d_ = nullptr;
  std::vector<uint8_t*> base_;  // where each shard's weights are on the device (slots are filled by copies)
  const ArenaRegion* slots_[2] = {nullptr, nullptr};
  const ArenaRegion* staging_ = nullptr;
  bool out_norm_uploaded_ = false;
  int logits_on_device_ = -1;  // the layer whose router logits router_d_ holds
  std::vector<Event> ev_;

  // The measured timeline (options_.timeline_runs): queue timestamps around device actions, host clock
  // around CPU ones, both from time 0 at the start (every queue idle after the last run).
  bool timed_ = false;
  std::vector<Event> t_start_, t_end_;
  std::vector<double> h_start_, h_end_;
  std::chrono::steady_clock::time_point host0_;

  bool graph_plan_ = false;
  bool capturing_ = false;
  std::vector<int> captured_;  // actions inside the open capture

  std::vector<std::vector<int>> order_;  // per resource: its actions in list order
  std::vector<size_t> next_;             // per resource: its next action not yet settled
  std::vector<char> settled_;            // device action enqueued, or CPU action finished
  size_t finished_ = 0;
};

Runtime::StepRun::StepRun(Runtime& rt, const Plan& plan, const int32_t* tokens,
                          const std::vector<StepSegment>& segments, const std::vector<float*>& logits,
                          const float* rows)
    : rt_(rt),
      device_(rt.device_),
      kernels_(rt.kernels_),
      pool_(rt.pool_),
      cpu_(rt.cpu_),
      spec_(rt.spec_),
      shards_(rt.shards_),
      layouts_(rt.layouts_),
      weights_(rt.weights_),
      source_(rt.source_),
      options_(rt.options_),
      host_kv_(rt.host_kv_.get()),
      arena_(rt.arena_),
      kv_on_gpu_(rt.kv_on_gpu_),
      b_(*rt.buf_),
      plan_(plan),
      tokens_(tokens),
      rows_(rows),
      segs_(segments),
      n_(segments.back().t0 + segments.back().n),
      ctx_(rt.table_.ctx),
      H_(spec_.hidden_size),
      QD_(spec_.q_dim()),
      KVD_(spec_.kv_dim()),
      W_(QD_ + 2 * KVD_),
      V_(spec_.vocab_size),
      E_(spec_.is_moe() ? spec_.num_experts : 0) {
  SW_CHECK(n_ <= b_.max_tokens, "runtime: ", n_, " tokens exceed the host staging's ", b_.max_tokens);
  for (size_t k = 0; k < segs_.size(); ++k)
    if (logits[k]) out_rows_.push_back(segs_[k].t0 + segs_[k].n - 1);
  SW_CHECK(static_cast<int64_t>(out_rows_.size()) <= b_.max_rows, "runtime: ", out_rows_.size(),
           " sequences end in one run, more than the ", b_.max_rows, " logits rows it has room for");
  for (auto& r : b_.routing) r.reset();
  for (auto& r : b_.split) r.reset();
  for (auto& e : b_.expert_ptrs) e.clear();
  carve_scratch();
  rt_.arena_peak_ = std::max(rt_.arena_peak_, plan_.vram_bytes);
  rt_.ensure_resident(plan_);
  locate_weights();
  kernels_->prepare_segments(segs_);
  cpu_.prepare_step(segs_);
  ev_.resize(plan_.actions.size());
  start_timeline();
  graph_plan_ = graphs_fit();
  order_.resize(kNumResources);
  for (const Action& a : plan_.actions) order_[static_cast<size_t>(a.resource)].push_back(a.id);
  next_.assign(kNumResources, 0);
  settled_.assign(plan_.actions.size(), 0);
}

void Runtime::StepRun::carve_scratch() {
  const ArenaRegion* scratch = region(plan_, "scratch");
  SW_CHECK(scratch != nullptr, "runtime: the plan has no scratch region");
  uint8_t* s = arena_ + scratch->offset;
  auto take = [&](uint64_t bytes) {
    uint8_t* p = s;
    s += align_up(bytes);
    return p;
  };
  x_d_ = reinterpret_cast<float*>(take(static_cast<uint64_t>(n_ * H_) * 4));
  qkv_d_ = reinterpret_cast<float*>(take(static_cast<uint64_t>(n_ * W_) * 4));
  attn_d_ = reinterpret_cast<float*>(take(static_cast<uint64_t>(n_ * QD_) * 4));
  router_d_ = reinterpret_cast<float*>(take(static_cast<uint64_t>(std::max<int64_t>(1, n_ * E_)) * 4));
  logits_d_ = reinterpret_cast<float*>(take(static_cast<uint64_t>(std::max<size_t>(1, out_rows_.size()) * V_) * 4));
  out_norm_d_ = reinterpret_cast<float*>(take(static_cast<uint64_t>(H_) * 4));
  bool shares = false;  // an MoE layer split between CPU and GPU: the CPU share's device copy
  for (const Action& a : plan_.actions) shares = shares || a.payload == Payload::MoePartial;
  partial_d_ = shares ? reinterpret_cast<float*>(take(static_cast<uint64_t>(n_ * H_) * 4)) : nullptr;
  bool guesses = false;  // router_next: the next layer's guessed router logits
  for (const Action& a : plan_.actions) guesses = guesses || a.part == ComputePart::RouterNext;
  guess_d_ =
      guesses ? reinterpret_cast<float*>(take(static_cast<uint64_t>(std::max<int64_t>(1, n_ * E_)) * 4)) : nullptr;
  const uint64_t used = static_cast<uint64_t>(s - (arena_ + scratch->offset));
  SW_CHECK(used <= scratch->bytes, "runtime: the step's activations (", used, " bytes) exceed the plan's scratch (",
           scratch->bytes, " bytes)");
  kernels_->set_workspace(s, scratch->bytes - used);
}

void Runtime::StepRun::locate_weights() {
  base_.assign(shards_.shards.size(), nullptr);
  for (const auto& p : plan_.placements)
    if (p.home == WeightHome::Pinned && p.arena_offset >= 0 && shards_.at(p.shard).kind != ShardKind::Kv)
      base_[static_cast<size_t>(p.shard)] = arena_ + p.arena_offset;
  slots_[0] = region(plan_, "slot0");
  slots_[1] = region(plan_, "slot1");
  staging_ = region(plan_, "kv staging");
}

void Runtime::StepRun::start_timeline() {
  timed_ =
      rt_.plan_runs_ >= options_.timeline_first && rt_.plan_runs_ < options_.timeline_first + options_.timeline_runs;
  if (rt_.plan_runs_ == options_.profiler_runs_begin) device_.profiler_range(true);
  if (!timed_) return;
  device_.begin_timeline();
  host0_ = std::chrono::steady_clock::now();
  t_start_.resize(plan_.actions.size());
  t_end_.resize(plan_.actions.size());
  h_start_.assign(plan_.actions.size(), 0);
  h_end_.assign(plan_.actions.size(), 0);
}

double Runtime::StepRun::host_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host0_).count();
}

// A step is captured as graphs when it is small enough to route on the device, is not timed, and has no
// CPU work but the embedding rows, no weight copies and no router logits to the host.
bool Runtime::StepRun::graphs_fit() const {
  bool fit = options_.cuda_graphs && !timed_ && n_ <= kDeviceRoutingMaxTokens;
  for (const Action& a : plan_.actions) {
    if (!fit) break;
    const bool cpu_work = a.resource == Resource::Cpu && a.kind != ActionKind::Embed;
    fit = !cpu_work && a.kind != ActionKind::CopyWeights && a.payload != Payload::RouterLogits;
  }
  return fit;
}

uint8_t* Runtime::StepRun::kv_dev(int layer, bool v) {
  const auto& p = plan_.placements[static_cast<size_t>(shards_.kv[static_cast<size_t>(layer)])];
  SW_CHECK(p.arena_offset >= 0, "runtime: layer ", layer, " keeps its KV in VRAM but the plan gives no offset");
  uint8_t* k = arena_ + p.arena_offset;
  const uint64_t half = static_cast<uint64_t>(ctx_) * host_kv_->row_bytes();  // K or V of ctx positions
  rt_.check_region(k, 2 * half, "a KV cache");
  return k + (v ? half : 0);
}

uint8_t* Runtime::StepRun::staged(int part) {
  SW_CHECK(staging_ != nullptr, "runtime: the plan stages a host cache but has no 'kv staging' region");
  const uint64_t one = static_cast<uint64_t>(ctx_) * host_kv_->row_bytes();
  SW_CHECK(4 * one <= staging_->bytes, "runtime: the plan's 'kv staging' region (", staging_->bytes,
           " bytes) holds no ", "layer's K and V twice (", 4 * one, ")");
  return arena_ + staging_->offset + static_cast<uint64_t>(part) * one;
}

void Runtime::StepRun::copy_seq_heads(int layer, bool up, bool past, Queue q) {
  for (const StepSegment& g : segs_) {
    const int64_t p0 = g.row0 + (past ? 0 : g.pos0);
    copy_heads(layer, up, p0, g.row0 + g.pos0 + (past ? 0 : g.n), q);
  }
}

void Runtime::StepRun::stage_layout(bool past) {
  for (const StepSegment& g : segs_) {
    const int64_t p0 = g.row0 + (past ? 0 : g.pos0), p1 = g.row0 + g.pos0 + (past ? 0 : g.n);
    kernels_->kv_layout(staged(past ? 2 : 0), staged(past ? 0 : 2), ctx_, p0, p1, past);
    kernels_->kv_layout(staged(past ? 3 : 1), staged(past ? 1 : 3), ctx_, p0, p1, past);
  }
}

void Runtime::StepRun::copy_heads(int layer, bool up, int64_t p0, int64_t p1, Queue q) {
  if (p1 <= p0) return;
  const int64_t hd = spec_.head_dim, kv_heads = spec_.num_key_value_heads;
  const uint64_t head_row = dtype_row_bytes(host_kv_->dtype(), hd);  // one position of one head
  for (int which = 0; which < 2; ++which) {
    uint8_t* host = static_cast<uint8_t*>(which == 0 ? host_kv_->k(layer) : host_kv_->v(layer));
    uint8_t* dev = staged(2 + which);
    for (int64_t h = 0; h < kv_heads; ++h) {
      const uint64_t at = static_cast<uint64_t>(h * ctx_ + p0) * head_row;
      const uint64_t bytes = static_cast<uint64_t>(p1 - p0) * head_row;
      if (up)
        device_.copy_h2d(dev + at, host + at, bytes, q);
      else
        device_.copy_d2h(host + at, dev + at, bytes);
    }
  }
}

const MoeRouting& Runtime::StepRun::route(int layer) {
  auto& r = b_.routing[static_cast<size_t>(layer)];
  if (!r)
    r = std::make_unique<MoeRouting>(
        route_tokens(b_.router[static_cast<size_t>(layer)], n_, E_, spec_.num_experts_per_tok, spec_.norm_topk_prob));
  return *r;
}

const MoeSplit& Runtime::StepRun::split(int layer, int cpu_experts) {
  auto& s = b_.split[static_cast<size_t>(layer)];
  if (!s) s = std::make_unique<MoeSplit>(split_routing(route(layer), cpu_experts, spec_.num_experts_per_tok));
  return *s;
}

void Runtime::StepRun::end_capture() {
  if (!capturing_) return;
  device_.end_capture(Queue::Compute, (static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&plan_)) << 12) ^
                                          static_cast<uint64_t>(captured_.front()));
  const Event g = device_.record(Queue::Compute);
  for (int id : captured_) ev_[static_cast<size_t>(id)] = g;
  captured_.clear();
  capturing_ = false;
}

void Runtime::StepRun::execute(const Action& a) {
  const bool on_device = a.resource != Resource::Cpu;
  if (rt_.trace_)
    log_message(LogLevel::Info, str_cat("action ", a.id, " ", resource_name(a.resource), " ", action_kind_name(a.kind),
                                        " ", a.label, " bytes=", a.bytes, " slot=", a.slot));
  // A capture holds only GPU compute actions that wait for nothing outside it.
  const bool graphable = graph_plan_ && a.resource == Resource::GpuCompute && a.kind == ActionKind::Compute;
  if (capturing_) {
    bool outside_dep = false;
    for (int d : a.deps) {
      const Event& e = ev_[static_cast<size_t>(d)];
      outside_dep = outside_dep || (e.valid() && e.queue != static_cast<int>(Queue::Compute));
    }
    if (!graphable || outside_dep || captured_.size() >= static_cast<size_t>(kGraphMaxActions)) end_capture();
  }
  // Dependencies: device work waits on other queues' events; CPU work waits on the host.
  for (int d : a.deps) {
    const Event& e = ev_[static_cast<size_t>(d)];
    if (!e.valid()) continue;  // CPU actions are done in program order
    if (on_device)
      device_.wait(queue_of(a.resource), e);
    else
      device_.host_wait(e);
  }
  if (graphable && !capturing_) capturing_ = device_.begin_capture(Queue::Compute);
  const Shard* sh = a.shard >= 0 ? &shards_.at(a.shard) : nullptr;
  const int layer = sh ? sh->layer : -1;
  if (timed_) {  // the host clock first: the queue may pass its timestamp before the host reads a clock
    h_start_[static_cast<size_t>(a.id)] = host_ms();
    if (on_device) t_start_[static_cast<size_t>(a.id)] = device_.timestamp(queue_of(a.resource));
  }
  switch (a.kind) {
    case ActionKind::Embed:
      if (rows_)
        std::memcpy(b_.x, rows_, static_cast<size_t>(n_ * H_) * sizeof(float));
      else
        embed_rows(weights_.token_embd, tokens_, n_, b_.x);
      break;
    case ActionKind::CopyActivations:
      copy_activations(a, layer);
      break;
    case ActionKind::CopyWeights:
      SW_CHECK(sh && a.slot >= 0 && a.slot < 2 && slots_[a.slot], "runtime: action ", a.id, " (", a.label,
               ") names no stream slot of the plan");
      copy_weights(a, *sh, layer);
      break;
    case ActionKind::Compute:
      SW_CHECK(sh != nullptr, "runtime: compute action ", a.id, " names no shard");
      if (a.resource == Resource::GpuCompute)
        compute_gpu(a, *sh, layer);
      else
        compute_cpu(a, *sh, layer);
      break;
    case ActionKind::CopyLogits:
      if (!out_rows_.empty())
        device_.copy_d2h(b_.logits, reinterpret_cast<uint8_t*>(logits_d_),
                         static_cast<uint64_t>(out_rows_.size()) * static_cast<uint64_t>(V_) * 4);
      break;
  }
  if (timed_) {
    h_end_[static_cast<size_t>(a.id)] = host_ms();
    if (on_device) t_end_[static_cast<size_t>(a.id)] = device_.timestamp(queue_of(a.resource));
  }
  if (capturing_ && graphable)
    captured_.push_back(a.id);
  else if (on_device)
    ev_[static_cast<size_t>(a.id)] = device_.record(queue_of(a.resource));
}

void Runtime::StepRun::copy_activations(const Action& a, int layer) {
  const bool h2d = a.resource == Resource::H2D || a.resource == Resource::H2DAct;
  const Queue up = queue_of(a.resource);
  switch (a.payload) {
    case Payload::Residual:
      if (h2d)
        device_.copy_h2d(reinterpret_cast<uint8_t*>(x_d_), b_.x, static_cast<uint64_t>(n_ * H_) * 4, up);
      else
        device_.copy_d2h(b_.x, reinterpret_cast<uint8_t*>(x_d_), static_cast<uint64_t>(n_ * H_) * 4);
      break;
    case Payload::Qkv:
      SW_CHECK(!h2d, "runtime: q,k,v only go to the host");
      device_.copy_d2h(b_.qkv, reinterpret_cast<uint8_t*>(qkv_d_), static_cast<uint64_t>(n_ * W_) * 4);
      break;
    case Payload::AttnOut:
      SW_CHECK(h2d, "runtime: the attention output only goes to the device");
      device_.copy_h2d(reinterpret_cast<uint8_t*>(attn_d_), b_.attn, static_cast<uint64_t>(n_ * QD_) * 4, up);
      break;
    case Payload::RouterLogits: {
      device_.copy_d2h(b_.router[static_cast<size_t>(layer)], reinterpret_cast<uint8_t*>(router_d_),
                       static_cast<uint64_t>(n_ * E_) * 4);
      break;
    }
    case Payload::KvPast:  // the cached rows [0, pos0) of the layer's host cache, into the staging
      SW_CHECK(h2d && !kv_on_gpu_[static_cast<size_t>(layer)], "runtime: ", a.label,
               " stages a cache that is not on the host");
      copy_seq_heads(layer, true, true, up);
      break;
    case Payload::RouterGuess:  // a layer's guessed router logits (router_next), down to the host
      SW_CHECK(!h2d && guess_d_ && b_.guess[static_cast<size_t>(a.layer)], "runtime: action ", a.id, " (", a.label,
               ") copies guessed router logits no router_next computed");
      device_.copy_d2h(b_.guess[static_cast<size_t>(a.layer)], reinterpret_cast<uint8_t*>(guess_d_),
                       static_cast<uint64_t>(n_ * E_) * 4);
      break;
    case Payload::MoePartial:  // an MoE layer's CPU share of the experts' outputs, up to the GPU
      SW_CHECK(h2d && partial_d_, "runtime: action ", a.id, " (", a.label, ") moves an MoE share the wrong way");
      device_.copy_h2d(reinterpret_cast<uint8_t*>(partial_d_), b_.partial, static_cast<uint64_t>(n_ * H_) * 4, up);
      break;
    case Payload::KvNew:  // the step's rows back into the layer's host cache
      SW_CHECK(!h2d && !kv_on_gpu_[static_cast<size_t>(layer)], "runtime: ", a.label,
               " returns rows of a cache not on the host");
      copy_seq_heads(layer, false, false, Queue::D2H);
      break;
    case Payload::None:
      fail("runtime: action ", a.id, " (", a.label, ") copies no known activation");
  }
}

void Runtime::StepRun::copy_weights(const Action& a, const Shard& sh, int layer) {
  uint8_t* dst = arena_ + slots_[a.slot]->offset;
  const uint64_t cap = slots_[a.slot]->bytes;
  if (sh.kind == ShardKind::Ffn && spec_.is_moe()) {
    copy_routed_experts(a, sh, layer, dst, cap);
  } else {
    const uint64_t need = a.row_end > a.row_begin ? a.bytes : sh.bytes;
    SW_CHECK(need <= cap, "runtime: shard ", sh.name(), " (", need, " bytes) does not fit its stream slot (", cap, ")");
    rt_.check_region(dst, need, "a stream slot");
    rt_.copy_shard(sh, dst, a.row_begin, a.row_end);
  }
  base_[static_cast<size_t>(sh.id)] = dst;
}

// A speculative copy's routing: the top_k of its layer's guessed router logits (of a split layer, the
// GPU's share of them); nullptr for any other copy.
std::unique_ptr<MoeRouting> Runtime::StepRun::guessed_routing(const Action& a, int layer) {
  std::unique_ptr<MoeRouting> guess;
  if (!a.speculative) return guess;
  const float* g = b_.guess[static_cast<size_t>(layer)];
  SW_CHECK(g != nullptr, "runtime: ", a.label, " has no guessed router logits");
  if (options_.guess_test != RuntimeOptions::GuessTest::Router) g = rt_.test_guess(g, n_, b_.inverted);
  guess = std::make_unique<MoeRouting>(route_tokens(g, n_, E_, spec_.num_experts_per_tok, spec_.norm_topk_prob));
  if (a.cpu_experts > 0)  // a split layer: the GPU's share of the guess
    guess = std::make_unique<MoeRouting>(split_routing(*guess, a.cpu_experts, spec_.num_experts_per_tok).gpu);
  return guess;
}

// Only the routed experts; the routing must be on the host now (the slot's previous user is waited for
// on the device, like any dependency). Without a guess they are packed in ascending order. A speculative
// copy packs the experts its layer's guessed logits pick; the layer's own copy after it only the routed
// experts the guess missed, into the places of the guesses not routed (so after a guess the places are
// in no order; expert_ptrs says which is where).
void Runtime::StepRun::copy_routed_experts(const Action& a, const Shard& sh, int layer, uint8_t* dst, uint64_t cap) {
  bool after_guess = false;
  for (int d : a.deps) {
    const Action& dep = plan_.actions[static_cast<size_t>(d)];
    if (dep.payload == Payload::RouterLogits || dep.payload == Payload::RouterGuess)
      device_.host_wait(ev_[static_cast<size_t>(d)]);
    after_guess = after_guess || (dep.speculative && dep.shard == a.shard);
  }
  const std::unique_ptr<MoeRouting> guess = guessed_routing(a, layer);
  // A layer split between CPU and GPU copies only the GPU's share of the routed experts.
  const MoeRouting& r = guess ? *guess : a.cpu_experts > 0 ? split(layer, a.cpu_experts).gpu : route(layer);
  const ShardLayout& L = layouts_[static_cast<size_t>(sh.id)];
  const std::string p = "blk." + std::to_string(layer) + ".";
  const TensorView& g = source_.tensor(p + "ffn_gate_exps.weight");
  const TensorView& u = source_.tensor(p + "ffn_up_exps.weight");
  const TensorView& dn = source_.tensor(p + "ffn_down_exps.weight");
  auto& ptrs = b_.expert_ptrs[static_cast<size_t>(layer)];
  // The FFN norm sits at its layout offset (before the experts); the experts follow, packed.
  // All of it goes through Device::copy_h2d_batch.
  std::vector<Device::HostCopy>& copies = b_.expert_copies;
  copies.clear();
  const uint64_t places = cap > L.expert_base && L.expert_stride > 0 ? (cap - L.expert_base) / L.expert_stride : 0;
  std::vector<char>& taken = b_.taken;
  taken.assign(static_cast<size_t>(places), 0);
  auto routed = [&](int64_t e) { return !r.tokens_of_expert[static_cast<size_t>(e)].empty(); };
  if (after_guess && ptrs.size() == static_cast<size_t>(E_)) {  // keep the guesses that were right
    for (int64_t e = 0; e < E_; ++e) {
      const uint8_t*& q = ptrs[static_cast<size_t>(e)];
      if (!q) continue;
      b_.guesses.guessed += 1;
      if (!routed(e)) {
        q = nullptr;
        continue;
      }
      b_.guesses.hits += 1;
      taken[static_cast<size_t>((q - dst - L.expert_base) / L.expert_stride)] = 1;
    }
  } else {
    ptrs.assign(static_cast<size_t>(E_), nullptr);
    for (const ShardTensorPlace& t : L.tensors) {
      SW_CHECK(t.shape.size() == 1, "runtime: unexpected tensor ", t.name, " in an MoE FFN shard");
      copies.push_back({dst + t.offset, weights_.layers[static_cast<size_t>(layer)].ffn_norm.data(), t.bytes});
    }
  }
  if (after_guess)
    for (int64_t e = 0; e < E_; ++e) b_.guesses.routed += routed(e) ? 1 : 0;
  uint64_t place = 0;
  for (int64_t e = 0; e < E_; ++e) {
    if (!routed(e) || ptrs[static_cast<size_t>(e)]) continue;
    while (place < places && taken[static_cast<size_t>(place)]) ++place;
    SW_CHECK(place < places, "runtime: the routed experts of layer ", layer, " do not fit the stream slot (", cap,
             " bytes)");
    taken[static_cast<size_t>(place)] = 1;
    uint8_t* blk = dst + L.expert_base + place * L.expert_stride;
    push_expert_copies(copies, blk, L, g.slice(e), u.slice(e), dn.slice(e));
    ptrs[static_cast<size_t>(e)] = blk;
  }
  if (!copies.empty()) device_.copy_h2d_batch(copies.data(), copies.size());
}

void Runtime::StepRun::compute_gpu(const Action& a, const Shard& sh, int layer) {
  if (a.part == ComputePart::RouterNext) {  // this layer's router on x as the layer before left it: a guess
    const DevLayer w = rt_.device_layer(layer, ShardKind::Attention, plan_, base_);
    SW_CHECK(w.router.data && w.ffn_norm && guess_d_, "runtime: the router of ", sh.name(), " is not on the device");
    kernels_->router(w, x_d_, n_, guess_d_);
  } else if (sh.kind == ShardKind::Attention) {
    gpu_attention(a, sh, layer);
  } else if (sh.kind == ShardKind::Ffn) {
    gpu_ffn(a, sh, layer);
  } else if (sh.kind == ShardKind::Output) {
    gpu_output(a, sh);
  }
}

void Runtime::StepRun::gpu_attention(const Action& a, const Shard& sh, int layer) {
  const DevLayer w = rt_.device_layer(layer, ShardKind::Attention, plan_, base_);
  SW_CHECK(w.wq.data, "runtime: the weights of ", sh.name(), " are not on the device");
  switch (a.part) {
    case ComputePart::Full:
      SW_CHECK(kv_on_gpu_[static_cast<size_t>(layer)], "runtime: ", sh.name(),
               " runs whole on the GPU but its KV is on the host");
      kernels_->attention(w, x_d_, n_, kv_dev(layer, false), kv_dev(layer, true));
      break;
    case ComputePart::AttnPre:
      kernels_->attention_pre(w, x_d_, n_, qkv_d_);
      break;
    case ComputePart::AttnPost:
      kernels_->attention_post(w, x_d_, attn_d_, n_);
      break;
    case ComputePart::AttnCore:
      fail("runtime: the attention core over a host cache runs on the CPU");
    case ComputePart::MoeCpuShare:
    case ComputePart::MoeGpuShare:
    case ComputePart::MoeShareAdd:
      fail("runtime: ", sh.name(), " is attention, not an MoE FFN to share");
    case ComputePart::RouterNext:
      break;                       // (compute_gpu)
    case ComputePart::AttnStaged:  // over the host cache staged on the device, its new rows back
      SW_CHECK(!kv_on_gpu_[static_cast<size_t>(layer)], "runtime: ", sh.name(), " stages a cache that is in VRAM");
      stage_layout(true);
      kernels_->attention(w, x_d_, n_, staged(0), staged(1));
      stage_layout(false);
      break;
  }
  if (spec_.is_moe() && a.part != ComputePart::AttnPre) {
    kernels_->router(w, x_d_, n_, router_d_);
    logits_on_device_ = layer;
  }
}

// MoE: routed on the device when the plan copies no router logits for this FFN and this layer's logits
// are the last the GPU computed (kDeviceRoutingMaxTokens, traits.h); else the host routes, once its copy
// of the logits (or the CPU's router) is there.
void Runtime::StepRun::gpu_ffn(const Action& a, const Shard& sh, int layer) {
  bool host_copy = false;
  if (spec_.is_moe())
    for (int d : a.deps)
      if (plan_.actions[static_cast<size_t>(d)].payload == Payload::RouterLogits) {
        device_.host_wait(ev_[static_cast<size_t>(d)]);
        host_copy = true;
      }
  const DevLayer w = rt_.device_layer(layer, ShardKind::Ffn, plan_, base_);
  SW_CHECK(w.ffn_norm, "runtime: the weights of ", sh.name(), " are not on the device");
  if (a.part == ComputePart::MoeGpuShare) {  // the GPU's experts into x, while the CPU computes its share
    // (the routing is the host's: its router logits copied, or the CPU's attention routed)
    SW_CHECK(spec_.is_moe() && a.cpu_experts > 0, "runtime: ", sh.name(), " runs a GPU share of no experts");
    kernels_->ffn(w, x_d_, n_, &split(layer, a.cpu_experts).gpu);
  } else if (a.part == ComputePart::MoeShareAdd) {  // then the CPU's share added
    SW_CHECK(spec_.is_moe() && a.cpu_experts > 0 && partial_d_, "runtime: ", sh.name(),
             " adds a CPU share of its experts that was never computed");
    kernels_->add(x_d_, partial_d_, n_ * H_);
  } else if (spec_.is_moe() && !host_copy && logits_on_device_ == layer) {
    SW_CHECK(n_ <= kDeviceRoutingMaxTokens, "runtime: ", sh.name(), " routes on the device for ", n_,
             " tokens (at most ", kDeviceRoutingMaxTokens, ")");
    kernels_->ffn_routed(w, x_d_, n_, router_d_);
  } else {
    const MoeRouting* r = spec_.is_moe() ? &route(layer) : nullptr;
    kernels_->ffn(w, x_d_, n_, r);
  }
}

void Runtime::StepRun::gpu_output(const Action& a, const Shard& sh) {
  const ShardLayout& L = layouts_[static_cast<size_t>(sh.id)];
  const ShardTensorPlace* head = L.find(spec_.tie_word_embeddings ? "token_embd.weight" : "output.weight");
  const ShardTensorPlace* norm = L.find("output_norm.weight");
  SW_CHECK(head && norm && base_[static_cast<size_t>(sh.id)], "runtime: the LM head is not on the device");
  const float* norm_d = nullptr;
  DevMat m;
  m.dtype = head->dtype;
  m.cols = H_;
  int64_t r0 = 0;
  if (a.row_end > a.row_begin) {  // a streamed piece: rows at the start of the slot
    if (!out_norm_uploaded_) {
      device_.copy_h2d(reinterpret_cast<uint8_t*>(out_norm_d_), b_.out_norm_f32, static_cast<uint64_t>(H_) * 4);
      device_.wait(Queue::Compute, device_.record(Queue::H2D));
      out_norm_uploaded_ = true;
    }
    norm_d = out_norm_d_;
    m.rows = a.row_end - a.row_begin;
    // This piece's own slot: the copy of the next piece, into the other slot, may have been issued
    // before this compute (base_ names the slot the shard was copied into last).
    SW_CHECK(a.slot >= 0 && a.slot < 2 && slots_[a.slot], "runtime: action ", a.id, " (", a.label,
             ") names no stream slot of the plan");
    m.data = arena_ + slots_[a.slot]->offset;
    r0 = a.row_begin;
  } else {
    norm_d = reinterpret_cast<const float*>(base_[static_cast<size_t>(sh.id)] + norm->offset);
    m.rows = V_;
    m.data = base_[static_cast<size_t>(sh.id)] + head->offset;
  }
  // A chunk that ends no sequence (the first chunks of a long prompt) needs no logits.
  if (!out_rows_.empty()) kernels_->output_rows(norm_d, m, x_d_, out_rows_, logits_d_ + r0, V_);
}

void Runtime::StepRun::compute_cpu(const Action& a, const Shard& sh, int layer) {
  if (sh.kind == ShardKind::Attention) {
    const LayerWeights& lw = weights_.layers[static_cast<size_t>(layer)];
    if (a.part == ComputePart::AttnCore) {
      cpu_.attention_core(b_.qkv, n_, host_kv_->k(layer), host_kv_->v(layer), b_.attn);
    } else {
      SW_CHECK(a.part == ComputePart::Full, "runtime: ", sh.name(), " part ", compute_part_name(a.part),
               " runs on the GPU, not the CPU");
      SW_CHECK(!kv_on_gpu_[static_cast<size_t>(layer)], "runtime: ", sh.name(),
               " runs on the CPU but its KV is on the GPU");
      cpu_.attention(lw, b_.x, n_, host_kv_->k(layer), host_kv_->v(layer));
      if (spec_.is_moe()) {
        cpu_.router(lw, b_.x, n_, b_.router[static_cast<size_t>(layer)]);
      }
    }
  } else if (sh.kind == ShardKind::Ffn && a.part == ComputePart::MoeCpuShare) {
    SW_CHECK(spec_.is_moe() && a.cpu_experts > 0, "runtime: ", sh.name(), " runs a CPU share of no experts");
    cpu_.moe_share(weights_.layers[static_cast<size_t>(layer)], b_.x, n_, split(layer, a.cpu_experts).cpu, b_.partial);
  } else if (sh.kind == ShardKind::Ffn) {
    const MoeRouting* r = spec_.is_moe() ? &route(layer) : nullptr;
    cpu_.ffn(weights_.layers[static_cast<size_t>(layer)], b_.x, n_, r);
  } else if (sh.kind == ShardKind::Output) {
    if (!out_rows_.empty())
      cpu_.output_rows(weights_.output_norm, weights_.output, b_.x, out_rows_.data(),
                       static_cast<int64_t>(out_rows_.size()), b_.logits, V_, 0, V_);
  }
}

bool Runtime::StepRun::needs_routing(const Action& a) const {
  if (!spec_.is_moe() || a.shard < 0 || shards_.at(a.shard).kind != ShardKind::Ffn) return false;
  return a.kind == ActionKind::CopyWeights || (a.kind == ActionKind::Compute && a.resource == Resource::GpuCompute);
}

bool Runtime::StepRun::routing_arrived(const Action& a) {
  for (int d : a.deps)
    if ((plan_.actions[static_cast<size_t>(d)].payload == Payload::RouterLogits ||
         plan_.actions[static_cast<size_t>(d)].payload == Payload::RouterGuess) &&
        !device_.event_done(ev_[static_cast<size_t>(d)]))
      return false;
  return true;
}

// The CPU's next action when it is a split layer's share and the pool has other threads to start it on
// (start_share); nullptr otherwise.
const Action* Runtime::StepRun::next_share() const {
  const size_t ci = next_[static_cast<size_t>(Resource::Cpu)];
  const auto& cq = order_[static_cast<size_t>(Resource::Cpu)];
  if (pool_.size() <= 1 || ci >= cq.size()) return nullptr;
  const Action& c = plan_.actions[static_cast<size_t>(cq[ci])];
  return c.part == ComputePart::MoeCpuShare ? &c : nullptr;
}

// Every device action whose dependencies are enqueued (and routing arrived); with `hold`, not the routed
// work of the layer whose CPU share comes next (it is enqueued beside that share; a copy on the layer's
// guess is not held: it was to be in flight before the routing).
void Runtime::StepRun::issue_ready(bool hold) {
  const Action* share = hold ? next_share() : nullptr;
  for (bool progress = true; progress;) {
    progress = false;
    for (Resource r : {Resource::GpuCompute, Resource::H2D, Resource::D2H, Resource::H2DAct}) {
      auto& q = order_[static_cast<size_t>(r)];
      size_t& i = next_[static_cast<size_t>(r)];
      while (i < q.size()) {
        const Action& a = plan_.actions[static_cast<size_t>(q[i])];
        bool ready = true;
        for (int d : a.deps) ready = ready && settled_[static_cast<size_t>(d)];
        if (!ready ||
            (needs_routing(a) && (!routing_arrived(a) || (share && !a.speculative && a.layer == share->layer))))
          break;
        execute(a);
        settled_[static_cast<size_t>(a.id)] = 1;
        ++finished_;
        ++i;
        progress = true;
      }
    }
  }
}

void Runtime::StepRun::wait_routing(const Action& a) {  // the host waits for a device action's routing only
  for (int d : a.deps) {
    const Payload p = plan_.actions[static_cast<size_t>(d)].payload;
    if (p == Payload::RouterLogits || p == Payload::RouterGuess) device_.host_wait(ev_[static_cast<size_t>(d)]);
  }
}

// A split layer's CPU share, once its dependencies are in, starts at once; the host enqueues the device
// work that is ready (the layer's routed expert copy and GPU share among it) while the pool's other
// threads compute (ThreadPool::set_caller_work). Enqueued first, a layer's copies and GPU-share kernels
// held its CPU share back by ~70 us (qwen30b 4G/1K decode). One thread enqueues first, then computes.
bool Runtime::StepRun::start_share() {
  const Action* c = next_share();
  if (!c) return false;
  for (int d : c->deps)
    if (!settled_[static_cast<size_t>(d)]) return false;
  end_capture();
  pool_.set_caller_work([this] { issue_ready(false); });
  try {
    execute(*c);
  } catch (...) {
    pool_.set_caller_work(nullptr);  // it names this run's state
    throw;
  }
  pool_.run_caller_work();
  settle(*c);
  return true;
}

void Runtime::StepRun::settle(const Action& a) {
  settled_[static_cast<size_t>(a.id)] = 1;
  ++finished_;
  ++next_[static_cast<size_t>(a.resource)];
}

// Issue order. The host thread is both the CPU worker and the one that enqueues device work, so device
// actions are enqueued as early as their dependencies allow — before a long CPU shard that precedes them
// in the list — keeping each queue in list order: weight copies for later layers then run while the CPU
// computes. Work that needs the host to know a layer's routing is only enqueued once that routing has
// arrived (or when nothing else can proceed); a split layer's routed work is enqueued beside its CPU
// share once that share can start (start_share).
void Runtime::StepRun::run() {
  const size_t N = plan_.actions.size();
  while (finished_ < N) {
    issue_ready(true);
    if (start_share()) continue;
    // The earliest action not yet settled: a CPU action (its dependencies are all settled), or a
    // device action waiting only for its routing to reach the host.
    int earliest = -1;
    for (int r = 0; r < kNumResources; ++r)
      if (next_[static_cast<size_t>(r)] < order_[static_cast<size_t>(r)].size()) {
        const int id = order_[static_cast<size_t>(r)][next_[static_cast<size_t>(r)]];
        if (earliest < 0 || id < earliest) earliest = id;
      }
    if (earliest < 0) break;
    end_capture();  // the host is about to wait or compute: what was captured must be running
    // A device action waits on the host for its routing only: its other dependencies are enqueued and
    // execute() makes its queue wait for them. Waiting here for all of them blocked the host on device
    // work: a speculative layer's miss copy on its guessed experts' copy (the whole layer's bytes), so
    // the next layer's guess was enqueued only after it, with the host's wake-up between every layer's
    // copies (GPU-only decode with the prefetch measured 3-50% slower than without).
    const Action& a = plan_.actions[static_cast<size_t>(earliest)];
    if (a.resource != Resource::Cpu) {
      wait_routing(a);
    }
    execute(a);
    settle(a);
  }
  end_capture();
  device_.synchronize();
}

void Runtime::StepRun::record_timeline() {
  if (!timed_) return;
  for (const Action& a : plan_.actions) {
    const size_t i = static_cast<size_t>(a.id);
    TimelineEntry t;
    t.run = rt_.plan_runs_;
    t.tier = plan_.tier;
    t.schedule = plan_.schedule;
    t.action = a.id;
    t.resource = a.resource;
    t.label = a.label;
    const bool dev = a.resource != Resource::Cpu;
    t.start_ms = dev ? device_.timestamp_ms(t_start_[i]) : h_start_[i];
    t.end_ms = dev ? device_.timestamp_ms(t_end_[i]) : h_end_[i];
    if (dev) {
      t.enqueue_start_ms = h_start_[i];
      t.enqueue_end_ms = h_end_[i];
    }
    rt_.timeline_.push_back(std::move(t));
  }
}

void Runtime::run_plan(const Plan& plan, const int32_t* tokens, const std::vector<StepSegment>& segments,
                       const std::vector<float*>& logits, const float* rows) {
  SW_CHECK(plan.feasible, "runtime: the ", schedule_name(plan.schedule), " plan for ", plan.tier,
           " tokens is infeasible (", plan.infeasible_reason, ")");
  const int64_t n = segments.back().t0 + segments.back().n;
  SW_CHECK(n <= plan.tier, "runtime: ", n, " tokens exceed the plan's tier ", plan.tier);
  if (!kv_fixed_) {
    kv_on_gpu_ = plan.kv_on_gpu;
    kv_fixed_ = true;
  }
  SW_CHECK(plan.kv_on_gpu == kv_on_gpu_,
           "runtime: this plan keeps the KV cache elsewhere than earlier steps (plans "
           "of one table must share the KV placement)");
  StepRun run(*this, plan, tokens, segments, logits, rows);
  run.run();
  run.record_timeline();
  ++plan_runs_;
  if (plan_runs_ == options_.profiler_runs_end) device_.profiler_range(false);
  const size_t V = static_cast<size_t>(spec_.vocab_size);
  size_t row = 0;
  for (float* out : logits)
    if (out) std::memcpy(out, buf_->logits + V * row++, V * sizeof(float));
}

}  // namespace shardwise
