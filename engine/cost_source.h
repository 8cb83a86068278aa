// engine/cost_source.h — the cost model every caller plans with (`run`, `plan`, the sweep, Python),
// from the user's choice of machine. One precedence rule: a measured profile takes precedence over a
// datasheet; the datasheet then only stands in for the GPU of a CPU-only profile, and beside a profile
// with GPU rows it is not used (a note the caller may log, in its own terms).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "core/hardware_spec.h"
#include "costmodel/cost_model.h"
#include "costmodel/profile_db.h"

namespace shardwise {

struct MachineChoice {
  std::string hw;                            // builtin machine or hardware .yaml; empty: none given
  std::optional<HardwareSpec> hw_spec;       // a datasheet already read (Python passes objects), instead of `hw`
  std::string profile;                       // a ProfileDB file (`shardwise profile`); empty: none
  std::string hw_option = "--hw";            // how the caller names the datasheet, for the note
  std::string profile_option = "--profile";  // ... and the profile
};

class CostSource {
 public:
  // Loads the profile, and reads the datasheet only where it is used (a bad --hw beside a GPU profile
  // is not an error). Throws Error when neither is given: callers first say it in their own terms.
  explicit CostSource(const MachineChoice& choice);

  // The cost model under a PCIe cap (bytes/s, 0 = none), built on first use and kept per cap (a
  // measured one indexes and fits the whole profile: a study plans hundreds of configurations).
  const CostModel& at_cap(double pcie_cap_bytes_per_s) const;

  bool measured() const { return db_.has_value(); }
  const ProfileDB* profile() const { return db_ ? &*db_ : nullptr; }
  // The datasheet the cost model answers from: the analytic model's, or the GPU standing in for a
  // CPU-only profile's; null beside a profile that has GPU rows (or when no datasheet was given).
  const HardwareSpec* datasheet() const { return hw_ ? &*hw_ : nullptr; }
  // What to tell the user when the datasheet was given but not used; empty otherwise.
  const std::string& unused_datasheet_note() const { return note_; }
  // The machine in one word: the datasheet's name, or the profile's file name.
  std::string label() const;

 private:
  std::optional<ProfileDB> db_;
  std::optional<HardwareSpec> hw_;
  std::string profile_path_;
  std::string note_;
  mutable std::map<long long, std::unique_ptr<CostModel>> models_;
};

}  // namespace shardwise
