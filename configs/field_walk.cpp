// The reflection walk over a config's scalar fields (see field_walk.h).
#include "configs/field_walk.h"

#include <stdexcept>

namespace mod::config {

void for_each_scalar_field(const google::protobuf::Message& msg, const FieldVisitor& visit,
                           const std::string& path) {
  const google::protobuf::Descriptor* d = msg.GetDescriptor();
  const google::protobuf::Reflection* refl = msg.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const std::string here = path.empty() ? f->name() : path + "." + f->name();
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      visit(msg, f, here);
      continue;
    }
    if (f->is_repeated()) throw std::logic_error("config: " + here + ": repeated message");
    for_each_scalar_field(refl->GetMessage(msg, f), visit, here);
  }
}

}  // namespace mod::config
