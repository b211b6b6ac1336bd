// A double as text, printf's %g at a given number of significant digits: the
// one spelling for case ids (10 digits: an id names the value it was made
// with), golden-file messages (9: a float round-trips) and comparisons (6).
#pragma once

#include <cstdio>
#include <string>

namespace mlagate {

inline std::string format_g(double v, int significant_digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*g", significant_digits, v);
  return buf;
}

}  // namespace mlagate
