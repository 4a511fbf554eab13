#!/bin/bash
# plyctl(8) renders cleanly (mandoc -T lint, groff -ww), has a whatis NAME
# line and a real date, and documents every command of `plyctl --help` and
# every object of docs/plyctl.schema.json.
# Usage: man_page.sh PLYCTL MAN_PAGE SCHEMA
set -uo pipefail
PLYCTL=$1 PAGE=$2 SCHEMA=$3
fails=0
check() {  # check "what" command...: the command must succeed
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
if command -v mandoc >/dev/null; then
  lint=$(mandoc -T lint "$PAGE" 2>&1)
  check "mandoc -T lint is clean" test -z "$lint"
  [[ -z $lint ]] || echo "$lint"
fi
if ! command -v groff >/dev/null; then
  echo "skipped: groff not found, cannot render the page"
  exit 77
fi
warnings=$(groff -t -man -ww -z "$PAGE" 2>&1)
check "groff renders it without warnings" test -z "$warnings"
[[ -z $warnings ]] || echo "$warnings"
text=$(groff -t -man -Tutf8 -P-cbou "$PAGE" 2>/dev/null)
check "NAME is whatis-parseable: plyctl - ..." grep -Eq '^ *plyctl +- manage the branches' <<<"$text"
check "the date is a date (YYYY-MM-DD)" grep -Eq '^\.TH PLYCTL 8 "?20[0-9]{2}-[01][0-9]-[0-3][0-9]"? ' "$PAGE"
for section in NAME SYNOPSIS DESCRIPTION NAMES "JSON SCHEMA" "EXIT STATUS" EXAMPLES "SEE ALSO"; do
  check "section $section" grep -q "^\\.SH \"\\?$section\"\\?\$" "$PAGE"
done
# Every command and subcommand of the usage text is in the synopsis.
synopsis=$(sed -n '/^SYNOPSIS/,/^DESCRIPTION/p' <<<"$text" | tr -s ' \n' ' ')
while read -r cmd; do
  check "synopsis has: $cmd" grep -qF "plyctl $cmd" <<<"$synopsis"
done < <("$PLYCTL" --help | sed -n 's/^  \([a-z]\+\( [a-z]\+\)\?\) [A-Z].*/\1/p' |
           sed 's/ \(IMAGE\|MNT\|SRC\|STRUCT\|BRANCH\)$//' | sort -u)
# Every object of the schema is described under JSON SCHEMA.
json_section=$(sed -n '/^JSON SCHEMA/,/^CONTROL CHANNEL/p' <<<"$text")
for obj in BranchRef StackEntry Branch BranchInfo View Snapshot Merge DiffEntry Image Import Export Trim Resize Scrub ScrubDamage ScrubReference ScrubStatus Sync SpaceUse BranchSpace Du Quota Devices Where Policy PolicyTest PolicyApply; do
  check "JSON SCHEMA describes $obj" grep -qw "$obj" <<<"$json_section"
  check "the schema file defines $obj" grep -q "\"$obj\": {" "$SCHEMA"
done
if ((fails)); then echo "$fails failed"; exit 1; fi
