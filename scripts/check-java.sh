#!/usr/bin/env bash
# Fail early, with instructions, when no Java >= 17 is available (Spark 4 needs it).
set -euo pipefail
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  cat >&2 <<'MSG'
error: Java was not found. Spark 4 needs a Java runtime, version 17 or newer.
  Debian/Ubuntu:  sudo apt-get install -y openjdk-17-jre-headless
  macOS:          brew install openjdk@17
Then make sure `java -version` works (or set JAVA_HOME) and run the command again.
MSG
  exit 1
fi
version_line="$("$java_bin" -version 2>&1 | head -n 1)"
major="$(sed -E 's/.*version "([0-9]+)(\.[0-9]+)*.*/\1/' <<<"$version_line")"
if [[ "$major" == "1" ]]; then major=8; fi
if ! [[ "$major" =~ ^[0-9]+$ ]] || (( major < 17 )); then
  echo "error: found $version_line; Spark 4 needs Java 17 or newer." >&2
  echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless (then set JAVA_HOME)" >&2
  exit 1
fi
