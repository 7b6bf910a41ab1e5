#!/usr/bin/env bash
# Container health probe for the Shepherd image (used by the Dockerfile HEALTHCHECK and
# by docker/compose.yaml). It does one HTTP/1.0 GET over bash's /dev/tcp and succeeds
# only on a 200 answer, so the runtime image needs no curl or wget.
#
#   shepherd-healthcheck [PATH]      PATH defaults to /healthz
#
# The port comes from SHEPHERD_LISTEN (host:port, default 127.0.0.1:8080); the probe
# always connects to the loopback address, which also reaches a 0.0.0.0 listener.
# HEALTHCHECK_TIMEOUT (seconds, default 2) bounds the whole exchange.
set -u
path="${1:-/healthz}"
listen="${SHEPHERD_LISTEN:-127.0.0.1:8080}"
port="${listen##*:}"
case "$listen" in
  \[*) host="::1" ;;          # an IPv6 listener such as [::]:8080
  *) host="127.0.0.1" ;;
esac
timeout="${HEALTHCHECK_TIMEOUT:-2}"

probe() {
  exec 3<>"/dev/tcp/$host/$port" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n' "$path" >&3
  local version status rest
  IFS=' ' read -r -t "$timeout" version status rest <&3 || return 1
  exec 3<&-
  [ "$status" = "200" ]
}

# `timeout` guards the connect itself, which bash's /dev/tcp does not bound.
export -f probe
export path host port timeout
exec timeout "$((timeout + 1))" bash -c probe
