// HTTP/2 on libnghttp2: one nghttp2_session per connection, fed with the bytes the connection
// reads (nghttp2_session_mem_recv) and drained into the connection's write batch
// (nghttp2_session_send, with response bodies referenced, not copied: NGHTTP2_DATA_FLAG_NO_COPY).
//
// Defences beyond nghttp2's own limits (set in Options::Http2): premature resets counted per
// connection (Envoy's rule), frames without progress drained from a token bucket (nghttp2 1.67's
// "glitch" limiter, which Debian's 1.52 lacks), and the memory budget: a new stream is refused
// while the connection or the server is over budget, and body bytes are taken (their window given
// back, nghttp2_session_consume) only while there is room. Complete requests are handed to the
// handler once the read that brought them is parsed, unless that read also ended their stream.
#include <malloc.h>
#include <nghttp2/nghttp2.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "service/common/log.h"
#include "service/httpd/internal/engine.h"
#include "service/httpd/internal/idle_reset_filter.h"

namespace offload::httpd::internal {
namespace {

constexpr size_t kMaxBatchBytes = 256 << 10;   // one write's worth, then the next
constexpr uint32_t kTinyWindowUpdate = 1024;   // smaller increments count as no progress...
constexpr int kMaxWindowCredit = 64;            // ...unless they give back our DATA's bytes,
constexpr int kFreeTinyUpdatesPerStream = 2;    // ...or come on a stream with a request open,
                                                // or announce the window of a new request
// A client's reset that comes this long or more after its request was handed to the handler, or
// in the last quarter of the time the request's deadline gave (or after it), is a client giving
// up on an answer it waited for (its deadline, a user's cancel: under overload many calls end
// so), not an abuse: it counts neither as a premature reset nor against the reset rate. Rapid
// Reset sends its resets with its requests. (Other resets take a credit earned by each stream
// that ended well - answered, or reset after a patient wait - and, with none left, drain the
// reset bucket.)
constexpr auto kPatientReset = std::chrono::milliseconds(100);
// Resets of streams we had closed with their answer, banked free (one per such stream): at least
// this many, or the connection's stream limit.
constexpr int kMaxLateResetCredit = 64;

// Whether the client's reset of `s`, now, is patient (kPatientReset).
bool PatientReset(const Stream& s) {
  if (!s.dispatched) return false;
  const Clock::time_point now = Clock::now();
  if (now - s.dispatched_at >= kPatientReset) return true;
  if (s.exchange == nullptr) return false;
  const absl::Time deadline = Access::Deadline(*s.exchange);
  if (deadline == absl::InfiniteFuture()) return false;
  // The deadline as a point on the steady clock, from the time left when it was handed over.
  const absl::Duration given = deadline - absl::Now() + absl::FromChrono(now - s.dispatched_at);
  return now - s.dispatched_at >= absl::ToChronoNanoseconds(given * 3 / 4);
}

// nghttp2's memory: the heap, except for blocks of two pages or more (its 16 KiB outbound frame
// buffer), which get mappings of their own, listed per session, so that an idle session can give
// their pages back (Http2::Trim): the frame buffer holds nothing between writes.
struct SessionMemory {
  static constexpr size_t kMapFrom = 8192;
  std::vector<std::pair<void*, size_t>> mapped;

  size_t* Find(void* p) {
    for (auto& [q, size] : mapped) {
      if (q == p) return &size;
    }
    return nullptr;
  }
  static void* Alloc(size_t size, void* self_ptr) {
    if (size < kMapFrom) return malloc(size);
    void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    static_cast<SessionMemory*>(self_ptr)->mapped.emplace_back(m, size);
    return m;
  }
  static void Free(void* p, void* self_ptr) {
    if (p == nullptr) return;
    auto* self = static_cast<SessionMemory*>(self_ptr);
    for (auto it = self->mapped.begin(); it != self->mapped.end(); ++it) {
      if (it->first == p) {
        munmap(p, it->second);
        self->mapped.erase(it);
        return;
      }
    }
    free(p);
  }
  static void* Calloc(size_t n, size_t size, void* self_ptr) {
    if (size != 0 && n > SIZE_MAX / size) return nullptr;
    if (n * size < kMapFrom) return calloc(n, size);
    return Alloc(n * size, self_ptr);  // mappings come zeroed
  }
  static void* Realloc(void* p, size_t size, void* self_ptr) {
    if (p == nullptr) return Alloc(size, self_ptr);
    auto* self = static_cast<SessionMemory*>(self_ptr);
    const size_t* mapped_size = self->Find(p);
    if (mapped_size == nullptr && size < kMapFrom) return realloc(p, size);
    const size_t old = mapped_size != nullptr ? *mapped_size : malloc_usable_size(p);
    void* q = Alloc(size, self_ptr);
    if (q == nullptr) return nullptr;
    std::memcpy(q, p, std::min(old, size));
    Free(p, self_ptr);
    return q;
  }
  // Pages of the mapped blocks back to the kernel (they come back zeroed when next touched).
  void ReleasePages() {
    for (auto& [p, size] : mapped) madvise(p, size, MADV_DONTNEED);
  }
};

// The frames that drain the no-progress bucket, by kind: counted per connection, and named in
// the log line of a no_progress verdict (what emptied the bucket).
enum class NoProgressKind : int {
  kEmptyData = 0,           // DATA without a byte or END_STREAM
  kPriority,                // PRIORITY
  kSettings,                // a SETTINGS frame after the first
  kPing,                    // a PING with nothing sent since the previous one
  kWindowUpdateConnection,  // a WINDOW_UPDATE under 1 KiB on the connection (stream 0)
  kWindowUpdateStream,      // ...on a stream of ours, beyond the free ones
  kWindowUpdateUnknown,     // ...on a stream we do not hold (refused, closed)
  kInvalid,                 // a frame nghttp2 found invalid (a stream error)
  kCount
};

const char* NoProgressKindName(NoProgressKind kind) {
  switch (kind) {
    case NoProgressKind::kEmptyData: return "empty_data";
    case NoProgressKind::kPriority: return "priority";
    case NoProgressKind::kSettings: return "settings";
    case NoProgressKind::kPing: return "ping";
    case NoProgressKind::kWindowUpdateConnection: return "window_update_connection";
    case NoProgressKind::kWindowUpdateStream: return "window_update_stream";
    case NoProgressKind::kWindowUpdateUnknown: return "window_update_unknown_stream";
    case NoProgressKind::kInvalid: return "invalid";
    case NoProgressKind::kCount: break;
  }
  return "unknown";
}

// A frame type's name as RFC 9113 section 6 spells it, for log lines.
const char* FrameTypeName(uint8_t type) {
  switch (type) {
    case NGHTTP2_DATA: return "DATA";
    case NGHTTP2_HEADERS: return "HEADERS";
    case NGHTTP2_PRIORITY: return "PRIORITY";
    case NGHTTP2_RST_STREAM: return "RST_STREAM";
    case NGHTTP2_SETTINGS: return "SETTINGS";
    case NGHTTP2_PUSH_PROMISE: return "PUSH_PROMISE";
    case NGHTTP2_PING: return "PING";
    case NGHTTP2_GOAWAY: return "GOAWAY";
    case NGHTTP2_WINDOW_UPDATE: return "WINDOW_UPDATE";
    case NGHTTP2_CONTINUATION: return "CONTINUATION";
    default: return "other";
  }
}

// The reason counted for a GOAWAY that nghttp2 submitted by itself (not one of ours). A SETTINGS
// frame with more entries than nghttp2_option_set_max_settings allows is one: nghttp2 1.52
// returns no error for it from nghttp2_session_mem_recv and calls no invalid-frame callback; it
// sends GOAWAY ENHANCE_YOUR_CALM with this debug text (nghttp2_session.c), and that GOAWAY is the
// only sign of it. Its reset rate limit (out of reach, since the reset bucket is ours) would be
// reset_rate; anything else is a protocol error.
AbuseReason NghttpGoawayReason(const nghttp2_goaway& goaway, uint8_t last_recv_type) {
  constexpr absl::string_view kTooManySettings = "SETTINGS: too many setting entries";
  const absl::string_view debug(reinterpret_cast<const char*>(goaway.opaque_data),
                                goaway.opaque_data_len);
  if (goaway.error_code == NGHTTP2_ENHANCE_YOUR_CALM && debug == kTooManySettings) {
    return AbuseReason::kSettings;
  }
  if (last_recv_type == NGHTTP2_RST_STREAM) return AbuseReason::kResetRate;
  return AbuseReason::kProtocolError;
}

// At most 128 bytes of `data` with anything but printable ASCII as '?', for a log line.
std::string PrintableText(const uint8_t* data, size_t size) {
  std::string out(reinterpret_cast<const char*>(data), std::min<size_t>(size, 128));
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

nghttp2_nv Nv(absl::string_view name, absl::string_view value) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                    value.size(), NGHTTP2_NV_FLAG_NONE};
}

class Http2 final : public Protocol {
 public:
  explicit Http2(Conn* conn);
  ~Http2() override;

  bool Receive(const char* data, size_t size) override;
  void Collect(WriteBatch* batch) override;
  void Written(size_t bytes) override;
  bool WantsClose() const override;
  bool WantsRead() const override { return !closing_ && !read_paused_; }
  bool Busy() const override { return !streams_.empty(); }
  bool AwaitingBody(Clock::time_point* since) const override;
  bool OutputBlocked() const override;
  void Deliver(Stream* stream, Exchange::Part part) override;
  void Drain() override;
  void Tick(Clock::time_point now) override;
  void Closed() override;
  void Trim() override;
  void PeerClosed() override {
    // An HTTP/2 client that closes has nothing left to read: nothing more is sent.
    fatal_ = closing_ = true;
    for (auto& [id, s] : streams_) {
      if (s->exchange != nullptr) Access::Detach(*s->exchange);
    }
  }

 private:
  // nghttp2 callbacks.
  static int OnBeginHeaders(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static int OnHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags,
                      void* self);
  static int OnFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static int OnDataChunk(nghttp2_session*, uint8_t flags, int32_t stream_id, const uint8_t* data,
                         size_t len, void* self);
  static int OnStreamClose(nghttp2_session*, int32_t stream_id, uint32_t error_code, void* self);
  static int OnInvalidFrame(nghttp2_session*, const nghttp2_frame* frame, int error, void* self);
  static int OnFrameSend(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static ssize_t OnSend(nghttp2_session*, const uint8_t* data, size_t length, int flags,
                        void* self);
  static int OnSendData(nghttp2_session*, nghttp2_frame* frame, const uint8_t* framehd,
                        size_t length, nghttp2_data_source* source, void* self);
  static ssize_t ReadData(nghttp2_session*, int32_t stream_id, uint8_t* buf, size_t length,
                          uint32_t* data_flags, nghttp2_data_source* source, void* self);

  // The stream `id`, or null. The last one found is remembered: nghttp2 calls back for one
  // stream several times in a row (begin, each header, end of headers, data).
  Stream* Find(int32_t id) {
    if (last_ != nullptr && last_->id == id) return last_;
    auto it = streams_.find(id);
    last_ = it == streams_.end() ? nullptr : it->second.get();
    return last_;
  }
  void HeadersDone(Stream* s);
  void RequestDone(Stream* s);
  // A complete request to the handler (refused if the connection's answers are past their
  // budget); the body's bytes and charge go.
  void HandOver(Stream* s);
  // The requests of the read just parsed that are still wanted (complete_), in order.
  void HandOverComplete();
  // The request goes to the handler at once, refused (`why`): the rest of its body is dropped.
  void Refuse(Stream* s, Exchange::Refusal why);
  void SubmitHeaders(Stream* s);
  void SubmitTrailers(Stream* s);
  // Gives back the window of `s`'s held-back body bytes while the budgets allow. `oldest`:
  // Oldest() when the caller has it (null: looked up when needed).
  void TakeBody(Stream* s, Stream* oldest = nullptr);
  // Past the connection's budget (its other streams' bytes) or the server's: only the oldest
  // request under way may take its body.
  bool OldestOnly(const Stream& s) const;
  void TakeHeldBack();
  // Gives back the window of `s`'s held-back body bytes.
  void TakeStreamWindow(Stream* s);
  // The incomplete request of this connection opened first (not refused, not streaming), or
  // null: the one that takes its body past a budget.
  Stream* Oldest() const;
  // A request body is still arriving on some stream.
  bool BodyUnderWay() const;
  void MaybeReleaseGrant();
  void ChargeBody(Stream* s, int64_t reserved, int64_t received) {
    internal::ChargeBody(conn_, s, reserved, received);
  }
  void ReleaseBodyCharge(Stream* s) { internal::ReleaseBodyCharge(conn_, s); }
  // A frame that makes no progress; an empty bucket ends the connection.
  void NoProgress(NoProgressKind kind);
  // A client reset that was not patient (kPatientReset): the reset bucket
  // (Options::Http2::reset_burst, reset_rate); an empty one ends the connection.
  void CountReset();
  // GOAWAY with `code` for `reason`, and the connection ends once it is written.
  void Abuse(AbuseReason reason, uint32_t code, absl::string_view debug = {},
             nlohmann::json detail = nlohmann::json());
  // A keep-alive PING from the client: gRPC's ping policy (Options::Http2::max_ping_strikes).
  void ClientPing();
  // The drain's last GOAWAY (the last stream id we took), once.
  void FinalGoaway();
  void UpdateReadPause();
  // Body bytes of `s` whose window is held back: `v`; holding_ follows.
  void SetUnconsumed(Stream* s, int32_t v) {
    if ((s->unconsumed > 0) != (v > 0)) holding_ += v > 0 ? 1 : -1;
    s->unconsumed = v;
  }
  // A closed stream goes back to spare_, emptied (its buffers' capacity kept).
  void Recycle(std::unique_ptr<Stream> s) {
    if (spare_.size() >= 16) return;
    PieceQueue out = std::move(s->out);
    Headers headers = std::move(s->headers);
    std::string keep = std::move(s->keep);
    out.clear();
    headers.clear();
    keep.clear();
    *s = Stream();
    s->out = std::move(out);
    s->headers = std::move(headers);
    s->keep = std::move(keep);
    spare_.push_back(std::move(s));
  }

  Conn* const conn_;
  const Server::Options& options_;
  SessionMemory memory_;  // before session_: nghttp2 frees through it in the destructor
  nghttp2_session* session_ = nullptr;
  absl::flat_hash_map<int32_t, std::unique_ptr<Stream>> streams_;
  Stream* last_ = nullptr;                       // Find's memory; cleared when it closes
  std::vector<std::unique_ptr<Stream>> spare_;   // closed streams to reuse (at most 16)
  WriteBatch* batch_ = nullptr;  // during Collect
  bool in_receive_ = false;      // nghttp2 is parsing a read (Receive)
  std::vector<int32_t> complete_;  // requests of that read whose hand-over waits for its end
  int64_t batch_body_ = 0;       // body bytes in the batch being written (charged until then)
  bool closing_ = false;         // GOAWAY for abuse or a fatal error: end once written
  bool fatal_ = false;           // nothing more may be sent
  bool our_goaway_ = false;      // the next GOAWAY sent is ours
  bool read_paused_ = false;
  int holding_ = 0;  // streams with body bytes whose window is held back (unconsumed > 0)
  Clock::time_point body_progress_ = Clock::now();  // request body bytes last arrived
  // Drain: the first GOAWAY (last stream id 2^31-1) and a PING are out; the second GOAWAY goes
  // when the PING comes back or a second has passed.
  bool drain_noticed_ = false;
  bool drain_final_ = false;
  Clock::time_point drain_at_;
  // Premature resets (Envoy's rule).
  uint64_t closed_streams_ = 0;
  uint64_t premature_ = 0;
  // Reset token bucket.
  double reset_tokens_;
  Clock::time_point reset_refilled_;
  uint64_t patient_resets_ = 0;  // client resets after a patient wait (not counted)
  uint64_t premature_by_us_ = 0;  // premature_ streams that we reset (a client's error)
  uint64_t reset_credit_ = 0;    // hasty resets earned by streams that ended well
  // Resets of: an unknown stream, one not dispatched, one dispatched, one never opened.
  std::array<uint64_t, 4> impatient_{};
  IdleResetFilter idle_resets_;  // what Receive passes to nghttp2
  // Streams closed with our whole answer and not reset by the client: a reset that comes for one
  // later (it raced the answer) is free, up to this many banked (kMaxLateResetCredit).
  int late_reset_credit_ = 0;
  // No-progress token bucket, and the frames that drained it by kind (for the verdict's log).
  double tokens_;
  std::array<uint32_t, static_cast<int>(NoProgressKind::kCount)> no_progress_{};
  Clock::time_point refilled_;
  bool sent_since_ping_ = true;  // HEADERS or DATA sent since the last PING
  // Small WINDOW_UPDATEs that answer our DATA frames (two each: stream and connection), banked
  // up to kMaxWindowCredit; and small connection WINDOW_UPDATEs that follow a new request (one
  // each: gRPC's C core grows the connection's window by the 5 bytes it announces on each new
  // call's stream, so each call sends a 5-byte connection WINDOW_UPDATE too, also when its
  // answer is a refusal without DATA), banked the same way.
  int window_credit_ = 0;
  int call_credit_ = 0;
  uint64_t data_frames_sent_ = 0;
  // gRPC's ping policy: when the last PING came, and strikes since we last sent.
  Clock::time_point last_ping_;
  int ping_strikes_ = 0;
  int settings_frames_ = 0;
  uint8_t last_recv_type_ = 0;
};

Http2::Http2(Conn* conn)
    : conn_(conn),
      options_(conn->options()),
      reset_tokens_(static_cast<double>(std::max<uint64_t>(1, options_.http2.reset_burst))),
      reset_refilled_(Clock::now()),
      tokens_(std::max(1, options_.http2.no_progress_burst)),
      refilled_(Clock::now()) {
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cb, &Http2::OnBeginHeaders);
  nghttp2_session_callbacks_set_on_header_callback(cb, &Http2::OnHeader);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, &Http2::OnFrameRecv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, &Http2::OnDataChunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, &Http2::OnStreamClose);
  nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(cb, &Http2::OnInvalidFrame);
  nghttp2_session_callbacks_set_on_frame_send_callback(cb, &Http2::OnFrameSend);
  nghttp2_session_callbacks_set_send_callback(cb, &Http2::OnSend);
  nghttp2_session_callbacks_set_send_data_callback(cb, &Http2::OnSendData);

  const Server::Options::Http2& h2 = options_.http2;
  nghttp2_option* opt = nullptr;
  nghttp2_option_new(&opt);
  nghttp2_option_set_no_auto_window_update(opt, 1);  // the budget decides (TakeBody)
  nghttp2_option_set_no_closed_streams(opt, 1);      // no priority tree of closed streams
  nghttp2_option_set_max_outbound_ack(opt, h2.max_outbound_ack);
  nghttp2_option_set_max_settings(opt, h2.max_settings);
  // The reset rate is ours (OnFrameRecv: resets after a patient wait are free); nghttp2's own
  // bucket, which takes every reset, is set out of reach.
  nghttp2_option_set_stream_reset_rate_limit(opt, UINT64_MAX / 2, UINT64_MAX / 2);
  nghttp2_option_set_max_continuations(opt, h2.max_continuations);
  nghttp2_mem mem{&memory_, &SessionMemory::Alloc, &SessionMemory::Free, &SessionMemory::Calloc,
                  &SessionMemory::Realloc};
  const int created = nghttp2_session_server_new3(&session_, cb, this, opt, &mem);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cb);
  if (created != 0) {
    session_ = nullptr;  // out of memory: the connection ends at once (fatal_)
    fatal_ = closing_ = true;
    return;
  }

  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS,
       static_cast<uint32_t>(std::max(1, h2.max_concurrent_streams))},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(h2.stream_window_bytes)},
      // RFC 9113 counts 32 bytes per field on top of names and values.
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
       static_cast<uint32_t>(std::min<int64_t>(options_.max_header_bytes + 32 * 64, 1 << 30))},
      {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
  };
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings,
                          sizeof(settings) / sizeof(settings[0]));
  nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0,
                                        h2.connection_window_bytes);
}

Http2::~Http2() {
  Closed();
  if (session_ != nullptr) nghttp2_session_del(session_);
}

void Http2::Closed() {
  for (auto& [id, s] : streams_) {
    if (s->exchange != nullptr) Access::Detach(*s->exchange);
    conn_->Charge(-s->held);
    conn_->ChargeAnswer(-s->answer_held);
    s->held = s->answer_held = 0;
  }
  streams_.clear();
  last_ = nullptr;
  spare_.clear();
  conn_->ChargeAnswer(-batch_body_);
  batch_body_ = 0;
  conn_->ReleaseGrant();
}

bool Http2::Receive(const char* data, size_t size) {
  if (closing_ || fatal_) return false;
  in_receive_ = true;
  ssize_t rv = 0;
  idle_resets_.Filter(
      reinterpret_cast<const uint8_t*>(data), size,
      [&](const uint8_t* part, size_t n) {
        rv = nghttp2_session_mem_recv(session_, part, n);
        return rv >= 0;
      },
      [&](int32_t) {
        // A reset of a call the client never sent (see IdleResetFilter): a client reset.
        ++impatient_[3];
        CountReset();
      });
  in_receive_ = false;
  if (rv >= 0) HandOverComplete();
  complete_.clear();
  if (rv < 0) {
    AbuseReason reason = AbuseReason::kProtocolError;
    if (rv == NGHTTP2_ERR_FLOODED) reason = AbuseReason::kControlFlood;
    if (rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS) reason = AbuseReason::kContinuations;
    // (Too many SETTINGS entries is not an error nghttp2 1.52 returns here: it sends its own
    // GOAWAY, counted in OnFrameSend.)
    conn_->Abuse(reason, {{"nghttp2_error", nghttp2_strerror(static_cast<int>(rv))},
                          {"last_frame", FrameTypeName(last_recv_type_)}});
    // A flood or a bad preface: nothing more is sent (nghttp2 may not be used again).
    fatal_ = closing_ = true;
    return false;
  }
  UpdateReadPause();
  return !closing_;
}

void Http2::Collect(WriteBatch* batch) {
  if (fatal_) return;
  batch_ = batch;
  const int rv = nghttp2_session_send(session_);
  batch_ = nullptr;
  if (rv != 0) {
    conn_->Abuse(AbuseReason::kProtocolError);
    fatal_ = closing_ = true;
  }
}

void Http2::Written(size_t) {
  conn_->ChargeAnswer(-batch_body_);
  batch_body_ = 0;
  TakeHeldBack();
}

bool Http2::WantsClose() const {
  if (fatal_) return true;
  if (closing_) return !nghttp2_session_want_write(session_);
  if (drain_final_ && streams_.empty()) return !nghttp2_session_want_write(session_);
  return !nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_);
}

bool Http2::AwaitingBody(Clock::time_point* since) const {
  // Not while we pause it, nor while we hold back the bytes of the request allowed to take
  // its body past a budget (its oldest under way): that stall is ours.
  if (read_paused_ || !BodyUnderWay()) return false;
  if (holding_ > 0) {
    // Other streams' bytes held back while that oldest request's window is open: the client
    // owes that one its body (bytes trickled on the others do not count as its progress).
    const Stream* oldest = Oldest();
    if (oldest == nullptr || oldest->unconsumed > 0) return false;
    *since = oldest->body_at;
    return true;
  }
  *since = body_progress_;
  return true;
}

bool Http2::OutputBlocked() const {
  for (const auto& [id, s] : streams_) {
    if (!s->out.empty() || (s->started && !s->headers_sent)) return true;
  }
  return batch_body_ > 0;
}

// ---------------------------------------------------------------------------------------------
// Requests

int Http2::OnBeginHeaders(nghttp2_session* session, const nghttp2_frame* frame, void* self_ptr) {
  auto* self = static_cast<Http2*>(self_ptr);
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  self->call_credit_ = std::min(self->call_credit_ + 1, kMaxWindowCredit);
  const int32_t id = frame->hd.stream_id;
  Conn* conn = self->conn_;
  if (self->closing_ || conn->impl()->stopping.load(std::memory_order_acquire)) {
    // After our GOAWAY for abuse, or once Stop has stopped waiting for requests: what the rest
    // of the read holds opens nothing (REFUSED_STREAM: the client may safely retry elsewhere).
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, id, NGHTTP2_REFUSED_STREAM);
    return 0;
  }
  std::unique_ptr<Stream> stream;
  if (self->spare_.empty()) {
    stream = std::make_unique<Stream>();
  } else {
    stream = std::move(self->spare_.back());
    self->spare_.pop_back();
  }
  Stream* s = stream.get();
  s->conn = conn;
  s->id = id;
  s->opened = s->body_at = Clock::now();
  s->exchange = std::make_shared<Exchange>(conn->loop(), conn->mailbox());
  Access::Fill(*s->exchange, conn, s, 0x200);
  self->streams_.emplace(id, std::move(stream));
  const int limit = std::max(1, self->options_.http2.max_concurrent_streams);
  s->opened_at_limit = self->streams_.size() >= static_cast<size_t>(limit);
  self->last_ = s;
  self->body_progress_ = s->opened;
  return 0;
}

int Http2::OnHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                    size_t namelen, const uint8_t* value, size_t valuelen, uint8_t,
                    void* self_ptr) {
  auto* self = static_cast<Http2*>(self_ptr);
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) {
    return 0;  // request trailers: not used
  }
  Stream* s = self->Find(frame->hd.stream_id);
  if (s == nullptr || s->header_too_large) return 0;
  const int64_t bytes = static_cast<int64_t>(namelen + valuelen);
  s->header_bytes += bytes;
  if (s->header_bytes > self->options_.max_header_bytes) {
    s->header_too_large = true;
    return 0;
  }
  // The decoded headers are kept (the exchange's text): charged, since HPACK lets a client send
  // a large header again for a byte.
  s->held += bytes;
  self->conn_->Charge(bytes);
  const absl::string_view n(reinterpret_cast<const char*>(name), namelen);
  const absl::string_view v(reinterpret_cast<const char*>(value), valuelen);
  Exchange& e = *s->exchange;
  if (!n.empty() && n[0] == ':') {
    if (n == ":method") {
      Access::SetMethod(e, v);
      s->head = v == "HEAD";
    } else if (n == ":path") {
      Access::SetTarget(e, v);
    }
    return 0;
  }
  Access::AddHeader(e, n, v, /*lower_name=*/false);  // nghttp2 checked they are lower-case
  uint64_t length = 0;
  if (n == "content-length" && absl::SimpleAtoi(v, &length)) {
    s->announced = static_cast<int64_t>(std::min<uint64_t>(length, INT64_MAX));
  }
  if (n == "content-length" && length > 0 &&
      length <= static_cast<uint64_t>(self->options_.max_body_bytes)) {
    // nghttp2 holds the body to this length: room for it at once, charged (at most
    // kBodyReserve and one stream window, so that a length announced and never sent costs
    // little).
    const int64_t room = static_cast<int64_t>(std::min<uint64_t>(
        {length, kBodyReserve,
         static_cast<uint64_t>(self->options_.http2.stream_window_bytes)}));
    Access::body(e).reserve(static_cast<size_t>(room));
    self->ChargeBody(s, room, 0);
  }
  return 0;
}

void Http2::HeadersDone(Stream* s) {
  if (closing_) return;
  if (s->header_too_large) {
    conn_->Abuse(AbuseReason::kHeaderTooLarge);
    Exchange::Part part;
    part.start = part.end = true;
    part.status = 431;
    part.headers = {{"content-type", "text/plain; charset=utf-8"}};
    part.data = absl::StrCat("request headers: expected at most ", options_.max_header_bytes,
                             " bytes, got ", s->header_bytes, " or more\n");
    // Whatever body comes is dropped (OnDataChunk); if the request is not over when the answer
    // is, the stream is reset (OnFrameSend), so nothing of it stays.
    Deliver(s, std::move(part));
    return;
  }
  // Past a budget the request is refused, unread, in its protocol's terms (the handler's
  // answer), never with REFUSED_STREAM: gRPC clients report that as UNAVAILABLE.
  if (const Exchange::Refusal why = conn_->RefuseNewRequest(/*own=*/s->held);
      why != Exchange::Refusal::kNone) {
    return Refuse(s, why);
  }
  Access::StartReceiving(*s->exchange);
  if (conn_->handler()->Streaming(*s->exchange)) {
    s->streaming = true;
    conn_->Dispatch(s);
    return;
  }
  s->body_limit = RequestBodyLimit(conn_->handler(), *s, options_.max_body_bytes);
  // Decided on the header alone when it says: a body announced past the limit is refused
  // before a byte of it is held (nghttp2 holds the stream to its Content-Length).
  if (s->announced > s->body_limit) {
    conn_->Abuse(AbuseReason::kBodyTooLarge);
    Refuse(s, Exchange::Refusal::kBodyTooLarge);
  }
}

void Http2::RequestDone(Stream* s) {
  if (s->request_done) return;
  s->request_done = true;
  TakeStreamWindow(s);  // its window is of no more use to a request that is over
  if (s->streaming) {
    if (s->exchange != nullptr) Access::Read(*s->exchange, absl::string_view(), true);
    return;
  }
  if (s->dispatched || s->header_too_large || closing_) {
    ReleaseBodyCharge(s);
    return;
  }
  if (in_receive_) {
    // Handed over once the whole read is parsed (Receive): a reset that came in the same read
    // (Rapid Reset sends its resets with its requests), or a frame there that makes us reset
    // the stream (MadeYouReset: Stream::doomed) or end the connection, ends it first, and no
    // work is done for it - also none that a handler would run at once, on this loop.
    complete_.push_back(s->id);
    return;
  }
  HandOver(s);
}

void Http2::HandOver(Stream* s) {
  if (conn_->AnswersOverBudget()) {
    // Taken when its headers came, but the connection's unsent answers passed their budget
    // while its body arrived (a client that sends every HEADERS first, then the bodies): refused
    // as a new request is, before any handler answers it (a memo hit is answered at once, with
    // no worker to look at the budget).
    conn_->Abuse(AbuseReason::kAnswersUnread);
    return Refuse(s, Exchange::Refusal::kAnswersUnread);
  }
  std::shared_ptr<Exchange> exchange = s->exchange;
  conn_->Dispatch(s);
  // The body's bytes go (copied by the handler if it needs them).
  Access::ReleaseBody(*exchange);
  ReleaseBodyCharge(s);
  MaybeReleaseGrant();
}

void Http2::HandOverComplete() {
  // None if the read brought a connection error (DATA or HEADERS after the client's
  // END_STREAM, for one: nghttp2's GOAWAY ends the session once sent).
  if (!nghttp2_session_want_read(session_)) {
    complete_.clear();
    return;
  }
  // By id: a stream closed meanwhile is gone from streams_ (its Stream reused).
  for (size_t i = 0; i < complete_.size(); ++i) {
    Stream* s = Find(complete_[i]);
    if (s == nullptr || closing_ || s->dispatched || s->refused || s->reset_by_peer ||
        s->doomed || s->exchange == nullptr || s->exchange->abandoned()) {
      continue;
    }
    HandOver(s);
  }
  complete_.clear();
  // The next request under way may take its body now (past a budget only the oldest does).
  TakeHeldBack();
}

void Http2::Refuse(Stream* s, Exchange::Refusal why) {
  s->refused = true;
  TakeStreamWindow(s);
  Access::ReleaseBody(*s->exchange);
  ReleaseBodyCharge(s);
  Access::SetRefusal(*s->exchange, why);
  conn_->Dispatch(s);  // answered in the handler's protocol; the rest of the body is dropped
  MaybeReleaseGrant();
}

void Http2::TakeStreamWindow(Stream* s) {
  if (s->unconsumed > 0) {
    nghttp2_session_consume_stream(session_, s->id, static_cast<size_t>(s->unconsumed));
    SetUnconsumed(s, 0);
  }
}

int Http2::OnDataChunk(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t* data,
                       size_t len, void* self_ptr) {
  auto* self = static_cast<Http2*>(self_ptr);
  // The connection's window is given back at once, whoever the bytes are for: bytes held back
  // keep only their own stream's window shut, so no stream can starve the others.
  nghttp2_session_consume_connection(session, len);
  Stream* s = self->Find(stream_id);
  if (s == nullptr || s->request_done || s->refused || s->header_too_large) {
    nghttp2_session_consume_stream(session, stream_id, len);  // nobody keeps these bytes
    return 0;
  }
  const absl::string_view chunk(reinterpret_cast<const char*>(data), len);
  if (len > 0) self->body_progress_ = s->body_at = Clock::now();
  if (s->streaming) {
    s->body_bytes += static_cast<int64_t>(len);
    Access::Read(*s->exchange, chunk, false);
    // Handed over, but its window comes back only as TakeBody allows: a stream whose client
    // sends without reading the answers is pushed back by flow control.
    self->SetUnconsumed(s, s->unconsumed + static_cast<int32_t>(len));
    self->TakeBody(s);
    return 0;
  }
  if (s->body_bytes + static_cast<int64_t>(len) > s->body_limit) {
    s->body_bytes += static_cast<int64_t>(len);
    nghttp2_session_consume_stream(session, stream_id, len);
    self->conn_->Abuse(AbuseReason::kBodyTooLarge);
    self->Refuse(s, Exchange::Refusal::kBodyTooLarge);
    return 0;
  }
  Access::AppendBody(*s->exchange, chunk);
  self->ChargeBody(s, 0, static_cast<int64_t>(len));
  self->SetUnconsumed(s, s->unconsumed + static_cast<int32_t>(len));
  self->TakeBody(s);
  return 0;
}

Stream* Http2::Oldest() const {
  Stream* oldest = nullptr;
  for (const auto& [id, s] : streams_) {
    if (s->request_done || s->streaming || s->refused || s->header_too_large) continue;
    if (oldest == nullptr || id < oldest->id) oldest = s.get();
  }
  return oldest;
}

void Http2::TakeBody(Stream* s, Stream* oldest) {
  if (s->unconsumed == 0) return;
  // A stream (bidirectional) takes more of its request only while its answers are being read:
  // at most a stream window of them waiting (Written() looks again).
  if (s->streaming && s->out_bytes > options_.http2.stream_window_bytes) return;
  // A stream's window is given back while the connection's other streams hold less than its
  // budget, and always for its oldest request under way, so that a request of the largest
  // size completes whatever else the connection sends. Past the server's budget only for
  // that oldest request, and only with a progress grant (Conn::MayTakeBody): a grant lets a
  // connection finish one request at a time, not every body it has started (up to its own
  // budget each, four grants held), which would carry the server that far past its budget. (A
  // bidirectional stream's window waits until the port is back under its budget.)
  if (OldestOnly(*s)) {
    if (oldest == nullptr) oldest = Oldest();
    if (s != oldest) return;
  }
  if (!conn_->MayTakeBody()) return;
  TakeStreamWindow(s);
}

bool Http2::OldestOnly(const Stream& s) const {
  const int64_t budget = conn_->budget();
  return (budget > 0 && conn_->held() - s.held >= budget) || conn_->ServerOverBudget();
}

void Http2::TakeHeldBack() {
  if (holding_ == 0) return;
  Stream* oldest = nullptr;  // looked up once, when a budget asks for it
  for (auto& [id, s] : streams_) {
    if (s->unconsumed == 0) continue;
    if (oldest == nullptr && OldestOnly(*s)) oldest = Oldest();
    TakeBody(s.get(), oldest);
  }
}

bool Http2::BodyUnderWay() const {
  for (const auto& [id, s] : streams_) {
    if (!s->request_done && !s->streaming && !s->refused && !s->header_too_large) {
      return true;
    }
  }
  return false;
}

void Http2::MaybeReleaseGrant() {
  // Looks at the streams only when there is a grant to give back: this runs per request.
  if (conn_->holds_grant() && !BodyUnderWay()) conn_->ReleaseGrant();
}

void Http2::UpdateReadPause() {
  // Past the server's budget, a connection with bodies under way and no progress grant is not
  // read: its streams' windows already bound it otherwise, and reading on lets WINDOW_UPDATEs
  // in.
  const bool pause = conn_->ServerOverBudget() && BodyUnderWay() && !conn_->MayTakeBody();
  if (pause && !read_paused_) conn_->Abuse(AbuseReason::kReadPaused);
  if (pause != read_paused_) {
    read_paused_ = pause;
    conn_->ReadStateChanged();
  }
}

int Http2::OnFrameRecv(nghttp2_session* session, const nghttp2_frame* frame, void* self_ptr) {
  auto* self = static_cast<Http2*>(self_ptr);
  self->last_recv_type_ = frame->hd.type;
  switch (frame->hd.type) {
    case NGHTTP2_DATA: {
      const bool end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
      if (frame->hd.length == 0 && !end) self->NoProgress(NoProgressKind::kEmptyData);
      if (end) {
        if (Stream* s = self->Find(frame->hd.stream_id)) self->RequestDone(s);
      }
      break;
    }
    case NGHTTP2_HEADERS: {
      Stream* s = self->Find(frame->hd.stream_id);
      if (s == nullptr) break;
      if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) self->HeadersDone(s);
      if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0 && self->Find(frame->hd.stream_id)) {
        self->RequestDone(s);
      }
      break;
    }
    case NGHTTP2_PRIORITY:
      self->NoProgress(NoProgressKind::kPriority);
      break;
    case NGHTTP2_RST_STREAM: {
      Stream* s = self->Find(frame->hd.stream_id);
      if (s != nullptr) {
        s->reset_by_peer = true;
        s->patient_reset = PatientReset(*s);
        // A client at its stream limit queues its calls, their deadlines (and the timeout
        // header each carries) counted from when they were made, and resets a call that waited
        // in its queue soon after it got the last slot and was sent (an overloaded Connect or
        // gRPC client does so by the thousand): not a premature reset. It still counts against
        // the reset rate (paid for by the calls that ended well) and earns nothing; Rapid
        // Reset's requests are reset in the read that brings them (never handed over).
        s->slot_wait_reset = !s->patient_reset && s->dispatched && s->opened_at_limit;
      }
      if (s == nullptr && self->late_reset_credit_ > 0) {
        // The reset of a stream we closed with its answer: the client's timer went off before
        // it read the answer (a busy client, an answer near its deadline). Free, once per
        // stream answered.
        --self->late_reset_credit_;
      } else if (s == nullptr || !s->patient_reset) {
        ++self->impatient_[s == nullptr ? 0 : !s->dispatched ? 1 : 2];
        self->CountReset();
      }
      break;
    }
    case NGHTTP2_SETTINGS:
      if ((frame->hd.flags & NGHTTP2_FLAG_ACK) == 0 && ++self->settings_frames_ > 1) {
        self->NoProgress(NoProgressKind::kSettings);
      }
      break;
    case NGHTTP2_PING:
      if ((frame->hd.flags & NGHTTP2_FLAG_ACK) != 0) {
        if (self->drain_noticed_) self->FinalGoaway();
        break;
      }
      // Keep-alive and BDP pings that follow our frames are fine; pings with nothing between
      // them are not progress.
      if (!self->sent_since_ping_) self->NoProgress(NoProgressKind::kPing);
      self->ClientPing();
      self->sent_since_ping_ = false;
      break;
    case NGHTTP2_WINDOW_UPDATE:
      if (frame->window_update.window_size_increment < static_cast<int32_t>(kTinyWindowUpdate)) {
        // A small answer's bytes given back (gRPC clients do it per message, stream and
        // connection) are progress, and so are the first few on a stream with a request open
        // (gRPC clients announce 5 bytes, a message header, on each new call whose window is
        // shut) and one on the connection per new request (the same 5 bytes, as gRPC's C core
        // grows the connection's window with its streams'); small updates with no DATA or
        // request before them are not.
        Stream* s = frame->hd.stream_id != 0 ? self->Find(frame->hd.stream_id) : nullptr;
        if (s != nullptr && s->tiny_window_updates < kFreeTinyUpdatesPerStream) {
          ++s->tiny_window_updates;
        } else if (frame->hd.stream_id == 0 && self->call_credit_ > 0) {
          --self->call_credit_;
        } else if (self->window_credit_ > 0) {
          --self->window_credit_;
        } else {
          self->NoProgress(frame->hd.stream_id == 0 ? NoProgressKind::kWindowUpdateConnection
                           : s != nullptr           ? NoProgressKind::kWindowUpdateStream
                                                    : NoProgressKind::kWindowUpdateUnknown);
        }
      }
      break;
    default:
      break;
  }
  return 0;
}

int Http2::OnInvalidFrame(nghttp2_session*, const nghttp2_frame* frame, int, void* self_ptr) {
  auto* self = static_cast<Http2*>(self_ptr);
  // A stream error (nghttp2 resets the stream: MadeYouReset's WINDOW_UPDATE overflow, a bad
  // PRIORITY, bad trailers) or a connection error: the stream's request is not handed over.
  if (frame->hd.stream_id != 0) {
    if (Stream* s = self->Find(frame->hd.stream_id)) s->doomed = true;
  }
  self->NoProgress(NoProgressKind::kInvalid);
  return 0;
}

void Http2::NoProgress(NoProgressKind kind) {
  ++no_progress_[static_cast<int>(kind)];
  const Clock::time_point now = Clock::now();
  const double burst = std::max(1, options_.http2.no_progress_burst);
  tokens_ = std::min(burst, tokens_ + std::chrono::duration<double>(now - refilled_).count() *
                                          options_.http2.no_progress_rate);
  refilled_ = now;
  tokens_ -= 1;
  if (tokens_ >= 0 || closing_) return;
  // The verdict says what emptied the bucket: this connection's frames without progress by
  // kind, since it opened.
  nlohmann::json frames = nlohmann::json::object();
  for (int i = 0; i < static_cast<int>(NoProgressKind::kCount); ++i) {
    if (no_progress_[i] > 0) frames[NoProgressKindName(static_cast<NoProgressKind>(i))] = no_progress_[i];
  }
  Abuse(AbuseReason::kNoProgress, NGHTTP2_ENHANCE_YOUR_CALM, {},
        {{"frames", std::move(frames)},
         {"streams_opened", closed_streams_ + streams_.size()},
         {"data_frames_sent", data_frames_sent_}});
}

void Http2::CountReset() {
  if (reset_credit_ > 0) {
    --reset_credit_;
    return;
  }
  const Clock::time_point now = Clock::now();
  const double burst = static_cast<double>(std::max<uint64_t>(1, options_.http2.reset_burst));
  reset_tokens_ =
      std::min(burst, reset_tokens_ + std::chrono::duration<double>(now - reset_refilled_).count() *
                                          static_cast<double>(options_.http2.reset_rate));
  reset_refilled_ = now;
  reset_tokens_ -= 1;
  if (reset_tokens_ < 0 && !closing_) {
    Abuse(AbuseReason::kResetRate, NGHTTP2_ENHANCE_YOUR_CALM, {},
          {{"patient_resets", patient_resets_},
           {"resets_unknown_stream", impatient_[0]},
           {"resets_before_dispatch", impatient_[1]},
           {"resets_soon_after_dispatch", impatient_[2]},
           {"resets_idle_stream", impatient_[3]}});
  }
}

void Http2::ClientPing() {
  const Server::Options::Http2& h2 = options_.http2;
  if (h2.max_ping_strikes <= 0) return;
  const Clock::time_point now = Clock::now();
  const absl::Duration interval = streams_.empty() ? h2.idle_ping_interval : h2.min_ping_interval;
  if (sent_since_ping_) {
    ping_strikes_ = 0;  // gRPC clears the strikes whenever it sends: this PING is free
  } else if (now - last_ping_ < absl::ToChronoNanoseconds(interval) &&
             ++ping_strikes_ > h2.max_ping_strikes) {
    Abuse(AbuseReason::kTooManyPings, NGHTTP2_ENHANCE_YOUR_CALM, "too_many_pings");
  }
  last_ping_ = now;
}

void Http2::Abuse(AbuseReason reason, uint32_t code, absl::string_view debug,
                  nlohmann::json detail) {
  if (closing_) return;
  conn_->Abuse(reason, std::move(detail));
  closing_ = true;
  our_goaway_ = true;
  nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                        nghttp2_session_get_last_proc_stream_id(session_), code,
                        reinterpret_cast<const uint8_t*>(debug.data()), debug.size());
  // Work for this connection's streams is not done: their exchanges are over.
  for (auto& [id, s] : streams_) {
    if (s->exchange != nullptr && !s->done) Access::Detach(*s->exchange);
  }
  conn_->ReadStateChanged();
}

int Http2::OnStreamClose(nghttp2_session* session, int32_t stream_id, uint32_t error_code,
                         void* self_ptr) {
  auto* self = static_cast<Http2*>(self_ptr);
  auto it = self->streams_.find(stream_id);
  if (it == self->streams_.end()) return 0;
  std::unique_ptr<Stream> s = std::move(it->second);
  self->streams_.erase(it);
  if (self->last_ == s.get()) self->last_ = nullptr;
  ++self->closed_streams_;
  const Server::Options::Http2& h2 = self->options_.http2;
  // Ended before its answer, by the client's reset (unless it waited patiently for it) or one
  // its error provoked (MadeYouReset).
  if (s->patient_reset) ++self->patient_resets_;
  if (s->done || s->patient_reset) {
    // A stream that ended well earns the connection one hasty reset: the bucket bounds the resets
    // a connection sends beyond the calls it let finish (Rapid Reset lets none), so that an
    // overloaded client's bursts of hasty resets among many waited-for calls never empty it
    // (the premature-reset rule still ends a connection whose resets are half its streams).
    ++self->reset_credit_;
  }
  if (s->done && !s->reset_by_peer) {
    self->late_reset_credit_ = std::min(
        self->late_reset_credit_ + 1, std::max(kMaxLateResetCredit, h2.max_concurrent_streams));
  }
  const bool early = !s->done && (s->reset_by_peer ? !s->patient_reset && !s->slot_wait_reset
                                                   : s->reset_by_us || error_code != 0);
  if (early && Clock::now() - s->opened < absl::ToChronoNanoseconds(h2.premature_reset_lifetime)) {
    ++self->premature_;
    if (!s->reset_by_peer) ++self->premature_by_us_;
  }
  if (s->exchange != nullptr) Access::Detach(*s->exchange);
  self->SetUnconsumed(s.get(), 0);  // the connection's window was given back on arrival
  self->conn_->Charge(-s->held);
  self->conn_->ChargeAnswer(-s->answer_held);
  self->Recycle(std::move(s));
  if (h2.premature_reset_streams > 0 && self->premature_ > 0) {
    const uint64_t limit = static_cast<uint64_t>(h2.premature_reset_streams);
    const bool over = self->closed_streams_ < limit ? self->premature_ * 2 >= limit
                                                     : self->premature_ * 2 >= self->closed_streams_;
    if (over) {
      self->Abuse(AbuseReason::kPrematureResets, NGHTTP2_ENHANCE_YOUR_CALM, {},
                  {{"closed_streams", self->closed_streams_},
                   {"premature", self->premature_},
                   {"patient_resets", self->patient_resets_},
                   {"resets_unknown_stream", self->impatient_[0]},
                   {"resets_before_dispatch", self->impatient_[1]},
                   {"resets_soon_after_dispatch", self->impatient_[2]},
                   {"resets_idle_stream", self->impatient_[3]},
                   {"reset_by_us", self->premature_by_us_}});
    }
  }
  self->UpdateReadPause();
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Answers

void Http2::Deliver(Stream* s, Exchange::Part part) {
  // Nothing after the end: a Write that raced the Finish of another thread is dropped.
  if (s->done || s->end) return;
  if (part.start) {
    s->started = true;
    s->status = part.status;
    s->headers = std::move(part.headers);
  }
  int64_t bytes = 0;
  if (!s->head) {
    // Small bodies stay in the stream and are copied into the write (no allocation); larger ones
    // are shared with the write batch, which may outlive the stream.
    AppendPieces(part, &s->out, &bytes, part.data.size() <= 4096 ? &s->keep : nullptr);
  } else {
    bytes = 0;
    s->out_bytes += static_cast<int64_t>(part.size());  // HEAD: only its length is sent
  }
  if (bytes > 0) {
    s->out_bytes += bytes;
    s->answer_held += bytes;
    conn_->ChargeAnswer(bytes);
  }
  if (part.end) {
    s->end = true;
    s->trailers = std::move(part.trailers);
  }
  if (s->exchange != nullptr) Access::SetUnsent(*s->exchange, s->out_bytes);
  if (!s->started) return;
  if (s->head && !s->end) return;  // HEAD: the headers once the length is known, no DATA
  if (!s->headers_sent) {
    SubmitHeaders(s);
  } else {
    nghttp2_session_resume_data(session_, s->id);
  }
  conn_->WantWrite();
}

void Http2::SubmitHeaders(Stream* s) {
  s->headers_sent = true;
  // On the stack: nghttp2 copies names and values when the frame is submitted.
  char status[16];
  char length[24];
  const absl::string_view status_text(status, absl::numbers_internal::FastIntToBuffer(s->status, status) - status);
  absl::InlinedVector<nghttp2_nv, 16> nva;
  nva.push_back(Nv(":status", status_text));
  nva.push_back(Nv("date", HttpDate()));
  nva.push_back(Nv("server", options_.server_name));
  if (s->end && s->trailers.empty()) {
    const char* end = absl::numbers_internal::FastIntToBuffer(s->out_bytes, length);
    nva.push_back(Nv("content-length", absl::string_view(length, end - length)));
  }
  for (const auto& [name, value] : s->headers) nva.push_back(Nv(name, value));
  const bool no_body = s->end && (s->head || s->out.empty());
  if (no_body && s->trailers.empty()) {
    nghttp2_submit_response(session_, s->id, nva.data(), nva.size(), nullptr);
  } else if (no_body) {
    // Headers, then trailers: two HEADERS frames, no DATA.
    nghttp2_submit_headers(session_, NGHTTP2_FLAG_NONE, s->id, nullptr, nva.data(), nva.size(),
                           nullptr);
    SubmitTrailers(s);
  } else {
    nghttp2_data_provider provider;
    provider.source.ptr = s;
    provider.read_callback = &Http2::ReadData;
    nghttp2_submit_response(session_, s->id, nva.data(), nva.size(), &provider);
  }
  s->headers.clear();
}

void Http2::SubmitTrailers(Stream* s) {
  absl::InlinedVector<nghttp2_nv, 8> tva;
  for (const auto& [name, value] : s->trailers) tva.push_back(Nv(name, value));
  nghttp2_submit_trailer(session_, s->id, tva.data(), tva.size());
}

ssize_t Http2::ReadData(nghttp2_session*, int32_t, uint8_t*, size_t length,
                        uint32_t* data_flags, nghttp2_data_source* source, void* self) {
  auto* s = static_cast<Stream*>(source->ptr);
  size_t available = 0;
  for (const Piece& p : s->out) {
    available += p.size;
    if (available >= length) break;
  }
  const size_t n = std::min(length, available);
  if (n == 0 && !s->end) return NGHTTP2_ERR_DEFERRED;  // more comes (Deliver resumes)
  *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
  if (s->end && n == static_cast<size_t>(s->out_bytes)) {
    *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    if (!s->trailers.empty()) {
      *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
      static_cast<Http2*>(self)->SubmitTrailers(s);
    }
  }
  return static_cast<ssize_t>(n);
}

int Http2::OnSendData(nghttp2_session*, nghttp2_frame* frame, const uint8_t* framehd,
                      size_t length, nghttp2_data_source* source, void* self_ptr) {
  auto* self = static_cast<Http2*>(self_ptr);
  auto* s = static_cast<Stream*>(source->ptr);
  if (self->batch_ == nullptr || self->batch_->size() >= kMaxBatchBytes) {
    return NGHTTP2_ERR_WOULDBLOCK;
  }
  self->batch_->Copy(framehd, 9);
  size_t left = length;
  while (left > 0 && !s->out.empty()) {
    Piece& p = s->out.front();
    const size_t n = std::min(left, p.size);
    if (p.owner == nullptr) {
      self->batch_->Copy(p.data, n, p.secret);  // the stream's own bytes: it may close first
    } else {
      self->batch_->Ref(p.data, n, p.owner, p.secret);
    }
    p.data += n;
    p.size -= n;
    left -= n;
    if (p.size == 0) s->out.pop_front();
  }
  // The bytes are the batch's now: charged to it until written.
  const int64_t moved = static_cast<int64_t>(length - left);
  s->out_bytes -= moved;
  s->answer_held -= moved;
  self->batch_body_ += moved;
  if (s->exchange != nullptr) Access::SetUnsent(*s->exchange, s->out_bytes);
  (void)frame;
  return 0;
}

ssize_t Http2::OnSend(nghttp2_session*, const uint8_t* data, size_t length, int, void* self_ptr) {
  auto* self = static_cast<Http2*>(self_ptr);
  if (self->batch_ == nullptr || self->batch_->size() >= kMaxBatchBytes) {
    return NGHTTP2_ERR_WOULDBLOCK;
  }
  self->batch_->Copy(data, length);
  return static_cast<ssize_t>(length);
}

int Http2::OnFrameSend(nghttp2_session* session, const nghttp2_frame* frame, void* self_ptr) {
  auto* self = static_cast<Http2*>(self_ptr);
  switch (frame->hd.type) {
    case NGHTTP2_DATA:
    case NGHTTP2_HEADERS: {
      self->sent_since_ping_ = true;
      if (frame->hd.type == NGHTTP2_DATA && frame->hd.length > 0) {
        ++self->data_frames_sent_;
        self->window_credit_ = std::min(self->window_credit_ + 2, kMaxWindowCredit);
      }
      if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) break;
      Stream* s = self->Find(frame->hd.stream_id);
      if (s == nullptr) break;
      s->done = true;
      if (s->exchange != nullptr) Access::Detach(*s->exchange);
      if (!s->request_done) {
        // Answered before the whole request came (a body too large, headers too large): the
        // rest is not wanted.
        nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_NO_ERROR);
      }
      break;
    }
    case NGHTTP2_RST_STREAM:
      if (frame->rst_stream.error_code != NGHTTP2_NO_ERROR &&
          frame->rst_stream.error_code != NGHTTP2_REFUSED_STREAM) {
        if (Stream* s = self->Find(frame->hd.stream_id)) s->reset_by_us = true;
      }
      break;
    case NGHTTP2_GOAWAY:
      if (self->our_goaway_ || frame->goaway.error_code == NGHTTP2_NO_ERROR) break;
      // nghttp2's own: a protocol error, or one of its limits (see NghttpGoawayReason).
      self->conn_->Abuse(NghttpGoawayReason(frame->goaway, self->last_recv_type_),
                         {{"goaway_error", nghttp2_http2_strerror(frame->goaway.error_code)},
                          // nghttp2's reason, e.g. "DATA: stream in idle" (its own text)
                          {"goaway_reason", PrintableText(frame->goaway.opaque_data,
                                                          frame->goaway.opaque_data_len)},
                          {"last_frame", FrameTypeName(self->last_recv_type_)}});
      self->closing_ = true;
      self->conn_->ReadStateChanged();
      break;
    default:
      break;
  }
  return 0;
}

void Http2::Trim() {
  spare_.clear();
  if (session_ == nullptr) return;
  // Nothing waits to be sent: the frame buffer's pages go back to the kernel.
  if (nghttp2_session_want_write(session_) == 0) memory_.ReleasePages();
}

// ---------------------------------------------------------------------------------------------
// Drain and time

void Http2::Drain() {
  if (closing_ || drain_noticed_) return;
  drain_noticed_ = true;
  drain_at_ = Clock::now();
  if (streams_.empty()) {
    FinalGoaway();
  } else {
    // gRPC's graceful shutdown: GOAWAY(2^31-1) and a PING; the real GOAWAY once the PING is
    // answered, so that no stream the client sent meanwhile is lost.
    nghttp2_submit_shutdown_notice(session_);
    nghttp2_submit_ping(session_, NGHTTP2_FLAG_NONE, nullptr);
  }
  conn_->WantWrite();
}

void Http2::FinalGoaway() {
  if (drain_final_) return;
  drain_final_ = true;
  nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                        nghttp2_session_get_last_proc_stream_id(session_), NGHTTP2_NO_ERROR,
                        nullptr, 0);
}

void Http2::Tick(Clock::time_point now) {
  if (session_ == nullptr) return;
  if (drain_noticed_ && !closing_ && conn_->DrainBodyDeadlinePassed(now)) {
    // The drain's deadline for bodies: requests still arriving are refused (UNAVAILABLE in the
    // handler's terms; never run), the rest of their bodies dropped.
    std::vector<Stream*> late;
    for (auto& [id, s] : streams_) {
      if (!s->request_done && !s->streaming && !s->refused && !s->header_too_large &&
          !s->dispatched) {
        late.push_back(s.get());
      }
    }
    for (Stream* s : late) {
      conn_->Abuse(AbuseReason::kDrainBodyLate);
      Refuse(s, Exchange::Refusal::kDraining);
    }
    if (!late.empty()) UpdateReadPause();
  }
  if (drain_noticed_ && !drain_final_ && now - drain_at_ >= std::chrono::seconds(1)) {
    FinalGoaway();
    conn_->WantWrite();
  }
  TakeHeldBack();
  UpdateReadPause();
  if (nghttp2_session_want_write(session_)) conn_->WantWrite();
}

}  // namespace

std::unique_ptr<Protocol> MakeHttp2(Conn* conn) { return std::make_unique<Http2>(conn); }

}  // namespace offload::httpd::internal
