// Private to golden/*.cpp: the sparse part of a case in schema v1 (SCHEMA.md,
// "Sparse cases"): the spec's sparse attributes on the case group, and the
// `sparse` group with the index sets, lengths, sink, V4's compressed entries,
// the kernels' query and the fp64 reference. The reader validates every value
// a kernel would act on (an index outside its request is a corrupt file).
#pragma once

#include <hdf5.h>

#include <memory>
#include <optional>

#include "cases/sparse.h"
#include "golden/detail/io.h"
#include "reference/prepared_case.h"

namespace mlagate::golden {

inline constexpr const char* kSparseGroup = "sparse";

void write_sparse_spec(hid_t case_group, const SparseSpec& s, const io::Where& w);
// Absent attributes: a dense case.
SparseSpec read_sparse_spec(hid_t case_group, const io::Where& w);

void write_sparse_group(hid_t case_group, const Case& c, const PreparedCase::SparseReference& ref, const io::Where& w);
// c: the case with its inputs (stored or regenerated) and spec; returns the
// sparse inputs as stored and the reference. Throws GoldenFileError naming
// the dataset and the bad value.
struct StoredSparse {
  std::shared_ptr<const SparseInputs> inputs;
  PreparedCase::SparseReference ref;
};
StoredSparse read_sparse_group(hid_t case_group, const Case& c, const io::Where& w, io::Budget& budget);

// The reference the export stores and a run compares against: the query of
// the absorbed inputs and the fp64 sparse reference on it.
PreparedCase::SparseReference compute_sparse_reference(const Case& c);

}  // namespace mlagate::golden
