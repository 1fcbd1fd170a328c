// Reading a settings document (TOML) against the declared settings
// (settings.h): every string expanded by one rule, unknown keys and wrong
// types refused, values typed and bounds-checked, each error naming the file,
// line and key. config.cc builds a Config from what this reads. Internal to
// the config module.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <toml++/toml.h>

#include "core/config/config.h"
#include "core/config/settings.h"

namespace idemsink::config {

SourcePos pos_of(const std::string& file, const toml::node& n);
[[noreturn]] void fail(const SourcePos& pos, std::string_view key, const std::string& reason);

/// The one expansion rule for every string in the file: ${NAME} is the
/// environment variable's value (unset is an error), $$ is a literal $, any
/// other $ stays as it is, and an unterminated ${ is an error. `secret` keeps
/// every part of the text, variable names included, out of the error (the
/// key and the position still show).
std::string expand_env(const std::string& in, const SourcePos& pos, std::string_view key, bool secret);
/// Rejects unknown keys and wrong types anywhere in the document. Values are
/// parsed and bounds-checked when read, after expansion.
void check_table(const toml::table& t, const std::string& prefix, const std::string& file);
/// A scalar as text: a string as it is, a number or a boolean as written.
std::string scalar_text(const toml::node& n);
/// The value of setting `s` from node `n` (null when the file leaves it
/// out): typed, expanded and bounds-checked, or else the declared default. A
/// missing required key is reported at `table_pos`, its enclosing table.
/// Errors name the key `as`, where the file's key is not the setting's path
/// ("route.database.port" for database.port); empty: the setting's path.
Value read_value(const Setting& s, const toml::node* n, const std::string& file, const SourcePos& table_pos,
                 std::string_view as = {});
/// Reads every bound setting in `scope` from table `t` into `target`: scope
/// "" is the top-level sections of the document, "route" one [[route]] table.
void read_bound(const toml::table& t, std::string_view scope, const std::string& file, const SourcePos& t_pos,
                const Target& target);

// Access to one validated table for the settings the code reads itself and
// for the positions of errors found across fields.
class Reader {
 public:
  Reader(const toml::table* t, std::string prefix, std::string file, SourcePos table_pos)
      : t_(t), prefix_(std::move(prefix)), file_(std::move(file)), table_pos_(std::move(table_pos)) {}

  std::string str(std::string_view key) const {
    return std::get<std::string>(read_value(decl(key), node(key), file_, table_pos_));
  }
  Reader sub(std::string_view key) const {
    const toml::node* n = node(key);
    static const toml::table kEmpty;
    return Reader(n ? n->as_table() : &kEmpty, path(key), file_, n ? pos_of(file_, *n) : table_pos_);
  }
  const toml::node* node(std::string_view key) const { return t_->get(key); }
  SourcePos pos_of_key(std::string_view key) const {
    const toml::node* n = node(key);
    return n ? pos_of(file_, *n) : table_pos_;
  }
  const SourcePos& table_pos() const { return table_pos_; }
  std::string path(std::string_view key) const {
    return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
  }

 private:
  const Setting& decl(std::string_view key) const {
    const Setting* s = find_setting(path(key));
    if (s == nullptr) throw std::logic_error("undeclared setting " + path(key));
    return *s;
  }
  const toml::table* t_;
  std::string prefix_;
  std::string file_;
  SourcePos table_pos_;
};

}  // namespace idemsink::config
