#include "core/common/util.h"

#include <openssl/sha.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <system_error>

namespace idemsink {

std::optional<Millis> parse_duration(std::string_view text) {
  int64_t n = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || p == text.data() || n < 0) return std::nullopt;
  const std::string_view unit(p, static_cast<size_t>(text.data() + text.size() - p));
  int64_t scale = 0;
  if (unit == "ms") {
    scale = 1;
  } else if (unit == "s") {
    scale = 1000;
  } else if (unit == "m") {
    scale = 60'000;
  } else if (unit == "h") {
    scale = 3'600'000;
  } else if (unit == "d") {
    scale = 86'400'000;
  } else {
    return std::nullopt;
  }
  if (n > std::numeric_limits<int64_t>::max() / scale) return std::nullopt;  // checked before multiplying
  return Millis(n * scale);
}

std::optional<HostPort> parse_host_port(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string_view host = text.substr(0, colon);
  const std::string_view port = text.substr(colon + 1);
  if (port.empty() || port.size() > 5) return std::nullopt;  // five digits cannot overflow
  uint32_t value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  if (value > 65535) return std::nullopt;

  const bool bracketed = host.size() >= 2 && host.front() == '[' && host.back() == ']';
  if (bracketed) host = host.substr(1, host.size() - 2);
  if (host.empty()) return std::nullopt;
  std::string addr(host);
  unsigned char buf[sizeof(in6_addr)];
  if (bracketed) {
    // A zone ("fe80::1%eth0") names an interface; it is checked when binding.
    const std::string without_zone = addr.substr(0, addr.find('%'));
    if (::inet_pton(AF_INET6, without_zone.c_str(), buf) != 1) return std::nullopt;
  } else if (::inet_pton(AF_INET, addr.c_str(), buf) != 1) {
    return std::nullopt;
  }
  return HostPort{std::move(addr), static_cast<uint16_t>(value)};
}

bool looks_secret(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; });
  for (std::string_view word : {"password", "secret", "token", "key"})
    if (lower.find(word) != std::string::npos) return true;
  return false;
}

namespace {

// 16 bytes as "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (a token per claimed
// record: written out directly, snprintf's format parsing showed in profiles).
std::string uuid_text(const unsigned char* bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(36, '-');
  size_t at = 0;
  for (int i = 0; i < 16; ++i) {
    if (at == 8 || at == 13 || at == 18 || at == 23) ++at;
    out[at++] = kHex[bytes[i] >> 4];
    out[at++] = kHex[bytes[i] & 0xF];
  }
  return out;
}

}  // namespace

std::string random_uuid() {
  // Straight from the kernel's CSPRNG, 122 random bits per token: no seed a
  // second thread or host could draw again (a remote that de-duplicates by
  // token would answer one order with another's result). No buffering, so a
  // forked child never replays its parent's bytes.
  uint64_t words[2];
  for (size_t got = 0; got < sizeof words;) {
    const ssize_t n = ::getrandom(reinterpret_cast<char*>(words) + got, sizeof words - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::system_error(errno, std::generic_category(), "getrandom");
    got += static_cast<size_t>(n);
  }
  uint64_t hi = words[0], lo = words[1];
  hi = (hi & 0xFFFFFFFFFFFF0FFFULL) | 0x0000000000004000ULL;  // version 4
  lo = (lo & 0x3FFFFFFFFFFFFFFFULL) | 0x8000000000000000ULL;  // RFC 4122 variant
  unsigned char bytes[16];
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<unsigned char>(hi >> (56 - 8 * i));
    bytes[8 + i] = static_cast<unsigned char>(lo >> (56 - 8 * i));
  }
  return uuid_text(bytes);
}

std::string name_uuid(std::string_view namespace_uuid, std::string_view name) {
  // RFC 4122 version 5: SHA-1 over the namespace's 16 bytes and the name.
  std::string hex;
  for (const char ch : namespace_uuid)
    if (ch != '-') hex.push_back(ch);
  if (hex.size() != 32) throw std::invalid_argument("name_uuid: namespace is not a UUID");
  std::string input(16, '\0');
  for (size_t i = 0; i < 16; ++i) {
    unsigned byte = 0;
    const char* first = hex.data() + 2 * i;
    const auto [end, ec] = std::from_chars(first, first + 2, byte, 16);
    if (ec != std::errc() || end != first + 2) throw std::invalid_argument("name_uuid: namespace is not a UUID");
    input[i] = static_cast<char>(byte);
  }
  input.append(name);
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(input.data()), input.size(), digest);
  digest[6] = static_cast<unsigned char>((digest[6] & 0x0F) | 0x50);  // version 5
  digest[8] = static_cast<unsigned char>((digest[8] & 0x3F) | 0x80);  // RFC 4122 variant
  return uuid_text(digest);
}

std::string payload_hash(std::string_view data) {
  XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  return std::string(reinterpret_cast<const char*>(c.digest), sizeof c.digest);
}

namespace {

// Length of the well-formed UTF-8 sequence starting at in[i], or 0 (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF).
size_t utf8_sequence(std::string_view in, size_t i) {
  const auto c = static_cast<unsigned char>(in[i]);
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c == 0xE0) {
    len = 3, lo = 0xA0;  // below: overlong
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    len = 3;
  } else if (c == 0xED) {
    len = 3, hi = 0x9F;  // above: surrogates
  } else if (c == 0xF0) {
    len = 4, lo = 0x90;  // below: overlong
  } else if (c >= 0xF1 && c <= 0xF3) {
    len = 4;
  } else if (c == 0xF4) {
    len = 4, hi = 0x8F;  // above: beyond U+10FFFF
  } else {
    return 0;  // C0, C1, F5..FF, or a continuation byte
  }
  if (i + len > in.size()) return 0;
  const auto c1 = static_cast<unsigned char>(in[i + 1]);
  if (c1 < lo || c1 > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if ((static_cast<unsigned char>(in[i + k]) & 0xC0) != 0x80) return 0;
  return len;
}

}  // namespace

std::string sanitize_utf8(std::string_view in, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(in.size(), max_bytes));
  size_t i = 0;
  while (i < in.size()) {
    size_t len = utf8_sequence(in, i);
    if (len == 1 && in[i] == '\0') len = 0;  // NUL is legal UTF-8 but useless in a message
    const size_t emit = len != 0 ? len : 1;
    if (out.size() + emit > max_bytes) break;
    if (len != 0) {
      out.append(in.substr(i, len));
    } else {
      out.push_back('?');
    }
    i += emit;
  }
  return out;
}

std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xF]);
  }
  return out;
}

std::string printable(std::string_view bytes, size_t max_len) {
  std::string out;
  for (unsigned char c : bytes) {
    if (out.size() >= max_len) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace idemsink
