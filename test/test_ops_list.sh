#!/usr/bin/env bash
# The op table's prototypes are written once (kernels/ops_list.h) and the
# compiler holds every backend to them: a table entry or a CPU reference
# whose signature drifts from its list entry must not compile. This builds
# a correct entry and reference (must compile) and drifted ones (must fail
# with "conflicting types"), with the project's C compiler.
# Usage: test_ops_list.sh SOURCE_DIR C_COMPILER
set -u
src=$1 cc=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
inc=(-I"$src/kernels" -I"$src/kernels/cpu")

# $1: file name, $2: the scale parameter's type in the backend entry, $3: in the CPU reference
write() {
    cat > "$tmp/$1" <<C
#include "cpu_ops.h"
#define OP(name, cls, cpu, cuda, params, args) static void t_##name TP_OP_WITH_BE params;
#include "ops_list.h"
static void t_scale(Backend *be, float *x, $2 s, size_t n) { (void)be; cpu_scale(x, (float)s, n); }
void cpu_scale(float *x, $3 s, size_t n_elems) { for (size_t i = 0; i < n_elems; i++) x[i] *= (float)s; }
void *use_it(void) { return (void *)t_scale; }
C
}
compile() { "$cc" -std=c11 -fsyntax-only "${inc[@]}" "$tmp/$1" > "$tmp/$1.err" 2>&1; }

write good.c float float
compile good.c || { cat "$tmp/good.c.err"; fail "the entry and reference as ops_list.h declares them do not compile"; }

write entry.c double float
compile entry.c && fail "a backend table entry with a drifted signature compiled"
grep -q "conflicting types for .t_scale" "$tmp/entry.c.err" || { cat "$tmp/entry.c.err"; fail "no conflicting-types error for t_scale"; }

write ref.c float double
compile ref.c && fail "a CPU reference with a drifted signature compiled"
grep -q "conflicting types for .cpu_scale" "$tmp/ref.c.err" || { cat "$tmp/ref.c.err"; fail "no conflicting-types error for cpu_scale"; }

echo "ok: drifted signatures refused"
