#include "core/format/json_writer.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>

namespace idemsink::format {

// As nlohmann's printer checks it.
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    uint64_t w;
    if (i + 8 <= s.size() && (std::memcpy(&w, s.data() + i, 8), (w & 0x8080808080808080) == 0)) {
      i += 8;  // eight ASCII bytes
      continue;
    }
    const auto c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    const auto second = static_cast<uint8_t>(s[i + 1]);
    if (second < lo || second > hi) return false;
    for (size_t k = 2; k <= n; ++k)
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n + 1;
  }
  return true;
}

namespace {

template <class Out>
void append_escaped(Out& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.put('"');
  size_t plain = 0;  // start of the run not yet copied
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.put(s.substr(plain, i - plain));
    plain = i + 1;
    switch (c) {
      case '"': out.put("\\\""); break;
      case '\\': out.put("\\\\"); break;
      case '\b': out.put("\\b"); break;
      case '\f': out.put("\\f"); break;
      case '\n': out.put("\\n"); break;
      case '\r': out.put("\\r"); break;
      case '\t': out.put("\\t"); break;
      default: {
        const char u[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
        out.put(std::string_view(u, sizeof u));
      }
    }
  }
  out.put(s.substr(plain));
  out.put('"');
}

// Text that is not UTF-8 as nlohmann prints it: each bad sequence U+FFFD.
std::string printed_json(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Printable ASCII with nothing to escape: most names and values. Eight
// bytes at a time: a byte under 0x20, from 0x80, '"' or '\\' anywhere in a
// word sets its high bit in `bad`.
bool plain(std::string_view s) {
  constexpr uint64_t kOnes = 0x0101010101010101, kHigh = 0x8080808080808080;
  auto has_zero = [](uint64_t w) { return (w - kOnes) & ~w & kHigh; };
  auto bad = [&](uint64_t w) {
    return (w & kHigh) | ((w - kOnes * 0x20) & ~w & kHigh) | has_zero(w ^ (kOnes * '"')) | has_zero(w ^ (kOnes * '\\'));
  };
  uint64_t any = 0;
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    any |= bad(w);
  }
  if (i < s.size()) {  // the tail, padded with a byte that is fine
    uint64_t w = kOnes * 'a';
    std::memcpy(&w, s.data() + i, s.size() - i);
    any |= bad(w);
  }
  return any == 0;
}

// A string as nlohmann prints it, what is not UTF-8 replaced as it replaces it.
template <class Out>
void append_string(Out& out, std::string_view s) {
  if (plain(s)) {
    char* at = out.room(s.size() + 2);
    at[0] = '"';
    std::memcpy(at + 1, s.data(), s.size());
    at[s.size() + 1] = '"';
  } else if (valid_utf8(s)) {
    append_escaped(out, s);
  } else {
    out.put(printed_json(s));
  }
}

}  // namespace

JsonWriter::JsonWriter(size_t input_size) {
  full_.reserve(2 * input_size + 64);  // text is about twice its binary encoding
  members_.reserve(32);
  frames_.reserve(8);
}

DecodedJson JsonWriter::finish() {
  DecodedJson out;
  out.json = full_.take();
  if (canon_on_) out.differing_canonical = canon_.take();
  return out;
}

void JsonWriter::before_value() {
  if (frames_.empty()) return;
  Frame& f = frames_.back();
  if (f.object) return;  // the member's key came first
  if (!f.empty) raw(',');
  f.empty = false;
}

void JsonWriter::raw(std::string_view text) {
  full_.put(text);
  if (canon_on_) canon_.put(text);
}

void JsonWriter::null() {
  before_value();
  raw("null");
  if (frames_.empty() || !frames_.back().object) return;
  members_.back().null = true;
  // The first null member: the canonical text parts from the JSON here.
  if (!canon_on_) {
    canon_.reserve(full_.size() * 2 + 64);
    canon_.put(full_.from(0));
    canon_on_ = true;
  }
}

void JsonWriter::boolean(bool b) {
  before_value();
  raw(b ? "true" : "false");
}

void JsonWriter::integer(int64_t v) {
  before_value();
  char buf[24];
  raw(std::string_view(buf, static_cast<size_t>(std::to_chars(buf, buf + sizeof buf, v).ptr - buf)));
}

void JsonWriter::unsigned_integer(uint64_t v) {
  before_value();
  char buf[24];
  raw(std::string_view(buf, static_cast<size_t>(std::to_chars(buf, buf + sizeof buf, v).ptr - buf)));
}

void JsonWriter::number(double d) {
  before_value();
  raw(nlohmann::json(d).dump());  // nlohmann's shortest text, as the rest of the host prints doubles
}

void JsonWriter::string(std::string_view s) {
  before_value();
  const size_t at = full_.size();
  append_string(full_, s);
  if (canon_on_) canon_.put(full_.from(at));
}

void JsonWriter::begin_object() {
  before_value();
  frames_.push_back({true, true, full_.size(), canon_size(), members_.size()});
  raw('{');
}

void JsonWriter::key(std::string_view k, std::string_view printed) {
  close_member();
  Frame& f = frames_.back();
  if (!f.empty) raw(',');
  f.empty = false;
  Member m;
  m.key = k;
  m.full_begin = full_.size();
  m.canon_begin = canon_size();
  members_.push_back(m);
  raw(printed);
}

std::string printed_key(std::string_view k) {
  struct Out {
    std::string s;
    void put(std::string_view v) { s += v; }
    void put(char c) { s += c; }
    char* room(size_t n) {
      s.resize(s.size() + n);
      return s.data() + s.size() - n;
    }
  } out;
  append_string(out, k);
  out.put(':');
  return out.s;
}

void JsonWriter::key(std::string_view k) {
  close_member();
  Frame& f = frames_.back();
  if (!f.empty) raw(',');
  f.empty = false;
  Member m;
  // Members sort by their keys as printed: a key that is not UTF-8 sorts
  // (and is the same key as another) by its replaced text, as the JSON
  // read back would have it.
  m.key =
      plain(k) || valid_utf8(k)
          ? k
          : std::string_view(replaced_keys_.emplace_back(nlohmann::json::parse(printed_json(k)).get<std::string>()));
  m.full_begin = full_.size();
  m.canon_begin = canon_size();
  members_.push_back(m);
  append_string(full_, m.key);
  full_.put(':');
  if (canon_on_) canon_.put(full_.from(m.full_begin));
}

void JsonWriter::close_member() {
  // The open member, if any, is the last: an inner object's are gone with it.
  if (members_.size() == frames_.back().first_member) return;
  members_.back().full_end = full_.size();
  members_.back().canon_end = canon_size();
}

void JsonWriter::end_object() {
  close_member();
  const Frame f = frames_.back();
  frames_.pop_back();
  // The members in key order, the last of equal keys kept.
  order_.clear();
  bool any_null = false, in_order = true;
  for (size_t i = f.first_member; i < members_.size(); ++i) {
    const Member* m = &members_[i];
    any_null = any_null || m->null;
    if (!order_.empty() && !(order_.back()->key < m->key)) in_order = false;
    order_.push_back(m);
  }
  if (!in_order) {
    // Equal keys stay in the order written. An insertion sort for the
    // small objects records are made of; a map of many keys must not cost
    // its square.
    const auto by_key = [](const Member* a, const Member* b) { return a->key < b->key; };
    if (order_.size() > 16) {
      std::stable_sort(order_.begin(), order_.end(), by_key);
    } else {
      for (size_t i = 1; i < order_.size(); ++i)
        for (size_t j = i; j > 0 && by_key(order_[j], order_[j - 1]); --j) std::swap(order_[j], order_[j - 1]);
    }
    size_t kept = 0;
    for (size_t i = 0; i < order_.size(); ++i)
      if (i + 1 == order_.size() || order_[i + 1]->key != order_[i]->key) order_[kept++] = order_[i];
    order_.resize(kept);
    rebuild(full_, f.full_start, false);
  } else {
    full_.put('}');
  }
  if (canon_on_) {
    if (!in_order || any_null) {
      rebuild(canon_, f.canon_start, true);
    } else {
      canon_.put('}');
    }
  }
  members_.resize(f.first_member);
}

// Rewrites an object (from its '{' at `start`) with its members in order_,
// null members left out of the canonical text.
void JsonWriter::rebuild(Text& out, size_t start, bool canon) {
  scratch_.assign(out.from(start));
  out.cut(start + 1);
  bool first = true;
  for (const Member* m : order_) {
    if (canon && m->null) continue;
    if (!first) out.put(',');
    first = false;
    const size_t begin = canon ? m->canon_begin : m->full_begin, end = canon ? m->canon_end : m->full_end;
    out.put(std::string_view(scratch_).substr(begin - start, end - begin));
  }
  out.put('}');
}

void JsonWriter::begin_array() {
  before_value();
  frames_.push_back({false, true, full_.size(), canon_size(), members_.size()});
  raw('[');
}

void JsonWriter::end_array() {
  frames_.pop_back();
  raw(']');
}

}  // namespace idemsink::format
