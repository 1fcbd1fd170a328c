// Writes a decoded record's JSON straight into text, no document in between:
// the JSON the host reads (object members sorted by key, compact, the text
// nlohmann's dump would print for the same value) and, in the same pass, its
// canonical form for the payload check (the same without null members:
// docs/formats.md). A decoder calls it in the order it reads its input; the
// members of an object are put in order when the object ends.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idemsink::format {

/// A decoded value: the JSON the host reads, and the canonical form the
/// payload check hashes (members sorted, null members dropped).
struct DecodedJson {
  std::string json;
  /// Set where it differs from `json` (a null member dropped).
  std::optional<std::string> differing_canonical;
  const std::string& canonical() const { return differing_canonical ? *differing_canonical : json; }
};

/// Whether `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no
/// surrogates, nothing past U+10FFFF).
bool valid_utf8(std::string_view s);

/// A member's key as the writer prints it: the JSON string and a colon.
/// Valid UTF-8 only (a schema's names are).
std::string printed_key(std::string_view k);

class JsonWriter {
 public:
  /// `input_size`: the encoded record's, to size the text once.
  explicit JsonWriter(size_t input_size = 0);

  void null();
  void boolean(bool b);
  void integer(int64_t v);
  void unsigned_integer(uint64_t v);
  /// A finite double (the caller writes NaN and the infinities as it maps them).
  void number(double d);
  void string(std::string_view s);

  void begin_object();
  /// The next member's key; it must stay valid until its object ends (a
  /// schema's name, or a view of the record's bytes). A key written twice
  /// keeps its last value, as a JSON document read back would. Members are
  /// sorted by key as printed (what is not UTF-8 replaced by U+FFFD).
  void key(std::string_view k);
  /// The same for a key known before the record (a schema's field name):
  /// `printed` is printed_key(k), made once.
  void key(std::string_view k, std::string_view printed);
  void end_object();
  void begin_array();
  void end_array();

  /// The JSON and its canonical form, once the top value is written.
  DecodedJson finish();

 private:
  // Text written through a cursor: the string is grown ahead and cut to
  // size once at the end, so a write is a copy rather than a call into
  // std::string (a record is some 100 writes).
  class Text {
   public:
    char* room(size_t n) {
      if (used_ + n > s_.size()) grow(n);
      char* at = s_.data() + used_;
      used_ += n;
      return at;
    }
    void put(std::string_view v) {
      if (!v.empty()) std::memcpy(room(v.size()), v.data(), v.size());
    }
    void put(char c) { *room(1) = c; }
    size_t size() const { return used_; }
    std::string_view from(size_t at) const { return {s_.data() + at, used_ - at}; }
    void cut(size_t size) { used_ = size; }
    void reserve(size_t n) { s_.resize(n); }
    std::string take() {
      s_.resize(used_);
      used_ = 0;
      return std::move(s_);
    }

   private:
    void grow(size_t n) { s_.resize(std::max(2 * s_.size(), used_ + n + 64)); }
    std::string s_;
    size_t used_ = 0;
  };
  struct Member {
    std::string_view key;
    size_t full_begin = 0, full_end = 0, canon_begin = 0, canon_end = 0;
    bool null = false;
  };
  struct Frame {
    bool object = false;
    bool empty = true;  // no member or item yet
    size_t full_start = 0, canon_start = 0;
    size_t first_member = 0;  // in members_
  };
  void before_value();
  void raw(std::string_view text);
  void raw(char c) {
    full_.put(c);
    if (canon_on_) canon_.put(c);
  }
  void close_member();
  size_t canon_size() const { return canon_on_ ? canon_.size() : full_.size(); }
  void rebuild(Text& out, size_t start, bool canon);

  Text full_;
  // The canonical text, written only from the first null member on: until
  // then it is the JSON itself.
  Text canon_;
  bool canon_on_ = false;
  std::vector<Frame> frames_;
  std::vector<Member> members_;           // the open objects' members, innermost last
  std::list<std::string> replaced_keys_;  // keys that were not UTF-8, as printed (a list: no allocation until used)
  std::vector<const Member*> order_;      // end_object's, kept for its capacity
  std::string scratch_;
};

}  // namespace idemsink::format
