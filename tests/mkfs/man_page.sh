#!/bin/bash
# The man page renders without warnings, has the sections mkfs(8)-style pages
# have, and documents every option `mkfs.plyfs -h` lists.
# Usage: man_page.sh MKFS MAN_PAGE
set -euo pipefail

MKFS=$1
PAGE=$2

if ! command -v groff >/dev/null; then
  echo "skipped: groff not found, cannot render the page"
  exit 77
fi

fails=0
check() {  # check "what" command...: the command must succeed
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}

warnings=$(groff -man -ww -z "$PAGE" 2>&1)
check "groff renders it without warnings" test -z "$warnings"
[[ -z $warnings ]] || echo "$warnings"
text=$(groff -man -Tutf8 -P-cbou "$PAGE" 2>/dev/null)
check "the page has text" test "$(wc -l <<<"$text")" -gt 50
for section in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" EXAMPLES "SEE ALSO"; do
  check "section $section" grep -q "^\\.SH \"\\?$section\"\\?\$" "$PAGE"
done
check "NAME is whatis-parseable" grep -q '^mkfs.plyfs - create a plyfs filesystem$' \
  <(sed -n '/^NAME/,/^SYNOPSIS/p' <<<"$text" | sed 's/^ *//')
for ref in 'fsck.plyfs(8)' 'plyfs(8)' 'plyctl(8)'; do
  check "SEE ALSO $ref" grep -qF "$ref" <<<"$text"
done
check "explains mkfs -t plyfs" grep -q 'mkfs -t plyfs' <<<"$text"

# Every option in the usage text is documented in OPTIONS, and vice versa.
usage_opts=$("$MKFS" -h | sed -n 's/^  \(-[a-zA-Z]\).*/\1/p' | sort)
# An option's entry is the tag line after .TP.
page_opts=$(sed -n '/^\.SH OPTIONS/,/^\.SH /p' "$PAGE" | awk 'tag { print } { tag = /^\.TP/ }' |
  sed -n 's/^\.B[IR]\? \\\(-[a-zA-Z]\).*/\1/p' | sort)
check "usage lists options" test "$(wc -w <<<"$usage_opts")" -ge 9
check "the page documents exactly the options -h lists" test "$usage_opts" = "$page_opts"
[[ $usage_opts == "$page_opts" ]] || diff <(echo "$usage_opts") <(echo "$page_opts") || true

if [[ $fails -ne 0 ]]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
