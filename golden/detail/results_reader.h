// Reading a results file's records (results/<backend>/<op>: status,
// message, outputs and their metrics), every value validated as the rest of
// the reader does (golden/reader.cpp). Private to golden/.
#pragma once

#include <vector>

#include "golden/detail/io.h"
#include "golden/golden_file.h"

namespace mlagate::golden {

// The records stored under case group g (path w) whose header is h; none when
// it has no results group.
std::vector<StoredResult> read_results(hid_t g, const io::Where& w, const CaseHeader& h, io::Budget& budget);

}  // namespace mlagate::golden
