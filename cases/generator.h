// Counter-based deterministic generator: every value is a pure function of
// (seed, tensor name, element index), so inputs are identical on any machine,
// compiler, thread count and case order. Only IEEE +, -, *, / and sqrt are
// used (this folder is built with -ffp-contract=off), never libm or <random>.
#pragma once

#include <cstdint>
#include <string_view>

namespace mlagate::gen {

// Bump when any generated bit changes; recorded in reports and golden files.
inline constexpr int kGeneratorVersion = 2;

std::uint64_t mix64(std::uint64_t x);              // splitmix64 finalizer
std::uint64_t tensor_key(std::string_view name);   // FNV-1a 64 of the name
std::uint64_t bits(std::uint64_t seed, std::uint64_t tensor, std::uint64_t index, std::uint64_t sub = 0);
// Uniform in (0, 1): 53 random bits, never exactly 0 or 1.
double uniform(std::uint64_t seed, std::uint64_t tensor, std::uint64_t index, std::uint64_t sub = 0);
// Standard normal by the Box-Muller transform with our own log, sine and
// cosine: normals 2k and 2k+1 are one pair (version 2; version 1 drew each by
// Marsaglia's polar method).
double normal(std::uint64_t seed, std::uint64_t tensor, std::uint64_t index);
// Natural log for x > 0 from IEEE arithmetic only (|error| < 2 ulp). Exposed for tests.
double det_log(double x);
// The same values with the (seed, tensor) part of the hash hoisted out of
// per-element loops: normal(seed, tensor, i) == normal_at(stream(seed, tensor), i).
std::uint64_t stream(std::uint64_t seed, std::uint64_t tensor);
double normal_at(std::uint64_t stream, std::uint64_t index);
// normal_at(stream, first + i) into out[i] for i < n, several indices at a
// time (the same bits, several times faster: the inputs' main cost).
void normals_at(std::uint64_t stream, std::uint64_t first, std::int64_t n, double* out);
// Uniform integer in [0, n).
std::uint64_t below(std::uint64_t n, std::uint64_t seed, std::uint64_t tensor, std::uint64_t index);

}  // namespace mlagate::gen
