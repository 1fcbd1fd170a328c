#include "core/format/protobuf.h"

#include <google/protobuf/compiler/parser.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <stdexcept>

#include "core/common/http_fetch.h"
#include "core/format/protobuf_json.h"

namespace idemsink::format {
namespace {

namespace pb = google::protobuf;

class Collect : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (what.empty()) what = "line " + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  std::string what;
};

class CollectPool : public pb::DescriptorPool::ErrorCollector {
 public:
  void AddError(const std::string& file, const std::string& element, const pb::Message*, ErrorLocation,
                const std::string& message) override {
    if (what.empty()) what = file + ": " + element + ": " + message;
  }
  std::string what;
};

// .proto text, or a FileDescriptorProto serialized and base64-encoded.
pb::FileDescriptorProto file_of(std::string_view text, const std::string& name) {
  pb::FileDescriptorProto out;
  std::string raw;
  if (text.find_first_of(" \n;{") == std::string_view::npos && base64_decode(text, raw) && out.ParseFromString(raw)) {
    out.set_name(name);
    return out;
  }
  pb::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  Collect errors;
  pb::io::Tokenizer tokens(&input, &errors);
  pb::compiler::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.Parse(&tokens, &out))
    throw std::runtime_error("protobuf schema " + name + " does not parse: " + errors.what);
  out.set_name(name);
  return out;
}

struct Reader {
  std::string_view b;
  size_t pos = 0;
  int64_t varint_zigzag() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= b.size()) throw std::runtime_error("ends inside its message indexes");
      const auto byte = static_cast<uint8_t>(b[pos++]);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1));
    }
    throw std::runtime_error("a message index longer than 10 bytes");
  }
};

}  // namespace

struct ProtobufSchema::Impl {
  // The well-known types (google/protobuf/*.proto) come from the pool
  // libprotobuf was built with.
  pb::DescriptorPool pool{pb::DescriptorPool::generated_pool()};
  const pb::FileDescriptor* file = nullptr;
  std::unique_ptr<ProtobufJson> json;  // once the file is built
};

ProtobufSchema::ProtobufSchema(std::string_view schema,
                               const std::vector<std::pair<std::string, std::string>>& references)
    : impl_(std::make_unique<Impl>()) {
  CollectPool errors;
  for (const auto& [name, text] : references) {
    if (impl_->pool.FindFileByName(name) != nullptr) continue;  // a well-known type, or built already
    if (impl_->pool.BuildFileCollectingErrors(file_of(text, name), &errors) == nullptr)
      throw std::runtime_error("protobuf schema: import " + name + ": " + errors.what);
  }
  impl_->file = impl_->pool.BuildFileCollectingErrors(file_of(schema, "idemsink_record.proto"), &errors);
  if (impl_->file == nullptr) throw std::runtime_error("protobuf schema: " + errors.what);
  if (impl_->file->message_type_count() == 0) throw std::runtime_error("protobuf schema: it defines no message");
  impl_->json = std::make_unique<ProtobufJson>(impl_->file);
}

ProtobufSchema::~ProtobufSchema() = default;

DecodedJson ProtobufSchema::decode(std::string_view bytes) const {
  // Confluent's framing: how many indexes (0: just the first message), then
  // the index of the message in the file, then in that message, and so on.
  Reader in{bytes};
  std::vector<int64_t> path;
  const int64_t count = in.varint_zigzag();
  if (count < 0 || count > 100) throw std::runtime_error("a message index count of " + std::to_string(count));
  for (int64_t i = 0; i < count; ++i) path.push_back(in.varint_zigzag());
  if (path.empty()) path.push_back(0);
  const pb::Descriptor* d = nullptr;
  for (size_t i = 0; i < path.size(); ++i) {
    const int64_t at = path[i];
    const int n = i == 0 ? impl_->file->message_type_count() : d->nested_type_count();
    if (at < 0 || at >= n) throw std::runtime_error("the schema has no message at index " + std::to_string(at));
    d = i == 0 ? impl_->file->message_type(static_cast<int>(at)) : d->nested_type(static_cast<int>(at));
  }
  // The names the schema writes, as paths name them. A field at its default
  // (0, "", false) is left out, as proto3 cannot tell it from one never set:
  // so a record written under a later version with a field added and left
  // unset reads as the same JSON (the same payload, the same key).
  return impl_->json->decode(d, bytes.substr(in.pos));
}

}  // namespace idemsink::format
