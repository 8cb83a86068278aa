// dev/pin/pin_file_probe.cu — lab: how should weights read from a file reach pinned host memory?
//
// Each method runs in a child process with a time limit, so a registration that never returns is
// caught: the parent then prints the child's kernel stacks (/proc/PID/task/*/stack) and kills it.
// Methods:
//   private_ro    mmap(PROT_READ, MAP_PRIVATE) + cudaHostRegister(ReadOnly)   (what the product did)
//   shared_ro     mmap(PROT_READ, MAP_SHARED)  + cudaHostRegister(ReadOnly)
//   anon_read     anonymous mmap, parallel pread of the file, cudaHostRegister(Default)
//   hostalloc     cudaHostAlloc, parallel pread of the file
// For each (check, then time): the bytes seen equal the file's (a checksum), then the load and pin
// times, H2D GB/s of 1 GiB copies from the buffer, and the CPU's read GB/s over the buffer with T
// threads (pinning may change how the kernel maps the pages, and with it the CPU's read rate).
//
// Build: nvcc -O2 -std=c++17 -arch=sm_90 -o pin_file_probe pin_file_probe.cu -lpthread
// Usage: pin_file_probe FILE GIB THREADS [method ...]   (writes FILE of GIB GiB if it is smaller)
#include <cuda_runtime.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void die(const char* what) {
  std::fprintf(stderr, "error: %s (%s)\n", what, std::strerror(errno));
  std::exit(2);
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("  CUDA %s: %s\n", what, cudaGetErrorString(e));
    std::fflush(stdout);
    std::exit(3);
  }
}

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

// The file holds mix(i) at word i: any byte read from the wrong place fails the checksum.
void make_file(const char* path, uint64_t bytes) {
  struct stat st;
  if (stat(path, &st) == 0 && static_cast<uint64_t>(st.st_size) >= bytes) return;
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("create file");
  std::vector<uint64_t> buf(1 << 20);
  for (uint64_t at = 0; at < bytes; at += buf.size() * 8) {
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = mix(at / 8 + i);
    if (write(fd, buf.data(), buf.size() * 8) != static_cast<ssize_t>(buf.size() * 8)) die("write file");
  }
  close(fd);
}

template <class F>
void parallel(int threads, uint64_t n, F&& f) {
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] { f(n * t / threads, n * (t + 1) / threads); });
  for (auto& t : ts) t.join();
}

// Sum of words XOR their expected value (0 when every word is where it should be) and the rate.
double check_and_read(const uint8_t* p, uint64_t bytes, int threads, bool* ok) {
  const uint64_t words = bytes / 8;
  std::atomic<uint64_t> bad{0};
  const double t0 = now_s();
  parallel(threads, words, [&](uint64_t b, uint64_t e) {
    const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
    uint64_t acc = 0;
    for (uint64_t i = b; i < e; ++i) acc |= w[i] ^ mix(i);
    bad |= acc;
  });
  const double dt = now_s() - t0;
  *ok = bad.load() == 0;
  return bytes / dt / 1e9;
}

double read_rate(const uint8_t* p, uint64_t bytes, int threads) {
  const uint64_t words = bytes / 8;
  std::atomic<uint64_t> sink{0};
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = now_s();
    parallel(threads, words, [&](uint64_t b, uint64_t e) {
      const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (uint64_t i = b; i + 4 <= e; i += 4) {
        a0 += w[i];
        a1 += w[i + 1];
        a2 += w[i + 2];
        a3 += w[i + 3];
      }
      sink += a0 + a1 + a2 + a3;
    });
    best = std::max(best, bytes / (now_s() - t0) / 1e9);
  }
  return best;
}

void pread_all(const char* path, uint8_t* dst, uint64_t bytes, int threads) {
  const int fd = open(path, O_RDONLY);
  if (fd < 0) die("open for pread");
  parallel(threads, bytes / 4096, [&](uint64_t b, uint64_t e) {
    uint64_t at = b * 4096;
    const uint64_t end = e == bytes / 4096 ? bytes : e * 4096;
    while (at < end) {
      const ssize_t r = pread(fd, dst + at, std::min<uint64_t>(end - at, 64ull << 20), static_cast<off_t>(at));
      if (r <= 0) die("pread");
      at += static_cast<uint64_t>(r);
    }
  });
  close(fd);
}

double h2d_rate(const uint8_t* host, uint64_t bytes) {
  const uint64_t chunk = std::min<uint64_t>(bytes, 1ull << 30);
  void* dev = nullptr;
  cuda_ok(cudaMalloc(&dev, chunk), "cudaMalloc");
  cudaStream_t s;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cuda_ok(cudaMemcpyAsync(dev, host, chunk, cudaMemcpyHostToDevice, s), "warm-up copy");
  cuda_ok(cudaStreamSynchronize(s), "sync");
  const int reps = 4;
  cudaEventRecord(a, s);
  for (int r = 0; r < reps; ++r) {
    const uint64_t off = (bytes - chunk) / reps * r / 4096 * 4096;
    cuda_ok(cudaMemcpyAsync(dev, host + off, chunk, cudaMemcpyHostToDevice, s), "copy");
  }
  cudaEventRecord(b, s);
  cuda_ok(cudaEventSynchronize(b), "sync");
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaFree(dev);
  return reps * chunk / (ms / 1e3) / 1e9;
}

long rss_mb() {
  FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (f && std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "VmRSS:", 6) == 0) kb = std::atol(line + 6);
  if (f) std::fclose(f);
  return kb / 1024;
}

void run_method(const std::string& m, const char* path, uint64_t bytes, int threads) {
  double t0 = now_s();
  cuda_ok(cudaFree(nullptr), "context");
  const double t_ctx = now_s() - t0;
  const uint8_t* p = nullptr;
  double t_load = 0, t_pin = 0;
  if (m == "private_ro" || m == "shared_ro") {
    const int fd = open(path, O_RDONLY);
    if (fd < 0) die("open");
    t0 = now_s();
    void* q = mmap(nullptr, bytes, PROT_READ, m == "private_ro" ? MAP_PRIVATE : MAP_SHARED, fd, 0);
    if (q == MAP_FAILED) die("mmap");
    close(fd);
    t_load = now_s() - t0;
    std::printf("  %s: mapped, registering %.2f GiB read-only\n", m.c_str(), bytes / 1073741824.0);
    std::fflush(stdout);
    t0 = now_s();
    cuda_ok(cudaHostRegister(q, bytes, cudaHostRegisterReadOnly), "cudaHostRegister(ReadOnly)");
    t_pin = now_s() - t0;
    p = static_cast<const uint8_t*>(q);
  } else if (m == "anon_read") {
    t0 = now_s();
    void* q = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) die("mmap anon");
    pread_all(path, static_cast<uint8_t*>(q), bytes, threads);
    t_load = now_s() - t0;
    t0 = now_s();
    cuda_ok(cudaHostRegister(q, bytes, cudaHostRegisterDefault), "cudaHostRegister(Default)");
    t_pin = now_s() - t0;
    p = static_cast<const uint8_t*>(q);
  } else if (m == "hostalloc") {
    t0 = now_s();
    void* q = nullptr;
    cuda_ok(cudaHostAlloc(&q, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    t_pin = now_s() - t0;
    t0 = now_s();
    pread_all(path, static_cast<uint8_t*>(q), bytes, threads);
    t_load = now_s() - t0;
    p = static_cast<const uint8_t*>(q);
  } else {
    std::printf("  unknown method %s\n", m.c_str());
    std::exit(4);
  }
  bool ok = false;
  const double first = check_and_read(p, bytes, threads, &ok);
  const double h2d = h2d_rate(p, bytes);
  const double cpu = read_rate(p, bytes, threads);
  std::printf(
      "RESULT %-11s ok=%d ctx=%.2fs load=%.2fs pin=%.2fs first_read=%.1fGB/s h2d=%.1fGB/s cpu_read=%.1fGB/s "
      "rss=%ldMB\n",
      m.c_str(), ok ? 1 : 0, t_ctx, t_load, t_pin, first, h2d, cpu, rss_mb());
  std::fflush(stdout);
}

void print_stacks(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string base = dir + "/" + e->d_name;
    std::string stat, stack;
    char buf[4096];
    if (FILE* f = std::fopen((base + "/stat").c_str(), "r")) {
      if (std::fgets(buf, sizeof buf, f)) stat = buf;
      std::fclose(f);
    }
    if (FILE* f = std::fopen((base + "/stack").c_str(), "r")) {
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) stack.append(buf, n);
      std::fclose(f);
    }
    std::printf("  task %s: %.60s\n%s", e->d_name, stat.c_str(), stack.c_str());
  }
  closedir(d);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s FILE GIB THREADS [method ...]\n", argv[0]);
    return 1;
  }
  const char* path = argv[1];
  const uint64_t bytes = static_cast<uint64_t>(std::atof(argv[2]) * 1073741824.0) / 4096 * 4096;
  const int threads = std::atoi(argv[3]);
  std::vector<std::string> methods;
  for (int i = 4; i < argc; ++i) methods.push_back(argv[i]);
  if (methods.empty()) methods = {"private_ro", "shared_ro", "anon_read", "hostalloc"};
  const double limit_s = std::getenv("PROBE_LIMIT_S") ? std::atof(std::getenv("PROBE_LIMIT_S")) : 30;
  const double t0 = now_s();
  make_file(path, bytes);
  std::printf("file %s: %.2f GiB ready in %.1f s\n", path, bytes / 1073741824.0, now_s() - t0);
  std::fflush(stdout);
  for (const auto& m : methods) {
    const pid_t pid = fork();
    if (pid == 0) {
      run_method(m, path, bytes, threads);
      std::_Exit(0);
    }
    const double start = now_s();
    int status = 0;
    bool done = false;
    while (now_s() - start < limit_s) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        done = true;
        break;
      }
      usleep(50000);
    }
    if (!done) {
      std::printf("RESULT %-11s HUNG after %.0f s; kernel stacks of its threads:\n", m.c_str(), limit_s);
      print_stacks(pid);
      std::fflush(stdout);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::printf("RESULT %-11s failed (status %d)\n", m.c_str(), status);
    }
  }
  return 0;
}
