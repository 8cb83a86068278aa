// vision/vision_runtime.cpp — see vision_runtime.h.
#include "vision/vision_runtime.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "core/size.h"

namespace shardwise {
namespace {

// A tensor's host bytes as it is copied to the device.
struct HostTensor {
  const void* data;
  uint64_t bytes;
};
HostTensor host(const std::vector<float>& v) {
  return {v.data(), v.size() * sizeof(float)};
}
HostTensor host(const VisionMatrix& m) {
  return {m.bytes.data(), m.bytes.size()};
}

// One block's tensors in the order they lie in a slot, and the patch embedding's and the merger's.
std::vector<HostTensor> block_tensors(const VisionBlockWeights& w) {
  return {host(w.norm1),  host(w.norm2),  host(w.qkv_w), host(w.qkv_b), host(w.proj_w), host(w.proj_b),
          host(w.gate_w), host(w.gate_b), host(w.up_w),  host(w.up_b),  host(w.down_w), host(w.down_b)};
}
std::vector<HostTensor> edge_tensors(const VisionWeights& w) {
  return {host(w.patch_embed),  host(w.merger_norm),  host(w.merger_fc1_w),
          host(w.merger_fc1_b), host(w.merger_fc2_w), host(w.merger_fc2_b)};
}

uint64_t laid_out_bytes(const std::vector<HostTensor>& tensors) {
  uint64_t b = 0;
  for (const HostTensor& t : tensors) b += vision_aligned_bytes(t.bytes);
  return b;
}

// Enqueues the tensors' copies to dst (laid out as laid_out_bytes counts) on the H2D queue; returns
// each one's device address.
std::vector<const uint8_t*> copy_tensors(Device& dev, uint8_t* dst, const std::vector<HostTensor>& ts) {
  std::vector<const uint8_t*> at;
  for (const HostTensor& t : ts) {
    dev.copy_h2d(dst, t.data, t.bytes, Queue::H2D);
    at.push_back(dst);
    dst += vision_aligned_bytes(t.bytes);
  }
  return at;
}

const float* dev_vec(const uint8_t* p) {
  return reinterpret_cast<const float*>(p);
}

VisionBlockPtrs copy_block(Device& dev, uint8_t* dst, const VisionSpec& s, const VisionWeights& weights,
                           const VisionBlockWeights& w) {
  const std::vector<const uint8_t*> p = copy_tensors(dev, dst, block_tensors(w));
  const int64_t h = s.hidden_size, f = s.intermediate_size;
  const DType t = weights.matrix_dtype;
  VisionBlockPtrs b;
  b.norm1 = dev_vec(p[0]), b.norm2 = dev_vec(p[1]);
  b.qkv = DevMat{t, 3 * h, h, p[2]}, b.qkv_b = dev_vec(p[3]);
  b.proj = DevMat{t, h, h, p[4]}, b.proj_b = dev_vec(p[5]);
  b.gate = DevMat{t, f, h, p[6]}, b.gate_b = dev_vec(p[7]);
  b.up = DevMat{t, f, h, p[8]}, b.up_b = dev_vec(p[9]);
  b.down = DevMat{t, h, f, p[10]}, b.down_b = dev_vec(p[11]);
  return b;
}

struct EdgePtrs {
  DevMat patch_embed;
  VisionMergerPtrs merger;
};
EdgePtrs copy_edges(Device& dev, uint8_t* dst, const VisionSpec& s, const VisionWeights& w) {
  const std::vector<const uint8_t*> p = copy_tensors(dev, dst, edge_tensors(w));
  const int64_t m = s.merger_width();
  const DType t = w.matrix_dtype;
  EdgePtrs e;
  e.patch_embed = DevMat{t, s.hidden_size, s.patch_dim(), p[0]};
  e.merger.norm = dev_vec(p[1]);
  e.merger.fc1 = DevMat{t, m, m, p[2]}, e.merger.fc1_b = dev_vec(p[3]);
  e.merger.fc2 = DevMat{t, s.out_hidden_size, m, p[4]}, e.merger.fc2_b = dev_vec(p[5]);
  return e;
}

// Runs `undo` (a device call) when the encode ends, however it ends.
template <class F>
class OnEncodeEnd {
 public:
  explicit OnEncodeEnd(F undo) : undo_(std::move(undo)) {}
  ~OnEncodeEnd() {
    try {
      undo_();
    } catch (...) {  // a destructor must not throw; the device reports its own failure on its next use
    }
  }
  OnEncodeEnd(const OnEncodeEnd&) = delete;
  OnEncodeEnd& operator=(const OnEncodeEnd&) = delete;

 private:
  F undo_;
};

// The blocks, each waiting for its weights; streamed blocks take turns in two slots, waiting for block
// b - 2, the slot's previous user. Block b's copy is enqueued once block b - 1's compute is, resident
// blocks' too: a copy from pageable memory holds the host until it is done, and enqueued all before the
// first block it would keep the device idle for the whole tower's copy.
void run_blocks(Device& dev, VisionKernels& k, const VisionSpec& s, const VisionWeights& w, const VisionPlan& plan,
                const VisionActivations& a, uint8_t* resident, uint8_t* slots) {
  const int64_t depth = s.depth, r = plan.resident_blocks;
  std::vector<VisionBlockPtrs> ptrs(static_cast<size_t>(depth));
  std::vector<Event> copied(static_cast<size_t>(depth)), done(static_cast<size_t>(depth));
  auto copy = [&](int64_t b) {
    uint8_t* dst = b < r ? resident + static_cast<uint64_t>(b) * plan.block_bytes
                         : slots + static_cast<uint64_t>((b - r) % 2) * plan.block_bytes;
    if (b >= r + 2) dev.wait(Queue::H2D, done[static_cast<size_t>(b - 2)]);
    ptrs[static_cast<size_t>(b)] = copy_block(dev, dst, s, w, w.blocks[static_cast<size_t>(b)]);
    copied[static_cast<size_t>(b)] = dev.record(Queue::H2D);
  };
  if (depth > 0) copy(0);
  for (int64_t l = 0; l < depth; ++l) {
    dev.wait(Queue::Compute, copied[static_cast<size_t>(l)]);
    vision_block(k, s, ptrs[static_cast<size_t>(l)], a, s.full_attention(l));
    done[static_cast<size_t>(l)] = dev.record(Queue::Compute);
    if (l + 1 < depth) copy(l + 1);
  }
}

}  // namespace

void pin_vision_matrices(Device& dev, const VisionWeights& w) {
  for (const VisionMatrix* m : vision_matrices(w)) dev.pin_host(m->bytes.data(), m->bytes.size(), HostAccess::ReadOnly);
}

uint64_t VisionPlan::weight_bytes() const {
  return edge_bytes + static_cast<uint64_t>(depth) * block_bytes;
}

std::string VisionPlan::describe() const {
  std::ostringstream o;
  o << "vision encoder: " << schedule() << ", " << n_patches << " patches, " << resident_blocks << " of " << depth
    << " blocks resident";
  if (slots > 0) o << ", the others streamed through " << slots << " slots of " << format_bytes(block_bytes);
  o << ", MLP in pieces of " << mlp_chunk << " tokens; arena " << format_bytes(arena_bytes) << " of "
    << format_bytes(budget_bytes) << " (activations " << format_bytes(activation_bytes) << ", weights "
    << format_bytes(edge_bytes + static_cast<uint64_t>(resident_blocks + slots) * block_bytes) << ")";
  return o.str();
}

namespace {

// The workspaces a plan tries, largest first: every linear layer in one GEMM; no layer in pieces smaller
// than an MLP piece (the rows of a whole layer capped at mlp_chunk); the least.
std::vector<uint64_t> workspace_levels(const VisionSpec& s, const VisionInputs& in, const VisionWorkspace& ws,
                                       int64_t mlp_chunk) {
  const int64_t n = in.n_patches, h = s.hidden_size, f = s.intermediate_size, m = s.merger_width();
  // (rows, cols) of the encoder's linear layers: patch embedding, qkv and proj, the MLP's pieces, the merger.
  const std::pair<int64_t, int64_t> layers[] = {
      {n, s.patch_dim()}, {n, h}, {mlp_chunk, h}, {mlp_chunk, f}, {n / s.merge_unit(), m}};
  uint64_t whole = ws.min_bytes, capped = ws.min_bytes;
  for (const auto& [rows, cols] : layers) {
    whole = std::max(whole, ws.bytes_for(rows, cols));
    capped = std::max(capped, ws.bytes_for(std::min(rows, mlp_chunk), cols));
  }
  std::vector<uint64_t> levels;
  for (uint64_t b : {whole, capped, ws.min_bytes}) {
    b = vision_aligned_bytes(b);
    if (levels.empty() || b < levels.back()) levels.push_back(b);
  }
  return levels;
}

}  // namespace

VisionPlan plan_vision_encoder(const VisionSpec& s, const VisionInputs& in, uint64_t budget,
                               const VisionWorkspace& workspace, DType matrix_dtype, int64_t max_resident) {
  SW_CHECK(max_resident >= 0, "plan_vision_encoder: max_resident ", max_resident);
  VisionPlan p;
  p.n_patches = in.n_patches;
  p.depth = s.depth;
  p.budget_bytes = budget;
  // Sizes from the spec alone (the weights need not be loaded to plan), in block_tensors' and
  // edge_tensors' order; encode_images_on_device checks them against the weights.
  const uint64_t h = static_cast<uint64_t>(s.hidden_size), f = static_cast<uint64_t>(s.intermediate_size);
  const uint64_t m = static_cast<uint64_t>(s.merger_width()), out = static_cast<uint64_t>(s.out_hidden_size);
  const uint64_t F = sizeof(float);
  SW_CHECK(matrix_dtype == DType::F32 || matrix_dtype == DType::F16 || matrix_dtype == DType::BF16,
           "plan_vision_encoder: matrices of ", dtype_name(matrix_dtype), " (f32, f16 or bf16)");
  const uint64_t M = static_cast<uint64_t>(dtype_block_bytes(matrix_dtype));  // a matrix element
  uint64_t (*const al)(uint64_t) = vision_aligned_bytes;
  p.block_bytes = 2 * al(F * h) + al(M * 3 * h * h) + al(F * 3 * h) + al(M * h * h) + al(F * h) +
                  2 * (al(M * f * h) + al(F * f)) + al(M * h * f) + al(F * h);
  p.edge_bytes = al(M * h * static_cast<uint64_t>(s.patch_dim())) + al(F * h) + al(M * m * m) + al(F * m) +
                 al(M * out * m) + al(F * out);
  const int64_t n = in.n_patches;
  const uint64_t two = std::min<uint64_t>(2, static_cast<uint64_t>(s.depth)) * p.block_bytes;
  uint64_t fixed = 0;
  for (int64_t chunk : {std::min<int64_t>(n, 4096), std::min<int64_t>(n, 1024), std::min<int64_t>(n, 256)}) {
    p.mlp_chunk = chunk;
    p.activation_bytes = vision_activation_bytes(s, in, chunk);
    for (uint64_t ws : workspace_levels(s, in, workspace, chunk)) {
      p.workspace_bytes = ws;
      fixed = p.activation_bytes + p.workspace_bytes + p.edge_bytes;
      if (fixed + two <= budget) break;
    }
    if (fixed + two <= budget) break;
  }
  if (fixed + two > budget)
    fail("the vision encoder needs at least ", format_bytes(fixed + two), " of device memory for ", n,
         " patches (activations ", format_bytes(p.activation_bytes), ", workspace ", format_bytes(p.workspace_bytes),
         ", patch embedding and merger ", format_bytes(p.edge_bytes), ", two blocks ", format_bytes(two),
         "); the budget is ", format_bytes(budget));
  const uint64_t all = static_cast<uint64_t>(s.depth) * p.block_bytes;
  if (fixed + all <= budget && max_resident >= s.depth) {
    p.resident_blocks = s.depth;
  } else {
    const int64_t fit = static_cast<int64_t>((budget - fixed - two) / p.block_bytes);
    p.resident_blocks = std::max<int64_t>(0, std::min({fit, max_resident, s.depth - 2}));
    p.slots = std::min<int64_t>(2, s.depth - p.resident_blocks);
  }
  p.arena_bytes = fixed + static_cast<uint64_t>(p.resident_blocks + p.slots) * p.block_bytes;
  return p;
}

namespace {

struct PlannedEncode {
  VisionInputs in;
  VisionPlan plan;
};
// The checked inputs of these images and their plan within `budget` on this device's kernels, the
// weight layout checked against it.
PlannedEncode planned_encode(Device& dev, const VisionSpec& s, const VisionWeights& w,
                             const std::vector<GridThw>& grids, uint64_t budget, int64_t max_resident) {
  validate_vision_spec(s, "encode_images");
  PlannedEncode p{vision_inputs(s, grids), {}};
  check_vision_weights(s, w);
  VisionKernels& k = dev.vision_kernels(s.head_dim());  // loaded before any arena of this encode
  p.plan = plan_vision_encoder(s, p.in, budget, k.workspace(w.matrix_dtype), w.matrix_dtype, max_resident);
  SW_CHECK(laid_out_bytes(block_tensors(w.blocks.at(0))) == p.plan.block_bytes &&
               laid_out_bytes(edge_tensors(w)) == p.plan.edge_bytes,
           "vision encoder: the planned weight layout differs from the weights'");
  return p;
}

// The encode itself, in `arena` (at least plan.arena_bytes), timed from t0.
std::vector<float> encode_planned(Device& dev, const VisionSpec& s, const VisionWeights& w, const VisionPlan& plan,
                                  const VisionInputs& in, uint8_t* arena, const float* pixel_values,
                                  std::chrono::steady_clock::time_point t0, VisionRunStats* stats) {
  VisionKernels& k = dev.vision_kernels(s.head_dim());
  const VisionActivations a = carve_vision_activations(s, in, plan.mlp_chunk, arena);
  uint8_t* ws = arena + plan.activation_bytes;
  uint8_t* edges = ws + plan.workspace_bytes;
  uint8_t* resident = edges + plan.edge_bytes;
  uint8_t* slots = resident + static_cast<uint64_t>(plan.resident_blocks) * plan.block_bytes;
  k.set_workspace(ws, plan.workspace_bytes);
  // No library keeps a pointer into an arena that may be released after.
  OnEncodeEnd clear_workspace([&k] { k.set_workspace(nullptr, 0); });

  upload_vision_inputs(
      in, a, [&](void* d, const void* h, uint64_t b) { dev.copy_h2d(static_cast<uint8_t*>(d), h, b, Queue::H2DAct); });
  dev.copy_h2d(reinterpret_cast<uint8_t*>(a.qkv), pixel_values,
               static_cast<uint64_t>(in.n_patches * s.patch_dim()) * sizeof(float), Queue::H2DAct);
  const Event inputs = dev.record(Queue::H2DAct);
  const EdgePtrs e = copy_edges(dev, edges, s, w);
  const Event edges_copied = dev.record(Queue::H2D);
  dev.wait(Queue::Compute, inputs);
  dev.wait(Queue::Compute, edges_copied);
  vision_embed(k, s, e.patch_embed, a);
  run_blocks(dev, k, s, w, plan, a, resident, slots);
  vision_merger(k, s, e.merger, a);
  dev.wait(Queue::D2H, dev.record(Queue::Compute));
  const int64_t tokens = in.n_patches / s.merge_unit();
  std::vector<float> result(static_cast<size_t>(tokens * s.out_hidden_size));
  dev.copy_d2h(result.data(), reinterpret_cast<const uint8_t*>(a.tokens), result.size() * sizeof(float));
  dev.synchronize();
  if (stats) {
    stats->plan = plan;
    stats->encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    stats->device_peak_bytes = dev.device_peak_bytes();
  }
  return result;
}

}  // namespace

std::vector<float> encode_images_on_device(Device& dev, const VisionSpec& s, const VisionWeights& w,
                                           const float* pixel_values, const std::vector<GridThw>& grids,
                                           uint64_t budget, VisionRunStats* stats, int64_t max_resident) {
  const PlannedEncode p = planned_encode(dev, s, w, grids, budget, max_resident);
  const auto t0 = std::chrono::steady_clock::now();
  uint8_t* arena = dev.allocate_arena(p.plan.arena_bytes);
  OnEncodeEnd release([&dev] { dev.release_arena(); });
  return encode_planned(dev, s, w, p.plan, p.in, arena, pixel_values, t0, stats);
}

std::vector<float> encode_images_in_arena(Device& dev, uint8_t* arena, uint64_t arena_bytes, const VisionSpec& s,
                                          const VisionWeights& w, const float* pixel_values,
                                          const std::vector<GridThw>& grids, VisionRunStats* stats) {
  SW_CHECK(arena != nullptr, "encode_images_in_arena: no arena");
  const PlannedEncode p = planned_encode(dev, s, w, grids, arena_bytes, INT64_MAX);
  return encode_planned(dev, s, w, p.plan, p.in, arena, pixel_values, std::chrono::steady_clock::now(), stats);
}

}  // namespace shardwise
