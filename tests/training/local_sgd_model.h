// The model and references of the LocalSgd tests (test_local_sgd_mpi.cc,
// test_local_sgd_streaming_mpi.cc): two parameters, w (float32, 3x4) and b
// (float64, 5), a deterministic gradient different on every rank, and the
// allgathers that let every rank compute the reference from all ranks'
// values.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gyre/gyre.h"
#include "gyre/view.h"

#include "../core/mpi_session.h"

namespace gyre::test_lsgd {

// A gyre session per test case; a stalled collective ends the job after 60 s.
struct Session : test::Session {
  Session() : test::Session(test::test_options_with_stall_shutdown(60)) {}
};

constexpr double kLr = 0.05;  // the inner SGD's learning rate

// The job's parameters: w (float32, 3x4) and b (float64, 5). Before the
// LocalSgd's broadcast each rank holds its own values, 0.01 k + `owner`.
struct Model {
  std::vector<float> w = std::vector<float>(12);
  std::vector<double> b = std::vector<double>(5);

  explicit Model(int owner) { set(initial(owner)); }
  static std::vector<double> initial(int owner) {
    std::vector<double> v(17);
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = 0.01 * static_cast<double>(k) + owner;
    return v;
  }
  std::vector<TensorView> views() { return {view(w, {3, 4}), view(b)}; }
  std::vector<double> flat() const {
    std::vector<double> v(w.begin(), w.end());
    v.insert(v.end(), b.begin(), b.end());
    return v;
  }
  void set(const std::vector<double>& v) {
    for (std::size_t k = 0; k < w.size(); ++k) w[k] = static_cast<float>(v[k]);
    for (std::size_t k = 0; k < b.size(); ++k) b[k] = v[w.size() + k];
  }
};

// Rank r's gradient at step t: 0.5 θ + sin(0.37 k + 1.3 (r + 1) + 0.19 t),
// different on every rank.
inline std::vector<double> gradient(const std::vector<double>& theta, int r, int t) {
  std::vector<double> g(theta.size());
  for (std::size_t k = 0; k < g.size(); ++k) {
    g[k] = 0.5 * theta[k] + std::sin(0.37 * static_cast<double>(k) + 1.3 * (r + 1) + 0.19 * t);
  }
  return g;
}

// The job's own (inner) update: plain SGD on this rank's gradient.
inline std::vector<double> inner_step(Model& m, int t) {
  std::vector<double> theta = m.flat();
  const std::vector<double> g = gradient(theta, rank(), t);
  for (std::size_t k = 0; k < theta.size(); ++k) theta[k] -= kLr * g[k];
  m.set(theta);
  return g;
}

// Every rank's `mine`, rank after rank.
inline std::vector<std::vector<double>> gather(const std::string& name,
                                               const std::vector<double>& mine) {
  Handle h = allgather_async(name, view(mine));
  h.wait();
  const OwnedTensor& out = h.output();
  std::vector<double> all(out.data.size() / sizeof(double));
  std::memcpy(all.data(), out.data.data(), out.data.size());
  std::vector<std::vector<double>> per_rank;
  for (std::size_t at = 0; at < all.size(); at += mine.size()) {
    per_rank.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(at),
                          all.begin() + static_cast<std::ptrdiff_t>(at + mine.size()));
  }
  return per_rank;
}

inline std::vector<double> mean(const std::vector<std::vector<double>>& per_rank) {
  std::vector<double> m(per_rank.front().size(), 0.0);
  for (const auto& v : per_rank) {
    for (std::size_t k = 0; k < m.size(); ++k) m[k] += v[k] / static_cast<double>(per_rank.size());
  }
  return m;
}

// Elements 0..11 are float32 (w), 12..16 float64 (b): each compared with
// its own tolerance.
inline void check_close(const std::vector<double>& got, const std::vector<double>& want,
                        double tol32, double tol64, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    INFO(fmt::format("{}: element {} is {:.12g}, expected {:.12g}", what, k, got[k], want[k]));
    CHECK(std::abs(got[k] - want[k]) <= (k < 12 ? tol32 : tol64));
  }
}

// A checksum of the parameters' bits: equal on two ranks iff (almost
// surely) their parameters are identical.
inline double checksum(const Model& m) {
  double s = 0;
  const auto v = m.flat();
  for (std::size_t k = 0; k < v.size(); ++k) s += v[k] * static_cast<double>(k + 1) * 1.0000001;
  return s;
}

}  // namespace gyre::test_lsgd
