// costmodel/profile_math.h — internal to costmodel: the small least-squares pieces shared by the
// roofline fit (profile_fit.cpp) and the measured model (measured_cost_model.cpp), and the class key
// of an op. Not part of the module's contract.
#pragma once

#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <vector>

#include "costmodel/profile_db.h"

namespace shardwise::profile_math {

// Norm, Rope, Elementwise and Embed touch f32 activations only: their classes ignore the dtype
// (recorded as f32) and their size is `elems`, not the tokens.
inline bool sized_by_elems(OpKind k) {
  return k == OpKind::Norm || k == OpKind::Rope || k == OpKind::Elementwise || k == OpKind::Embed;
}
inline DType class_dtype(const Op& op) {
  return sized_by_elems(op.kind) ? DType::F32 : op.dtype;
}

inline double op_bytes(const Op& op) {
  return op.weight_bytes() + op.activation_bytes();
}

// t_ms of a fitted roofline.
inline double roofline_ms(const RooflineFit& f, double bytes, double flops) {
  return f.overhead_ms + std::max(bytes / (f.bw_gbps * 1e6), flops / (f.peak_gflops * 1e6));
}

struct Nnls3 {
  bool ok = false;
  Eigen::Vector3d x = Eigen::Vector3d::Zero();
  double objective = 0;  // residual sum of squares
};

// The roofline t = o + max(bytes · x, flops · y) (ms, ms per byte, ms per flop) fitted by least
// squares in relative error (see profile_fit.cpp). x and y come back positive and finite: a term no
// point binds is set so that the ridge sits at the most extreme measured intensity.
struct FitPoint {
  double bytes, flops, ms;
};
struct RooflineParams {
  double o = 0, x = 0, y = 0;
  double rel_sse = 0;  // sum of squared relative errors on the fitted points
  double predict(double bytes, double flops) const { return o + std::max(bytes * x, flops * y); }
};
RooflineParams fit_roofline(std::vector<FitPoint> points);

// Non-negative least squares with at most three unknowns, exactly: the optimum is the unconstrained
// solution on its support, so every support (subset of the `usable` unknowns, larger ones first) is
// solved and the non-negative solution of least residual kept (ties keep the larger support).
// Given the normal equations N = AᵀA, r = Aᵀb and bb = bᵀb.
Nnls3 nnls3_normal(const Eigen::Matrix3d& N, const Eigen::Vector3d& r, double bb, const std::array<bool, 3>& usable);
// The same on the design matrix (n × 3) itself, solved by column-pivoting QR (better conditioned).
Nnls3 nnls3_design(const Eigen::MatrixX3d& A, const Eigen::VectorXd& b, const std::array<bool, 3>& usable);

// The same for a design matrix of up to 6 columns (every support enumerated).
struct Nnls {
  bool ok = false;
  Eigen::VectorXd x;
  double objective = 0;
};
Nnls nnls_design(const Eigen::MatrixXd& A, const Eigen::VectorXd& b);

}  // namespace shardwise::profile_math
