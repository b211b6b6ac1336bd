// mlagate merge of results files: the shards of one run (or runs of disjoint
// cases) into one file, each case group copied byte for byte.
#include <map>
#include <string>
#include <vector>

#include "golden/detail/h5.h"
#include "golden/detail/writer.h"
#include "golden/golden_file.h"
#include "reports/shard.h"

namespace mlagate {

namespace h5 = golden::h5;

std::size_t merge_results_files(const std::vector<std::string>& inputs, const std::string& out,
                                const std::string& command_line) {
  if (inputs.empty()) throw GoldenFileError("merge: no results files given");
  // Everything is checked before the output's temporary file exists.
  std::vector<std::pair<std::string, std::string>> shards;
  std::map<std::string, std::string> owner;  // case id -> input
  std::vector<std::vector<std::string>> case_ids;  // per input, in file order
  std::string generator;
  for (const std::string& path : inputs) {
    GoldenReader reader(path);
    if (reader.info().kind != FileKind::kResults)
      throw GoldenFileError(path + ": a golden file, not a results file (merge takes --save-results files)");
    reader.validate_all();
    const std::string gen = std::to_string(reader.info().generator_version);
    if (!generator.empty() && gen != generator)
      throw GoldenFileError(path + ": generator version " + gen + ", the other inputs " + generator);
    generator = gen;
    shards.emplace_back(path, reader.info().shard);
    case_ids.push_back(reader.case_ids());
    for (const std::string& id : case_ids.back())
      if (auto [it, fresh] = owner.emplace(id, path); !fresh)
        throw GoldenFileError("case " + id + " is in " + it->second + " and " + path);
  }
  try {
    check_shard_set(shards);
  } catch (const InputError& e) {
    throw GoldenFileError(std::string("merge: ") + e.what());
  }
  golden::TempH5 file(out, FileKind::kResults, command_line);
  const h5::PropList fapl = h5::pcreate(H5P_FILE_ACCESS, "file access properties");
  std::size_t cases = 0;
  for (std::size_t f = 0; f < inputs.size(); ++f) {
    const h5::File src = h5::fopen(inputs[f], H5F_ACC_RDONLY, fapl);
    const std::vector<std::string>& ids = case_ids[f];
    for (const std::string& id : ids) {
      // The first components of this file's cases below this one: left to their own copy.
      std::vector<std::string> nested;
      for (const std::string& other : ids)
        if (other.size() > id.size() + 1 && other.compare(0, id.size(), id) == 0 && other[id.size()] == '/')
          nested.push_back(other.substr(id.size() + 1, other.find('/', id.size() + 1) - id.size() - 1));
      file.copy_case(src.get(), id, nested);
      ++cases;
    }
  }
  file.commit();
  GoldenReader(out).validate_all();  // what was written reads back whole
  return cases;
}

}  // namespace mlagate
