// executor/runtime/timeline_trace.cpp — see timeline_trace.h.
#include "executor/runtime/timeline_trace.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "planner/plan.h"

namespace shardwise {

std::string write_timeline_trace(const Runtime& rt, const std::string& path, const std::string& option) {
  nlohmann::json events = nlohmann::json::array();
  std::map<int, std::pair<double, double>> span;  // run -> measured end, predicted end
  std::map<int, double> enqueued;                 // run -> when the host had enqueued its last device action
  auto name_process = [&](int pid, const std::string& name) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}});
    for (int r = 0; r < kNumResources; ++r)
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", pid},
                        {"tid", r},
                        {"args", {{"name", resource_name(static_cast<Resource>(r))}}}});
  };
  int last_run = -1;
  for (const TimelineEntry& t : rt.timeline()) {
    if (t.run != last_run) {
      last_run = t.run;
      const std::string what = str_cat("run ", t.run, ": tier ", t.tier, ", ", schedule_name(t.schedule));
      name_process(2 * t.run, what + " (measured)");
      name_process(2 * t.run + 1, what + " (predicted)");
      for (const auto& tier : rt.table().tiers)
        if (tier.tokens == t.tier)
          if (const Plan* p = tier.find(t.schedule))
            for (const Action& a : p->actions) {
              events.push_back({{"name", a.label},
                                {"cat", action_kind_name(a.kind)},
                                {"ph", "X"},
                                {"pid", 2 * t.run + 1},
                                {"tid", static_cast<int>(a.resource)},
                                {"ts", a.start_ms * 1e3},
                                {"dur", (a.end_ms - a.start_ms) * 1e3},
                                {"args", {{"id", a.id}, {"bytes", a.bytes}}}});
              span[t.run].second = std::max(span[t.run].second, a.end_ms);
            }
    }
    nlohmann::json args = {{"id", t.action}};
    if (t.enqueue_end_ms >= 0) {
      args["enqueued_ms"] = {t.enqueue_start_ms, t.enqueue_end_ms};
      enqueued[t.run] = std::max(enqueued[t.run], t.enqueue_end_ms);
    }
    events.push_back({{"name", t.label},
                      {"ph", "X"},
                      {"pid", 2 * t.run},
                      {"tid", static_cast<int>(t.resource)},
                      {"ts", t.start_ms * 1e3},
                      {"dur", (t.end_ms - t.start_ms) * 1e3},
                      {"args", args}});
    span[t.run].first = std::max(span[t.run].first, t.end_ms);
  }
  nlohmann::json j;
  j["traceEvents"] = events;
  j["displayTimeUnit"] = "ms";
  std::ofstream out(path);
  if (!out) fail(option, " ", path, ": cannot write the file (check the directory and permissions)");
  out << j.dump();
  if (!out) fail(option, " ", path, ": writing failed");
  // The third figure: when the host had enqueued the run's last device action. Close to the
  // measured end, the device waited for the host (launch-bound); far before it, the device was busy.
  std::string s =
      str_cat("timeline: ", span.size(), " plan runs -> ", path, " (measured / predicted / host enqueue done, ms:");
  char buf[96];
  for (const auto& [run, ms] : span) {
    std::snprintf(buf, sizeof buf, " %.2f/%.2f/%.2f", ms.first, ms.second, enqueued.count(run) ? enqueued[run] : 0.0);
    s += buf;
  }
  return s + ")";
}

}  // namespace shardwise
