// The dashboard's pages, from runtime/src/dashboard/assets, built into the library by
// runtime/embed_text.cmake.
#pragma once

namespace jobrt::dashboard_assets {
extern const char* const index;  // index.html
extern const char* const app;    // app.js
extern const char* const style;  // style.css
}  // namespace jobrt::dashboard_assets
