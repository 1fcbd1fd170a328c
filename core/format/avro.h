// Avro's binary encoding read with the writer's schema, into JSON
// (docs/formats.md has the mapping). Written here rather than on Avro C:
// Debian's libavro 1.11 knows no logical types (a decimal would come out as
// raw bytes) and cannot resolve a named type defined in another schema, which
// a registry's references need.
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/format/json_writer.h"

namespace idemsink::format {

class AvroSchema {
 public:
  /// The schema (JSON text), after the schemas it references (in order, each
  /// defining named types it may use). Throws std::runtime_error naming what
  /// is wrong.
  explicit AvroSchema(std::string_view schema, const std::vector<std::string>& references = {});
  ~AvroSchema();

  /// The record's JSON and its canonical form; throws std::runtime_error
  /// when the bytes do not decode under the schema (short, a bad union
  /// index, bytes left over).
  DecodedJson decode(std::string_view bytes) const;
  std::string to_json(std::string_view bytes) const { return decode(bytes).json; }

  struct Type;

 private:
  const Type* parse(const void* json, const std::string& ns, int depth);
  void define_named(Type& t, const void* json, const std::string& kind, const std::string& ns, int depth);
  const Type* named(const std::string& name, const std::string& ns) const;

  std::vector<std::unique_ptr<Type>> types_;  // types point at each other
  std::map<std::string, const Type*> names_;
  const Type* root_ = nullptr;
};

}  // namespace idemsink::format
