/* Debian 12's civetweb 1.15 loads OpenSSL at run time (dlopen "libssl.so" / "libcrypto.so", then
 * dlsym of each function it uses) and asks for SSL_get_peer_certificate, which OpenSSL 3 only
 * has as a macro: the pointer stays null and every HTTPS connection crashes the process. This
 * library is named libssl.so (SONAME too) and linked into offload_server, so that civetweb's
 * dlopen finds it already loaded; dlsym then finds the one missing function here and everything
 * else in the real libssl.so.3 it depends on. No cryptography here: a forwarding call. */
#include <openssl/ssl.h>

#undef SSL_get_peer_certificate
X509* SSL_get_peer_certificate(const SSL* ssl);
X509* SSL_get_peer_certificate(const SSL* ssl) { return SSL_get1_peer_certificate(ssl); }
