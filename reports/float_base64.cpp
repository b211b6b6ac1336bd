// The base64 float form of reports/float_base64.h.
#include "reports/float_base64.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace mlagate {
namespace {
constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}  // namespace

std::string floats_to_base64(const std::vector<float>& v) {
  std::string bytes;
  bytes.reserve(v.size() * 4);
  for (float f : v) {
    const auto u = std::bit_cast<std::uint32_t>(f);
    for (int k = 0; k < 4; ++k) bytes += static_cast<char>((u >> (8 * k)) & 0xff);
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    std::uint32_t chunk = 0;
    for (std::size_t k = 0; k < 3; ++k)
      chunk = (chunk << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (std::size_t k = 0; k < 4; ++k) out += k <= n ? kBase64[(chunk >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

std::vector<float> floats_from_base64(std::string_view s) {
  if (s.size() % 4 != 0) throw std::runtime_error("base64 floats: length not a multiple of 4");
  std::string bytes;
  for (std::size_t i = 0; i < s.size(); i += 4) {
    std::uint32_t chunk = 0;
    int pad = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const char c = s[i + k];
      const char* at = c == '=' ? nullptr : std::strchr(kBase64, c);
      if (c == '=' && i + 4 == s.size() && k >= 2) {
        ++pad;
      } else if (at == nullptr || c == '\0' || pad > 0) {
        throw std::runtime_error("base64 floats: not base64");
      }
      chunk = (chunk << 6) | static_cast<std::uint32_t>(at ? at - kBase64 : 0);
    }
    for (int k = 0; k < 3 - pad; ++k) bytes += static_cast<char>((chunk >> (16 - 8 * k)) & 0xff);
  }
  if (bytes.size() % 4 != 0) throw std::runtime_error("base64 floats: not a whole number of floats");
  std::vector<float> v(bytes.size() / 4);
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t u = 0;
    for (int k = 3; k >= 0; --k) u = (u << 8) | static_cast<unsigned char>(bytes[4 * i + static_cast<std::size_t>(k)]);
    v[i] = std::bit_cast<float>(u);
  }
  return v;
}

}  // namespace mlagate
