// Text helpers shared by the report writers: locale-independent number formatting and
// UTF-8 cleaning and truncation, so that every format renders values the same way.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mlagate::detail {

// printf "%.6g", with "nan", "inf" and "-inf" for the non-finite values.
std::string format_g(double v);
// printf "%.<decimals>f", with the same non-finite spellings as format_g.
std::string format_fixed(double v, int decimals);

// Length of the UTF-8 sequence at s[i] when it encodes a character that XML 1.0 allows
// (tab, newline, carriage return, and U+0020..U+10FFFF except surrogates, U+FFFE and U+FFFF),
// 0 when it does not: an invalid, overlong or truncated sequence, or a control character.
std::size_t allowed_char_length(std::string_view s, std::size_t i);

// `s` with every byte that allowed_char_length rejects written as the text "\xNN", so that
// messages from backends (which may hold raw bytes) stay readable and lose nothing silently.
std::string printable_text(std::string_view s);

// `s` cut to at most `max_bytes` bytes at a UTF-8 boundary, ending in "..." when it was cut.
std::string truncate_text(std::string_view s, std::size_t max_bytes);

// Text for HTML element content and attribute values alike: cut to `max_bytes`, bytes that
// are not valid UTF-8 (or are control characters) become "\xNN", then the five markup
// characters become entities, so nothing a backend or case id holds can open a tag or end
// an attribute (the HTML report and mlagate explore's page).
std::string html_text(std::string_view s, std::size_t max_bytes);

// Columns a console shows for `s`: one per code point (no wide-character handling).
std::size_t display_width(std::string_view s);

}  // namespace mlagate::detail
