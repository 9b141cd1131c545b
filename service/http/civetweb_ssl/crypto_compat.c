/* Named libcrypto.so (SONAME too) and depending on libcrypto.so.3: civetweb's dlopen of
 * "libcrypto.so" finds it loaded, so the server needs no libssl-dev (the unversioned symlink) at
 * run time. See ssl_compat.c. */
int offload_civetweb_crypto_compat(void);
int offload_civetweb_crypto_compat(void) { return 3; }
