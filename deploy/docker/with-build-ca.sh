#!/bin/sh
# Runs one build step's command trusting the site's CA bundle, when the build was given one.
#
#   with-build-ca.sh COMMAND [ARGS...]
#
# Why it exists: where package traffic passes a company's TLS proxy, or the PyPI/apt mirror sits
# behind the company's own CA, pip (which trusts only its bundled certifi) and apt refuse the
# certificate, and neither image can build. The bundle comes in as the build secret `build_ca`
# (compose: BUILD_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt docker compose build; docker build:
# --secret id=build_ca,src=FILE), a PEM file that holds every CA the build must trust (a host's
# whole bundle, which already trusts the company's CA, is the usual choice). A secret is mounted
# for one RUN step only: it stays out of every layer. Without one (or with an empty one: compose's
# default is /dev/null), the command runs unchanged.
#
# The Dockerfiles mount the script from the build context (RUN --mount=type=bind): no layer.

ca=/run/secrets/build_ca
if [ -s "$ca" ]; then
    # pip (and requests, which pip vendors), Python's ssl and OpenSSL's defaults, and apt's https.
    export PIP_CERT="$ca" REQUESTS_CA_BUNDLE="$ca" SSL_CERT_FILE="$ca"
    # apt reads APT_CONFIG in place of /etc/apt/apt.conf (apt.conf.d/ still applies); the file
    # is removed after the command, so that it leaves nothing in the layer either.
    apt_conf=$(mktemp)
    printf 'Acquire::https::CAInfo "%s";\n' "$ca" >"$apt_conf"
    export APT_CONFIG="$apt_conf"
    status=0
    "$@" || status=$?
    rm -f "$apt_conf"
    exit "$status"
fi
exec "$@"
