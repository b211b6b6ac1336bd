// Private to golden/*.cpp: a new HDF5 file written at a temporary path beside
// its target and renamed onto it only when complete, plus the case-group
// writers export and results files share.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "golden/detail/h5.h"
#include "golden/detail/io.h"
#include "golden/golden_file.h"

namespace mlagate::golden {

class TempH5 {
 public:
  // Checks the target's directory, creates ".<name>.tmp.<pid>.<n>" beside it
  // and writes the root attributes.
  TempH5(const std::string& target, FileKind kind, const std::string& command_line);
  ~TempH5();  // not committed: closes and removes the temporary file
  TempH5(const TempH5&) = delete;
  TempH5& operator=(const TempH5&) = delete;

  // The group /cases/<id> (created with its parents on first use); `id` is a
  // case id, its components checked by schema::id_path. `created`: the case is
  // new to the file, whether or not its group was there already as the path
  // of a nested case added before it ("…/cmp=4x64/sink" before "…/cmp=4x64").
  hid_t case_group(const std::string& id, bool& created);
  // A group at `path` below the root ("cases/<id>/results/cpu.paged"), created
  // with its parents on first use.
  hid_t group(const std::string& path, bool& created);
  const io::Where& where() const { return where_; }
  hid_t root() const { return file_.get(); }
  // Copies case group /cases/<id> of `src` (an open file) as stored: its
  // attributes and its members, less `nested` (the first path components of
  // the source's other cases below this one: a case id may be another's
  // prefix, "…/seed=0" and "…/seed=0/dims=glm", and those are copied as cases
  // of their own).
  void copy_case(hid_t src, const std::string& id, const std::vector<std::string>& nested);
  // Writes /case_ids, closes (flushing), fsyncs and renames onto the target.
  void commit();

 private:
  std::string target_, temp_;
  io::Where where_;
  h5::File file_;
  std::vector<std::string> ids_;  // in the order added: /case_ids
  std::set<std::string> id_set_;
  std::map<std::string, h5::Group> open_;  // every group created, by path below the root
  bool committed_ = false;
};

// The case group's attributes (every spec parameter, provenance, policy,
// hashes when the case's inputs exist) and seq_lens, query_lens, query_start_loc.
void write_case_header(hid_t g, const CaseSpec& spec, const InputHashes* hashes, const Policy& policy,
                       const io::Where& w);
// Inputs, caches, golden and decode reference of a prepared case.
void write_case_content(hid_t g, const PreparedCase& pc, const io::Where& w);

}  // namespace mlagate::golden
