// Small shared helpers: durations and listen addresses in config text, secret
// key names, random ids, payload hashes, UTF-8 sanitizing for error text
// stored in the database.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idemsink {

using Millis = std::chrono::milliseconds;

/// Parses "250ms", "2s", "5m", "1h", "7d" (a non-negative integer and a unit).
/// Refuses a value whose milliseconds do not fit in 64 bits.
std::optional<Millis> parse_duration(std::string_view text);

/// A listen address split into its parts.
struct HostPort {
  std::string host;  // an IP address, IPv6 without its brackets
  uint16_t port = 0;
};

/// Parses "host:port": the host an IPv4 address, or an IPv6 address in
/// brackets ("[::1]:9464"); the port decimal, 0..65535. Host names are not
/// accepted (nothing is resolved).
std::optional<HostPort> parse_host_port(std::string_view text);

/// True for a key name that may hold a credential: it contains "password",
/// "secret", "token" or "key", in any case. Error messages leave such a
/// key's value out.
bool looks_secret(std::string_view name);

/// Random RFC 4122 version-4 UUID in canonical 36-character text.
std::string random_uuid();
/// A name-based UUID (RFC 4122 version 5, SHA-1) of `name` in the namespace
/// `namespace_uuid` ("xxxxxxxx-xxxx-..."): the same pair gives the same UUID,
/// anywhere, any time; another namespace gives an unrelated one.
std::string name_uuid(std::string_view namespace_uuid, std::string_view name);

/// 128-bit XXH3 hash of `data`, as 16 raw bytes.
std::string payload_hash(std::string_view data);

/// Replaces every byte that is not part of well-formed UTF-8 (RFC 3629:
/// overlong forms, surrogates and code points above U+10FFFF included) and
/// NUL with '?', and cuts to at most `max_bytes` without splitting a
/// character, so any text fits a utf8mb4 column and a log line.
std::string sanitize_utf8(std::string_view in, size_t max_bytes);

/// Hex rendering of bytes (for logs of binary keys).
std::string to_hex(std::string_view bytes);

/// Printable rendering of a possibly binary key for log lines.
std::string printable(std::string_view bytes, size_t max_len = 80);

}  // namespace idemsink
