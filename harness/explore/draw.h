// Drawing random cases for `mlagate explore` (EXPLORE.md): case i of a search
// is a pure function of the seed, i, the space and the backends' declarations,
// computed with integer arithmetic only, so the same seed draws the same cases
// on any machine. Draws lean toward the values kernels get wrong: block and
// tile boundaries (0, 1, bs - 1, bs, bs + 1, 63/64/65, 2^k +- 1), head counts
// that are no power of two, padding requests, large Q magnitudes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "cases/explore_space.h"

namespace mlagate {

// splitmix64: a stream of 64-bit values from one seed; below(n) maps to
// [0, n) by a 128-bit multiply (no modulo bias worth caring about, no floats).
class DrawRng {
 public:
  DrawRng(std::uint64_t seed, std::uint64_t index);
  std::uint64_t next();
  std::uint64_t below(std::uint64_t n);            // n >= 1
  int between(int lo, int hi);                     // inclusive, lo <= hi
  bool percent(int p) { return static_cast<int>(below(100)) < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[below(v.size())]; }

 private:
  std::uint64_t s_;
};

struct DrawLimits {
  std::uint64_t max_bytes = 0;  // host bytes of one case (estimate_case_bytes); 0: no limit
  double max_work = 1e9;        // multiply-adds of the case's fp64 reference
};

struct DrawnCase {
  CaseSpec spec;
  Op op = Op::kLayer;
  std::string target;  // the backend whose declaration it was drawn within
};

class CaseDrawer {
 public:
  // backends: the selected backends (not owned; they answer supports()).
  CaseDrawer(ExploreSpace space, std::vector<const Backend*> backends, std::uint64_t seed, DrawLimits limits);
  // Case `index` (its batch named "x<index>", suite "explore"); nullopt when no
  // valid case within the limits came out of 400 attempts (a space too narrow).
  std::optional<DrawnCase> draw(std::uint64_t index) const;
  // The ops drawn for a backend: the space's, or every one it declares.
  std::vector<Op> ops_of(const Backend& b) const;
  const ExploreSpace& space() const { return space_; }

 private:
  CaseSpec draw_spec(DrawRng& r, const Backend& b, Op op) const;
  void draw_layout(std::uint64_t index, int attempt, const Backend& b, Op op, CaseSpec& c) const;
  ExploreSpace space_;
  std::vector<const Backend*> backends_;
  std::uint64_t seed_;
  DrawLimits limits_;
};

// Multiply-adds of the fp64 reference of `spec` on `op` (the draw's work limit).
double reference_work(const CaseSpec& spec, Op op);

}  // namespace mlagate
