#include "service/auth/forwarded_identity.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "service/auth/tls.h"

namespace offload::auth {
namespace {

constexpr size_t kMaxValueBytes = 16 << 10;

// `text` cut at each `sep` that is neither inside double quotes nor escaped by a backslash;
// nullopt if a quote is left open or a backslash ends the text. Refusing those matters: a proxy
// that appends its element to a client-supplied header would otherwise have its element swallowed
// by the client's open quote, and the client's URI= read as the identity.
std::optional<std::vector<absl::string_view>> SplitUnquoted(absl::string_view text, char sep) {
  std::vector<absl::string_view> out;
  bool quoted = false;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\') {
      if (++i == text.size()) return std::nullopt;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == sep && !quoted) {
      out.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  if (quoted) return std::nullopt;
  out.push_back(text.substr(start));
  return out;
}

// A value without its surrounding quotes and with backslash escapes undone.
std::string Unquote(absl::string_view v) {
  v = absl::StripAsciiWhitespace(v);
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == '\\' && i + 1 < v.size()) ++i;
    out.push_back(v[i]);
  }
  return out;
}

// The CN of a distinguished name in RFC 2253 / RFC 4514 form ("CN=app-a,O=Example"); empty if
// it has none.
std::string CommonNameOf(absl::string_view dn) {
  const std::optional<std::vector<absl::string_view>> rdns = SplitUnquoted(dn, ',');
  if (!rdns.has_value()) return "";
  for (absl::string_view rdn : *rdns) {
    rdn = absl::StripAsciiWhitespace(rdn);
    if (rdn.size() > 3 && absl::EqualsIgnoreCase(rdn.substr(0, 3), "CN=")) {
      return Unquote(rdn.substr(3));
    }
  }
  return "";
}

std::optional<std::string> PercentDecode(absl::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size() || !absl::ascii_isxdigit(in[i + 1]) ||
        !absl::ascii_isxdigit(in[i + 2])) {
      return std::nullopt;
    }
    const auto hex = [](char c) { return absl::ascii_isdigit(c) ? c - '0' : (c | 0x20) - 'a' + 10; };
    out.push_back(static_cast<char>(hex(in[i + 1]) * 16 + hex(in[i + 2])));
    i += 2;
  }
  return out;
}

absl::StatusOr<std::string> IdentityOfXfcc(absl::string_view value) {
  // Each proxy appends its element: the last one is what the nearest (trusted) proxy saw.
  const std::optional<std::vector<absl::string_view>> elements = SplitUnquoted(value, ',');
  const std::optional<std::vector<absl::string_view>> pairs =
      elements.has_value() ? SplitUnquoted(elements->back(), ';') : std::nullopt;
  if (!pairs.has_value()) {
    return absl::InvalidArgumentError(
        "x-forwarded-client-cert: an open quote or a dangling escape");
  }
  std::string uri, dns, subject;
  for (absl::string_view pair : *pairs) {
    const size_t eq = pair.find('=');
    if (eq == absl::string_view::npos) continue;
    const absl::string_view key = absl::StripAsciiWhitespace(pair.substr(0, eq));
    std::string v = Unquote(pair.substr(eq + 1));
    if (absl::EqualsIgnoreCase(key, "URI") && uri.empty()) uri = std::move(v);
    if (absl::EqualsIgnoreCase(key, "DNS") && dns.empty()) dns = std::move(v);
    if (absl::EqualsIgnoreCase(key, "Subject") && subject.empty()) subject = std::move(v);
  }
  if (!uri.empty()) return uri;
  if (!dns.empty()) return dns;
  std::string cn = CommonNameOf(subject);
  if (!cn.empty()) return cn;
  return absl::InvalidArgumentError(
      "x-forwarded-client-cert: the last element names no URI, DNS or Subject CN");
}

absl::StatusOr<std::string> IdentityOfPem(absl::string_view value) {
  std::optional<std::string> pem = PercentDecode(value);
  if (!pem.has_value()) {
    return absl::InvalidArgumentError("ssl-client-cert: expected a URL-encoded PEM certificate");
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())),
                                                BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      bio == nullptr ? nullptr : PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr),
      X509_free);
  if (cert == nullptr) {
    return absl::InvalidArgumentError("ssl-client-cert: expected a URL-encoded PEM certificate");
  }
  std::string identity = auth::IdentityOf(cert.get());
  if (identity.empty()) {
    return absl::InvalidArgumentError("ssl-client-cert: the certificate names no identity");
  }
  return identity;
}

}  // namespace

absl::StatusOr<ForwardedIdentity> ForwardedIdentity::Parse(absl::string_view header) {
  const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(header));
  if (name == "x-forwarded-client-cert") return ForwardedIdentity(Kind::kXfcc, name);
  if (name == "ssl-client-cert") return ForwardedIdentity(Kind::kNginxCert, name);
  if (name == "x-ssl-client-s-dn") return ForwardedIdentity(Kind::kNginxSubjectDn, name);
  return absl::InvalidArgumentError(absl::StrCat(
      "forwarded_identity_header: expected x-forwarded-client-cert, ssl-client-cert or "
      "x-ssl-client-s-dn, got \"", header, "\""));
}

absl::StatusOr<std::string> ForwardedIdentity::IdentityOf(absl::string_view value) const {
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(header_, ": ", value.size(), " bytes; at most ", kMaxValueBytes));
  }
  switch (kind_) {
    case Kind::kXfcc: return IdentityOfXfcc(value);
    case Kind::kNginxCert: return IdentityOfPem(value);
    case Kind::kNginxSubjectDn: {
      std::string cn = CommonNameOf(value);
      if (cn.empty()) return absl::InvalidArgumentError("x-ssl-client-s-dn: names no CN");
      return cn;
    }
  }
  return absl::InvalidArgumentError("unknown forwarded identity header");
}

}  // namespace offload::auth
