#!/bin/sh
# The example host application (examples/host_app) trains bit-identically however the
# optimizer is embedded: master weights, m, v and the model's weights after 30 steps are
# the same bytes
#  1. in the application that runs lws and its own tasks, with the optimizer in a context
#     of its own (handles; host_app itself checks that its tasks stayed under lws and that
#     the dos context placed only the optimizer's tasks);
#  2. in an application that never calls starpu_init (buffers; the API starts StarPU with
#     dos and stops it);
#  3. through the optimizer's internal path in a StarPU that runs only dos
#     (tests/test_embed_reference, the path of dos-train's loop);
#  4. after saving at step 12 and resuming in a new process through the API, in either
#     kind of application.
set -u
app=./examples/host_app
ref=./tests/test_embed_reference
# shellcheck source=tests/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

run() { # name, program, args...
	name=$1
	shift
	"$@" >"$work/$name.log" 2>&1
	status=$?
	[ $status = 77 ] && exit 77
	[ $status = 0 ] || fail "$name: $* failed ($status): $(cat "$work/$name.log")"
}
same() { # a, b, what
	cmp -s "$work/$1.bin" "$work/$2.bin" || fail "$3: $1 and $2 differ"
}

run lws $app --dump "$work/lws.bin"
cat "$work/lws.log"
run owned $app --no-starpu-init --dump "$work/owned.bin"
run reference $ref --dump "$work/reference.bin"
cat "$work/reference.log"
same lws reference "the embedded optimizer against the internal path"
same lws owned "an application with StarPU against one without"
echo "embedding: lws + dos context, API-owned StarPU and the internal path: bit-identical after 30 steps"

mkdir -p "$work/ck"
run saved $app --checkpoint-dir "$work/ck" --save-at 12 --dump "$work/saved.bin"
[ -f "$work/ck/checkpoint-12.dos" ] || fail "no checkpoint-12.dos after --save-at 12: $(ls "$work/ck")"
same lws saved "saving must not change the training"
run resumed $app --checkpoint-dir "$work/ck" --resume --dump "$work/resumed.bin"
grep -q "resumed from .*checkpoint-12.dos after step 12" "$work/resumed.log" || fail "no resume: $(cat "$work/resumed.log")"
same lws resumed "12 steps + save + load + 18 steps against 30 steps"
run resumed-owned $app --no-starpu-init --checkpoint-dir "$work/ck" --resume --dump "$work/resumed-owned.bin"
same lws resumed-owned "resuming in an application without StarPU"
echo "checkpoints: 12 steps + save + load (new process, either application) + 18 steps = 30 steps, bit for bit"

# the comparisons are not vacuous: fewer steps end elsewhere
run short $app --steps 29 --dump "$work/short.bin"
cmp -s "$work/lws.bin" "$work/short.bin" && fail "29 and 30 steps ended identical"
exit 0
