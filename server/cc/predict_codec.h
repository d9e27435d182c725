// Predict requests taken apart and Predict responses put together in a gRPC front-end process, so that the main
// process (Python) neither parses nor serializes protobufs on its hot path (server/forwarding.py: the PREDICT and
// OUTPUTS frames, whose layouts these functions write and read).
//
// The message types come from the main process at start, as a serialized FileDescriptorSet of TF Serving's
// predict.proto and its imports (the descriptors its own tensorflow_serving.apis package was generated from), and
// requests are parsed by protobuf's DynamicMessage: protobuf's own parser and its semantics (last value wins, map
// keys deduplicated, unknown fields skipped), no field number written down here.
//
// Only what the main process decodes the same way from raw bytes is taken apart: a request whose tensors are all
// float, double, int32 or int64, values in tensor_content or the dtype's typed field, shapes of known rank. Any
// other request (strings, halves, no model_spec, ...) goes to the main process as its bytes, which answers it, or
// names what is wrong with it, exactly as before. Sizes, dtypes and shapes are checked there, for both forms, by
// one piece of code (server/tensors.py). A request with the bertserve token inputs also carries what this process
// measured of them (the fused op's mask check, compiled in from custom_ops/kernels/validation.cc, and the ranges
// of ids and segment ids at real positions), which the main process compares with the model's tables
// (server/token_inputs.py) instead of scanning the request on its event loop.

#ifndef BERTSERVE_SERVER_CC_PREDICT_CODEC_H_
#define BERTSERVE_SERVER_CC_PREDICT_CODEC_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/message.h>

#include <cstddef>
#include <memory>
#include <string>

namespace bertserve {

class PredictCodec {
 public:
  // Null when `descriptor_set` is empty or does not describe tensorflow.serving.PredictRequest/PredictResponse as
  // expected (every request then goes to the main process as bytes); `error` says why for a non-empty set.
  static std::unique_ptr<PredictCodec> Create(const std::string& descriptor_set, std::string* error);

  // Appends the PREDICT frame's body after its call header (server/forwarding.py PREDICT_HEAD onwards) to `out`;
  // false (and `out` as it was) when the request is to go to the main process as bytes. Thread-safe.
  bool DecodeRequest(const char* data, size_t size, std::string* out) const;

  // The serialized PredictResponse of an OUTPUTS frame's body after its call id; false when the body is malformed.
  // Thread-safe.
  bool EncodeResponse(const char* data, size_t size, std::string* out) const;

 private:
  PredictCodec() = default;
  bool Init(const std::string& descriptor_set, std::string* error);

  google::protobuf::DescriptorPool pool_;
  std::unique_ptr<google::protobuf::DynamicMessageFactory> factory_;
  const google::protobuf::Message* request_prototype_ = nullptr;
  const google::protobuf::Message* response_prototype_ = nullptr;
  // PredictRequest / PredictResponse
  const google::protobuf::FieldDescriptor *model_spec_, *inputs_, *output_filter_, *outputs_, *response_spec_;
  // ModelSpec, google.protobuf.Int64Value
  const google::protobuf::FieldDescriptor *spec_name_, *spec_version_, *spec_label_, *spec_signature_, *int64_value_;
  // map<string, TensorProto> entries of inputs and of outputs
  const google::protobuf::FieldDescriptor *entry_key_, *entry_value_, *output_key_, *output_value_;
  // TensorProto, TensorShapeProto, TensorShapeProto.Dim
  const google::protobuf::FieldDescriptor *dtype_, *shape_, *content_, *float_val_, *double_val_, *int_val_,
      *int64_val_;
  const google::protobuf::FieldDescriptor *dims_, *unknown_rank_, *dim_size_;
};

}  // namespace bertserve

#endif  // BERTSERVE_SERVER_CC_PREDICT_CODEC_H_
