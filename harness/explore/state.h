// The search state DIR/state.json read back by `mlagate explore --resume`
// (EXPLORE.md, "Isolation and resume"): an input like any other, checked
// whole before the search writes or runs anything.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace mlagate {

// Checks every key of a state that explore.cpp's Search writes and reads
// (main(), round(), failure(), progress(), explore_report.cpp): its type, its
// range and its consistency with the rest of the state (state.cpp says what
// is consistent). Throws InputError "explore: PATH: FIELD: expected ..., got
// ..." (FIELD as `cases.ran`, `findings[2].backend`); a top-level key it does
// not know is refused, a key inside a finding or a harness error is not. A
// schema other than mlagate-explore/1, or no fingerprint, gives load()'s
// message "explore: PATH is not a search state of this mlagate"; whether the
// fingerprint is this search's is load()'s to check.
// A key added to the state (explore.cpp, main()) must be added here too.
void validate_explore_state(const nlohmann::json& state, const std::string& path);

}  // namespace mlagate
