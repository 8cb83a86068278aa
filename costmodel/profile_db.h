// costmodel/profile_db.h — measured profiles (`shardwise profile`): the versioned ProfileDB file with
// the machine's fingerprint and every measured point, the roofline fit over those points (Eigen least
// squares) and the CostModel that answers from them. The profiler (microbench/) fills a ProfileDB;
// this module only stores, fits and interpolates. It never runs a kernel.
//
// How the measured model answers op_ms (DESIGN.md §2 "Profile"):
//   1. points of the same class (backend, op kind, dtype, threads) and the same shape (every Op
//      field but `tokens`): between the two nearest measured counts, the ratio measured / fitted
//      roofline (step 3) interpolated log-log in tokens, times the roofline at the query (exact at
//      measured counts; follows the bend where the op turns compute-bound between them);
//   2. other shapes within the measured token range: at each of the two bracketing measured token
//      counts, a least-squares fit t = c + a·bytes + b·flops (+ d·cols for GPU matmuls, whose GEMV
//      warps walk a row serially) over that count's shapes (≥ 3; or
//      t = c + max(a·bytes, b·flops) where that fits them better: shapes on both sides of the ridge),
//      then interpolated between the two counts as in 1;
//   3. above the largest measured token count (of the shape in 1, of the fits in 2): the roofline at
//      the query times the ratio measured / roofline at that largest count (the class's fit is a
//      compromise over all shapes; the largest point says how far this shape is from it);
//   4. below the smallest count, or too few points: the class's fitted roofline
//      t = overhead + max(bytes / bandwidth, flops / peak).
// CPU times depend on PCIe traffic running meanwhile: rows measured under contention record the
// copy rate g_c they ran with; the CPU and the copies share host DRAM, which served the op's bytes at
// bytes / t_contention plus g_c, so a query with concurrent_pcie_gbps = g leaves the op that minus g:
// t = max(t_alone, bytes / (bytes / t_contention + g_c − g)) (g ≤ g_c). Copies: the measured rows of
// the model's PCIe cap (else the uncapped rows held to the cap); below the smallest size measured
// under the cap the uncapped rows (the executor paces only copies of 64 KiB and more); a burst of
// copies (the routed experts of one MoE layer) at the `burst` rows' time per copy, never faster than
// its bytes as one copy. MoE steps whose routing was measured (Op::active_experts) are d
// experts of n·k/d tokens each, each costed as one expert of a uniform row with that many tokens
// per expert; past the MoE rows' largest count an expert grows as its three matmuls' rows. Thread counts not profiled
// interpolate between the two nearest profiled counts (in log threads); outside them the nearest count is used. Norm,
// Rope, Elementwise and Embed are keyed by kind only (their size is `elems`: steps 1 and 3 in log elems), and stand in
// for each other when one was not measured on a backend (the profiler times rope and embed on the
// CPU only). GPU rows measured under contention are stored but not used by the model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/hardware_spec.h"
#include "costmodel/cost_model.h"

namespace shardwise {

constexpr int kProfileFormatVersion = 1;

struct MachineFingerprint {
  std::string cpu_model;  // /proc/cpuinfo "model name"
  int cpu_cores = 0;      // hardware threads the OS offers
  std::string isa;        // highest CPU kernel level used: scalar | avx2 | avx512
  uint64_t dram_bytes = 0;
  std::string gpu_name;     // empty without a GPU
  int gpu_driver = 0;       // CUDA driver version (e.g. 13000)
  uint64_t vram_bytes = 0;  // total device memory (0 without a GPU)
};

// One measured op. GPU rows have threads = 0.
struct OpSample {
  Backend backend = Backend::Cpu;
  int threads = 1;
  // CPU: measured while the copy engines moved pinned data (ProfileDB::copy_traffic); GPU: while the CPU
  // pool streamed DRAM.
  bool contention = false;
  double concurrent_gbps = 0;  // CPU contention rows: PCIe rate achieved meanwhile (all directions together)
  Op op;
  double ms = 0;      // median of the repeats
  double spread = 0;  // (max - min) / median of the repeats
  int repeats = 0;
};

// One measured copy of `bytes` between pinned (or pageable) host memory and the device.
struct TransferSample {
  Direction dir = Direction::HostToDevice;
  bool pinned = true;
  double cap_gbps = 0;  // the PCIe cap it ran under; 0 = none
  uint64_t bytes = 0;
  double ms = 0, spread = 0;
  int repeats = 0;
  // > 1: `burst` copies of `bytes` issued back to back before one synchronisation, `ms` per copy (the
  // copy engine's cost per transfer without the synchronisation's latency); 1: one copy, synchronised.
  int burst = 1;
};

// Host DRAM read bandwidth of the CPU pool (a streaming read larger than the last-level cache).
struct DramSample {
  int threads = 1;
  bool contention = false;
  double concurrent_gbps = 0;
  double gbps = 0;
};

// The roofline fitted to one class: t_ms = overhead_ms + max(bytes / bw, flops / peak), bytes =
// weight_bytes + activation_bytes of the Op, fitted by least squares on the measured points.
struct RooflineFit {
  Backend backend = Backend::Cpu;
  OpKind kind = OpKind::Matmul;
  DType dtype = DType::F32;
  int threads = 0;
  bool contention = false;
  double peak_gflops = 0;  // FLOP/s / 1e9
  double bw_gbps = 0;      // bytes/s / 1e9
  double overhead_ms = 0;
  int points = 0;
  double median_rel_err = 0;  // of the fit on its own points
};

struct ProfileDB {
  int version = kProfileFormatVersion;
  std::string device;  // "cuda" (GPU rows present) or "cpu" (none)
  MachineFingerprint machine;
  std::string created;                 // UTC, ISO 8601
  std::string git_rev;                 // revision of the profiler that measured it
  bool quick = false;                  // measured with --quick (a smaller grid)
  std::vector<int> threads;            // the CPU thread counts measured
  std::vector<double> pcie_caps_gbps;  // the PCIe caps measured (0 = none)
  double sync_ms = 0;                  // one host-device synchronisation (GPU profiles)
  // The copy traffic beside the contention rows: "h2d" (host to device, as weights stream) or "both" (equal
  // bytes each way: profiles that do not say). The cost model reads the rows as
  // measured either way: DRAM total = the CPU's rate + the copies'.
  std::string copy_traffic = "both";
  double launch_ms = 0;  // one empty kernel launch (GPU profiles)
  // Host time per pinned 1 MiB host-to-device copy when a burst of them is enqueued through the
  // runtime's path (Device::copy_h2d_batch: one call per copy), uncapped and under a PCIe cap (each paced
  // copy also launches its pacing kernel): what the host spends issuing an MoE layer's expert copies once
  // their routing is known. GPU profiles; 0 = not measured (profiles before it), the cost model then
  // charges nothing. Measured on the H200 host: 2.5 us, paced 8.1 us.
  double copy_issue_ms = 0, paced_copy_issue_ms = 0;
  std::vector<OpSample> ops;
  std::vector<TransferSample> transfers;
  std::vector<DramSample> dram;
  std::vector<RooflineFit> fits;
  // Where it was read from (profile_from_json's origin), for messages only: neither stored nor hashed.
  std::string origin;

  bool has_gpu() const { return device == "cuda"; }
};

// Canonical JSON (compact; numbers to 4 significant digits where measured). Load validates every
// field and names the file and field in its Error; unknown versions are refused.
std::string profile_to_json(const ProfileDB& db);
ProfileDB profile_from_json(const std::string& text, const std::string& origin);
ProfileDB load_profile(const std::string& path);
void save_profile(const ProfileDB& db, const std::string& path);
// 16 hex digits identifying the measured content (FNV-1a of the canonical JSON without `created`).
std::string profile_hash(const ProfileDB& db);

// Fills db.fits: one RooflineFit per (backend, kind, dtype, threads, contention) with ≥ 1 point.
void fit_profile(ProfileDB& db);

struct MeasuredOptions {
  double pcie_cap_bytes_per_s = 0;  // 0 = none
  bool use_contention = true;       // false: ignore contention rows (to show what they change)
  // A CPU-only profile has no GPU rows: planning GPU work from it is an error, unless this names a
  // datasheet whose analytic model then answers GPU ops and copies (with a warning on stderr).
  const HardwareSpec* gpu_fallback = nullptr;
};
std::unique_ptr<CostModel> make_measured_cost_model(const ProfileDB& db, const MeasuredOptions& options = {});

}  // namespace shardwise
