#!/bin/bash
# Builds the Debian packages from a build tree (cpack) and checks what they
# carry: the binary, every plugin the shipped config points to, the config as
# a conffile, the systemd unit (its binary and config in the package, a stop
# timeout above the drain), the postinst, library dependencies; the SDK's
# headers and CMake package. Usage: check_deb.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "check_deb: $*" >&2; exit 1; }

(cd "$build" && cpack -G DEB -B "$out" >"$out/cpack.log" 2>&1) || { cat "$out/cpack.log"; fail "cpack failed"; }
host=$(ls "$out"/idemsink_*_amd64.deb) || fail "no idemsink package"
sdk=$(ls "$out"/idemsink-sdk_*_all.deb) || fail "no idemsink-sdk package"
dpkg-deb -c "$host" | awk '{print $6}' | sed 's|^\.||' >"$out/host.files"
dpkg-deb -c "$sdk" | awk '{print $6}' | sed 's|^\.||' >"$out/sdk.files"
echo "idemsink package:"; grep -v '/$' "$out/host.files" | sed 's/^/  /'

has() { grep -qx "$2" "$out/$1.files" || fail "$1 package lacks $2"; }
has host /usr/bin/idemsink
has host /usr/lib/systemd/system/idemsink.service
has host /etc/idemsink/idemsink.toml
# One plugin path everywhere: what the shipped config names is in the package.
plugins=$(grep -oE '^plugin = "[^"]+"' "$src/conf/idemsink.toml" | cut -d'"' -f2)
[ -n "$plugins" ] || fail "no plugin paths in conf/idemsink.toml"
for p in $plugins; do has host "$p"; done

dpkg-deb -e "$host" "$out/control"
grep -qx /etc/idemsink/idemsink.toml "$out/control/conffiles" || fail "the config is not a conffile"
[ -x "$out/control/postinst" ] || fail "no executable postinst"
grep -q "adduser --system" "$out/control/postinst" || fail "postinst does not create the service user"
depends=$(dpkg-deb -f "$host" Depends)
for lib in librdkafka1 libmariadb3 libjemalloc2 adduser; do
  [[ $depends == *"$lib"* ]] || fail "Depends lacks $lib: $depends"
done

dpkg-deb -x "$host" "$out/root"
unit="$out/root/usr/lib/systemd/system/idemsink.service"
exec_start=$(grep -E '^ExecStart=' "$unit" | cut -d= -f2-)
read -r binary _ _ config <<<"$exec_start"
has host "$binary"
[ "$config" = /etc/idemsink/idemsink.toml ] || fail "the unit's config $config is not the packaged one"
# "90", "90s", "2m", "1min" -> seconds
seconds() {
  local v=$1
  case $v in
    *min) echo $((${v%min} * 60)) ;;
    *ms) echo $((${v%ms} / 1000)) ;;
    *m) echo $((${v%m} * 60)) ;;
    *s) echo "${v%s}" ;;
    *) echo "$v" ;;
  esac
}
stop=$(seconds "$(grep -E '^TimeoutStopSec=' "$unit" | cut -d= -f2)")
grace=$(seconds "$(grep -E '^shutdown_grace' "$src/conf/idemsink.toml" | cut -d'"' -f2)")
# The host drains for the grace, then gives itself 5 s more and its database workers 5 s.
[ "$stop" -ge $((grace + 10)) ] || fail "TimeoutStopSec=${stop}s is below shutdown_grace ${grace}s + 10 s"
"$out/root/usr/bin/idemsink" --version | grep -q '^idemsink ' || fail "the packaged binary does not run"

has sdk /usr/include/idemsink/plugin_abi.h
has sdk /usr/include/idemsink/sdk.h
has sdk /usr/include/idemsink/detail/descriptor.h
has sdk /usr/include/idemsink/testing/fake_tx.h
has sdk /usr/lib/cmake/idemsink/idemsinkConfig.cmake
echo "check_deb: ok ($(basename "$host"), $(basename "$sdk"))"
