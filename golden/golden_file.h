// Golden and results files (HDF5, schema in golden/SCHEMA.md): export a suite's
// inputs, paged caches and fp64 references; read them back fully validated;
// store every backend's outputs and metrics. HDF5 itself stays behind this
// header (golden/detail/h5.h is private to golden/*.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cases/case.h"
#include "cases/errors.h"
#include "cases/paged_cache.h"
#include "cases/op.h"
#include "cases/tensor.h"
#include "reference/compare.h"
#include "reference/prepared_case.h"
#include "reports/record.h"

namespace mlagate {

inline constexpr const char* kGoldenSchema = "mlagate.golden";
inline constexpr int kGoldenSchemaVersion = 1;
// Default --max-bytes: what one case (or one compared pair) may make us allocate.
inline constexpr std::uint64_t kDefaultMaxBytes = std::uint64_t{8} << 30;

// A golden or results file that cannot be used (missing, truncated, corrupt,
// hostile, or not matching the run). An InputError: the CLI exits 2.
struct GoldenFileError : InputError {
  using InputError::InputError;
};

// An HDF5 C API call failed. what(): the call, the object and HDF5's innermost
// message; stack(): the whole HDF5 error stack, outermost first.
class H5Error : public GoldenFileError {
 public:
  H5Error(const std::string& what, std::vector<std::string> stack)
      : GoldenFileError(what), stack_(std::move(stack)) {}
  const std::vector<std::string>& stack() const { return stack_; }

 private:
  std::vector<std::string> stack_;
};

// FNV-1a 64 over raw bytes: the content hash stored with every dataset.
inline constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ull;
inline constexpr std::uint64_t kFnvPrime = 0x100000001b3ull;
std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h = kFnvOffset);
// XXH64 (the published algorithm) over raw bytes: stored beside fnv1a64 since
// it was added, and the hash readers check where a file has it (it runs at
// memory speed; FNV-1a at about 1 GB/s).
std::uint64_t xxh64(const void* data, std::size_t n, std::uint64_t seed = 0);
std::string hash_hex(std::uint64_t h);  // 16 lowercase hex digits

// A content hash as a reader checks it: the dataset's xxh64 attribute where
// it has one, else its fnv1a64 (files written before xxh64 was stored).
struct ContentHash {
  enum class Kind : std::uint8_t { kFnv1a64, kXxh64 };
  Kind kind = Kind::kFnv1a64;
  std::uint64_t value = 0;
  static ContentHash of(Kind kind, const void* data, std::size_t n);
  bool matches(const void* data, std::size_t n) const { return of(kind, data, n).value == value; }
  std::string str() const;  // "xxh64 0123456789abcdef"
  bool operator==(const ContentHash&) const = default;
};

// Content hashes of a case's inputs. `combined` is FNV-1a over the raw bytes of
// q, kv_c, k_pe, W_UK, W_UV in this order (the case's input_hash attribute);
// the five FNV-1a hashes are hash_<name>, the XXH64 ones xxh64_<name> (absent
// from older files: `has_xxh` false when read from one).
struct InputHashes {
  std::uint64_t q = 0, kv_c = 0, k_pe = 0, w_uk = 0, w_uv = 0, combined = 0;
  std::array<std::uint64_t, 5> xxh{};  // q, kv_c, k_pe, W_UK, W_UV
  bool has_xxh = false;  // input_hashes() sets it; readers when the file has them
  bool operator==(const InputHashes&) const = default;
};
InputHashes input_hashes(const Case& c);  // both kinds
std::array<std::uint64_t, 5> input_xxh64(const Case& c);  // the XXH64 ones only

enum class FileKind { kGolden, kResults };

// Provenance stored on the root group (and repeated on every case group).
struct FileInfo {
  FileKind kind = FileKind::kGolden;
  int schema_version = kGoldenSchemaVersion;
  int generator_version = 0;
  std::string mlagate_version, git_commit, created_at, command_line;
  std::string shard;  // results files of a --shard run: "I/N"; empty otherwise
};

// ---------------------------------------------------------------- writing

// What export stores for each case.
struct ExportOptions {
  std::vector<Op> ops{Op::kLayer};  // decode: also the kernel-level decode op's absorbed queries and reference
  Policy policy;                    // recorded with every case
  CacheOptions cache;               // poison and block-table poison of the stored caches
  std::string command_line;
  // Block sizes whose cache is stored (e.g. each selected backend's, for bs=auto).
  std::function<std::vector<int>(const CaseSpec&)> block_sizes;
  // Called after each case is written (progress). An exception aborts the
  // export and leaves no file behind (tests simulate a killed export this way).
  std::function<void(std::size_t cases_written, const std::string& case_id)> after_case;
};

// A case as export stores it: generated inputs, the fp64 reference (absorbed
// path: out, lse), the caches without the new tokens, and (with the decode op)
// the absorbed queries and their reference.
PreparedCase prepare_export_case(const CaseSpec& spec, const ExportOptions& opt);

struct ExportSummary {
  std::size_t cases = 0, caches = 0;
  std::uintmax_t file_bytes = 0;
};
// Writes every case to `path` through a temporary file renamed into place:
// `path` is the old file or the whole new one, never a partial one.
ExportSummary export_golden(const std::vector<CaseSpec>& cases, const std::string& path, const ExportOptions& opt);

// Writes a results file: per case the spec and input hashes, per backend and
// op the status, metrics and raw outputs. Temporary file until commit().
class ResultsWriter {
 public:
  // `shard`: "I/N" of a --shard run (the root's shard attribute), or empty.
  ResultsWriter(const std::string& path, const std::string& command_line, const std::string& shard = "");
  ~ResultsWriter();  // without commit(): the temporary file is removed, `path` untouched
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;

  // The case group (idempotent). `c` gives the input hashes; null for a case
  // that could not be generated (INVALID_CASE records).
  void add_case(const CaseSpec& spec, const Case* c, const Policy& policy);
  // One output of a record as the backend produced it (dtype and shape).
  struct Output {
    std::string name;  // "out", "lse", "o_lat", "o"
    TensorView data;
  };
  // One record and its outputs (empty when nothing ran). The case must be added.
  void add_record(const Record& r, std::span<const Output> outputs);
  bool has_record(const Record& r) const;
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Merges results files (the shards of one run, or runs of disjoint cases)
// into `out`: every input validated whole first, every case group copied as
// stored. A case in two inputs, a golden file among the inputs, shards of
// different counts, a shard given twice or missing: GoldenFileError, and `out`
// is not written. Returns the number of cases.
std::size_t merge_results_files(const std::vector<std::string>& inputs, const std::string& out,
                                const std::string& command_line);

// ---------------------------------------------------------------- reading

// A case group's attributes and small datasets, validated (CaseSpec::validate,
// the id they form equals the group's, derived counts agree).
struct CaseHeader {
  std::string id;
  bool valid = true;  // false: a results file's case that could not be generated (no spec beyond the id)
  CaseSpec spec;
  InputHashes hashes;
  std::string policy;  // description recorded at export
  std::vector<std::int32_t> query_start_loc;  // [B+1]
  std::vector<int> cache_block_sizes;          // golden files: caches stored
  bool has_inputs = false, has_golden = false, has_decode = false;
};

// A stored cache's recorded options (what `run --golden` must rebuild with).
struct StoredCacheOptions {
  Poison poison = Poison::kNaN;
  bool poison_block_table = false;
  int spare_blocks = kDefaultSpareBlocks;
  ContentHash hash_data, hash_block_table, hash_slot_mapping;  // the datasets' checked hashes
};

struct StoredOutput {
  std::string name;  // "out", "lse", "o_lat", "o"
  Tensor data;       // as the backend produced it (dtype and shape)
  Metrics metrics;   // against the reference, as the run computed them
  std::int64_t heads = 1, dim = 1;  // for locating elements
};

struct StoredResult {
  std::string backend, op;
  Status status = Status::kSkipped;
  std::string message, policy, repro;
  int block_size = 0;
  std::vector<StoredOutput> outputs;
};

// Opens a reference or results file and validates everything it reads before
// returning it: a corrupt or hostile file throws GoldenFileError (never a
// crash, never an out-of-bounds read). Allocations per call stay within
// max_bytes.
class GoldenReader {
 public:
  explicit GoldenReader(const std::string& path, std::uint64_t max_bytes = kDefaultMaxBytes);
  ~GoldenReader();
  GoldenReader(const GoldenReader&) = delete;
  GoldenReader& operator=(const GoldenReader&) = delete;

  const std::string& path() const;
  const FileInfo& info() const;
  const std::vector<std::string>& case_ids() const;  // in file order
  bool has_case(const std::string& id) const;

  CaseHeader header(const std::string& id);
  // Reads and checks every case the file holds, as load_case (golden files)
  // or load_results (results files) would, and refuses case groups that
  // /case_ids does not list. A command runs this before anything else, so a
  // bad file is an input error before any backend runs, whichever cases the
  // command selects. Memory: one case at a time, within max_bytes.
  // kReferences (run --golden, which regenerates the inputs and caches and
  // checks them against the stored hashes): everything but the bytes of the
  // stored inputs and cache data, whose datasets are checked for dtype, shape,
  // storage and attributes without being read (a corrupt chunk in them is
  // found by replay, which reads them).
  enum class ValidateScope { kEverything, kReferences };
  void validate_all(ValidateScope scope = ValidateScope::kEverything);
  // Everything replay needs: inputs, golden, decode reference (if stored) and
  // the caches by block size, each checked (hashes, shapes, block ids <
  // num_blocks, slot mapping, lengths). build_missing_caches is false.
  PreparedCase load_case(const std::string& id);
  // Stored references only (run --golden), checked like load_case.
  ReferenceOutputs load_reference(const std::string& id);
  std::optional<PreparedCase::DecodeReference> load_decode_reference(const std::string& id);
  // Stored err_baseline parts (files exported before they were stored: none).
  std::optional<StoredBaselines> load_baselines(const std::string& id);
  // The stored content hashes (ContentHash) of a case's references (golden/,
  // decode/, err_baseline/; which groups and datasets exist included), without
  // reading them: equal for two cases of a validated file means equal
  // references.
  std::vector<std::uint64_t> stored_reference_hashes(const std::string& id);
  // A sparse case's stored query and reference, every stored value validated
  // and the index sets checked equal to c's (the regenerated case).
  PreparedCase::SparseReference load_sparse(const std::string& id, const Case& c);
  StoredCacheOptions cache_options(const std::string& id, int block_size);
  // Results files: every backend x op stored for the case.
  std::vector<StoredResult> load_results(const std::string& id);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mlagate
