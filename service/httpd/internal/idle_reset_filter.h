// The HTTP/2 bytes a client sends, with its RST_STREAM frames for streams it never opened taken
// out before nghttp2 sees them.
//
// RFC 9113 6.4 makes a RST_STREAM on an idle stream a connection error, and nghttp2 answers it
// with GOAWAY(PROTOCOL_ERROR), which ends every call on the connection. gRPC's C core (1.51 in
// Debian: python3-grpcio, the C++ library) sends exactly that when a call is cancelled, or its
// deadline passes, between taking a stream id and writing the call's HEADERS
// (grpc/grpc#19655, #38758): a 1 ms deadline does it now and then. gRPC's own servers ignore
// such a reset; so do we, and the reset is counted as a client reset (the reset bucket).
//
// The filter only finds frame boundaries (the 9-byte header of RFC 9113 4.1: a length, a type,
// a stream id); nghttp2 parses everything it passes on. Frames pass unchanged and in order.
#ifndef OFFLOAD_SERVICE_HTTPD_INTERNAL_IDLE_RESET_FILTER_H_
#define OFFLOAD_SERVICE_HTTPD_INTERNAL_IDLE_RESET_FILTER_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace offload::httpd::internal {

class IdleResetFilter {
 public:
  // Calls `feed(const uint8_t* data, size_t size)` with the parts of `data` to pass on, in order,
  // and `dropped(int32_t stream_id)` for each reset taken out. `feed` returns false to stop
  // (nghttp2 failed): Filter then returns false.
  template <typename Feed, typename Dropped>
  bool Filter(const uint8_t* data, size_t size, Feed&& feed, Dropped&& dropped) {
    const uint8_t* p = data;
    const uint8_t* const end = data + size;
    const uint8_t* pass = p;  // start of the bytes to pass on not yet fed
    while (p < end) {
      const size_t left = static_cast<size_t>(end - p);
      if (preface_left_ > 0 || payload_left_ > 0) {
        size_t& counter = preface_left_ > 0 ? preface_left_ : payload_left_;
        const size_t n = counter < left ? counter : left;
        counter -= n;
        p += n;
        continue;
      }
      if (skip_left_ > 0) {
        const size_t n = skip_left_ < left ? skip_left_ : left;
        skip_left_ -= n;
        p += n;
        pass = p;
        continue;
      }
      // A frame header, maybe begun in an earlier read (held back, not yet fed).
      const bool began_earlier = held_ > 0;
      const size_t n = kHeader - held_ < left ? kHeader - held_ : left;
      if (!began_earlier && n == kHeader) {
        std::memcpy(header_, p, kHeader);
      } else {
        if (!began_earlier && p > pass && !feed(pass, static_cast<size_t>(p - pass))) return false;
        std::memcpy(header_ + held_, p, n);
      }
      held_ += n;
      p += n;
      if (held_ < kHeader) {
        pass = p;  // the rest of this header comes with the next read
        break;
      }
      held_ = 0;
      const uint32_t length = (uint32_t{header_[0]} << 16) | (uint32_t{header_[1]} << 8) | header_[2];
      const uint8_t type = header_[3];
      const int32_t stream = static_cast<int32_t>(
          ((uint32_t{header_[5]} & 0x7f) << 24) | (uint32_t{header_[6]} << 16) |
          (uint32_t{header_[7]} << 8) | header_[8]);
      const bool client_stream = (stream & 1) == 1;
      if (type == kRstStream && length == 4 && client_stream && stream > highest_opened_) {
        // Dropped: the header bytes seen so far go, and the 4 bytes of its error code.
        const uint8_t* header_start = began_earlier ? data : p - kHeader;
        if (header_start > pass && !feed(pass, static_cast<size_t>(header_start - pass))) {
          return false;
        }
        dropped(stream);
        skip_left_ = length;
        pass = p;
        continue;
      }
      if (type == kHeaders && client_stream && stream > highest_opened_) highest_opened_ = stream;
      payload_left_ = length;
      if (began_earlier) {
        // The header's start was held back: it goes now, whole, and this read's bytes follow.
        if (!feed(header_, kHeader)) return false;
        pass = p;
      }
    }
    if (p > pass && !feed(pass, static_cast<size_t>(p - pass))) return false;
    return true;
  }

  // The highest client stream id a HEADERS frame has named (nghttp2's last_recv_stream_id).
  int32_t highest_opened() const { return highest_opened_; }

 private:
  static constexpr size_t kHeader = 9;
  static constexpr uint8_t kHeaders = 0x1;
  static constexpr uint8_t kRstStream = 0x3;

  size_t preface_left_ = 24;  // "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n": nghttp2 checks it
  size_t payload_left_ = 0;   // of the frame passing through
  size_t skip_left_ = 0;      // of the reset being dropped
  uint8_t header_[kHeader] = {};
  size_t held_ = 0;           // bytes of header_ from earlier reads, not yet fed
  int32_t highest_opened_ = 0;
};

}  // namespace offload::httpd::internal

#endif  // OFFLOAD_SERVICE_HTTPD_INTERNAL_IDLE_RESET_FILTER_H_
