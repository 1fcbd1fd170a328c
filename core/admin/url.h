// The URL pieces the admin server and its API decode: path segments and
// query strings (RFC 3986 percent-encoding; "+" is a space in a query).
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace idemsink::admin {

/// "a%20b" -> "a b"; in a query (`plus_is_space`) "+" is a space too.
std::string percent_decode(std::string_view s, bool plus_is_space = false);
/// The query string's parameters (a repeated name: the last).
std::map<std::string, std::string> parse_query(std::string_view q);

}  // namespace idemsink::admin
