// serve/server.h — `shardwise serve`: an OpenAI-compatible HTTP server for one model (Boost.Beast).
// I/O threads read requests, answer GET /health, /metrics and /v1/models themselves, and turn
// POST /v1/chat/completions and /v1/completions into generations for the Scheduler, whose events they
// write back whole or as server-sent events. A client that disconnects cancels its generation.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "executor/session/step_engine.h"
#include "serve/api.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"

namespace shardwise {
class Runtime;
}

namespace shardwise::serve {

// A model whose VRAM budget can change while it stays loaded (the CLI's run set-up on a device):
// POST /admin/budget.
class BudgetControl {
 public:
  virtual ~BudgetControl() = default;
  // Re-plans for `bytes` and sets a new engine up (the old one gone first); what it did, as JSON. Throws
  // Error when it cannot, with the old budget's engine set up again.
  virtual nlohmann::json change_budget(uint64_t bytes) = 0;
  virtual StepEngine& engine() = 0;
  virtual Runtime* runtime() = 0;  // the engine's runtime (device metrics)
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;               // 0: a free port (Server::port() says which)
  std::string api_key;                // non-empty: every /v1 request needs "Authorization: Bearer KEY" (else 401)
  int parallel = 1;                   // scheduler slots: requests stepped together (at most the engine's slots)
  int64_t queue_limit = 64;           // generations waiting beyond it are refused with 429
  double timeout_s = 600;             // per generation, from its arrival (0: none); see Scheduler
  uint64_t max_body_bytes = 1 << 20;  // larger bodies are refused with 413 before they are read
  int64_t prefill_chunk = 512;        // prompt tokens per step (0: the runtime's tiers)
  int io_threads = 2;
  int max_connections = 512;        // connections beyond it get 503 and are closed
  double idle_timeout_s = 60;       // a connection silent this long between requests, or not reading, is closed
  BudgetControl* budget = nullptr;  // null: the budget is fixed (POST /admin/budget answers 400)
};

// Listens on host:port and closes again: `serve` checks its address this way before it loads the model,
// so that a port in use or a host that does not resolve is one error line at once, not after the load.
// Throws Error as the Server would.
void check_listen_address(const std::string& host, uint16_t port);

class Server {
 public:
  // Binds host:port and starts the scheduler on `engine` (which must outlive the server). `runtime`,
  // where the run has one, gives the device metrics. Throws Error for an address it cannot listen on and
  // for a --parallel the engine has no slots for.
  Server(StepEngine& engine, ServedModel model, const ServerOptions& options, Runtime* runtime = nullptr);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  std::string url() const;  // "http://127.0.0.1:8080"

  void start();  // the I/O threads begin accepting
  // SIGINT and SIGTERM make wait() return (call before start()).
  void stop_on_signals();
  // Blocks until request_stop() or one of those signals.
  void wait();
  void request_stop();
  // Refuses new work, fails what waits, cancels what runs, closes every connection, joins the threads.
  // Idempotent; not from an I/O thread.
  void stop();

  Metrics& metrics();
  Scheduler& scheduler();
  const ServedModel& model() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardwise::serve
