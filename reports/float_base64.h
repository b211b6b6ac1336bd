// Float arrays as base64 of their little-endian IEEE-754 bits: exact (NaN and
// the infinities included) and about 5.3 characters a value, where decimal
// floats would print up to 9 digits and JSON has no NaN. The journal's record
// lines, the JSON report's error maps and the HTML report's embedded data all
// use this one form (the HTML page's script decodes it).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mlagate {

std::string floats_to_base64(const std::vector<float>& v);
// Throws std::runtime_error for text that is not base64 of whole floats.
std::vector<float> floats_from_base64(std::string_view s);

}  // namespace mlagate
