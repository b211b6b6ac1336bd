// The HTML report's inline assets: the page loads nothing, so its CSS and the
// script that decodes and draws the error maps are written into every page.
#pragma once

namespace mlagate::detail {

extern const char* const kHtmlStyle;   // the page's <style>
extern const char* const kHtmlScript;  // the maps' <script>: sets body[data-rendered="1"] when done

}  // namespace mlagate::detail
