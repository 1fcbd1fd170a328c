// What a request of the remote plugins may be and what its answer means:
// the endpoint's URL, the `headers` option's text, the checks that keep a
// record's text from adding headers or requests, and the classification of
// a result into a handler outcome. The client that sends it is http_client.cc.
#include "plugins/common/http_client.h"

#include <boost/beast/core/string.hpp>
#include <cctype>
#include <stdexcept>
#include <string_view>

namespace idemsink::plugins {

namespace beast = boost::beast;

idemsink_outcome classify(const HttpResult& r) {
  switch (r.failure) {
    case HttpResult::Failure::BeforeSend: return IDEMSINK_OUTCOME_RETRYABLE;
    case HttpResult::Failure::AfterSend: return IDEMSINK_OUTCOME_UNCERTAIN;
    case HttpResult::Failure::Invalid: return IDEMSINK_OUTCOME_PERMANENT;
    case HttpResult::Failure::None: break;
  }
  if (r.status >= 200 && r.status < 300) return IDEMSINK_OUTCOME_OK;
  if (r.status == 408 || r.status == 429 || r.status >= 500) return IDEMSINK_OUTCOME_RETRYABLE;
  return IDEMSINK_OUTCOME_PERMANENT;
}

std::optional<std::string_view> HttpResult::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (beast::iequals(k, beast::string_view(name.data(), name.size()))) return v;
  return std::nullopt;
}

std::string describe(const HttpResult& r) {
  if (r.failure == HttpResult::Failure::BeforeSend) return "not sent: " + r.error;
  if (r.failure == HttpResult::Failure::AfterSend) return "no response after sending: " + r.error;
  if (r.failure == HttpResult::Failure::Invalid) return "not sent, the request is malformed: " + r.error;
  return "HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 200);
}

Endpoint parse_url(const std::string& url) {
  Endpoint e;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    rest = url.substr(8);
    e.tls = true;
    e.port = 443;
  } else {
    throw std::invalid_argument("endpoint must start with http:// or https://, got " + url);
  }
  const auto slash = rest.find('/');
  if (slash != std::string::npos) {
    e.base_path = rest.substr(slash);
    while (!e.base_path.empty() && e.base_path.back() == '/') e.base_path.pop_back();
    rest = rest.substr(0, slash);
  }
  const auto colon = rest.rfind(':');
  e.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  if (colon != std::string::npos) {
    const int port = std::stoi(rest.substr(colon + 1));
    if (port <= 0 || port > 65535) throw std::invalid_argument("bad port in " + url);
    e.port = static_cast<uint16_t>(port);
  }
  if (e.host.empty()) throw std::invalid_argument("no host in " + url);
  return e;
}

bool is_framing_header(std::string_view name) {
  const beast::string_view n(name.data(), name.size());
  return beast::iequals(n, "Content-Length") || beast::iequals(n, "Transfer-Encoding");
}

// What may stand in a request line's target: visible ASCII only. A space
// would end the target, CR LF the line: text a record put there would add
// headers, or a second request.
bool valid_target(std::string_view target) {
  for (unsigned char c : target)
    if (c <= 0x20 || c >= 0x7F) return false;
  return true;
}

// A header value may hold tabs and visible bytes (obs-text included), never
// another control character: CR LF would start a header of the record's own.
bool valid_header_value(std::string_view value) {
  for (unsigned char c : value)
    if ((c < 0x20 && c != '\t') || c == 0x7F) return false;
  return true;
}

bool valid_header_name(std::string_view name) {
  if (name.empty()) return false;
  for (unsigned char c : name)
    if (!(std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos))
      return false;
  return true;
}

std::vector<std::pair<std::string, std::string>> parse_headers(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  auto trim = [](std::string s) {
    const auto a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    const std::string entry = trim(text.substr(pos, end - pos));
    pos = end + 1;
    if (entry.empty()) continue;
    const auto colon = entry.find(':');
    const std::string name = trim(entry.substr(0, colon));
    if (colon == std::string::npos || name.empty())
      throw std::invalid_argument("headers: expected \"Name: value\", got an entry without a name and colon");
    if (!valid_header_name(name)) throw std::invalid_argument("headers: \"" + name + "\" is not a valid header name");
    // The body's framing is the client's: a length or transfer coding from
    // the configuration would contradict the one it writes.
    if (is_framing_header(name))
      throw std::invalid_argument("headers: " + name + " is set by the client from the body; leave it out");
    const std::string value = trim(entry.substr(colon + 1));
    if (!valid_header_value(value))
      throw std::invalid_argument("headers: the value of " + name + " holds a line break or control character");
    // A name given twice: the last value, as one header.
    std::erase_if(out, [&](const auto& h) { return beast::iequals(h.first, name); });
    out.emplace_back(name, value);
  }
  return out;
}

}  // namespace idemsink::plugins
