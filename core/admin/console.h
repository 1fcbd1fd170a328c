// The operator's console: static files compiled into the binary from
// core/admin/console/ (no CDN, no network at run time, no JavaScript build):
// served at / and /console/*, with the API's OpenAPI document.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace idemsink::admin {

struct StaticFile {
  std::string_view content_type;
  std::string_view body;
};

/// The console file at this path ("/" is its index), if any.
std::optional<StaticFile> console_file(std::string_view path);

/// The /api/v1 OpenAPI 3.0 document.
std::string openapi_document();

}  // namespace idemsink::admin
