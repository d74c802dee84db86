# shellcheck shell=bash
# host_apt_uri SUITE: the URI of the first enabled apt source of this host
# that serves SUITE ("deb" type), from deb822 `.sources` files and one-line
# `.list` files under APT_ETC (default /etc/apt), without its trailing slash;
# nothing when none does. hull's image and setup take their Debian mirror
# from here, so they use the mirror the host already uses (an internal one
# included) and no host name is written into hull.
host_apt_uri() {
  local suite=$1 etc=${APT_ETC:-/etc/apt} f
  {
    for f in "$etc"/sources.list.d/*.sources; do
      [ -f "$f" ] || continue
      awk -v want="$suite" '
        function flush() {
          if (deb && has && enabled && uri != "") print uri
          deb = 0; has = 0; uri = ""; enabled = 1
        }
        BEGIN { enabled = 1 }
        /^[[:space:]]*$/ { flush(); next }
        /^[[:space:]]*#/ { next }
        tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
        tolower($1) == "uris:" { uri = $2 }
        tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == want) has = 1 }
        tolower($1) == "enabled:" { if (tolower($2) == "no") enabled = 0 }
        END { flush() }' "$f"
    done
    for f in "$etc"/sources.list "$etc"/sources.list.d/*.list; do
      [ -f "$f" ] || continue
      awk -v want="$suite" '
        $1 == "deb" {
          i = 2
          if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
          if ($(i + 1) == want) print $i
        }' "$f"
    done
  } | head -n1 | sed 's:/*$::'
}
