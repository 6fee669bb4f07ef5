// Every scalar field of a config message, by reflection: what the tables covering every field of
// a kind (float_ranges.h, string_fields.h) walk, so a field added to the schema is found.
#pragma once

#include <google/protobuf/message.h>

#include <functional>
#include <string>

namespace mod::config {

// visit(message, field, path) for each non-message field of msg and of its sub-messages, depth
// first; path is the field's from the root, e.g. "model.mod.capacity". A repeated message field
// is a logic_error (the schemas have none).
using FieldVisitor = std::function<void(const google::protobuf::Message& msg,
                                        const google::protobuf::FieldDescriptor* field,
                                        const std::string& path)>;
void for_each_scalar_field(const google::protobuf::Message& msg, const FieldVisitor& visit,
                           const std::string& path = "");

}  // namespace mod::config
