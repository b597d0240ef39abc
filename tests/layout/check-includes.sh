#!/bin/sh
# check-includes.sh — lib/'s folders may include only their own floor's
# neighbours named below and the floors beneath, never above; no header
# outside lib/<folder>/ is included by path; no file stands in lib/ itself.
# Prints one line per offending include and exits 1 if there is any.
# The floors (docs/architecture.md draws them):
#   train rollout             the run loops the commands call
#   sync reward queue model   services over the data and the weights
#   compute tok stream        numbers, text, records
#   base                      logging, errors, files, JSON, hashes
# Within a floor an include must follow the arrows in ALLOW (no circle).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 2

floor() {
	case $1 in
	base) echo 0 ;;
	compute|tok|stream) echo 1 ;;
	model|queue|reward|sync) echo 2 ;;
	rollout|train) echo 3 ;;
	*) echo -1 ;;
	esac
}
# same-floor arrows that are allowed: "from>to"
ALLOW=" sync>model reward>queue "

bad=0
for f in lib/*; do
	[ "$f" = lib/README.md ] && continue  # the floors in words
	[ -d "$f" ] || { echo "lib/: '$f' is not in a subsystem folder"; bad=1; }
done
for f in lib/*/*.c lib/*/*.h; do
	from=${f#lib/}; from=${from%%/*}
	ff=$(floor "$from")
	if [ "$ff" = -1 ]; then echo "$f: folder '$from' has no floor in $0"; bad=1; continue; fi
	grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | while IFS= read -r line; do
		inc=$(printf '%s\n' "$line" | sed 's/.*include[[:space:]]*"\([^"]*\)".*/\1/')
		n=${line%%:*}
		case $inc in
		kernels/launch.h) [ "$from" = compute ] && continue
			echo "$f:$n: only lib/compute includes kernels/launch.h"; echo x >&3; continue ;;
		*/*) to=${inc%%/*} ;;
		*) # a bare name: a header beside the file
			[ -f "lib/$from/$inc" ] && continue
			echo "$f:$n: '$inc' is not in lib/$from: include it as \"folder/$inc\""; echo x >&3; continue ;;
		esac
		if [ ! -f "lib/$inc" ]; then
			echo "$f:$n: '$inc' is not a header in lib/"; echo x >&3; continue
		fi
		[ "$to" = "$from" ] && continue
		tf=$(floor "$to")
		if [ "$tf" -gt "$ff" ]; then
			echo "$f:$n: $from (floor $ff) includes $inc from $to (floor $tf): an include that runs back up"; echo x >&3
		elif [ "$tf" = "$ff" ]; then
			case $ALLOW in *" $from>$to "*) ;; *)
				echo "$f:$n: $from includes $inc from $to on the same floor, not an allowed arrow ($ALLOW)"; echo x >&3 ;;
			esac
		fi
	done 3>>"${TMPDIR:-/tmp}/rl-layout.$$"
done
[ -s "${TMPDIR:-/tmp}/rl-layout.$$" ] && bad=1

# no circle between modules (a module is a .c/.h pair: lib/sync/wsync.c and
# lib/sync/wsync.h are one node); tsort names the modules of each loop.  A
# folder's internal header (NAME_int.h, NAME_impl.h: the shared insides of
# the folder's files, see lib/stream/traj_int.h) is no node of its own.
edges=$(for f in lib/*/*.c lib/*/*.h; do
	m=${f%.*}
	grep -h '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
		sed 's/.*include[[:space:]]*"\([^"]*\)".*/\1/' | while IFS= read -r inc; do
			[ -f "lib/$inc" ] || continue
			case $inc in *_int.h|*_impl.h) continue ;; esac
			t=lib/${inc%.*}
			[ "$t" != "$m" ] && echo "$m $t"
		done
done)
if ! loops=$(printf '%s\n' "$edges" | tsort 2>&1 >/dev/null) || [ -n "$loops" ]; then
	echo "lib/: modules include each other in a circle:"
	printf '%s\n' "$loops" | sed 's/^/  /'
	bad=1
fi
rm -f "${TMPDIR:-/tmp}/rl-layout.$$"
[ $bad = 0 ] && echo "layout: lib/ includes follow the floors"
exit $bad
