#include "service/httpd/internal/engine.h"

#include <time.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "service/common/log.h"
#include "service/common/secret_bytes.h"

namespace offload::httpd {

size_t Response::body_size() const {
  size_t n = body.size();
  for (absl::string_view piece : shared_body) n += piece.size();
  return n;
}

size_t Exchange::Part::size() const {
  size_t n = data.size();
  for (absl::string_view piece : shared) n += piece.size();
  return n;
}

const char* AbuseReasonName(AbuseReason reason) {
  switch (reason) {
    case AbuseReason::kPrematureResets: return "premature_resets";
    case AbuseReason::kResetRate: return "reset_rate";
    case AbuseReason::kContinuations: return "continuations";
    case AbuseReason::kControlFlood: return "control_flood";
    case AbuseReason::kSettings: return "settings";
    case AbuseReason::kNoProgress: return "no_progress";
    case AbuseReason::kProtocolError: return "protocol_error";
    case AbuseReason::kHeaderTooLarge: return "header_too_large";
    case AbuseReason::kBodyTooLarge: return "body_too_large";
    case AbuseReason::kStreamRefused: return "stream_refused";
    case AbuseReason::kReadPaused: return "read_paused";
    case AbuseReason::kSendTimeout: return "send_timeout";
    case AbuseReason::kTooManyPings: return "too_many_pings";
    case AbuseReason::kAnswersUnread: return "answers_unread";
    case AbuseReason::kDrainBodyLate: return "drain_body_late";
    case AbuseReason::kCount: break;
  }
  return "unknown";
}

bool Exchange::answers_over_budget() const { return answers_ != nullptr && answers_->Over(); }

void Exchange::SetDeadline(absl::Time deadline) {
  deadline_ns_.store(absl::ToUnixNanos(deadline), std::memory_order_relaxed);
}

std::optional<absl::string_view> Exchange::header(absl::string_view name) const {
  for (const HeaderSpan& h : headers_) {
    if (Piece(h.name) == name) return Piece(h.value);
  }
  return std::nullopt;
}

void Exchange::ForEachHeader(
    const std::function<void(absl::string_view, absl::string_view)>& fn) const {
  for (const HeaderSpan& h : headers_) fn(Piece(h.name), Piece(h.value));
}

void Exchange::ReadBody(std::function<void(absl::string_view, bool)> reader) {
  reader_ = std::move(reader);
}

namespace internal {

// ---------------------------------------------------------------------------------------------
// WriteBatch

void WriteBatch::Copy(const void* data, size_t size, bool secret) {
  if (size == 0) return;
  if (!segments_.empty() && segments_.back().own &&
      segments_.back().offset + segments_.back().size == own_.size()) {
    segments_.back().size += size;  // grows the last copied segment
  } else {
    segments_.push_back(Segment{true, own_.size(), nullptr, size});
  }
  secret_ = secret_ || secret;
  if (secret_) {
    AppendWiping(&own_, static_cast<const char*>(data), size);
  } else {
    own_.append(static_cast<const char*>(data), size);
  }
  size_ += size;
}

void WriteBatch::Ref(const char* data, size_t size, const std::shared_ptr<const void>& owner,
                     bool secret) {
  if (size == 0) return;
  if (size < 512) {  // a small piece costs less copied than as an iovec of its own
    Copy(data, size, secret);
    return;
  }
  segments_.push_back(Segment{false, 0, data, size});
  if (owner != nullptr && (owners_.empty() || owners_.back() != owner)) owners_.push_back(owner);
  size_ += size;
}

const std::vector<iovec>& WriteBatch::Iov() {
  iov_.clear();
  for (size_t i = first_; i < segments_.size() && iov_.size() < 64; ++i) {
    const Segment& s = segments_[i];
    const char* base = s.own ? own_.data() + s.offset : s.data;
    const size_t skip = i == first_ ? first_done_ : 0;
    iov_.push_back(iovec{const_cast<char*>(base + skip), s.size - skip});
  }
  return iov_;
}

void WriteBatch::Consume(size_t n) {
  size_ -= n;
  while (n > 0 && first_ < segments_.size()) {
    const size_t left = segments_[first_].size - first_done_;
    if (n < left) {
      first_done_ += n;
      return;
    }
    n -= left;
    ++first_;
    first_done_ = 0;
  }
}

void WriteBatch::Release() {
  Clear();
  std::string().swap(own_);  // zeroed by Clear if it held a secret
  std::vector<Segment>().swap(segments_);
  std::vector<std::shared_ptr<const void>>().swap(owners_);
  std::vector<iovec>().swap(iov_);
}

void WriteBatch::Clear() {
  if (secret_) {
    WipeString(&own_);
    secret_ = false;
  }
  own_.clear();
  if (own_.capacity() > (256 << 10)) std::string().swap(own_);
  segments_.clear();
  owners_.clear();
  iov_.clear();
  first_ = first_done_ = size_ = 0;
}

// ---------------------------------------------------------------------------------------------
// Conn

Conn::Conn(Loop* loop, Server::Impl* impl)
    : loop_(loop),
      impl_(impl),
      answers_(std::make_shared<AnswerGauge>(impl->options.connection_answer_budget_bytes)) {}

Conn::~Conn() { ReleaseGrant(); }

bool Conn::MayTakeBody() {
  if (grant_ || !ServerOverBudget()) return true;
  int held = impl_->grants.load(std::memory_order_relaxed);
  while (held < kProgressGrants) {
    if (impl_->grants.compare_exchange_weak(held, held + 1, std::memory_order_acq_rel)) {
      grant_ = true;
      return true;
    }
  }
  return false;
}

void Conn::ReleaseGrant() {
  if (!grant_) return;
  grant_ = false;
  impl_->grants.fetch_sub(1, std::memory_order_acq_rel);
}

const Server::Options& Conn::options() const { return impl_->options; }
Counters& Conn::counters() const { return impl_->counters; }
Handler* Conn::handler() const { return impl_->handler; }
bool Conn::draining() const { return impl_->draining.load(std::memory_order_relaxed); }

bool Conn::DrainBodyDeadlinePassed(Clock::time_point now) const {
  const int64_t deadline = impl_->drain_body_deadline.load(std::memory_order_relaxed);
  return deadline != 0 && now.time_since_epoch().count() >= deadline;
}

namespace {

// The server's count follows a connection's total in steps (Conn::kChargeStep).
void Report(std::atomic<int64_t>& buffered, int64_t total, int64_t* reported) {
  const int64_t gap = total - *reported;
  if (gap >= Conn::kChargeStep || gap <= -Conn::kChargeStep || total == 0) {
    if (gap != 0) buffered.fetch_add(gap, std::memory_order_relaxed);
    *reported = total;
  }
}

}  // namespace

void Conn::Charge(int64_t delta) {
  held_ += delta;
  Report(impl_->counters.buffered, held_ + answer_held_, &reported_);
}

void Conn::ChargeAnswer(int64_t delta) {
  if (delta == 0) return;
  answer_held_ += delta;
  answers_->bytes.fetch_add(delta, std::memory_order_relaxed);
  Report(impl_->counters.buffered, held_ + answer_held_, &reported_);
}

Exchange::Refusal Conn::RefuseNewRequest(int64_t own) {
  if (AnswersOverBudget()) {
    Abuse(AbuseReason::kAnswersUnread);
    return Exchange::Refusal::kAnswersUnread;
  }
  const int64_t others = held_ - own + answer_held_;
  const int64_t b = budget();
  if ((b > 0 && held_ - own >= b) || (others > 0 && ServerOverBudget())) {
    Abuse(AbuseReason::kStreamRefused);
    return Exchange::Refusal::kBusy;
  }
  return Exchange::Refusal::kNone;
}

int64_t Conn::budget() const { return impl_->options.connection_budget_bytes; }

bool Conn::OverBudget() const {
  const int64_t b = budget();
  return b > 0 && held_ >= b;
}

bool Conn::ServerOverBudget() const {
  const int64_t b = impl_->options.memory_budget_bytes;
  return b > 0 && impl_->counters.buffered.load(std::memory_order_relaxed) >= b;
}

void Conn::Abuse(AbuseReason reason, nlohmann::json detail) {
  Counters& c = impl_->counters;
  c.Count(reason);
  if (reason == AbuseReason::kHeaderTooLarge) impl_->handler->HeaderTooLarge(*peer_address_);
  const int i = static_cast<int>(reason);
  const int64_t second = static_cast<int64_t>(time(nullptr));
  int64_t last = c.logged_second[i].load(std::memory_order_relaxed);
  if (last == second ||
      !c.logged_second[i].compare_exchange_strong(last, second, std::memory_order_relaxed)) {
    c.unlogged[i].fetch_add(1, std::memory_order_relaxed);
    return;
  }
  nlohmann::json fields = {{"reason", AbuseReasonName(reason)},
                           {"address", impl_->address},
                           {"peer", *peer_address_},
                           {"unlogged_since_last", c.unlogged[i].exchange(0, std::memory_order_relaxed)}};
  if (detail.is_object()) fields.update(detail);
  Log(LogLevel::kWarning, "http_abuse", std::move(fields));
}

int64_t RequestBodyLimit(Handler* handler, const Stream& s, int64_t max_body_bytes) {
  const int64_t limit = handler->BodyLimit(*s.exchange);
  return limit < 0 ? max_body_bytes : std::min(limit, max_body_bytes);
}

void Conn::Dispatch(Stream* stream) {
  stream->dispatched = true;
  last_busy_ = stream->dispatched_at = Clock::now();
  impl_->counters.requests.fetch_add(1, std::memory_order_relaxed);
  impl_->unanswered->fetch_add(1, std::memory_order_acq_rel);
  // The handler may answer at once; the stream stays (its protocol owns it) until closed.
  std::shared_ptr<Exchange> exchange = stream->exchange;
  Access::SetDispatched(*exchange);
  impl_->handler->Handle(exchange);
}

// ---------------------------------------------------------------------------------------------
// Access

Exchange& Access::Fill(Exchange& e, Conn* conn, Stream* stream, int version) {
  e.stream_ = stream;
  e.version_ = version;
  e.tls_ = conn->tls();
  e.peer_address_ = conn->peer_address();
  e.peer_identity_ = conn->identity();
  e.answers_ = conn->answers();
  return e;
}

absl::Time Access::Deadline(const Exchange& e) {
  const int64_t ns = e.deadline_ns_.load(std::memory_order_relaxed);
  return ns == 0 ? absl::InfiniteFuture() : absl::FromUnixNanos(ns);
}

void Access::StartReceiving(Exchange& e) {
  if (!e.receiving_.exchange(true, std::memory_order_acq_rel)) e.mailbox_->Receiving(1);
}

void Access::StopReceiving(Exchange& e) {
  if (e.receiving_.exchange(false, std::memory_order_acq_rel)) e.mailbox_->Receiving(-1);
}

Exchange::Span Access::Append(Exchange& e, absl::string_view s) {
  const size_t at = e.text_.size();
  e.text_.resize(at + s.size());
  if (!s.empty()) std::memcpy(e.text_.data() + at, s.data(), s.size());
  return Exchange::Span{static_cast<uint32_t>(at), static_cast<uint32_t>(s.size())};
}

void Access::SetMethod(Exchange& e, absl::string_view method) { e.method_ = Append(e, method); }

void Access::SetTarget(Exchange& e, absl::string_view target) {
  const size_t q = target.find('?');
  e.path_ = Append(e, target.substr(0, q));
  if (q != absl::string_view::npos) e.query_ = Append(e, target.substr(q + 1));
}

void Access::AddHeader(Exchange& e, absl::string_view name, absl::string_view value,
                       bool lower_name) {
  Exchange::HeaderSpan h;
  h.name = Append(e, name);
  if (lower_name) {
    char* p = e.text_.data() + h.name.offset;
    for (uint32_t i = 0; i < h.name.size; ++i) p[i] = absl::ascii_tolower(p[i]);
  }
  h.value = Append(e, value);
  e.headers_.push_back(h);
}

void Access::ReleaseBody(Exchange& e) {
  // Handed over, the handler has said whether the body is secret (Exchange::MarkSecret); one
  // dropped before (refused: rare) is zeroed whatever it is.
  if (e.secret_ || !e.dispatched_.load(std::memory_order_acquire)) WipeString(&e.body_);
  std::string().swap(e.body_);
}

void Access::AppendBody(Exchange& e, absl::string_view data) {
  AppendWiping(&e.body_, data.data(), data.size());
}

void Access::Read(Exchange& e, absl::string_view data, bool end) {
  if (e.reader_ == nullptr) return;
  e.reader_(data, end);
  if (end) e.reader_ = nullptr;
}

void Access::Detach(Exchange& e) {
  StopReceiving(e);
  e.stream_ = nullptr;
  e.abandoned_.store(true, std::memory_order_release);
  e.unsent_.store(0, std::memory_order_relaxed);
  if (e.reader_ != nullptr) {
    auto reader = std::move(e.reader_);
    e.reader_ = nullptr;
    reader(absl::string_view(), true);
  }
}

void Access::Deliver(Exchange& e, Exchange::Part part) {
  // The bytes Exchange::Send counted in transit are the loop's now: charged by the protocol
  // (Conn::ChargeAnswer), or dropped.
  if (e.answers_ != nullptr) {
    e.answers_->bytes.fetch_sub(static_cast<int64_t>(part.size()), std::memory_order_relaxed);
  }
  Stream* stream = e.stream_;
  if (stream == nullptr) return;  // the request is over
  stream->conn->protocol()->Deliver(stream, std::move(part));
}

void ChargeBody(Conn* conn, Stream* s, int64_t reserved, int64_t received) {
  s->body_reserved = std::max(s->body_reserved, reserved);
  s->body_bytes += received;
  const int64_t need = std::max(s->body_reserved, s->body_bytes);
  if (need > s->body_charge) {
    s->held += need - s->body_charge;
    conn->Charge(need - s->body_charge);
    s->body_charge = need;
  }
}

void ReleaseBodyCharge(Conn* conn, Stream* s) {
  s->held -= s->body_charge;
  conn->Charge(-s->body_charge);
  s->body_charge = 0;
  s->body_reserved = 0;
}

void AppendPieces(Exchange::Part& part, PieceQueue* out, int64_t* bytes, std::string* keep) {
  // A secret body is never kept in the protocol's reused buffer: it goes in a buffer of its own,
  // zeroed when the last write that references it is done.
  if (!part.data.empty() && keep != nullptr && keep->empty() && !part.secret) {
    *keep = std::move(part.data);
    *bytes += static_cast<int64_t>(keep->size());
    out->push_back(Piece{keep->data(), keep->size(), nullptr});
  } else if (!part.data.empty()) {
    std::shared_ptr<std::string> owned =
        part.secret ? std::shared_ptr<std::string>(new std::string(std::move(part.data)),
                                                   WipingDelete())
                    : std::make_shared<std::string>(std::move(part.data));
    *bytes += static_cast<int64_t>(owned->size());
    out->push_back(Piece{owned->data(), owned->size(), owned, part.secret});
  }
  for (absl::string_view piece : part.shared) {
    if (piece.empty()) continue;
    *bytes += static_cast<int64_t>(piece.size());
    out->push_back(Piece{piece.data(), piece.size(), part.owner, part.secret});
  }
}

absl::string_view HttpDate() {
  thread_local time_t cached_second = 0;
  thread_local char cached[40];
  thread_local size_t cached_size = 0;
  const time_t now = time(nullptr);
  if (now != cached_second) {
    tm t{};
    gmtime_r(&now, &t);
    cached_size = strftime(cached, sizeof(cached), "%a, %d %b %Y %H:%M:%S GMT", &t);
    cached_second = now;
  }
  return absl::string_view(cached, cached_size);
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 412: return "Precondition Failed";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
}

}  // namespace internal
}  // namespace offload::httpd
