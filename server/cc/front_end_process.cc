// A gRPC front-end process of `bertserve serve --grpc_front_end_processes=N` (N > 1), in C++.
//
// It terminates gRPC on the shared port (SO_REUSEPORT: the kernel spreads new connections over the N processes)
// and forwards every call, as bytes, over its socketpair to the main process, which owns the models, batchers,
// metrics and REST and answers it (server/front_end_processes.py, server/forwarding.py hold the frame format).
// Why C++: grpc.aio costs ~330 CPU-us per call on a 2-core host, where this process costs a fraction of it
// (bench/serve_overhead.py); the front ends then leave the cores to the model and the main process.
//
// It holds no state but its calls in flight; health (grpc.health.v1 Check and Watch, gRPC's own service) is what
// the main process last said. SIGTERM and SIGINT are ignored (a signal to the process group reaches the main
// process, which drains the front ends itself); DRAIN makes it finish its calls in flight within the grace and
// exit 0; a lost link (the main process is gone) makes it exit 1 at once; a port it cannot listen on, 3.
//
// Predict requests are taken apart here and their responses put together here (server/cc/predict_codec.h), so the
// main process's Python handles arrays, not protobufs; every other call goes over as its bytes.
//
// Run by the main process as `bertserve_front_end --link_fd=FD --index=I --port=P --grpc_socket_path=PATH
// --drain_grace_seconds=S --methods=/pkg.Service/Method,...`, with the serialized FileDescriptorSet of TF Serving's
// predict.proto on its standard input (empty: every call goes over as bytes).

#include <absl/synchronization/mutex.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/socket.h>
#include <unistd.h>

#include "predict_codec.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

constexpr int kExitLinkLost = 1;
constexpr int kExitCannotListen = 3;
constexpr int kExitBadArguments = 2;

// Frame kinds and layouts: server/forwarding.py (little-endian, packed).
enum Kind : uint8_t {
  kCall = 1, kCancel = 2, kReady = 3, kAnswer = 4, kHealth = 5, kDrain = 6, kPredict = 7, kOutputs = 8
};
constexpr size_t kLengthSize = 4;     // <I: bytes after the length field (kind + body)
constexpr size_t kAnswerHeader = 9;   // <IBI: call id, status code, details length
constexpr size_t kMaxDescriptorSet = 16 << 20;
const char kPredictMethod[] = "/tensorflow.serving.PredictionService/Predict";
// Health services answered as the Python front end answers them (server/grpc_front_end.py HEALTH_SERVICES).
const char* const kHealthServices[] = {"", "tensorflow.serving.PredictionService",
                                       "tensorflow.serving.ModelService"};

int g_index = 0;

void Log(const char* level, const std::string& message) {
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::fprintf(stderr, "%s %s bertserve.server[front end %d]: %s\n", stamp, level, g_index, message.c_str());
  std::fflush(stderr);
}

template <typename T>
void Put(std::string* out, T value) {  // x86-64 and aarch64 are little-endian, as the frame format
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
T Get(const char* data) {
  T value;
  std::memcpy(&value, data, sizeof(value));
  return value;
}

class ForwardedCall;

// The link to the main process: frames out from gRPC's threads (each written at once when the link is idle, else
// queued for the writer thread, and frames queued while a write is under way leave together in its next write),
// frames in on a reader thread.
class Link {
 public:
  explicit Link(int fd) : fd_(fd), writer_(&Link::WriteFrames, this) {}

  ~Link() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
    }
    queued_.notify_one();
    writer_.join();
  }

  // Sends one frame (kind + body parts); false once the link is broken. With nothing queued or being written, the
  // calling thread writes it at once without blocking (no hand-off to the writer thread, whose wake-up would cost a
  // context switch per call); whatever the socket does not take at once, and frames that come while a write is
  // under way, go out through the writer thread, in order. gRPC's threads never block on the link.
  bool Send(Kind kind, const std::string& head, const std::vector<grpc::Slice>& payload = {}) {
    size_t length = 1 + head.size();
    for (const grpc::Slice& slice : payload) length += slice.size();
    if (length > std::numeric_limits<uint32_t>::max()) return false;
    std::string frame;
    frame.reserve(kLengthSize + length);
    Put<uint32_t>(&frame, static_cast<uint32_t>(length));
    frame.push_back(static_cast<char>(kind));
    frame.append(head);
    for (const grpc::Slice& slice : payload) {
      frame.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (broken_) return false;
    if (writing_ || !pending_.empty()) {
      pending_.append(frame);
      queued_.notify_one();
      return true;
    }
    writing_ = true;
    lock.unlock();
    size_t sent = 0;
    while (sent < frame.size()) {
      ssize_t written = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (written < 0 && errno == EINTR) continue;
      if (written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;  // full: the writer waits for room
      if (written <= 0) {
        lock.lock();
        writing_ = false;
        broken_ = true;
        pending_.clear();
        queued_.notify_one();
        written_.notify_all();
        return false;
      }
      sent += static_cast<size_t>(written);
    }
    lock.lock();
    writing_ = false;
    if (sent < frame.size()) pending_.insert(0, frame, sent, std::string::npos);  // ahead of frames queued since
    if (!pending_.empty() || closing_) queued_.notify_one();  // a closing writer waits for this write to end
    written_.notify_all();
    return true;
  }

  // Blocks for the next frame: kind and body; false when the other end is gone. Reads as much as the socket
  // holds, so a burst of answers costs one read, not three per frame.
  bool Receive(Kind* kind, std::string* body) {
    if (!Buffered(kLengthSize)) return false;
    uint32_t length = Get<uint32_t>(in_.data() + in_start_);
    if (length < 1 || !Buffered(kLengthSize + length)) return false;
    const char* frame = in_.data() + in_start_ + kLengthSize;
    *kind = static_cast<Kind>(frame[0]);
    body->assign(frame + 1, length - 1);
    in_start_ += kLengthSize + length;
    return true;
  }

  // Stops both directions once what is queued has been written (the reader then sees the end).
  void Close() {
    std::unique_lock<std::mutex> lock(mutex_);
    written_.wait(lock, [&] { return (pending_.empty() && !writing_) || broken_; });
    lock.unlock();
    ::shutdown(fd_, SHUT_RDWR);
  }

 private:
  void WriteFrames() {
    std::string sending;
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      queued_.wait(lock, [&] { return (!pending_.empty() && !writing_) || (closing_ && !writing_); });
      if (pending_.empty()) return;
      sending.swap(pending_);
      writing_ = true;
      lock.unlock();
      bool ok = WriteAll(sending.data(), sending.size());
      sending.clear();
      lock.lock();
      writing_ = false;
      if (!ok) {
        broken_ = true;
        pending_.clear();
      }
      written_.notify_all();
    }
  }

  bool WriteAll(const char* data, size_t size) {
    while (size > 0) {
      ssize_t written = ::write(fd_, data, size);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) return false;
      data += written;
      size -= static_cast<size_t>(written);
    }
    return true;
  }

  // Whether the input buffer holds `size` unparsed bytes, reading more (what the socket holds, up to 64 KiB or
  // the rest of a larger frame) until it does; false when the other end is gone.
  bool Buffered(size_t size) {
    if (in_start_ > 0 && in_.size() - in_start_ < size) {  // keep only the unparsed tail
      in_.erase(0, in_start_);
      in_start_ = 0;
    }
    while (in_.size() - in_start_ < size) {
      size_t have = in_.size();
      size_t want = std::max<size_t>(size - (have - in_start_), 65536);
      in_.resize(have + want);
      ssize_t got = ::read(fd_, &in_[have], want);
      in_.resize(have + (got > 0 ? static_cast<size_t>(got) : 0));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
    }
    return true;
  }

  int fd_;
  std::mutex mutex_;
  std::condition_variable queued_, written_;
  std::string pending_;  // frames queued for the next write
  std::string in_;  // bytes read from the link; in_[in_start_:] not parsed yet (reader thread only)
  size_t in_start_ = 0;
  bool writing_ = false, broken_ = false, closing_ = false;
  std::thread writer_;  // last: started once the members it uses exist
};

// Calls waiting for the main process's answer, by call id. Whoever takes a call out of the table (its answer, its
// cancellation, or the link's loss) is the one that finishes it, so a call is finished exactly once.
class CallTable {
 public:
  uint32_t Add(ForwardedCall* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (next_id_ == 0) next_id_ = 1;  // 0 means "not sent yet" to a call (ForwardedCall::OnCancel)
    uint32_t id = next_id_++;
    calls_[id] = call;
    return id;
  }

  ForwardedCall* Take(uint32_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = calls_.find(id);
    if (found == calls_.end()) return nullptr;
    ForwardedCall* call = found->second;
    calls_.erase(found);
    return call;
  }

  std::vector<ForwardedCall*> TakeAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ForwardedCall*> all;
    for (auto& entry : calls_) all.push_back(entry.second);
    calls_.clear();
    return all;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<uint32_t, ForwardedCall*> calls_;
  uint32_t next_id_ = 1;  // wraps around, skipping 0
};

// What a completion-queue tag stands for: a step of a call or a call's end.
struct Tag {
  enum Kind { kStep, kEnd } kind;
  void* owner;
};

// One unary call on gRPC's asynchronous generic API: requested, its request read, sent to the main process,
// answered with what comes back. Why the completion-queue API, one thread serving the queue: an empty echo costs
// about 50 CPU-us per call that way here, against about 87 through the callback API's reactors, which hand each
// call between several of gRPC's threads (64 calls in flight on 2 cores); in the server the front ends' cost per
// Predict fell by ~8 %. The answer is started on the link's reader thread at once: handing it to the queue's
// thread (one grpc::Alarm per burst of answers) cost a little less CPU but added ~165 us to the median latency.
//
// The queue's thread sees its steps complete (the request, the read, the finish) and, once, its end (cancelled or
// finished: context_.AsyncNotifyWhenDone). Whoever takes it out of the CallTable (its answer, its cancellation, the
// link's loss) finishes it, so it is finished exactly once; `mutex_` keeps the queue's thread from deleting it
// while another thread is still starting its finish. It is deleted when both its finish and its end completed.
class ForwardedCall {
 public:
  static void Start(grpc::AsyncGenericService* service, grpc::ServerCompletionQueue* queue, Link* link,
                    CallTable* table, const std::unordered_set<std::string>* methods,
                    const bertserve::PredictCodec* codec) {
    auto* call = new ForwardedCall(service, queue, link, table, methods, codec);
    call->context_.AsyncNotifyWhenDone(&call->end_tag_);
    service->RequestCall(&call->context_, &call->stream_, queue, queue, &call->step_tag_);
  }

  // The main process's answer (reader thread; the call was taken out of the table).
  void Answer(uint8_t code, std::string details, const char* body, size_t body_size) {
    if (code == 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      state_ = kFinishing;
      grpc::Slice slice(body, body_size);
      response_ = grpc::ByteBuffer(&slice, 1);
      stream_.WriteAndFinish(response_, grpc::WriteOptions(), grpc::Status::OK, &step_tag_);
    } else {
      Finish(grpc::Status(static_cast<grpc::StatusCode>(code), std::move(details)));
    }
  }

  void FailUnavailable() { Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server's main process is gone")); }

  void Step(bool ok) {
    switch (state_) {
      case kRequested:
        if (!ok) {  // the server is shutting down: the call never started, so its end never comes
          delete this;
          return;
        }
        started_ = true;
        Start(service_, queue_, link_, table_, methods_, codec_);  // the next call
        if (methods_->count(context_.method()) == 0) {  // as gRPC answers a method nobody serves
          Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "Method not found!"));
          return;
        }
        state_ = kReading;
        stream_.Read(&request_, &step_tag_);
        return;
      case kReading:
        if (!ok) {  // the client went away (or sent no message) before its request arrived
          Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call ended before its request arrived"));
          return;
        }
        Forward();
        return;
      case kWaiting:
        return;  // no operation is outstanding while the main process works on it
      case kFinishing:
        finished_ = true;
        DeleteIfDone();
        return;
    }
  }

  // The call ended: finished, or cancelled by the client or its deadline. A cancelled call still waiting for its
  // answer is told to the main process, which stops working on it, and finished here.
  void Ended() {
    ended_ = true;
    if (context_.IsCancelled() && id_ != 0 && table_->Take(id_) != nullptr) {
      std::string head;
      Put<uint32_t>(&head, id_);
      link_->Send(kCancel, head);
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    DeleteIfDone();
  }

 private:
  enum State { kRequested, kReading, kWaiting, kFinishing };

  ForwardedCall(grpc::AsyncGenericService* service, grpc::ServerCompletionQueue* queue, Link* link, CallTable* table,
                const std::unordered_set<std::string>* methods, const bertserve::PredictCodec* codec)
      : service_(service), queue_(queue), link_(link), table_(table), methods_(methods), codec_(codec) {}

  void Finish(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mutex_);
    state_ = kFinishing;
    stream_.Finish(status, &step_tag_);
  }

  void Forward() {
    std::vector<grpc::Slice> payload;
    if (!request_.Dump(&payload).ok()) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL, "could not read the request"));
      return;
    }
    const std::string& method = context_.method();
    std::string head;
    state_ = kWaiting;
    id_ = table_->Add(this);
    Put<uint32_t>(&head, id_);
    Put<double>(&head, SecondsLeft());
    // When the request arrived, on the clock Python's time.monotonic() reads (CLOCK_MONOTONIC): the main process
    // refuses calls that waited too long in the link, so a backlog there stays bounded.
    Put<double>(&head, std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
    bool sent;
    if (Decoded(method, payload, &head)) {
      sent = link_->Send(kPredict, head);
    } else {
      Put<uint16_t>(&head, static_cast<uint16_t>(method.size()));
      head.append(method);
      sent = link_->Send(kCall, head, payload);
    }
    if (!sent && table_->Take(id_) != nullptr) FailUnavailable();
  }

  // Appends the PREDICT frame's body to `head` when this is a Predict the codec takes apart.
  bool Decoded(const std::string& method, const std::vector<grpc::Slice>& payload, std::string* head) const {
    if (codec_ == nullptr || method != kPredictMethod) return false;
    if (payload.size() == 1) {
      return codec_->DecodeRequest(reinterpret_cast<const char*>(payload[0].begin()), payload[0].size(), head);
    }
    std::string joined;
    for (const grpc::Slice& slice : payload) joined.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    return codec_->DecodeRequest(joined.data(), joined.size(), head);
  }

  void DeleteIfDone() {
    if (!finished_ || !(ended_ || !started_)) return;
    { std::lock_guard<std::mutex> lock(mutex_); }  // a thread that started the finish has let go of the call
    delete this;
  }

  double SecondsLeft() const {
    auto deadline = context_.deadline();
    if (deadline == std::chrono::system_clock::time_point::max()) return -1.0;
    double seconds = std::chrono::duration<double>(deadline - std::chrono::system_clock::now()).count();
    if (seconds > 1e9) return -1.0;  // "infinite" deadlines come back as a far future, not max()
    return seconds < 0 ? 0.0 : seconds;
  }

  grpc::AsyncGenericService* service_;
  grpc::ServerCompletionQueue* queue_;
  Link* link_;
  CallTable* table_;
  const std::unordered_set<std::string>* methods_;
  const bertserve::PredictCodec* codec_;  // null: every call goes over as bytes
  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_{&context_};
  grpc::ByteBuffer request_, response_;
  Tag step_tag_{Tag::kStep, this}, end_tag_{Tag::kEnd, this};
  std::mutex mutex_;
  State state_ = kRequested;  // the queue's thread's, but for kFinishing, set by whoever finishes
  uint32_t id_ = 0;  // 0: not sent to the main process
  bool started_ = false, finished_ = false, ended_ = false;
};

// Serves the completion queue until it is shut down and drained.
void ServeCalls(grpc::AsyncGenericService* service, grpc::ServerCompletionQueue* queue, Link* link, CallTable* table,
                const std::unordered_set<std::string>* methods, const bertserve::PredictCodec* codec) {
  constexpr int kCallsRequested = 32;  // calls gRPC may start before this thread gets to them
  for (int i = 0; i < kCallsRequested; ++i) ForwardedCall::Start(service, queue, link, table, methods, codec);
  void* tag;
  bool ok;
  while (queue->Next(&tag, &ok)) {
    auto* which = static_cast<Tag*>(tag);
    switch (which->kind) {
      case Tag::kStep:
        static_cast<ForwardedCall*>(which->owner)->Step(ok);
        break;
      case Tag::kEnd:
        static_cast<ForwardedCall*>(which->owner)->Ended();
        break;
    }
  }
}

struct Arguments {
  int link_fd = -1;
  int port = 0;
  std::string unix_socket;
  double drain_grace_seconds = 0;
  std::unordered_set<std::string> methods;
};

bool ParseArguments(int argc, char** argv, Arguments* args) {
  std::map<std::string, std::string> given;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    size_t equals = arg.find('=');
    if (arg.rfind("--", 0) != 0 || equals == std::string::npos) return false;
    given[arg.substr(2, equals - 2)] = arg.substr(equals + 1);
  }
  for (const char* required : {"link_fd", "index", "port", "drain_grace_seconds", "methods"}) {
    if (given.count(required) == 0) return false;
  }
  try {
    args->link_fd = std::stoi(given["link_fd"]);
    g_index = std::stoi(given["index"]);
    args->port = std::stoi(given["port"]);
    args->drain_grace_seconds = std::stod(given["drain_grace_seconds"]);
  } catch (const std::exception&) {
    return false;
  }
  args->unix_socket = given["grpc_socket_path"];
  std::stringstream methods(given["methods"]);
  for (std::string method; std::getline(methods, method, ',');) {
    if (!method.empty()) args->methods.insert(method);
  }
  return args->link_fd >= 0 && !args->methods.empty();
}

// What the reader thread tells the main thread: drain, or the link is gone.
struct Ending {
  std::mutex mutex;
  std::condition_variable changed;
  bool drain = false;
  bool lost = false;
};

void SetHealth(grpc::Server* server, bool serving) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  for (const char* service : kHealthServices) health->SetServingStatus(service, serving);
}

// Reads the main process's frames until the link closes: answers, health, drain.
void ReadFrames(Link* link, CallTable* table, const bertserve::PredictCodec* codec,
                std::atomic<grpc::Server*>* server, std::atomic<int>* health, Ending* ending) {
  std::string response;
  Kind kind;
  std::string body;
  while (link->Receive(&kind, &body)) {
    if (kind == kAnswer && body.size() >= kAnswerHeader) {
      uint32_t id = Get<uint32_t>(body.data());
      uint8_t code = static_cast<uint8_t>(body[4]);
      uint32_t details_size = Get<uint32_t>(body.data() + 5);
      if (kAnswerHeader + details_size > body.size()) continue;  // malformed: the call's deadline ends it
      ForwardedCall* call = table->Take(id);
      if (call == nullptr) continue;  // cancelled meanwhile
      const char* details = body.data() + kAnswerHeader;
      call->Answer(code, std::string(details, details_size), details + details_size,
                   body.size() - kAnswerHeader - details_size);
    } else if (kind == kOutputs && codec != nullptr && body.size() >= sizeof(uint32_t)) {
      ForwardedCall* call = table->Take(Get<uint32_t>(body.data()));
      if (call == nullptr) continue;  // cancelled meanwhile
      response.clear();
      if (codec->EncodeResponse(body.data() + sizeof(uint32_t), body.size() - sizeof(uint32_t), &response)) {
        call->Answer(0, "", response.data(), response.size());
      } else {
        call->Answer(static_cast<uint8_t>(grpc::StatusCode::INTERNAL), "the server sent a malformed Predict answer",
                     nullptr, 0);
      }
    } else if (kind == kHealth && !body.empty()) {
      health->store(body[0] ? 1 : 0);
      grpc::Server* running = server->load();
      if (running != nullptr) SetHealth(running, body[0] != 0);
    } else if (kind == kDrain) {
      std::lock_guard<std::mutex> lock(ending->mutex);
      ending->drain = true;
      ending->changed.notify_all();
    }
  }
  for (ForwardedCall* call : table->TakeAll()) call->FailUnavailable();
  std::lock_guard<std::mutex> lock(ending->mutex);
  ending->lost = true;
  ending->changed.notify_all();
}

// The Predict codec from the descriptor set on standard input; null (calls go over as bytes) when there is none.
std::unique_ptr<bertserve::PredictCodec> ReadCodec() {
  std::string descriptors;
  char buffer[65536];
  while (descriptors.size() <= kMaxDescriptorSet) {
    ssize_t got = ::read(STDIN_FILENO, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    descriptors.append(buffer, static_cast<size_t>(got));
  }
  std::string error;
  std::unique_ptr<bertserve::PredictCodec> codec = bertserve::PredictCodec::Create(descriptors, &error);
  if (codec == nullptr && !descriptors.empty()) {
    Log("WARNING", "Predict requests go to the main process as bytes: " + error);
  }
  return codec;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments args;
  if (!ParseArguments(argc, argv, &args)) {
    std::fprintf(stderr, "usage: %s --link_fd=FD --index=I --port=P [--grpc_socket_path=PATH] "
                 "--drain_grace_seconds=S --methods=/pkg.Service/Method,...\n", argv[0]);
    return kExitBadArguments;
  }
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGPIPE, SIG_IGN);  // a write to a closed link fails with EPIPE instead
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles (a few % of this process's CPU under load).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  std::unique_ptr<bertserve::PredictCodec> codec = ReadCodec();
  Link link(args.link_fd);
  CallTable table;
  Ending ending;
  std::atomic<grpc::Server*> server_for_reader{nullptr};
  std::atomic<int> health{0};  // what the main process last said, applied once the server is up

  grpc::EnableDefaultHealthCheckService(true);
  grpc::AsyncGenericService service;  // every method reaches it; health is gRPC's own, registered before it
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1);
  builder.AddChannelArgument(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, -1);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 1);
  std::vector<std::string> addresses;
  if (args.port) addresses.push_back("0.0.0.0:" + std::to_string(args.port));
  if (!args.unix_socket.empty()) addresses.push_back("unix:" + args.unix_socket);
  std::vector<int> bound(addresses.size(), 0);
  for (size_t i = 0; i < addresses.size(); ++i) {
    builder.AddListeningPort(addresses[i], grpc::InsecureServerCredentials(), &bound[i]);
  }
  builder.RegisterAsyncGenericService(&service);
  std::unique_ptr<grpc::ServerCompletionQueue> queue = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (server == nullptr || bound[i] == 0) {
      Log("ERROR", "front end " + std::to_string(g_index) + ": cannot listen for gRPC on " + addresses[i]);
      std::_Exit(kExitCannotListen);
    }
  }
  std::thread calls(ServeCalls, &service, queue.get(), &link, &table, &args.methods, codec.get());
  std::thread reader(ReadFrames, &link, &table, codec.get(), &server_for_reader, &health, &ending);
  SetHealth(server.get(), health.load() != 0);
  server_for_reader.store(server.get());
  SetHealth(server.get(), health.load() != 0);  // a HEALTH frame may have come in between
  link.Send(kReady, "");
  Log("INFO", "gRPC front end " + std::to_string(g_index) + " listening on port " + std::to_string(args.port) +
                  (args.unix_socket.empty() ? "" : " and " + args.unix_socket));

  std::unique_lock<std::mutex> lock(ending.mutex);
  ending.changed.wait(lock, [&] { return ending.drain || ending.lost; });
  bool drained = ending.drain;
  lock.unlock();
  server->GetHealthCheckService()->Shutdown();  // NOT_SERVING from now on, whatever comes later
  if (drained) {
    auto grace = std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::duration<double>(args.drain_grace_seconds));
    server->Shutdown(std::chrono::system_clock::now() + grace);
    queue->Shutdown();
    calls.join();
    link.Close();
    reader.join();
    return 0;
  }
  Log("ERROR", "front end " + std::to_string(g_index) + ": the main process is gone; exiting");
  server->Shutdown(std::chrono::system_clock::now());
  queue->Shutdown();
  calls.join();
  reader.join();
  return kExitLinkLost;
}
