#include "core/admin/console.h"

#include <map>

#include "core/admin/console_assets.h"

namespace idemsink::admin {

std::optional<StaticFile> console_file(std::string_view path) {
  static const std::map<std::string_view, std::string_view> kTypes = {{".html", "text/html; charset=utf-8"},
                                                                      {".js", "text/javascript; charset=utf-8"},
                                                                      {".css", "text/css; charset=utf-8"},
                                                                      {".json", "application/json"},
                                                                      {".svg", "image/svg+xml"}};
  const std::string_view name = path == "/" ? "index.html" : path.substr(path.rfind('/') + 1);
  for (const auto& a : kConsoleAssets) {
    if (a.name != name) continue;
    const auto dot = name.rfind('.');
    const auto type = kTypes.find(dot == std::string_view::npos ? "" : name.substr(dot));
    return StaticFile{type == kTypes.end() ? "application/octet-stream" : type->second, a.body};
  }
  return std::nullopt;
}

std::string openapi_document() {
  for (const auto& a : kConsoleAssets)
    if (a.name == "openapi.json") return std::string(a.body);
  return "{}";
}

}  // namespace idemsink::admin
