// Private to golden/*.cpp: the names of schema v1 (golden/SCHEMA.md) and the
// pieces the writer and the reader share.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cases/case.h"
#include "golden/golden_file.h"

namespace mlagate::golden::schema {

inline constexpr const char* kCasesGroup = "cases";
inline constexpr const char* kCaseIds = "case_ids";
inline constexpr const char* kInputsGroup = "inputs";
inline constexpr const char* kCacheGroup = "cache";
inline constexpr const char* kGoldenGroup = "golden";
inline constexpr const char* kDecodeGroup = "decode";
inline constexpr const char* kBaselineGroup = "err_baseline";
inline constexpr const char* kResultsGroup = "results";
// Dataset names of the five inputs, in the order of the combined input hash.
inline constexpr std::array<const char*, 5> kInputNames = {"q", "kv_c", "k_pe", "W_UK", "W_UV"};

// Reader limits that no real file comes near.
inline constexpr std::size_t kMaxCases = 1'000'000;
inline constexpr std::size_t kMaxIdBytes = 4096;
inline constexpr std::int64_t kMaxRequests = 1 << 20;
inline constexpr std::size_t kMaxMembers = 100'000;

std::string file_kind_name(FileKind k);  // "golden" | "results"

// The components of a case id as HDF5 group names below /cases; throws
// GoldenFileError for an id that cannot be a path (empty or "." component).
std::vector<std::string> id_path(const std::string& id);
std::string cache_group_name(int block_size);  // "bs16"

// Tensors of a case in kInputNames order.
std::array<const Tensor*, 5> input_tensors(const Case& c);
std::array<Tensor*, 5> input_tensors(Case& c);
// Expected shapes of the inputs, from the spec alone.
std::array<Shape, 5> input_shapes(const CaseSpec& spec);

// A cache of this case's format with one token at `block_size`: its kv dtype,
// element dtype, entry size and data shape are what build_paged_cache makes,
// so every format of cases/ (fp8 ones included) is validated the same way.
PagedCache cache_template(const CaseSpec& spec, int block_size);

// Shape, dtype, (heads, dim) of an output an op produces, as harness/run/layer.cpp allocates it.
struct OutputShape {
  Shape shape;
  DType dtype;
  std::int64_t heads, dim;
};
bool output_shape(const CaseSpec& spec, const std::string& op, const std::string& output, OutputShape& out);

}  // namespace mlagate::golden::schema
