// Private to golden/*.cpp: a merge case in schema v1 (SCHEMA.md, "Merge
// cases"): the `merge_states` group with the op's two partial results (the
// inputs) and the fp64 reference. The reader checks every dataset's dtype,
// shape and content hash and the reference's values (finite outputs, lses
// finite or -inf) before anything acts on them.
#pragma once

#include <hdf5.h>

#include <memory>

#include "cases/merge.h"
#include "golden/detail/io.h"
#include "reference/merge_reference.h"

namespace mlagate::golden {

inline constexpr const char* kMergeGroup = "merge_states";

void write_merge_group(hid_t case_group, const Case& c, const MergeReference& ref, const io::Where& w);

struct StoredMerge {
  std::shared_ptr<const MergeInputs> inputs;
  MergeReference ref;
};
// spec: the case's (validated) spec; throws GoldenFileError naming the dataset.
StoredMerge read_merge_group(hid_t case_group, const CaseSpec& spec, const io::Where& w, io::Budget& budget);

}  // namespace mlagate::golden
