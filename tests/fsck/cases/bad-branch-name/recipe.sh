# Branch names that break the name rule (format.md#catalog, U5), as older
# versions let programs make them or as a damaged info item holds them: a
# '/' in one, a newline in another, and a third branch already named what
# the first would be renamed to.
"$MKFS" -q -s 32M "$IMG"
"$CTL" branch create "$IMG" work
"$CTL" branch create "$IMG" w_rk
"$CTL" debug corrupt "$IMG" fsinfo work name.1 --set 0x2f   # "w/rk"
"$CTL" debug corrupt "$IMG" fsinfo main name.2 --set 0x0a   # "ma\nn"
