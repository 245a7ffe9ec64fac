#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/http/http_session.h"

namespace tandem::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;

class StreamHandle final : public ResponseStream {
 public:
  explicit StreamHandle(std::shared_ptr<SessionBase> s) : session_(std::move(s)) {}
  ~StreamHandle() override { session_->Close(); }
  bool Write(std::string data) override { return session_->Write(std::move(data)); }
  void Close() override { session_->Close(); }
  bool cancelled() const override { return session_->cancelled(); }
  void OnCancel(std::function<void()> fn) override { session_->OnCancel(std::move(fn)); }

 private:
  std::shared_ptr<SessionBase> session_;
};

}  // namespace

template <typename Stream>
std::shared_ptr<ResponseStream> Session<Stream>::StartStream(
    int status, const std::string& content_type,
    std::vector<std::pair<std::string, std::string>> headers) {
  net::dispatch(stream_.get_executor(), [self = this->shared_from_this(), status, content_type,
                                         headers = std::move(headers)] {
    self->BeginStream(status, content_type, headers);
  });
  return std::make_shared<StreamHandle>(this->shared_from_this());
}

template <typename Stream>
void Session<Stream>::BeginStream(int status, const std::string& content_type,
                                  const std::vector<std::pair<std::string, std::string>>& headers) {
  awaiting_reply_ = false;
  if (cancelled_.load()) return;  // the client left before its answer began
  streaming_ = true;
  tcp().expires_never();
  stream_header_ =
      std::make_shared<bhttp::response<bhttp::empty_body>>(static_cast<bhttp::status>(status), 11);
  stream_header_->set(bhttp::field::server, "tandem");
  stream_header_->set(bhttp::field::content_type, content_type);
  stream_header_->set(bhttp::field::cache_control, "no-cache");
  for (const auto& [k, v] : headers) stream_header_->set(k, v);
  // HTTP/1.0 has no chunked coding: its stream is the raw bytes, ended by the close.
  stream_header_->chunked(!http10_);
  // One streamed response per connection (WatchForDisconnect reads the socket meanwhile, and the
  // connection closes after the last chunk): say so, or a pooling client would reuse it.
  stream_header_->keep_alive(false);
  serializer_ = std::make_shared<bhttp::response_serializer<bhttp::empty_body>>(*stream_header_);
  writing_ = true;
  bhttp::async_write_header(stream_, *serializer_,
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              self->writing_ = false;
                              if (ec) {
                                self->Cancel();
                                return;
                              }
                              // A read pending since before the answer already watches.
                              if (!self->watching_) self->WatchForDisconnect();
                              self->WriteNext();
                            });
}

template <typename Stream>
void Session<Stream>::WatchForDisconnect() {
  // A streaming client sends nothing; a completed read means it closed (or misbehaves). Over TLS
  // this read runs alongside the chunk writes (one read and one write at a time is allowed).
  stream_.async_read_some(net::buffer(probe_),
                          [self = this->shared_from_this()](beast::error_code ec, size_t) {
                            if (ec && !self->closed_.load()) self->Cancel();
                          });
}

template <typename Stream>
bool Session<Stream>::Write(std::string data) {
  if (cancelled_.load() || closed_.load()) return false;
  net::post(stream_.get_executor(),
            [self = this->shared_from_this(), d = std::move(data)]() mutable {
              if (self->cancelled_.load() || self->closing_) return;
              self->queue_.push_back(std::move(d));
              self->WriteNext();
            });
  return true;
}

template <typename Stream>
void Session<Stream>::Close() {
  if (closed_.exchange(true)) return;
  net::post(stream_.get_executor(), [self = this->shared_from_this()] {
    self->closing_ = true;
    self->WriteNext();
  });
}

template <typename Stream>
void Session<Stream>::WriteNext() {
  if (writing_ || cancelled_.load() || !streaming_) return;
  if (!queue_.empty()) {
    auto data = std::make_shared<std::string>(std::move(queue_.front()));
    queue_.pop_front();
    writing_ = true;
    const auto done = [self = this->shared_from_this(), data](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) {
        self->Cancel();
        return;
      }
      self->WriteNext();
    };
    if (http10_) {
      net::async_write(stream_, net::buffer(*data), done);
    } else {
      net::async_write(stream_, bhttp::make_chunk(net::buffer(*data)), done);
    }
    return;
  }
  if (closing_ && http10_) {
    streaming_ = false;
    Shutdown();  // the close ends an HTTP/1.0 stream's body
  } else if (closing_) {
    streaming_ = false;
    writing_ = true;
    net::async_write(stream_, bhttp::make_chunk_last(),
                     [self = this->shared_from_this()](beast::error_code, size_t) {
                       self->writing_ = false;
                       self->Shutdown();  // one streamed response per connection
                     });
  }
}

template <typename Stream>
void Session<Stream>::Cancel() {
  if (closed_.load() && !streaming_) return;
  if (cancelled_.exchange(true)) return;
  if (std::function<void()> fn = TakeOnCancel()) fn();
  watching_ ? CloseSocket() : Shutdown();  // no close_notify exchange beside a pending read
}

// What http_server.cc (the vtable) and http_session.cc call, for both streams.
template std::shared_ptr<ResponseStream> Session<PlainStream>::StartStream(
    int, const std::string&, std::vector<std::pair<std::string, std::string>>);
template bool Session<PlainStream>::Write(std::string);
template void Session<PlainStream>::Close();
template void Session<PlainStream>::Cancel();
template std::shared_ptr<ResponseStream> Session<TlsStream>::StartStream(
    int, const std::string&, std::vector<std::pair<std::string, std::string>>);
template bool Session<TlsStream>::Write(std::string);
template void Session<TlsStream>::Close();
template void Session<TlsStream>::Cancel();

}  // namespace tandem::http
