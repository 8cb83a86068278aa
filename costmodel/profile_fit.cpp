// costmodel/profile_fit.cpp — the roofline fitted to each op class of a profile (see profile_db.h).
//
// Model: t = overhead + max(bytes · x, flops · y), x = 1/bandwidth, y = 1/peak, all ≥ 0, fitted in
// relative error (each point weighted 1/t, so a 5 µs decode op counts as much as a 50 ms prefill).
// For a given (x, y) a point is memory-bound exactly when its arithmetic intensity flops/bytes is
// below x/y, so every classification worth considering is a threshold in intensity: the points are
// sorted by intensity and, for every split (low side memory-bound, high side compute-bound), the
// linear problem t = o + [mem]·bytes·x + [comp]·flops·y is solved by exact non-negative least squares
// (normal equations from prefix sums: O(1) per split). The split whose parameters give the smallest
// relative error of the true max() model wins; then points are re-classified by those parameters and
// re-solved (QR on the weighted design) while that improves the fit.
// A term the data never binds (no memory-bound or no compute-bound point) is set to the least
// favourable value that still leaves every measured point unchanged: the ridge sits at the most
// extreme measured intensity, so extrapolating past the data never predicts faster than measured.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

#include "core/error.h"
#include "costmodel/profile_math.h"

namespace shardwise {
namespace profile_math {

namespace {
constexpr int kSupports[] = {7, 3, 5, 6, 2, 4, 1};  // bit 0: overhead, bit 1: x, bit 2: y
}

Nnls3 nnls3_normal(const Eigen::Matrix3d& N, const Eigen::Vector3d& r, double bb, const std::array<bool, 3>& usable) {
  Nnls3 best;
  const double tie = 1e-12 * std::max(1.0, bb);
  for (int mask : kSupports) {
    int idx[3], k = 0;
    bool ok = true;
    for (int j = 0; j < 3; ++j)
      if (mask & (1 << j)) {
        ok &= usable[j];
        idx[k++] = j;
      }
    if (!ok) continue;
    Eigen::MatrixXd Ns(k, k);
    Eigen::VectorXd rs(k);
    for (int a = 0; a < k; ++a) {
      rs(a) = r(idx[a]);
      for (int b = 0; b < k; ++b) Ns(a, b) = N(idx[a], idx[b]);
    }
    Eigen::FullPivLU<Eigen::MatrixXd> lu(Ns);
    lu.setThreshold(1e-12);
    if (lu.rank() < k) continue;
    const Eigen::VectorXd z = lu.solve(rs);
    if (!z.allFinite() || (z.array() < 0).any()) continue;
    Eigen::Vector3d x = Eigen::Vector3d::Zero();
    for (int a = 0; a < k; ++a) x(idx[a]) = z(a);
    const double obj = std::max(0.0, bb - 2.0 * x.dot(r) + x.dot(N * x));
    if (!best.ok || obj < best.objective - tie) best = {true, x, obj};
  }
  return best;
}

Nnls3 nnls3_design(const Eigen::MatrixX3d& A, const Eigen::VectorXd& b, const std::array<bool, 3>& usable) {
  Nnls3 best;
  const double tie = 1e-12 * std::max(1.0, b.squaredNorm());
  for (int mask : kSupports) {
    int idx[3], k = 0;
    bool ok = true;
    for (int j = 0; j < 3; ++j)
      if (mask & (1 << j)) {
        ok &= usable[j];
        idx[k++] = j;
      }
    if (!ok || A.rows() < k) continue;
    Eigen::MatrixXd As(A.rows(), k);
    for (int a = 0; a < k; ++a) As.col(a) = A.col(idx[a]);
    Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(As);
    qr.setThreshold(1e-10);
    if (qr.rank() < k) continue;
    const Eigen::VectorXd z = qr.solve(b);
    if (!z.allFinite() || (z.array() < 0).any()) continue;
    Eigen::Vector3d x = Eigen::Vector3d::Zero();
    for (int a = 0; a < k; ++a) x(idx[a]) = z(a);
    const double obj = (As * z - b).squaredNorm();
    if (!best.ok || obj < best.objective - tie) best = {true, x, obj};
  }
  return best;
}

Nnls nnls_design(const Eigen::MatrixXd& A, const Eigen::VectorXd& b) {
  const int m = static_cast<int>(A.cols());
  SW_CHECK(m >= 1 && m <= 6, "nnls_design: ", m, " unknowns (1..6)");
  Nnls best;
  best.x = Eigen::VectorXd::Zero(m);
  const double tie = 1e-12 * std::max(1.0, b.squaredNorm());
  // Larger supports first, so that a tie keeps the larger one.
  std::vector<int> masks;
  for (int mask = 1; mask < (1 << m); ++mask) masks.push_back(mask);
  std::stable_sort(masks.begin(), masks.end(),
                   [](int a, int c) { return __builtin_popcount(a) > __builtin_popcount(c); });
  for (int mask : masks) {
    std::vector<int> idx;
    for (int j = 0; j < m; ++j)
      if (mask & (1 << j)) idx.push_back(j);
    const int k = static_cast<int>(idx.size());
    if (A.rows() < k) continue;
    Eigen::MatrixXd As(A.rows(), k);
    for (int a = 0; a < k; ++a) As.col(a) = A.col(idx[static_cast<size_t>(a)]);
    Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(As);
    qr.setThreshold(1e-10);
    if (qr.rank() < k) continue;
    const Eigen::VectorXd z = qr.solve(b);
    if (!z.allFinite() || (z.array() < 0).any()) continue;
    const double obj = (As * z - b).squaredNorm();
    if (!best.ok || obj < best.objective - tie) {
      best.ok = true;
      best.objective = obj;
      best.x.setZero();
      for (int a = 0; a < k; ++a) best.x(idx[static_cast<size_t>(a)]) = z(a);
    }
  }
  return best;
}

namespace {

double relative_sse(const std::vector<FitPoint>& pts, const RooflineParams& q) {
  double s = 0;
  for (const FitPoint& p : pts) {
    const double e = (q.predict(p.bytes, p.flops) - p.ms) / p.ms;
    s += e * e;
  }
  return s;
}

double median_relative_error(const std::vector<FitPoint>& pts, const RooflineParams& q) {
  std::vector<double> e;
  for (const FitPoint& p : pts) e.push_back(std::fabs(q.predict(p.bytes, p.flops) - p.ms) / p.ms);
  std::sort(e.begin(), e.end());
  const size_t n = e.size();
  return n % 2 ? e[n / 2] : (e[n / 2 - 1] + e[n / 2]) / 2;
}

// Terms the data never binds: the ridge at the most extreme measured intensity.
void bind_unbound_terms(const std::vector<FitPoint>& pts, RooflineParams& q) {
  constexpr double kTinyX = 1.0 / (1e9 * 1e6), kTinyY = 1.0 / (1e12 * 1e6);  // 1e9 GB/s, 1e12 GFLOP/s
  if (!(q.x > kTinyX) && !(q.y > kTinyY)) {
    q.x = kTinyX;
    q.y = kTinyY;
  } else if (!(q.y > kTinyY)) {
    q.y = INFINITY;
    for (const FitPoint& p : pts)
      if (p.flops > 0) q.y = std::min(q.y, p.bytes * q.x / p.flops);
    if (!std::isfinite(q.y) || q.y < kTinyY) q.y = kTinyY;
  } else if (!(q.x > kTinyX)) {
    q.x = INFINITY;
    for (const FitPoint& p : pts)
      if (p.bytes > 0) q.x = std::min(q.x, p.flops * q.y / p.bytes);
    if (!std::isfinite(q.x) || q.x < kTinyX) q.x = kTinyX;
  }
}

}  // namespace

RooflineParams fit_roofline(std::vector<FitPoint> pts) {
  const size_t n = pts.size();
  if (n == 0) fail("fit_roofline: no points");
  std::sort(pts.begin(), pts.end(),
            [](const FitPoint& a, const FitPoint& b) { return a.flops * b.bytes < b.flops * a.bytes; });
  double sb = 0, sf = 0;  // column scales
  for (const FitPoint& p : pts) {
    sb = std::max(sb, p.bytes);
    sf = std::max(sf, p.flops);
  }
  if (sb <= 0) sb = 1;
  if (sf <= 0) sf = 1;

  // Weighted, scaled columns: w = 1/t, b' = bytes/sb, f' = flops/sf; the target is 1 for every point.
  // Prefix sums over the memory-bound side [0, k), suffix sums over the compute-bound side [k, n).
  std::vector<double> pb(n + 1, 0), pbb(n + 1, 0), pbw(n + 1, 0), sfw2(n + 1, 0), sff(n + 1, 0), sfw(n + 1, 0);
  double w2 = 0, w1 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double w = 1.0 / pts[i].ms, b = pts[i].bytes / sb;
    w2 += w * w;
    w1 += w;
    pb[i + 1] = pb[i] + b * w * w;
    pbb[i + 1] = pbb[i] + b * b * w * w;
    pbw[i + 1] = pbw[i] + b * w;
  }
  for (size_t i = n; i-- > 0;) {
    const double w = 1.0 / pts[i].ms, f = pts[i].flops / sf;
    sfw2[i] = sfw2[i + 1] + f * w * w;
    sff[i] = sff[i + 1] + f * f * w * w;
    sfw[i] = sfw[i + 1] + f * w;
  }

  RooflineParams best;
  best.rel_sse = INFINITY;
  auto consider = [&](const Nnls3& s) {
    if (!s.ok) return;
    RooflineParams q;
    q.o = s.x(0);
    q.x = s.x(1) / sb;
    q.y = s.x(2) / sf;
    q.rel_sse = relative_sse(pts, q);
    if (q.rel_sse < best.rel_sse * (1 - 1e-12)) best = q;
  };
  // All memory-bound first, so that equal fits (constant intensity: norms, element-wise) stay
  // memory-bound.
  for (size_t k = n + 1; k-- > 0;) {
    Eigen::Matrix3d N;
    N << w2, pb[k], sfw2[k], pb[k], pbb[k], 0, sfw2[k], 0, sff[k];
    const Eigen::Vector3d r(w1, pbw[k], sfw[k]);
    consider(nnls3_normal(N, r, static_cast<double>(n), {true, k > 0, k < n}));
  }
  // Re-classify by the winner and re-solve on the design matrix while that helps.
  for (int iter = 0; iter < 10 && std::isfinite(best.rel_sse); ++iter) {
    Eigen::MatrixX3d A(n, 3);
    bool any_mem = false, any_comp = false;
    for (size_t i = 0; i < n; ++i) {
      const FitPoint& p = pts[i];
      const bool mem = p.bytes * best.x >= p.flops * best.y;
      any_mem |= mem;
      any_comp |= !mem;
      A(i, 0) = 1.0 / p.ms;
      A(i, 1) = mem ? p.bytes / sb / p.ms : 0.0;
      A(i, 2) = mem ? 0.0 : p.flops / sf / p.ms;
    }
    const double before = best.rel_sse;
    consider(nnls3_design(A, Eigen::VectorXd::Ones(n), {true, any_mem, any_comp}));
    if (!(best.rel_sse < before * (1 - 1e-9))) break;
  }

  RooflineParams q = best;
  bind_unbound_terms(pts, q);
  q.o = std::max(0.0, q.o);
  q.rel_sse = relative_sse(pts, q);
  return q;
}

}  // namespace profile_math

namespace {

using namespace profile_math;

RooflineFit fit_points(const std::vector<FitPoint>& pts) {
  const RooflineParams q = fit_roofline(pts);
  RooflineFit f;
  f.bw_gbps = std::min(1e9, std::max(1e-6, 1.0 / (q.x * 1e6)));
  f.peak_gflops = std::min(1e12, std::max(1e-6, 1.0 / (q.y * 1e6)));
  f.overhead_ms = q.o;
  f.points = static_cast<int>(pts.size());
  RooflineParams stored;
  stored.o = f.overhead_ms;
  stored.x = 1.0 / (f.bw_gbps * 1e6);
  stored.y = 1.0 / (f.peak_gflops * 1e6);
  f.median_rel_err = median_relative_error(pts, stored);
  return f;
}

}  // namespace

void fit_profile(ProfileDB& db) {
  using Key = std::tuple<int, int, int, int, bool>;  // backend, kind, dtype, threads, contention
  std::map<Key, std::vector<FitPoint>> classes;
  for (const OpSample& s : db.ops)
    classes[{static_cast<int>(s.backend), static_cast<int>(s.op.kind), static_cast<int>(class_dtype(s.op)), s.threads,
             s.contention}]
        .push_back({op_bytes(s.op), s.op.flops(), s.ms});
  db.fits.clear();
  for (auto& [key, pts] : classes) {
    RooflineFit f = fit_points(pts);
    f.backend = static_cast<Backend>(std::get<0>(key));
    f.kind = static_cast<OpKind>(std::get<1>(key));
    f.dtype = static_cast<DType>(std::get<2>(key));
    f.threads = std::get<3>(key);
    f.contention = std::get<4>(key);
    db.fits.push_back(f);
  }
}

}  // namespace shardwise
