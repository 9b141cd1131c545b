#!/bin/sh
# Container entrypoint of offload_server. Secrets come in as files (compose secrets, Kubernetes
# Secret volumes), never as image layers:
#   OFFLOAD_POSTGRES_PASSWORD_FILE  file holding the PostgreSQL password; exported as PGPASSWORD,
#                                   which libpq reads, so the DSN itself carries no password
#   --kek_file=/run/secrets/...     the key-encryption key (the server checks it is mode 0600)
set -eu
if [ -n "${OFFLOAD_POSTGRES_PASSWORD_FILE:-}" ]; then
  PGPASSWORD="$(cat "$OFFLOAD_POSTGRES_PASSWORD_FILE")"
  export PGPASSWORD
  unset OFFLOAD_POSTGRES_PASSWORD_FILE
fi
exec /usr/local/bin/offload_server "$@"
