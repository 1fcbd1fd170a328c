#include "core/format/protobuf_json.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/type_resolver_util.h>

#include <algorithm>
#include <vector>

#include "core/format/protobuf_plan.h"

namespace idemsink::format {

namespace pb = google::protobuf;
using FD = pb::FieldDescriptor;

namespace {

// The well-known types whose JSON is protobuf's own shape.
bool printed_by_protobuf(const std::string& type) {
  return type == "google.protobuf.Struct" || type == "google.protobuf.Value" || type == "google.protobuf.ListValue" ||
         type == "google.protobuf.Any" || type == "google.protobuf.FieldMask";
}

}  // namespace

ProtobufJson::ProtobufJson(const pb::FileDescriptor* file)
    : resolver_(pb::util::NewTypeResolverForDescriptorPool("type.googleapis.com", file->pool())) {
  std::vector<const pb::Descriptor*> todo;
  for (int i = 0; i < file->message_type_count(); ++i) todo.push_back(file->message_type(i));
  while (!todo.empty()) {
    const pb::Descriptor* d = todo.back();
    todo.pop_back();
    plan_of(d);
    for (int i = 0; i < d->nested_type_count(); ++i) todo.push_back(d->nested_type(i));
  }
}

ProtobufJson::~ProtobufJson() = default;

// Plans are made once, at construction: decoding only reads them (several
// threads may decode at once).
const ProtobufJson::Plan* ProtobufJson::plan_of(const pb::Descriptor* d) {
  if (auto it = plans_.find(d); it != plans_.end()) return it->second.get();
  Plan& p = *plans_.emplace(d, std::make_unique<Plan>()).first->second;  // before its fields: types recurse
  p.d = d;
  const std::string& type = d->full_name();
  if (type == "google.protobuf.Timestamp") p.kind = Plan::Kind::Timestamp;
  if (type == "google.protobuf.Duration") p.kind = Plan::Kind::Duration;
  if (d->file()->name() == "google/protobuf/wrappers.proto") p.kind = Plan::Kind::Wrapper;
  if (printed_by_protobuf(type)) p.kind = Plan::Kind::Printed;
  p.oneofs = d->oneof_decl_count();
  for (int i = 0; i < d->field_count(); ++i) {
    Plan::Field f;
    f.f = d->field(i);
    if (f.f->cpp_type() == FD::CPPTYPE_MESSAGE) f.message = plan_of(f.f->message_type());
    if (const pb::OneofDescriptor* o = f.f->real_containing_oneof()) f.oneof = o->index();
    f.closed_enum =
        f.f->type() == FD::TYPE_ENUM && f.f->enum_type()->file()->syntax() == pb::FileDescriptor::SYNTAX_PROTO2;
    p.any_required = p.any_required || f.f->is_required();
    f.printed = printed_key(f.f->name());
    p.fields.push_back(f);
  }
  std::sort(p.fields.begin(), p.fields.end(), [](const auto& a, const auto& b) { return a.f->name() < b.f->name(); });
  for (size_t i = 0; i < p.fields.size(); ++i) p.by_number[static_cast<uint64_t>(p.fields[i].f->number())] = i;
  return &p;
}

}  // namespace idemsink::format
