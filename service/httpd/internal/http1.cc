// HTTP/1.1 on Boost.Beast's request parser (http::basic_parser, fed the bytes the connection
// reads; no allocation per header: names and values go straight into the Exchange). One request
// at a time: bytes of a pipelined next request wait until the answer is written. Answers are
// written in one piece (head and body), or chunked when the handler streams or sends trailers.
//
// Request framing is refused before any body byte is read and before the handler sees the
// request, and the connection closes after the answer (RFC 9112 6.1, 6.3; request smuggling):
// a Transfer-Encoding that is not exactly one `chunked` (400 when chunked is not the final coding,
// is repeated, or the fields are several; 501 for another coding under a final chunked, since
// chunked is the only one served) - Beast itself refuses Content-Length beside chunked, and
// disagreeing Content-Lengths - and, RFC 9112 3.2, an HTTP/1.1 request without Host or any
// request with two (HTTP/1.0 may omit it). All are counted as protocol_error.
// An answer on a connection that stays open carries `keep-alive: timeout=N` (the idle timeout,
// whole seconds; none under 1 s): pooling clients (undici) retire the connection before we close
// it.
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "service/httpd/internal/engine.h"

namespace offload::httpd::internal {
namespace {

namespace http = boost::beast::http;
using boost::beast::error_code;

constexpr absl::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

// What one Transfer-Encoding field says of the body's framing. Chunked is the only coding we
// implement, and it must be applied once and last (RFC 9112 6.1, 7).
enum class Coding : uint8_t {
  kNone,         // no Transfer-Encoding field
  kChunked,      // exactly one coding: chunked
  kNotFinal,     // chunked is not the final coding (or no coding at all): 400
  kRepeated,     // chunked more than once: 400
  kUnsupported,  // another coding under a final chunked (gzip, chunked): 501
};

// The verdict on a Transfer-Encoding field value: a comma-separated list of codings, optional
// whitespace around each, names without case; empty list elements are ignored (RFC 9110 5.6.1).
Coding JudgeTransferEncoding(absl::string_view value) {
  int codings = 0;
  int chunked = 0;
  bool last_chunked = false;
  for (absl::string_view coding : absl::StrSplit(value, ',')) {
    coding = absl::StripAsciiWhitespace(coding);
    if (coding.empty()) continue;
    ++codings;
    last_chunked = absl::EqualsIgnoreCase(coding, "chunked");
    if (last_chunked) ++chunked;
  }
  if (!last_chunked) return Coding::kNotFinal;
  if (chunked > 1) return Coding::kRepeated;
  return codings == 1 ? Coding::kChunked : Coding::kUnsupported;
}

class Http1;

// Beast's parser, with its callbacks turned into calls on Http1.
class Parser final : public http::basic_parser<true> {
 public:
  explicit Parser(Http1* owner) : owner_(owner) {}

 private:
  void on_request_impl(http::verb, boost::beast::string_view method,
                       boost::beast::string_view target, int version, error_code& ec) override;
  void on_response_impl(int, boost::beast::string_view, int, error_code&) override {}
  void on_field_impl(http::field, boost::beast::string_view name,
                     boost::beast::string_view value, error_code& ec) override;
  void on_header_impl(error_code& ec) override;
  void on_body_init_impl(const boost::optional<std::uint64_t>& length, error_code& ec) override;
  std::size_t on_body_impl(boost::beast::string_view body, error_code& ec) override;
  void on_chunk_header_impl(std::uint64_t, boost::beast::string_view, error_code&) override {}
  std::size_t on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                 error_code& ec) override;
  void on_finish_impl(error_code& ec) override;

  Http1* const owner_;
};

class Http1 final : public Protocol {
 public:
  explicit Http1(Conn* conn)
      : conn_(conn),
        options_(conn->options()),
        keep_alive_seconds_(static_cast<int>(std::clamp<int64_t>(
            absl::ToInt64Seconds(conn->options().idle_timeout), 0, 1 << 30))) {}
  ~Http1() override { Closed(); }

  bool Receive(const char* data, size_t size) override;
  void Collect(WriteBatch* batch) override;
  void Written(size_t bytes) override;
  // Once the answer owed (if any) is written: a request handed over and not yet answered keeps
  // the connection.
  bool WantsClose() const override {
    return abort_ || (close_ && out_.empty() && !pending_interim_ && stream_ == nullptr);
  }
  bool WantsRead() const override {
    // While answering, a few bytes are read (a client that hangs up is seen; a pipelined request
    // waits in `in_`); past that, the socket waits.
    return !close_ && !body_paused_ &&
           static_cast<int64_t>(in_.size()) < options_.max_header_bytes + 65536;
  }
  bool Busy() const override { return stream_ != nullptr; }
  bool AwaitingBody(Clock::time_point* since) const override {
    if (!InBody() || body_paused_) return false;  // a pause is ours, not the client's stall
    *since = body_progress_;
    return true;
  }
  void Tick(Clock::time_point now) override {
    if (InBody() && conn_->draining() && conn_->DrainBodyDeadlinePassed(now)) {
      // The drain's deadline for bodies: refused (UNAVAILABLE in the handler's terms; never
      // run), and the connection closes after the answer.
      conn_->Abuse(AbuseReason::kDrainBodyLate);
      Refused(Exchange::Refusal::kDraining);
      conn_->ReadStateChanged();
      return;
    }
    UpdateBodyPause();
  }
  bool InHeaders() const override {
    return (stream_ == nullptr && !in_.empty()) || (parser_.has_value() && !parser_->is_header_done());
  }
  bool OutputBlocked() const override { return !out_.empty(); }
  void Deliver(Stream* stream, Exchange::Part part) override;
  void Drain() override;
  void Closed() override;
  void PeerClosed() override;
  void Trim() override {
    if (stream_ != nullptr || !out_.empty()) return;
    std::string().swap(head_);
    std::string().swap(body_);
    if (in_.empty()) std::string().swap(in_);
    out_.clear();
    PieceQueue().swap(out_);
  }

  // From the parser's callbacks.
  // False: the request line alone is over the header limit.
  bool OnRequest(absl::string_view method, absl::string_view target, int version);
  bool OnField(absl::string_view name, absl::string_view value);
  // False stops the parser (stop_ says why).
  bool OnHeaderDone();
  bool OnBodyInit(std::optional<uint64_t> length);
  void OnBody(absl::string_view data);
  void OnFinish() { finished_ = true; }

 private:
  // A request body is under way (its headers read, its end not yet).
  bool InBody() const {
    return stream_ != nullptr && parser_.has_value() && parser_->is_header_done() &&
           !stream_->request_done && !stream_->streaming;
  }
  // Past the server's budget, a body under way without a progress grant waits (not read).
  void UpdateBodyPause() {
    const bool pause = InBody() && conn_->ServerOverBudget() && !conn_->MayTakeBody();
    if (pause && !body_paused_) conn_->Abuse(AbuseReason::kReadPaused);
    if (pause != body_paused_) {
      body_paused_ = pause;
      conn_->ReadStateChanged();
    }
  }
  // Parses from `data` (the read buffer, or in_); returns the bytes used. Leaves in_ alone.
  size_t Parse(const char* data, size_t size);
  // Parses what waits in in_.
  void ParseBuffered();
  void Complete();
  // The request goes to the handler at once, refused (`why`, see Exchange::Refusal): its body is
  // never read, and the connection closes after the answer.
  void Refused(Exchange::Refusal why);
  // An answer of the engine's own (400, 431, 503); the connection closes after it.
  // `detail` joins the abuse log line.
  void Refuse(int status, std::string text, AbuseReason reason,
              nlohmann::json detail = nlohmann::json());
  // Whether the request's framing fields (Transfer-Encoding, Host) are ones we serve; if not,
  // sets stop_ and bad_ for Parse to refuse it (see the file comment). REQUIRES: headers whole.
  bool FramingAcceptable();
  void StartAnswer(Stream* s);
  void Finished();
  void Push(std::shared_ptr<const std::string> bytes);
  void Push(Piece piece);
  static std::shared_ptr<const std::string> CrLf() {
    static const auto* crlf = new std::shared_ptr<const std::string>(std::make_shared<std::string>("\r\n"));
    return *crlf;
  }

  Conn* const conn_;
  const Server::Options& options_;
  std::string in_;                   // bytes read and not yet parsed (only what a read left over)
  std::optional<Parser> parser_;     // the request being read
  std::unique_ptr<Stream> stream_;   // the request under way (read or answered)
  enum class Stop { kNone, kRefused, kBadRequest };
  Stop stop_ = Stop::kNone;          // why a callback stopped the parser
  Exchange::Refusal refusal_ = Exchange::Refusal::kNone;  // with Stop::kRefused
  struct BadRequest {
    int status = 400;
    const char* text = "";     // the answer's body
    const char* problem = "";  // the abuse log line's `problem`
  } bad_;                      // with Stop::kBadRequest
  // The request's header fields that decide its framing (FramingAcceptable).
  int request_version_ = 11;   // Beast's: 10 * major + minor
  int transfer_encodings_ = 0;  // Transfer-Encoding fields
  Coding coding_ = Coding::kNone;  // the last one's verdict
  int hosts_ = 0;              // Host fields
  // The `keep-alive: timeout=` hint (Options::idle_timeout, whole seconds); 0: none is sent.
  const int keep_alive_seconds_;
  bool finished_ = false;            // set by the parser, handled after put()
  bool keep_alive_ = true;
  bool close_ = false;               // close once the answer is written
  bool expect_continue_ = false;
  bool pending_interim_ = false;     // 100 Continue to send
  bool chunked_out_ = false;         // the answer is chunked
  bool answer_done_ = false;         // the last part of the answer is queued
  bool draining_ = false;
  bool body_paused_ = false;         // UpdateBodyPause
  bool abort_ = false;               // close now, whatever is owed (the protocol broke)
  Clock::time_point body_progress_;  // request body bytes last arrived
  PieceQueue out_;                   // the answer's bytes, in order
  std::string head_;                 // the answer's status line and headers (reused)
  std::string body_;                 // the answer's own body bytes (reused)
  int64_t out_bytes_ = 0;
  int64_t written_pending_ = 0;      // bytes handed to the batch being written
  int64_t charged_out_ = 0;          // answer bytes charged to the budgets (out_ and the batch)
};

void Parser::on_request_impl(http::verb, boost::beast::string_view method,
                             boost::beast::string_view target, int version, error_code& ec) {
  if (!owner_->OnRequest(absl::string_view(method.data(), method.size()),
                         absl::string_view(target.data(), target.size()), version)) {
    ec = http::error::header_limit;  // the request line alone is over the header limit
  }
}

void Parser::on_field_impl(http::field, boost::beast::string_view name,
                           boost::beast::string_view value, error_code& ec) {
  if (!owner_->OnField(absl::string_view(name.data(), name.size()),
                       absl::string_view(value.data(), value.size()))) {
    ec = http::error::header_limit;
  }
}

void Parser::on_header_impl(error_code& ec) {
  if (!owner_->OnHeaderDone()) ec = http::error::stale_parser;  // Http1::stop_ says why
}

void Parser::on_body_init_impl(const boost::optional<std::uint64_t>& length, error_code& ec) {
  if (!owner_->OnBodyInit(length ? std::optional<uint64_t>(*length) : std::nullopt)) {
    ec = http::error::stale_parser;
  }
}

std::size_t Parser::on_body_impl(boost::beast::string_view body, error_code&) {
  owner_->OnBody(absl::string_view(body.data(), body.size()));
  return body.size();
}

std::size_t Parser::on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                       error_code&) {
  owner_->OnBody(absl::string_view(body.data(), body.size()));
  return body.size();
}

void Parser::on_finish_impl(error_code&) { owner_->OnFinish(); }

// ---------------------------------------------------------------------------------------------

bool Http1::Receive(const char* data, size_t size) {
  if (close_) return true;  // a lingering close: what comes is dropped
  if (in_.empty()) {
    // The usual case, a whole request in one read: parsed where it was read, not copied.
    const size_t used = Parse(data, size);
    if (close_) {
      in_.clear();
    } else if (used < size) {
      in_.assign(data + used, size - used);
    }
    return true;
  }
  in_.append(data, size);
  ParseBuffered();
  return true;
}

void Http1::ParseBuffered() {
  const size_t used = Parse(in_.data(), in_.size());
  if (close_) {
    in_.clear();
  } else {
    in_.erase(0, used);
  }
}

size_t Http1::Parse(const char* data, size_t size) {
  size_t total = 0;
  while (!close_ && total < size) {
    if (stream_ != nullptr && stream_->request_done) {
      // Answering: a pipelined request waits for the answer to be written.
      return total;
    }
    if (!parser_.has_value()) {
      if (conn_->draining() && stream_ == nullptr) {
        close_ = true;  // no new request while draining
        return total;
      }
      parser_.emplace(this);
      parser_->eager(true);
      // Ours is Options::max_body_bytes (OnHeaderDone, OnBody). (Beast 1.74 treats boost::none
      // as a limit of 0 for a Content-Length body, so no limit is the largest one.)
      parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
      // Beast's bound counts the request line and CR LFs too: ours (OnField) is the exact one.
      parser_->header_limit(
          static_cast<uint32_t>(std::min<int64_t>(options_.max_header_bytes * 2 + 4096, 1 << 30)));
    }
    error_code ec;
    const size_t used =
        parser_->put(boost::asio::const_buffer(data + total, size - total), ec);
    total += used;
    if (ec == http::error::need_more) {
      if (used == 0) return total;
      continue;
    }
    if (ec) {
      const Stop stop = stop_;
      stop_ = Stop::kNone;
      if (stop == Stop::kRefused) {
        Refused(refusal_);
      } else if (stop == Stop::kBadRequest) {
        Refuse(bad_.status, bad_.text, AbuseReason::kProtocolError,
               {{"status", bad_.status}, {"problem", bad_.problem}});
      } else if (ec == http::error::header_limit) {
        const int64_t got = stream_ != nullptr ? stream_->header_bytes : 0;
        Refuse(431,
               absl::StrCat("request headers: expected at most ", options_.max_header_bytes,
                            " bytes, got ", got, " or more\n"),
               AbuseReason::kHeaderTooLarge);
      } else {
        Refuse(400, absl::StrCat("bad request: ", ec.message(), "\n"),
               AbuseReason::kProtocolError);
      }
      return total;
    }
    if (finished_) {
      finished_ = false;
      Complete();
    }
    if (used == 0) return total;
  }
  return total;
}

bool Http1::OnRequest(absl::string_view method, absl::string_view target, int version) {
  stream_ = std::make_unique<Stream>();
  stream_->conn = conn_;
  stream_->opened = Clock::now();
  stream_->exchange = std::make_shared<Exchange>(conn_->loop(), conn_->mailbox());
  Exchange& e = Access::Fill(*stream_->exchange, conn_, stream_.get(), version == 10 ? 0x100 : 0x101);
  Access::SetMethod(e, method);
  Access::SetTarget(e, target);
  stream_->head = method == "HEAD";
  stream_->header_bytes = static_cast<int64_t>(method.size() + target.size());
  keep_alive_ = version >= 11;
  expect_continue_ = false;
  request_version_ = version;
  transfer_encodings_ = hosts_ = 0;
  coding_ = Coding::kNone;
  return stream_->header_bytes <= options_.max_header_bytes;
}

bool Http1::OnField(absl::string_view name, absl::string_view value) {
  if (stream_ == nullptr) return false;
  // Trailer fields of a chunked body come after the request was handed over: the exchange's
  // headers are not touched again (workers may be reading them).
  if (stream_->dispatched) return true;
  stream_->header_bytes += static_cast<int64_t>(name.size() + value.size());
  if (stream_->header_bytes > options_.max_header_bytes) return false;
  // A chunked body's trailer (the parser is past the header then) is counted against the header
  // bytes but never becomes a request header: neither framing, keep-alive nor anything the
  // handler reads (an identity header a proxy stripped from the head must not come back in a
  // trailer). HTTP/2 ignores request trailers alike.
  if (parser_->is_header_done()) return true;
  Access::AddHeader(*stream_->exchange, name, value, /*lower_name=*/true);
  if (absl::EqualsIgnoreCase(name, "transfer-encoding")) {
    ++transfer_encodings_;
    coding_ = JudgeTransferEncoding(value);
  } else if (absl::EqualsIgnoreCase(name, "host")) {
    ++hosts_;
  } else if (absl::EqualsIgnoreCase(name, "connection")) {
    for (absl::string_view token : absl::StrSplit(value, ',')) {
      token = absl::StripAsciiWhitespace(token);
      if (absl::EqualsIgnoreCase(token, "close")) keep_alive_ = false;
      if (absl::EqualsIgnoreCase(token, "keep-alive")) keep_alive_ = true;
    }
  } else if (absl::EqualsIgnoreCase(name, "expect") && absl::EqualsIgnoreCase(value, "100-continue")) {
    expect_continue_ = true;
  }
  return true;
}

bool Http1::FramingAcceptable() {
  const auto refuse = [this](int status, const char* text, const char* problem) {
    bad_ = BadRequest{status, text, problem};
    stop_ = Stop::kBadRequest;
    return false;
  };
  if (transfer_encodings_ > 1) {
    return refuse(400, "bad request: more than one Transfer-Encoding field\n",
                  "transfer_encoding_fields");
  }
  if (transfer_encodings_ == 1) {
    switch (coding_) {
      case Coding::kNotFinal:
        return refuse(400, "bad request: the final transfer coding must be chunked\n",
                      "transfer_encoding_not_chunked");
      case Coding::kRepeated:
        return refuse(400, "bad request: chunked more than once\n", "transfer_encoding_repeated");
      case Coding::kUnsupported:
        return refuse(501, "not implemented: chunked is the only transfer coding served\n",
                      "transfer_coding_unsupported");
      case Coding::kChunked:
        // Beast frames the body by its own reading of the field: served only when it reads
        // chunked too, never framed one way here and another way there.
        if (!parser_->chunked()) {
          return refuse(400, "bad request: ambiguous Transfer-Encoding\n",
                        "transfer_encoding_ambiguous");
        }
        break;
      case Coding::kNone:
        break;
    }
  }
  if (hosts_ == 0 && request_version_ >= 11) {
    return refuse(400, "bad request: an HTTP/1.1 request needs a Host field\n", "host_missing");
  }
  if (hosts_ > 1) return refuse(400, "bad request: more than one Host field\n", "host_fields");
  return true;
}

bool Http1::OnHeaderDone() {
  Stream* s = stream_.get();
  if (s == nullptr) return false;
  if (!FramingAcceptable()) return false;  // answered by Parse, before any body byte is read
  // HTTP/1.0 with a Transfer-Encoding: served, and the connection closes after it (RFC 9112 6.1:
  // its framing is treated as faulty).
  if (transfer_encodings_ > 0 && request_version_ < 11) keep_alive_ = false;
  if (const Exchange::Refusal why = conn_->RefuseNewRequest(); why != Exchange::Refusal::kNone) {
    stop_ = Stop::kRefused;  // answered by the handler, in its protocol's terms
    refusal_ = why;
    return false;
  }
  Access::StartReceiving(*s->exchange);
  if (conn_->handler()->Streaming(*s->exchange)) {
    s->streaming = true;
    conn_->Dispatch(s);
  }
  // Decided on the header alone: a client that waits for an answer (or for 100 Continue) before
  // it sends its body gets one.
  const boost::optional<std::uint64_t> length = parser_->content_length();
  if (!s->streaming) {
    s->body_limit = RequestBodyLimit(conn_->handler(), *s, options_.max_body_bytes);
  }
  if (length && *length > static_cast<uint64_t>(s->body_limit) && !s->streaming) {
    conn_->Abuse(AbuseReason::kBodyTooLarge);
    stop_ = Stop::kRefused;  // the body is never read
    refusal_ = Exchange::Refusal::kBodyTooLarge;
    return false;
  }
  // Room for the body at once (charged), no regrowth while it arrives; at most kBodyReserve, so
  // that a length announced and never sent costs little.
  if (length && *length > 0 && !s->streaming) {
    const int64_t room = static_cast<int64_t>(std::min<uint64_t>(*length, kBodyReserve));
    Access::body(*s->exchange).reserve(static_cast<size_t>(room));
    ChargeBody(conn_, s, room, 0);
  }
  body_progress_ = Clock::now();
  if (expect_continue_ && !s->started && ((length && *length > 0) || parser_->chunked())) {
    pending_interim_ = true;
    conn_->WantWrite();
  }
  return true;
}

bool Http1::OnBodyInit(std::optional<uint64_t>) { return stream_ != nullptr; }

void Http1::Refused(Exchange::Refusal why) {
  // Content-Length over the limit, or a budget spent: the handler answers at once, the body is
  // never read, and the connection closes after the answer.
  Stream* s = stream_.get();
  s->refused = true;
  s->request_done = true;
  keep_alive_ = false;
  close_ = true;  // the rest of the input is dropped
  parser_.reset();
  pending_interim_ = false;  // no 100 Continue: the body is not wanted
  ReleaseBodyCharge(conn_, s);
  Access::ReleaseBody(*s->exchange);
  conn_->ReleaseGrant();
  body_paused_ = false;
  Access::SetRefusal(*s->exchange, why);
  conn_->Dispatch(s);
}

void Http1::OnBody(absl::string_view data) {
  Stream* s = stream_.get();
  if (s == nullptr || s->refused) return;
  if (!data.empty()) body_progress_ = Clock::now();
  if (s->streaming) {
    s->body_bytes += static_cast<int64_t>(data.size());
    Access::Read(*s->exchange, data, false);
    return;
  }
  if (s->body_bytes + static_cast<int64_t>(data.size()) > s->body_limit) {
    // A chunked body past the limit: answered now, the connection closes after the answer.
    conn_->Abuse(AbuseReason::kBodyTooLarge);
    ReleaseBodyCharge(conn_, s);
    s->refused = true;
    s->request_done = true;
    keep_alive_ = false;
    close_ = true;
    Access::ReleaseBody(*s->exchange);
    Access::SetRefusal(*s->exchange, Exchange::Refusal::kBodyTooLarge);
    conn_->Dispatch(s);
    conn_->ReleaseGrant();
    return;
  }
  Access::AppendBody(*s->exchange, absl::string_view(data.data(), data.size()));
  ChargeBody(conn_, s, 0, static_cast<int64_t>(data.size()));
  UpdateBodyPause();
}

void Http1::Complete() {
  parser_.reset();
  Stream* s = stream_.get();
  if (s == nullptr || s->request_done) return;
  s->request_done = true;
  pending_interim_ = false;
  conn_->ReleaseGrant();
  if (body_paused_) UpdateBodyPause();
  if (s->streaming) {
    Access::Read(*s->exchange, absl::string_view(), true);
    return;
  }
  std::shared_ptr<Exchange> exchange = s->exchange;
  conn_->Dispatch(s);
  Access::ReleaseBody(*exchange);
  if (stream_.get() == s) ReleaseBodyCharge(conn_, s);
}

void Http1::Refuse(int status, std::string text, AbuseReason reason, nlohmann::json detail) {
  conn_->Abuse(reason, std::move(detail));
  parser_.reset();  // close_ (below): the rest of the input is dropped
  keep_alive_ = false;
  close_ = true;
  conn_->ReleaseGrant();
  if (stream_ != nullptr && stream_->headers_sent) {
    // A streamed answer has begun: no second one inside it; the connection just ends.
    abort_ = true;
    if (stream_->exchange != nullptr) Access::Detach(*stream_->exchange);
    return;
  }
  if (stream_ != nullptr && stream_->exchange != nullptr) Access::Detach(*stream_->exchange);
  if (stream_ != nullptr) conn_->Charge(-stream_->held);
  stream_ = std::make_unique<Stream>();
  stream_->conn = conn_;
  stream_->request_done = true;
  Exchange::Part part;
  part.start = part.end = true;
  part.status = status;
  part.headers = {{"content-type", "text/plain; charset=utf-8"}};
  part.data = std::move(text);
  Deliver(stream_.get(), std::move(part));
}

// ---------------------------------------------------------------------------------------------
// Answers

void Http1::StartAnswer(Stream* s) {
  if (draining_ || conn_->draining()) keep_alive_ = false;
  const bool whole = s->end && (s->trailers.empty() || s->head);  // HEAD: no body, no trailers
  chunked_out_ = !whole && s->exchange != nullptr && s->exchange->http_version() >= 0x101;
  if (!whole && !chunked_out_) keep_alive_ = false;  // HTTP/1.0: the close ends the body
  for (const auto& [name, value] : s->headers) {
    if (name == "connection" && absl::EqualsIgnoreCase(value, "close")) keep_alive_ = false;
  }
  std::string head = std::move(head_);
  head.clear();
  absl::StrAppend(&head, "HTTP/1.1 ", s->status, " ", ReasonPhrase(s->status), "\r\ndate: ",
                  HttpDate(), "\r\nserver: ", options_.server_name, "\r\n");
  if (whole) {
    absl::StrAppend(&head, "content-length: ", s->out_bytes, "\r\n");
  } else if (chunked_out_) {
    head += "transfer-encoding: chunked\r\n";
    if (!s->trailers.empty()) {
      head += "trailer: ";
      for (size_t i = 0; i < s->trailers.size(); ++i) {
        absl::StrAppend(&head, i == 0 ? "" : ", ", s->trailers[i].first);
      }
      head += "\r\n";
    }
  }
  bool has_connection = false;
  for (const auto& [name, value] : s->headers) {
    if (name == "content-length" || name == "transfer-encoding") continue;
    if (name == "connection") has_connection = true;
    absl::StrAppend(&head, name, ": ", value, "\r\n");
  }
  if (!keep_alive_ && !has_connection) head += "connection: close\r\n";
  if (keep_alive_ && s->exchange != nullptr && s->exchange->http_version() == 0x100) {
    head += "connection: keep-alive\r\n";
  }
  // How long the connection may stay idle: clients that pool connections retire it before we
  // close it (undici, Node's fetch, reads this; without it, its own 4 s default races ours). Not
  // when the connection ends after this answer: a request whose body is still arriving may yet
  // close it (Finished). Not under a second either: the hint counts whole seconds, and rounded up
  // it would promise more than we keep.
  if (keep_alive_ && s->request_done && keep_alive_seconds_ > 0) {
    absl::StrAppend(&head, "keep-alive: timeout=", keep_alive_seconds_, "\r\n");
  }
  head += "\r\n";
  head_ = std::move(head);  // kept until written (Finished)
  Push(Piece{head_.data(), head_.size(), nullptr});
  s->headers_sent = true;
  s->headers.clear();
}

void Http1::Push(std::shared_ptr<const std::string> bytes) {
  const absl::string_view v(*bytes);
  Push(Piece{v.data(), v.size(), std::move(bytes)});
}

void Http1::Push(Piece piece) {
  out_bytes_ += static_cast<int64_t>(piece.size);
  charged_out_ += static_cast<int64_t>(piece.size);
  conn_->ChargeAnswer(static_cast<int64_t>(piece.size));
  out_.push_back(std::move(piece));
}

void Http1::Deliver(Stream* s, Exchange::Part part) {
  if (s != stream_.get() || s->done || answer_done_) return;
  if (part.start) {
    s->started = true;
    s->status = part.status;
    s->headers = std::move(part.headers);
    pending_interim_ = false;
  }
  int64_t bytes = 0;
  AppendPieces(part, &s->out, &bytes, &body_);
  s->out_bytes += bytes;
  if (part.end) {
    s->end = true;
    s->trailers = std::move(part.trailers);
  }
  if (!s->started) return;
  if (s->head && !s->end) return;  // HEAD: the head once the length is known, nothing else
  // A whole answer (status, body and end together) has a content-length and goes in one write;
  // a streamed one is chunked.
  if (!s->headers_sent) StartAnswer(s);
  if (!s->head && s->out_bytes > 0) {
    if (chunked_out_) Push(std::make_shared<const std::string>(absl::StrCat(absl::Hex(s->out_bytes), "\r\n")));
    for (Piece& p : s->out) Push(std::move(p));
    if (chunked_out_) Push(CrLf());
  }
  s->out.clear();
  s->out_bytes = 0;
  if (s->end) {
    if (chunked_out_) {
      std::string last = "0\r\n";
      for (const auto& [name, value] : s->trailers) absl::StrAppend(&last, name, ": ", value, "\r\n");
      last += "\r\n";
      Push(std::make_shared<const std::string>(std::move(last)));
    }
    answer_done_ = true;
  }
  if (s->exchange != nullptr) Access::SetUnsent(*s->exchange, out_bytes_);
  conn_->WantWrite();
}

void Http1::Collect(WriteBatch* batch) {
  if (pending_interim_ && (stream_ == nullptr || !stream_->headers_sent)) {
    batch->Copy(kContinue.data(), kContinue.size());
    pending_interim_ = false;
  }
  for (const Piece& p : out_) batch->Ref(p.data, p.size, p.owner, p.secret);
  written_pending_ += out_bytes_;
  out_.clear();
  out_bytes_ = 0;
}

void Http1::Written(size_t) {
  conn_->ChargeAnswer(-written_pending_);
  charged_out_ -= written_pending_;
  written_pending_ = 0;
  if (stream_ == nullptr) return;
  Stream* s = stream_.get();
  if (s->exchange != nullptr) Access::SetUnsent(*s->exchange, out_bytes_);
  if (answer_done_ && out_.empty()) Finished();
}

void Http1::Finished() {
  // The answer is written: the request is over.
  answer_done_ = false;
  chunked_out_ = false;
  head_.clear();
  body_.clear();
  if (stream_ != nullptr) {
    stream_->done = true;
    if (stream_->exchange != nullptr) Access::Detach(*stream_->exchange);
    conn_->Charge(-stream_->held);
  }
  const bool request_read = stream_ == nullptr || stream_->request_done;
  stream_.reset();
  if (!keep_alive_ || !request_read || draining_ || conn_->draining()) {
    close_ = true;
    return;
  }
  keep_alive_ = true;
  // The idle timeout runs from the end of the answer, as the keep-alive hint told the client.
  conn_->set_last_busy(Clock::now());
  ParseBuffered();  // a pipelined request may be waiting
}

void Http1::Drain() {
  draining_ = true;
  if (stream_ == nullptr) close_ = true;  // idle: closed at once
  conn_->ReadStateChanged();
}

void Http1::Closed() {
  conn_->ReleaseGrant();
  if (stream_ != nullptr) {
    if (stream_->exchange != nullptr) Access::Detach(*stream_->exchange);
    conn_->Charge(-stream_->held);
    stream_->held = 0;
    stream_.reset();
  }
  out_.clear();
  out_bytes_ = 0;
  conn_->ChargeAnswer(-charged_out_);
  charged_out_ = written_pending_ = 0;
}

void Http1::PeerClosed() {
  // The client sent FIN: work for its request is not done, an answer already on its way is still
  // written (a half-closed client reads it), and the connection ends after it. A request not yet
  // whole never will be.
  close_ = true;
  if (stream_ == nullptr) return;
  if (stream_->exchange != nullptr) Access::Abandon(*stream_->exchange);
  if (!stream_->dispatched) {
    if (stream_->exchange != nullptr) Access::Detach(*stream_->exchange);
    conn_->Charge(-stream_->held);
    stream_.reset();
    parser_.reset();
  }
}

}  // namespace

std::unique_ptr<Protocol> MakeHttp1(Conn* conn) { return std::make_unique<Http1>(conn); }

}  // namespace offload::httpd::internal
