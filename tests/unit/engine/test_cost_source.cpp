// Tests for the engine's cost model (engine/cost_source.h): one precedence rule for every caller — a
// measured profile over a datasheet, the datasheet standing in for the GPU of a CPU-only profile and
// not even read beside a GPU profile — and one cost model per PCIe cap.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/hardware_spec.h"
#include "costmodel/profile_db.h"
#include "engine/cost_source.h"
#include "test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;

namespace {

// The committed profile of the GPU machine (it has GPU rows).
std::string gpu_profile() {
  return test::fixtures_dir() + "/../../configs/profiles/h200-host.profile.json";
}

// The same machine as if measured without a GPU: its CPU rows alone.
std::string cpu_profile() {
  static const std::string path = [] {
    ProfileDB db = load_profile(gpu_profile());
    db.device = "cpu";
    db.machine.gpu_name.clear();
    db.machine.gpu_driver = 0;
    db.machine.vram_bytes = 0;
    db.pcie_caps_gbps = {0};
    db.sync_ms = db.launch_ms = db.copy_issue_ms = db.paced_copy_issue_ms = 0;
    std::vector<OpSample> cpu;
    for (const OpSample& s : db.ops)
      if (s.backend == Backend::Cpu && !s.contention) cpu.push_back(s);
    db.ops = cpu;
    std::vector<DramSample> dram;
    for (const DramSample& s : db.dram)
      if (!s.contention) dram.push_back(s);
    db.dram = dram;
    db.transfers.clear();
    fit_profile(db);
    const std::string p = test::temp_path("cpu_only.profile.json");
    save_profile(db, p);
    return p;
  }();
  return path;
}

const Op kMatmul = [] {
  Op op;
  op.kind = OpKind::Matmul;
  op.dtype = DType::F16;
  op.tokens = 16;
  op.rows = 4096;
  op.cols = 4096;
  return op;
}();
const ExecEnv kGpu{Backend::Gpu, 1, 0}, kCpu{Backend::Cpu, 16, 0};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("engine cost: a datasheet alone is its analytic model", "[engine][cost]") {
  const CostSource s(MachineChoice{"cli3", std::nullopt, "", "--hw"});
  REQUIRE(!s.measured());
  REQUIRE(s.datasheet() != nullptr);
  CHECK(s.datasheet()->name == "cli3");
  CHECK(s.label() == "cli3");
  CHECK(s.unused_datasheet_note().empty());
  const auto analytic = make_analytic_cost_model(builtin_hardware("cli3"), 16e9);
  CHECK(s.at_cap(16e9).op_ms(kMatmul, kGpu) == analytic->op_ms(kMatmul, kGpu));
  CHECK(s.at_cap(16e9).transfer_ms(64 << 20, Direction::HostToDevice) ==
        analytic->transfer_ms(64 << 20, Direction::HostToDevice));
  // A datasheet given as an object (Python) is the same machine.
  const CostSource object(MachineChoice{"", builtin_hardware("cli3"), "", "hardware"});
  CHECK(object.at_cap(16e9).op_ms(kMatmul, kGpu) == analytic->op_ms(kMatmul, kGpu));
}

TEST_CASE("engine cost: a profile with GPU rows takes precedence and the datasheet is not used, said once",
          "[engine][cost]") {
  // Not even read: a datasheet that does not exist is no error beside a GPU profile.
  const CostSource s(MachineChoice{"no-such-machine", std::nullopt, gpu_profile(), "--hw"});
  REQUIRE(s.measured());
  CHECK(s.datasheet() == nullptr);
  CHECK_THAT(s.unused_datasheet_note(), Contains("--hw no-such-machine is not used") &&
                                            Contains("h200-host.profile.json") && Contains("has GPU rows"));
  CHECK(s.label() == "h200-host.profile.json");
  const auto measured = make_measured_cost_model(load_profile(gpu_profile()));
  CHECK(s.at_cap(0).op_ms(kMatmul, kGpu) == measured->op_ms(kMatmul, kGpu));
  CHECK(s.at_cap(0).op_ms(kMatmul, kCpu) == measured->op_ms(kMatmul, kCpu));
  // Without a datasheet there is nothing to say.
  CHECK(CostSource(MachineChoice{"", std::nullopt, gpu_profile(), "--hw"}).unused_datasheet_note().empty());
}

TEST_CASE("engine cost: the datasheet stands in for the GPU of a CPU-only profile", "[engine][cost]") {
  const CostSource s(MachineChoice{"cli3", std::nullopt, cpu_profile(), "--hw"});
  REQUIRE(s.measured());
  REQUIRE(s.datasheet() != nullptr);
  CHECK(s.datasheet()->name == "cli3");
  CHECK(s.unused_datasheet_note().empty());
  const auto analytic = make_analytic_cost_model(builtin_hardware("cli3"));
  const auto cpu_only = make_measured_cost_model(load_profile(cpu_profile()));
  CHECK(s.at_cap(0).op_ms(kMatmul, kGpu) == analytic->op_ms(kMatmul, kGpu));  // the GPU from the datasheet
  CHECK(s.at_cap(0).op_ms(kMatmul, kCpu) == cpu_only->op_ms(kMatmul, kCpu));  // the CPU as measured
  CHECK(s.at_cap(0).vram_bytes() == builtin_hardware("cli3").vram_bytes);
  // Without one, GPU questions are refused naming the profile.
  const CostSource alone(MachineChoice{"", std::nullopt, cpu_profile(), "--hw"});
  CHECK_THAT(error_of([&] { alone.at_cap(0).op_ms(kMatmul, kGpu); }), Contains("has no GPU rows"));
  // A bad datasheet beside a CPU-only profile is read, and refused.
  CHECK_THAT(error_of([&] {
               CostSource(MachineChoice{"no-such-machine", std::nullopt, cpu_profile(), "--hw"});
             }),
             Contains("no-such-machine"));
}

TEST_CASE("engine cost: neither a datasheet nor a profile is an error, and one model is kept per PCIe cap",
          "[engine][cost]") {
  CHECK_THAT(error_of([] { CostSource(MachineChoice{}); }), Contains("no machine"));
  const CostSource s(MachineChoice{"h200-host", std::nullopt, "", "--hw"});
  CHECK(&s.at_cap(16e9) == &s.at_cap(16e9));
  CHECK(&s.at_cap(16e9) != &s.at_cap(0));
  CHECK(s.at_cap(16e9).transfer_ms(1 << 30, Direction::HostToDevice) >
        s.at_cap(0).transfer_ms(1 << 30, Direction::HostToDevice));
}
