// Number formatting and UTF-8 handling for the report writers.
// std::to_chars is used rather than printf because it ignores the C locale.
#include "reports/text.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>

namespace mlagate::detail {
namespace {

std::string non_finite(double v) {
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

std::string to_chars_string(double v, std::chars_format fmt, int precision) {
  if (!std::isfinite(v)) return non_finite(v);
  char buf[400];  // fixed notation of 1e308 with a few decimals fits
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, fmt, precision);
  if (ec != std::errc()) return "?";
  return std::string(buf, end);
}

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

std::string format_g(double v) { return to_chars_string(v, std::chars_format::general, 6); }

std::string format_fixed(double v, int decimals) {
  return to_chars_string(v, std::chars_format::fixed, decimals);
}

std::size_t allowed_char_length(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char b0 = byte(0);
  if (b0 < 0x80) return (b0 >= 0x20 || b0 == '\t' || b0 == '\n' || b0 == '\r') ? 1 : 0;

  std::size_t len = 0;
  std::uint32_t cp = 0, min_cp = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, cp = b0 & 0x1F, min_cp = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, cp = b0 & 0x0F, min_cp = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, cp = b0 & 0x07, min_cp = 0x10000;
  } else {
    return 0;  // a stray continuation byte, C0/C1 (always overlong) or F5..FF
  }
  if (i + len > s.size()) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    if (!is_continuation(byte(k))) return 0;
    cp = (cp << 6) | (byte(k) & 0x3F);
  }
  if (cp < min_cp || cp > 0x10FFFF) return 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  if (cp == 0xFFFE || cp == 0xFFFF) return 0;
  return len;
}

std::string printable_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (const std::size_t len = allowed_char_length(s, i)) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned char>(s[i]));
      out += buf;
      ++i;
    }
  }
  return out;
}

std::string html_text(std::string_view s, std::size_t max_bytes) {
  std::string out;
  for (char c : printable_text(truncate_text(s, max_bytes))) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string truncate_text(std::string_view s, std::size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  static constexpr std::string_view kEllipsis = "...";
  std::size_t cut = max_bytes > kEllipsis.size() ? max_bytes - kEllipsis.size() : 0;
  while (cut > 0 && is_continuation(static_cast<unsigned char>(s[cut]))) --cut;
  return std::string(s.substr(0, cut)) + std::string(kEllipsis);
}

std::size_t display_width(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) n += !is_continuation(static_cast<unsigned char>(c));
  return n;
}

}  // namespace mlagate::detail
