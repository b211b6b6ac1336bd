// The text helpers decide what survives into XML and Markdown: invalid UTF-8 and control
// characters must come out as "\xNN", valid characters untouched, and cuts must not split one.
#include <gtest/gtest.h>

#include <limits>

#include "reports/text.h"

namespace mlagate::detail {
namespace {

TEST(ReportText, FormatsNumbersLikePrintfG) {
  EXPECT_EQ(format_g(0.0123), "0.0123");
  EXPECT_EQ(format_g(1.52587890625e-05), "1.52588e-05");
  EXPECT_EQ(format_g(130), "130");
  EXPECT_EQ(format_g(1234567), "1.23457e+06");
  EXPECT_EQ(format_g(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(format_g(-std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(format_g(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(format_g(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(format_fixed(0.002125, 6), "0.002125");
  EXPECT_EQ(format_fixed(0.5, 3), "0.500");
  EXPECT_EQ(format_fixed(1e300, 1).size(), 303u);
}

TEST(ReportText, KeepsValidTextAndEscapesTheRest) {
  EXPECT_EQ(printable_text("plain <&> text\twith\nlines\r"), "plain <&> text\twith\nlines\r");
  EXPECT_EQ(printable_text("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");  // 2, 3 and 4 byte characters
  EXPECT_EQ(printable_text(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable_text("\x01\x1F\x7F"), "\\x01\\x1F\x7F");  // DEL is allowed in XML 1.0
  EXPECT_EQ(printable_text("\xFF"), "\\xFF");
  EXPECT_EQ(printable_text("\xC0\xAF"), "\\xC0\\xAF");                // overlong '/'
  EXPECT_EQ(printable_text("\xE0\x80\xAF"), "\\xE0\\x80\\xAF");       // overlong, 3 bytes
  EXPECT_EQ(printable_text("\xED\xA0\x80"), "\\xED\\xA0\\x80");       // a surrogate
  EXPECT_EQ(printable_text("\xEF\xBF\xBE"), "\\xEF\\xBF\\xBE");       // U+FFFE
  EXPECT_EQ(printable_text("\xF4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(printable_text("\xE2\x82"), "\\xE2\\x82");                // truncated sequence
  EXPECT_EQ(printable_text("\xE2\x82x"), "\\xE2\\x82x");
}

TEST(ReportText, TruncatesAtCharacterBoundaries) {
  EXPECT_EQ(truncate_text("short", 10), "short");
  EXPECT_EQ(truncate_text("exactly10!", 10), "exactly10!");
  EXPECT_EQ(truncate_text("0123456789abc", 10), "0123456...");
  // "\xC3\xA9" would straddle the cut at byte 7: it is dropped whole.
  EXPECT_EQ(truncate_text("012345\xC3\xA9" "89abc", 10), "012345...");
  EXPECT_EQ(truncate_text("abcdef", 2), "...");
}

TEST(ReportText, DisplayWidthCountsCodePoints) {
  EXPECT_EQ(display_width("cpu"), 3u);
  EXPECT_EQ(display_width("caf\xC3\xA9"), 4u);
}

}  // namespace
}  // namespace mlagate::detail
