// Shared by the golden-file tests: scratch directories, a small exported
// golden file, and in-place edits of a file through the HDF5 C API (hostile
// files are made by editing good ones; hashes are kept consistent so that the
// check under test, not the content hash, has to catch the edit).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cases/case_spec.h"
#include "cases/tensor.h"
#include "golden/golden_file.h"
#include "harness/cli/cli.h"

namespace mlagate::testing {

namespace fs = std::filesystem;

// A fresh directory under the gtest temp dir, removed at destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  std::vector<std::string> entries() const;  // file names, sorted

 private:
  fs::path path_;
};

// The small selection the tests export: smoke's small_decode, mixed_small
// (bf16, tp16: decodes and a prefill with context) and edge_padding.
std::vector<CaseSpec> small_specs();
// Export options: layer + decode references, caches for block sizes 16 and 64.
ExportOptions small_export_options();
// A golden file of small_specs() (or the given specs) at `path`.
void export_small(const fs::path& path, const std::vector<CaseSpec>& specs = small_specs());

int cli(std::vector<std::string> args);  // cli_main as a user would call it
std::string read_bytes(const fs::path& p);
void write_bytes(const fs::path& p, const std::string& bytes);

// In-place edits (the file is opened read-write for each call). `object` is a
// path from the root ("/", "/cases/<id>", "/cases/<id>/inputs/q").
void set_int_attr(const fs::path& file, const std::string& object, const std::string& name, std::int64_t v);
void set_string_attr(const fs::path& file, const std::string& object, const std::string& name, const std::string& v);
void set_vlen_string_attr(const fs::path& file, const std::string& object, const std::string& name, const std::string& v);
void delete_attr(const fs::path& file, const std::string& object, const std::string& name);
// A float64 tensor of `shape` holding v (row-major).
Tensor doubles(const std::vector<double>& v, const Shape& shape);
// Replaces a dataset (new shape and data allowed) with correct dtype and
// fnv1a64 attributes, as a consistent but hostile writer would.
void replace_dataset(const fs::path& file, const std::string& group, const std::string& name, const Tensor& t);
// Replaces a dataset with one whose storage is an external raw file.
void replace_with_external(const fs::path& file, const std::string& group, const std::string& name,
                           const std::string& raw_file, const Tensor& like);
// Turns a hard-linked member into a soft link to a renamed copy of itself.
void make_soft_link(const fs::path& file, const std::string& group, const std::string& name);
// Byte ranges of the file that hold no dataset's raw data (metadata, free space).
std::vector<std::pair<std::uint64_t, std::uint64_t>> metadata_ranges(const fs::path& file);

std::string case_path(const std::string& id);  // "/cases/<id>"

// Replaces a dataset with a chunked one whose pipeline holds `filter` (an HDF5
// filter id such as 32000, h5py's lzf). The test registers a pass-through
// filter of that id when HDF5 lacks it, so the file is what a foreign writer
// makes; mlagate must refuse it from the pipeline alone.
void replace_dataset_filtered(const fs::path& file, const std::string& group, const std::string& name, const Tensor& t,
                              int filter);
// File offsets and sizes of a chunked dataset's chunks.
std::vector<std::pair<std::uint64_t, std::uint64_t>> chunk_ranges(const fs::path& file, const std::string& dataset);
// Copies a group (and everything below it) to a new path, creating missing parents.
void copy_group(const fs::path& file, const std::string& from, const std::string& to);

// The real mlagate binary (MLAGATE_TEST_BINARY), run as a user runs it: with
// process isolation, so that workers are spawned as in production.
struct BinaryRun {
  int rc = -1;
  std::string out, err;
};
BinaryRun run_binary(const std::vector<std::string>& args, const fs::path& scratch);

}  // namespace mlagate::testing
