#include "predict_codec.h"

#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/repeated_field.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <vector>

#include "custom_ops/kernels/bert_core.h"

namespace bertserve {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// tensorflow.DataType numbers of the dtypes taken apart here (tensorflow/core/framework/types.proto); the
// descriptors name the enum, not which field carries which dtype, so that pairing is written down once here.
constexpr int kFloat = 1, kDouble = 2, kInt32 = 3, kInt64 = 9;
constexpr size_t kMaxName = std::numeric_limits<uint16_t>::max();
constexpr int kMaxDims = std::numeric_limits<uint8_t>::max();

template <typename T>
void Put(std::string* out, T value) {  // little-endian, as the frame format (x86-64 and aarch64 are)
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// Reads an OUTPUTS body front to back; every read is bounds-checked, and a failed one leaves ok() false.
class Reader {
 public:
  Reader(const char* data, size_t size) : data_(data), left_(size) {}
  template <typename T>
  T Get() {
    T value{};
    if (Take(sizeof(T))) std::memcpy(&value, data_ - sizeof(T), sizeof(T));
    return value;
  }
  const char* Bytes(size_t size) { return Take(size) ? data_ - size : nullptr; }
  bool ok() const { return ok_; }

 private:
  bool Take(size_t size) {
    if (!ok_ || size > left_) return ok_ = false;
    data_ += size;
    left_ -= size;
    return true;
  }
  const char* data_;
  size_t left_;
  bool ok_ = true;
};

// One of the bertserve token inputs (input_ids, input_mask, segment_ids) as DecodeRequest wrote it into the frame.
struct TokenInput {
  bool seen = false;
  int dtype = 0;
  std::vector<int64_t> dims;
  size_t data_at = 0, data_size = 0;
};
constexpr const char* kTokenInputNames[3] = {"input_ids", "input_mask", "segment_ids"};

// Appends the TOKENS block (server/forwarding.py) for the token inputs of a request: whether the fused op's mask
// check passes (CuSeqlensFromMask: the op's own code, compiled in) and the range of ids and segment ids at real
// positions, so the main process compares four numbers with the model's tables instead of scanning the request
// (server/token_inputs.py). State 0: no summary (inputs missing, not int32 [batch, seq], values broadcast from
// one, ...): the main process checks the arrays itself, as it does to name what a refused request got wrong.
void AppendTokenSummary(const TokenInput (&inputs)[3], std::string* out) {
  uint8_t state = 0;
  int32_t id_min = 0, id_max = -1, segment_min = 0, segment_max = -1;  // empty ranges pass any table
  const TokenInput& ids = inputs[0];
  bool usable = true;
  for (const TokenInput& input : inputs) {
    usable = usable && input.seen && input.dtype == kInt32 && input.dims.size() == 2 && input.dims == ids.dims;
  }
  if (usable) {
    const int64_t batch = ids.dims[0], seq = ids.dims[1];
    // seq > 0 bounds batch by the bytes received, and so the cu_seqlens allocated below.
    usable = batch >= 0 && seq > 0 && batch <= std::numeric_limits<int64_t>::max() / seq / 4;
    for (const TokenInput& input : inputs) {
      usable = usable && input.data_size == static_cast<size_t>(batch * seq * 4);
    }
  }
  if (usable) {
    const int64_t batch = ids.dims[0], seq = ids.dims[1];
    std::vector<int32_t> values[3];
    for (int i = 0; i < 3; ++i) {  // copied: frame bytes are not int32-aligned
      values[i].resize(static_cast<size_t>(batch * seq));
      std::memcpy(values[i].data(), out->data() + inputs[i].data_at, inputs[i].data_size);
    }
    std::vector<int32_t> cu_seqlens(static_cast<size_t>(batch) + 1);
    if (!CuSeqlensFromMask(values[1].data(), batch, seq, cu_seqlens.data()).empty()) {
      state = 2;
    } else {
      state = 1;
      id_min = segment_min = std::numeric_limits<int32_t>::max();
      id_max = segment_max = std::numeric_limits<int32_t>::min();
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t row = b * seq, length = cu_seqlens[b + 1] - cu_seqlens[b];
        for (int64_t s = 0; s < length; ++s) {
          id_min = std::min(id_min, values[0][row + s]);
          id_max = std::max(id_max, values[0][row + s]);
          segment_min = std::min(segment_min, values[2][row + s]);
          segment_max = std::max(segment_max, values[2][row + s]);
        }
      }
      if (cu_seqlens[batch] == 0) id_min = segment_min = 0, id_max = segment_max = -1;
    }
  }
  Put<uint8_t>(out, state);
  Put<int32_t>(out, id_min);
  Put<int32_t>(out, id_max);
  Put<int32_t>(out, segment_min);
  Put<int32_t>(out, segment_max);
}

const FieldDescriptor* Field(const Descriptor* type, const char* name, FieldDescriptor::CppType cpp_type,
                             bool repeated, std::string* error) {
  const FieldDescriptor* field = type == nullptr ? nullptr : type->FindFieldByName(name);
  if (field == nullptr || field->cpp_type() != cpp_type || field->is_repeated() != repeated) {
    *error = std::string("the descriptors lack the expected field ") + (type ? type->full_name() : "?") + "." + name;
    return nullptr;
  }
  return field;
}

// GetRepeatedField and MutableRepeatedField are deprecated for GetRepeatedFieldRef, which hands values out one
// virtual call at a time; these hand out the array, which is copied in one go.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// The typed field's values of a dtype, as little-endian bytes.
template <typename T>
void AppendValues(const Reflection* reflection, const Message& tensor, const FieldDescriptor* field,
                  std::string* out) {
  const google::protobuf::RepeatedField<T>& values = reflection->GetRepeatedField<T>(tensor, field);
  out->append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

template <typename T>
void SetValues(const Reflection* reflection, Message* tensor, const FieldDescriptor* field, const char* data,
               size_t count) {
  google::protobuf::RepeatedField<T>* values = reflection->MutableRepeatedField<T>(tensor, field);
  values->Resize(static_cast<int>(count), T());
  std::memcpy(values->mutable_data(), data, count * sizeof(T));
}
#pragma GCC diagnostic pop

// A message of the prototype's type for one call: the thread's own, cleared, whose buffers are reused from call to
// call; for a call over kReusedUpTo bytes a message of its own, so no thread keeps the largest call's capacity.
class CallMessage {
 public:
  CallMessage(const Message* prototype, size_t size) {
    constexpr size_t kReusedUpTo = 1 << 20;
    if (size > kReusedUpTo) {
      owned_.reset(prototype->New());
      message_ = owned_.get();
      return;
    }
    thread_local std::unordered_map<const Message*, std::unique_ptr<Message>> reused;
    std::unique_ptr<Message>& message = reused[prototype];
    if (message == nullptr) message.reset(prototype->New());
    message->Clear();
    message_ = message.get();
  }
  Message* get() const { return message_; }

 private:
  std::unique_ptr<Message> owned_;
  Message* message_;
};

}  // namespace

std::unique_ptr<PredictCodec> PredictCodec::Create(const std::string& descriptor_set, std::string* error) {
  if (descriptor_set.empty()) return nullptr;
  std::unique_ptr<PredictCodec> codec(new PredictCodec());
  if (!codec->Init(descriptor_set, error)) return nullptr;
  return codec;
}

bool PredictCodec::Init(const std::string& descriptor_set, std::string* error) {
  google::protobuf::FileDescriptorSet files;
  if (!files.ParseFromString(descriptor_set)) {
    *error = "the descriptor set does not parse";
    return false;
  }
  for (const google::protobuf::FileDescriptorProto& file : files.file()) {  // imports first (the sender's order)
    if (pool_.BuildFile(file) == nullptr) {
      *error = "the descriptor set's file " + file.name() + " does not build";
      return false;
    }
  }
  using F = FieldDescriptor;
  const Descriptor* request = pool_.FindMessageTypeByName("tensorflow.serving.PredictRequest");
  const Descriptor* response = pool_.FindMessageTypeByName("tensorflow.serving.PredictResponse");
  if (request == nullptr || response == nullptr) {
    *error = "the descriptor set lacks tensorflow.serving.PredictRequest or PredictResponse";
    return false;
  }
  if (!(model_spec_ = Field(request, "model_spec", F::CPPTYPE_MESSAGE, false, error)) ||
      !(inputs_ = Field(request, "inputs", F::CPPTYPE_MESSAGE, true, error)) ||
      !(output_filter_ = Field(request, "output_filter", F::CPPTYPE_STRING, true, error)) ||
      !(outputs_ = Field(response, "outputs", F::CPPTYPE_MESSAGE, true, error))) {
    return false;
  }
  if (!inputs_->is_map() || !outputs_->is_map()) {
    *error = "PredictRequest.inputs or PredictResponse.outputs is not a map";
    return false;
  }
  const Descriptor* spec = model_spec_->message_type();
  const Descriptor* entry = inputs_->message_type();
  if (!(spec_name_ = Field(spec, "name", F::CPPTYPE_STRING, false, error)) ||
      !(spec_version_ = Field(spec, "version", F::CPPTYPE_MESSAGE, false, error)) ||
      !(spec_label_ = Field(spec, "version_label", F::CPPTYPE_STRING, false, error)) ||
      !(spec_signature_ = Field(spec, "signature_name", F::CPPTYPE_STRING, false, error)) ||
      !(int64_value_ = Field(spec_version_->message_type(), "value", F::CPPTYPE_INT64, false, error)) ||
      !(entry_key_ = Field(entry, "key", F::CPPTYPE_STRING, false, error)) ||
      !(entry_value_ = Field(entry, "value", F::CPPTYPE_MESSAGE, false, error))) {
    return false;
  }
  const Descriptor* tensor = entry_value_->message_type();
  if (!(dtype_ = Field(tensor, "dtype", F::CPPTYPE_ENUM, false, error)) ||
      !(shape_ = Field(tensor, "tensor_shape", F::CPPTYPE_MESSAGE, false, error)) ||
      !(content_ = Field(tensor, "tensor_content", F::CPPTYPE_STRING, false, error)) ||
      !(float_val_ = Field(tensor, "float_val", F::CPPTYPE_FLOAT, true, error)) ||
      !(double_val_ = Field(tensor, "double_val", F::CPPTYPE_DOUBLE, true, error)) ||
      !(int_val_ = Field(tensor, "int_val", F::CPPTYPE_INT32, true, error)) ||
      !(int64_val_ = Field(tensor, "int64_val", F::CPPTYPE_INT64, true, error)) ||
      !(dims_ = Field(shape_->message_type(), "dim", F::CPPTYPE_MESSAGE, true, error)) ||
      !(unknown_rank_ = Field(shape_->message_type(), "unknown_rank", F::CPPTYPE_BOOL, false, error)) ||
      !(dim_size_ = Field(dims_->message_type(), "size", F::CPPTYPE_INT64, false, error))) {
    return false;
  }
  // The response is written with the request's field descriptors: its map entries and model_spec must be of the
  // same types (the entry types differ by name only: InputsEntry, OutputsEntry).
  if (!(response_spec_ = Field(response, "model_spec", F::CPPTYPE_MESSAGE, false, error)) ||
      !(output_key_ = Field(outputs_->message_type(), "key", F::CPPTYPE_STRING, false, error)) ||
      !(output_value_ = Field(outputs_->message_type(), "value", F::CPPTYPE_MESSAGE, false, error))) {
    return false;
  }
  if (response_spec_->message_type() != spec || output_value_->message_type() != tensor) {
    *error = "PredictResponse's model_spec or outputs are not of PredictRequest's types";
    return false;
  }
  factory_.reset(new google::protobuf::DynamicMessageFactory(&pool_));
  request_prototype_ = factory_->GetPrototype(request);
  response_prototype_ = factory_->GetPrototype(response);
  return request_prototype_ != nullptr && response_prototype_ != nullptr;
}

bool PredictCodec::DecodeRequest(const char* data, size_t size, std::string* out) const {
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) return false;
  CallMessage call_message(request_prototype_, size);
  Message* request = call_message.get();
  if (!request->ParseFromArray(data, static_cast<int>(size))) return false;  // the main process names the error
  const Reflection* reflection = request->GetReflection();
  if (!reflection->HasField(*request, model_spec_)) return false;
  const Message& spec = reflection->GetMessage(*request, model_spec_);
  const Reflection* spec_reflection = spec.GetReflection();
  std::string scratch_name, scratch_label, scratch_signature, scratch;
  const std::string& name = spec_reflection->GetStringReference(spec, spec_name_, &scratch_name);
  const std::string& label = spec_reflection->GetStringReference(spec, spec_label_, &scratch_label);
  const std::string& signature = spec_reflection->GetStringReference(spec, spec_signature_, &scratch_signature);
  bool has_version = spec_reflection->HasField(spec, spec_version_);
  int64_t version = 0;
  if (has_version) {
    const Message& wrapper = spec_reflection->GetMessage(spec, spec_version_);
    version = wrapper.GetReflection()->GetInt64(wrapper, int64_value_);
  }
  int filters = reflection->FieldSize(*request, output_filter_);
  int inputs = reflection->FieldSize(*request, inputs_);
  if (name.empty() || name.size() > kMaxName || label.size() > kMaxName || signature.size() > kMaxName ||
      filters > static_cast<int>(kMaxName) || inputs > static_cast<int>(kMaxName)) {
    return false;
  }
  size_t start = out->size();
  Put<uint8_t>(out, has_version);
  Put<int64_t>(out, version);
  Put<uint16_t>(out, static_cast<uint16_t>(name.size()));
  Put<uint16_t>(out, static_cast<uint16_t>(label.size()));
  Put<uint16_t>(out, static_cast<uint16_t>(signature.size()));
  Put<uint16_t>(out, static_cast<uint16_t>(filters));
  Put<uint16_t>(out, static_cast<uint16_t>(inputs));
  out->append(name).append(label).append(signature);
  for (int i = 0; i < filters; ++i) {
    const std::string& filter = reflection->GetRepeatedStringReference(*request, output_filter_, i, &scratch);
    if (filter.size() > kMaxName) {
      out->resize(start);
      return false;
    }
    Put<uint16_t>(out, static_cast<uint16_t>(filter.size()));
    out->append(filter);
  }
  TokenInput token_inputs[3];
  for (int i = 0; i < inputs; ++i) {
    const Message& entry = reflection->GetRepeatedMessage(*request, inputs_, i);
    const Reflection* entry_reflection = entry.GetReflection();
    std::string scratch_alias;
    const std::string& alias = entry_reflection->GetStringReference(entry, entry_key_, &scratch_alias);
    const Message& tensor = entry_reflection->GetMessage(entry, entry_value_);
    const Reflection* tensor_reflection = tensor.GetReflection();
    int dtype = tensor_reflection->GetEnumValue(tensor, dtype_);
    const Message& shape = tensor_reflection->GetMessage(tensor, shape_);
    const Reflection* shape_reflection = shape.GetReflection();
    int rank = shape_reflection->FieldSize(shape, dims_);
    bool known = dtype == kFloat || dtype == kDouble || dtype == kInt32 || dtype == kInt64;
    if (!known || alias.size() > kMaxName || rank > kMaxDims || shape_reflection->GetBool(shape, unknown_rank_)) {
      out->resize(start);
      return false;
    }
    const std::string& content = tensor_reflection->GetStringReference(tensor, content_, &scratch);
    Put<uint16_t>(out, static_cast<uint16_t>(alias.size()));
    Put<int32_t>(out, dtype);
    Put<uint8_t>(out, !content.empty());
    Put<uint8_t>(out, static_cast<uint8_t>(rank));
    size_t data_size_at = out->size();
    Put<uint32_t>(out, 0);  // the data's size, once known
    out->append(alias);
    std::vector<int64_t> dims(static_cast<size_t>(rank));
    for (int d = 0; d < rank; ++d) {
      const Message& dim = shape_reflection->GetRepeatedMessage(shape, dims_, d);
      dims[d] = dim.GetReflection()->GetInt64(dim, dim_size_);
      Put<int64_t>(out, dims[d]);
    }
    size_t data_at = out->size();
    if (!content.empty()) {
      out->append(content);
    } else if (dtype == kFloat) {
      AppendValues<float>(tensor_reflection, tensor, float_val_, out);
    } else if (dtype == kDouble) {
      AppendValues<double>(tensor_reflection, tensor, double_val_, out);
    } else if (dtype == kInt32) {
      AppendValues<int32_t>(tensor_reflection, tensor, int_val_, out);
    } else {
      AppendValues<int64_t>(tensor_reflection, tensor, int64_val_, out);
    }
    size_t data_size = out->size() - data_at;
    if (data_size > std::numeric_limits<uint32_t>::max()) {
      out->resize(start);
      return false;
    }
    uint32_t stored = static_cast<uint32_t>(data_size);
    std::memcpy(&(*out)[data_size_at], &stored, sizeof(stored));
    for (int t = 0; t < 3; ++t) {
      if (alias == kTokenInputNames[t]) {  // a repeated key: the last wins, as in the main process's dict
        TokenInput& token = token_inputs[t];
        token.seen = true;
        token.dtype = dtype;
        token.dims = dims;
        token.data_at = data_at;
        token.data_size = data_size;
      }
    }
  }
  AppendTokenSummary(token_inputs, out);
  return true;
}

bool PredictCodec::EncodeResponse(const char* data, size_t size, std::string* out) const {
  CallMessage call_message(response_prototype_, size);
  Message* response = call_message.get();
  Reader in(data, size);
  int64_t version = in.Get<int64_t>();
  bool as_content = in.Get<uint8_t>() != 0;
  uint16_t name_size = in.Get<uint16_t>(), signature_size = in.Get<uint16_t>(), outputs = in.Get<uint16_t>();
  const char* name = in.Bytes(name_size);
  const char* signature = in.Bytes(signature_size);
  if (!in.ok()) return false;
  const Reflection* reflection = response->GetReflection();
  Message* spec = reflection->MutableMessage(response, response_spec_);
  const Reflection* spec_reflection = spec->GetReflection();
  spec_reflection->SetString(spec, spec_name_, std::string(name, name_size));
  Message* wrapper = spec_reflection->MutableMessage(spec, spec_version_);
  wrapper->GetReflection()->SetInt64(wrapper, int64_value_, version);
  spec_reflection->SetString(spec, spec_signature_, std::string(signature, signature_size));
  for (uint16_t i = 0; i < outputs; ++i) {
    uint16_t alias_size = in.Get<uint16_t>();
    int32_t dtype = in.Get<int32_t>();
    in.Get<uint8_t>();  // the input frames' "values in tensor_content" flag; `as_content` decides here
    uint8_t rank = in.Get<uint8_t>();
    uint32_t data_size = in.Get<uint32_t>();
    const char* alias = in.Bytes(alias_size);
    const char* dims = in.Bytes(static_cast<size_t>(rank) * sizeof(int64_t));
    const char* values = in.Bytes(data_size);
    if (!in.ok()) return false;
    size_t item = dtype == kFloat || dtype == kInt32 ? 4 : dtype == kDouble || dtype == kInt64 ? 8 : 0;
    if (item == 0 || data_size % item != 0) return false;
    Message* entry = reflection->AddMessage(response, outputs_);
    entry->GetReflection()->SetString(entry, output_key_, std::string(alias, alias_size));
    Message* tensor = entry->GetReflection()->MutableMessage(entry, output_value_);
    const Reflection* tensor_reflection = tensor->GetReflection();
    tensor_reflection->SetEnumValue(tensor, dtype_, dtype);
    Message* shape = tensor_reflection->MutableMessage(tensor, shape_);
    for (uint8_t d = 0; d < rank; ++d) {
      Message* dim = shape->GetReflection()->AddMessage(shape, dims_);
      int64_t dim_size;
      std::memcpy(&dim_size, dims + d * sizeof(int64_t), sizeof(dim_size));
      dim->GetReflection()->SetInt64(dim, dim_size_, dim_size);
    }
    size_t count = data_size / item;
    if (as_content) {
      if (data_size > 0) tensor_reflection->SetString(tensor, content_, std::string(values, data_size));
    } else if (dtype == kFloat) {
      SetValues<float>(tensor_reflection, tensor, float_val_, values, count);
    } else if (dtype == kDouble) {
      SetValues<double>(tensor_reflection, tensor, double_val_, values, count);
    } else if (dtype == kInt32) {
      SetValues<int32_t>(tensor_reflection, tensor, int_val_, values, count);
    } else {
      SetValues<int64_t>(tensor_reflection, tensor, int64_val_, values, count);
    }
  }
  return in.ok() && response->SerializeToString(out);
}

}  // namespace bertserve
